import Redlock, { ExecutionError } from 'redlock';
import { countingClient, ready } from '../support/redis';
import { type Body, LEASE_MS, type Locker, type LockMode, NOTHING_LOGGED } from './locker';

/**
 * redlock 5 (beta) on one Redis. uncontended: `retryCount: 0` (one attempt). contended: its
 * defaults (retryCount 10, retryDelay 200 ms, retryJitter 100 ms): after ~2 s of retries `acquire`
 * rejects with an ExecutionError, which counts as a failure; the worker then tries again.
 */
export async function redlockLocker(mode: LockMode, redisUrl: string): Promise<Locker> {
  const { client, sent } = countingClient(redisUrl, `bench-redlock-${process.pid}`);
  await ready(client);
  const redlock = new Redlock([client], mode === 'uncontended' ? { retryCount: 0 } : {});
  redlock.on('error', () => undefined); // redlock emits its (expected) acquisition failures here too

  return {
    async critical(key: string, body: Body): Promise<boolean> {
      let lock;
      try {
        lock = await redlock.acquire([key], LEASE_MS);
      } catch (error) {
        if (error instanceof ExecutionError) return false;
        throw error;
      }
      try {
        await body();
      } finally {
        await lock.release();
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
