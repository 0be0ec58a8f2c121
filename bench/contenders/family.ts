import type { ContenderId, RedisTarget } from '../support/protocol';
import { serverUrl } from '../support/redis';
import type { Body, Locker, LockMode } from './locker';

/** The semaphore cases: at most this many holders of one name at once. */
export const PERMITS = 4;

/** What one turn of the read-write case asks for (the other contenders ignore it). */
export type Access = 'read' | 'write';

/** A `Locker` whose `critical` also takes the access a turn asks for (read-write case). */
export interface FamilyLocker extends Locker {
  critical(key: string, body: Body, access?: Access): Promise<boolean>;
}

/**
 * The family group's contenders; loads only what each needs (Nest for nestjs-dislock, the
 * redis-semaphore package for its `Semaphore`). On the single server only.
 */
export async function createFamilyLocker(
  contender: ContenderId,
  mode: LockMode,
  target: RedisTarget,
): Promise<FamilyLocker> {
  switch (contender) {
    case 'dislock-semaphore':
    case 'dislock-rw':
    case 'dislock-mutex':
    case 'dislock-multi':
    case 'dislock-two-locks':
      return (await import('./dislock-family.js')).dislockFamilyLocker(contender, mode, target);
    case 'redis-semaphore':
      return (await import('./semaphore-family.js')).semaphoreFamilyLocker(mode, serverUrl(target));
    default:
      throw new Error(`${contender} is not a contender of the family group`);
  }
}
