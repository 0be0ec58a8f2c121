import { LockNotAcquiredError } from 'nestjs-dislock';
import type { RedisTarget } from '../support/protocol';
import { countingConnection, ready } from '../support/redis';
import { type Body, LEASE_MS, type Locker, type LockMode, WAIT_MS } from './locker';
import { startDislockApp } from './nest-app';

/**
 * nestjs-dislock in a Nest application context, on a client the benchmark passes in (so that it
 * can count round trips): a `Redis`, or on the Cluster an ioredis `Cluster`. Fixed lease of 10 s
 * (`expire`); contended: `waitTime` 10 s.
 * - service: `LockService.lock()` then `handle.release()`.
 * - decorator: a provider method with `@DisLock({ key: 'k:{0}', expire: 10000 })` (+ `waitTime`).
 */
export async function dislockLocker(decorator: boolean, mode: LockMode, redis: RedisTarget): Promise<Locker> {
  const { client, sent } = countingConnection(redis, `bench-dislock-${process.pid}`);
  await ready(client);
  const { app, locks, target, logger } = await startDislockApp({ redis: client });
  const options = mode === 'contended' ? { expire: LEASE_MS, waitTime: WAIT_MS } : { expire: LEASE_MS };

  const viaService = async (key: string, body: Body): Promise<boolean> => {
    let handle;
    try {
      handle = await locks.lock(`k:${key}`, options);
    } catch (error) {
      if (error instanceof LockNotAcquiredError) return false;
      throw error;
    }
    try {
      await body();
    } finally {
      await handle.release();
    }
    return true;
  };

  const viaDecorator = async (key: string, body: Body): Promise<boolean> => {
    try {
      await (mode === 'contended' ? target.waiting(key, body) : target.once(key, body));
      return true;
    } catch (error) {
      if (error instanceof LockNotAcquiredError) return false;
      throw error;
    }
  };

  return {
    critical: decorator ? viaDecorator : viaService,
    sent,
    logged: () => logger.snapshot(),
    async close() {
      await app.close();
      await client.quit();
    },
  };
}
