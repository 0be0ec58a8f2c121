import { type LockHandle, type LockOptions, LockNotAcquiredError } from 'nestjs-dislock';
import type { ContenderId, RedisTarget } from '../support/protocol';
import { countingConnection, ready } from '../support/redis';
import { type Access, type FamilyLocker, PERMITS } from './family';
import { type Body, LEASE_MS, type LockMode, WAIT_MS } from './locker';
import { startDislockApp } from './nest-app';

/**
 * nestjs-dislock's lock family through `LockService`, in a Nest application context as in the
 * other groups (dislock.ts): fixed lease `expire: 10000`; contended: `waitTime: 10000` added.
 * - dislock-semaphore: `lock(name, { permits: 4 })`.
 * - dislock-rw: `lock(name, { mode })`, the mode the turn asks for ('read' or 'write').
 * - dislock-mutex: `lock(name)` whatever the turn asks for: the read-write case's baseline.
 * - dislock-multi: `lock([a, b])`, one handle for both.
 * - dislock-two-locks: `lock(a)` then `lock(b)`, released b then a: the multi-lock's baseline.
 */
export async function dislockFamilyLocker(
  contender: ContenderId,
  mode: LockMode,
  target: RedisTarget,
): Promise<FamilyLocker> {
  const { client, sent } = countingConnection(target, `bench-dislock-${process.pid}`);
  await ready(client);
  const { app, locks, logger } = await startDislockApp({ redis: client });
  const base: LockOptions = mode === 'contended' ? { expire: LEASE_MS, waitTime: WAIT_MS } : { expire: LEASE_MS };
  const semaphore: LockOptions = { ...base, permits: PERMITS };
  const read: LockOptions = { ...base, mode: 'read' };
  const write: LockOptions = { ...base, mode: 'write' };

  /** The handles, in the order they were taken; `null` when a wait ran out (nothing is held then). */
  const take = async (key: string, access: Access): Promise<LockHandle[] | null> => {
    const name = `k:${key}`;
    try {
      switch (contender) {
        case 'dislock-semaphore':
          return [await locks.lock(name, semaphore)];
        case 'dislock-rw':
          return [await locks.lock(name, access === 'read' ? read : write)];
        case 'dislock-multi':
          return [await locks.lock([`${name}:a`, `${name}:b`], base)];
        case 'dislock-two-locks': {
          const first = await locks.lock(`${name}:a`, base);
          try {
            return [first, await locks.lock(`${name}:b`, base)];
          } catch (error) {
            await first.release();
            throw error;
          }
        }
        default:
          return [await locks.lock(name, base)];
      }
    } catch (error) {
      if (error instanceof LockNotAcquiredError) return null;
      throw error;
    }
  };

  return {
    async critical(key: string, body: Body, access: Access = 'write'): Promise<boolean> {
      const handles = await take(key, access);
      if (!handles) return false;
      try {
        await body();
      } finally {
        for (const handle of handles.reverse()) await handle.release();
      }
      return true;
    },
    sent,
    logged: () => logger.snapshot(),
    async close() {
      await app.close();
      await client.quit();
    },
  };
}
