import { Mutex, TimeoutError } from 'redis-semaphore';
import { countingClient, ready } from '../support/redis';
import { type Body, LEASE_MS, type Locker, type LockMode, NOTHING_LOGGED } from './locker';

/**
 * redis-semaphore `Mutex`, a new one per acquisition (its identifier is per instance).
 * - uncontended: `lockTimeout: 10000, refreshInterval: 0` (refresh disabled: a fixed lease, like the
 *   other contenders here), otherwise defaults.
 * - contended: all defaults (lockTimeout 10 s, acquireTimeout 10 s, retryInterval 10 ms, refresh
 *   every 0.8 x lockTimeout = 8 s, which a 1 ms hold never reaches).
 */
export async function semaphoreLocker(mode: LockMode, redisUrl: string): Promise<Locker> {
  const { client, sent } = countingClient(redisUrl, `bench-semaphore-${process.pid}`);
  await ready(client);
  const options = mode === 'uncontended' ? { lockTimeout: LEASE_MS, refreshInterval: 0 } : {};

  return {
    async critical(key: string, body: Body): Promise<boolean> {
      const mutex = new Mutex(client, key, options);
      try {
        await mutex.acquire();
      } catch (error) {
        if (error instanceof TimeoutError) return false;
        throw error;
      }
      try {
        await body();
      } finally {
        await mutex.release();
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
