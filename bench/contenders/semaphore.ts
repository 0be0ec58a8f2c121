import type { Redis } from 'ioredis';
import { type LockOptions, Mutex, TimeoutError } from 'redis-semaphore';
import { countingClient, ready } from '../support/redis';
import { type Body, LEASE_MS, type Locker, type LockMode, NOTHING_LOGGED } from './locker';

/** What redis-semaphore's `Mutex` and `Semaphore` have in common for one acquisition. */
interface RedisSemaphoreLock {
  acquire(): Promise<void>;
  release(): Promise<void>;
}

/**
 * A redis-semaphore lock, a new one per acquisition (its identifier is per instance), made by
 * `create` on this process's client:
 * - uncontended: `lockTimeout: 10000, refreshInterval: 0` (refresh disabled: a fixed lease, like the
 *   other contenders here), otherwise defaults.
 * - contended: all defaults (lockTimeout 10 s, acquireTimeout 10 s, retryInterval 10 ms: it polls;
 *   its refresh every 0.8 x lockTimeout = 8 s never fires during a short hold).
 */
export async function redisSemaphoreLocker(
  mode: LockMode,
  redisUrl: string,
  create: (client: Redis, key: string, options: LockOptions) => RedisSemaphoreLock,
): Promise<Locker> {
  const { client, sent } = countingClient(redisUrl, `bench-semaphore-${process.pid}`);
  await ready(client);
  const options = mode === 'uncontended' ? { lockTimeout: LEASE_MS, refreshInterval: 0 } : {};

  return {
    async critical(key: string, body: Body): Promise<boolean> {
      const lock = create(client, key, options);
      try {
        await lock.acquire();
      } catch (error) {
        if (error instanceof TimeoutError) return false;
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

/** redis-semaphore `Mutex`, set up as `redisSemaphoreLocker` says. */
export function semaphoreLocker(mode: LockMode, redisUrl: string): Promise<Locker> {
  return redisSemaphoreLocker(mode, redisUrl, (client, key, options) => new Mutex(client, key, options));
}
