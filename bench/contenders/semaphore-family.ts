import { Semaphore } from 'redis-semaphore';
import { type FamilyLocker, PERMITS } from './family';
import type { LockMode } from './locker';
import { redisSemaphoreLocker } from './semaphore';

/** redis-semaphore `Semaphore` (limit 4), set up as its `Mutex` is in the other groups (semaphore.ts). */
export function semaphoreFamilyLocker(mode: LockMode, redisUrl: string): Promise<FamilyLocker> {
  return redisSemaphoreLocker(
    mode,
    redisUrl,
    (client, key, options) => new Semaphore(client, `s:${key}`, PERMITS, options),
  );
}
