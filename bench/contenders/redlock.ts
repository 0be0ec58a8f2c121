import Redlock, { ExecutionError } from 'redlock';
import { type CountingClient, countingClient, ready } from '../support/redis';
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

  return redlockShaped(
    client,
    sent,
    (key) => redlock.acquire([key], LEASE_MS),
    (error) => error instanceof ExecutionError,
  );
}

/**
 * The Locker over a redlock-shaped library (redlock 5 and its fork): `acquire` takes the lock or
 * rejects, with an error `isBusy` recognizes when the lock stayed busy (a failed critical section).
 */
export function redlockShaped(
  client: CountingClient['client'],
  sent: CountingClient['sent'],
  acquire: (key: string) => Promise<{ release(): Promise<unknown> }>,
  isBusy: (error: unknown) => boolean,
): Locker {
  return {
    async critical(key: string, body: Body): Promise<boolean> {
      let lock;
      try {
        lock = await acquire(key);
      } catch (error) {
        if (isBusy(error)) return false;
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
