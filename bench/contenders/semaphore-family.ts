import { Semaphore, TimeoutError } from 'redis-semaphore';
import { countingClient, ready } from '../support/redis';
import { type FamilyLocker, PERMITS } from './family';
import { type Body, LEASE_MS, type LockMode, NOTHING_LOGGED } from './locker';

/**
 * redis-semaphore `Semaphore` (limit 4), a new one per acquisition (its identifier is per
 * instance), set up as its `Mutex` is in the other groups (semaphore.ts):
 * - uncontended: `lockTimeout: 10000, refreshInterval: 0` (refresh disabled: a fixed lease).
 * - contended: all defaults (lockTimeout 10 s, acquireTimeout 10 s, retryInterval 10 ms: it polls;
 *   its refresh every 8 s never fires during a short hold).
 */
export async function semaphoreFamilyLocker(mode: LockMode, redisUrl: string): Promise<FamilyLocker> {
  const { client, sent } = countingClient(redisUrl, `bench-semaphore-${process.pid}`);
  await ready(client);
  const options = mode === 'uncontended' ? { lockTimeout: LEASE_MS, refreshInterval: 0 } : {};

  return {
    async critical(key: string, body: Body): Promise<boolean> {
      const semaphore = new Semaphore(client, `s:${key}`, PERMITS, options);
      try {
        await semaphore.acquire();
      } catch (error) {
        if (error instanceof TimeoutError) return false;
        throw error;
      }
      try {
        await body();
      } finally {
        await semaphore.release();
      }
      return true;
    },
    sent,
    logged: () => NOTHING_LOGGED,
    async close() {
      await client.quit();
    },
  };
}
