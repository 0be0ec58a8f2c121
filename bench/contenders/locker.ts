import type { ContenderId, RedisTarget } from '../support/protocol';
import { serverUrl } from '../support/redis';

/** uncontended: one attempt, the lock is expected to be free. contended: wait as the contender does. */
export type LockMode = 'uncontended' | 'contended';

/** Every lock in the benchmark has this fixed lease (renewal is measured separately). */
export const LEASE_MS = 10_000;
/** How long the contenders that take a wait time wait for a busy lock. */
export const WAIT_MS = 10_000;

export type Body = () => Promise<void>;

/** One contender, driven only through its public API. */
export interface Locker {
  /**
   * Take `key` (waiting as the contender does in this mode), run `body` while holding it, release
   * it. Resolves once the release has been answered; `false` when the lock stayed busy for the
   * contender's whole wait. Other failures reject.
   */
  critical(key: string, body: Body): Promise<boolean>;
  /** Commands this process has sent to Redis so far (one round trip each). */
  sent(): number;
  /** Warnings and errors the contender logged, where it has a logger. */
  logged(): { warnings: number; errors: number; first: string[] };
  close(): Promise<void>;
}

export const NOTHING_LOGGED = { warnings: 0, errors: 0, first: [] };

/**
 * Loads only what the contender needs (Nest is not loaded for the raw baselines, the redlocks or
 * redis-semaphore). The raw baselines and nestjs-dislock also run on a Redis Cluster.
 */
export async function createLocker(contender: ContenderId, mode: LockMode, target: RedisTarget): Promise<Locker> {
  switch (contender) {
    case 'raw':
    case 'raw-poll-1ms':
      return (await import('./raw.js')).rawLocker(mode, target);
    case 'dislock-service':
    case 'dislock-decorator':
      return (await import('./dislock.js')).dislockLocker(contender === 'dislock-decorator', mode, target);
    case 'redlock':
      return (await import('./redlock.js')).redlockLocker(mode, serverUrl(target));
    case 'sesame-redlock':
      return (await import('./sesame-redlock.js')).sesameRedlockLocker(mode, serverUrl(target));
    case 'redis-semaphore':
      return (await import('./semaphore.js')).semaphoreLocker(mode, serverUrl(target));
    default:
      throw new Error(`${contender} does not take locks in this scenario`);
  }
}
