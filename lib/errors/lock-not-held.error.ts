import { DisLockError } from './dislock.error';

/**
 * `LockService.assertLocked` was called outside the lock it names: the running async call chain
 * (a `@DisLock` method or a `withLock` callback and everything they call) does not hold it.
 */
export class LockNotHeldError extends DisLockError {
  constructor(
    /** The lock name asked for (without the key prefix); `undefined`: any lock. */
    readonly lockName: string | undefined,
  ) {
    super(
      lockName === undefined
        ? 'No lock is held by the current call chain: run this code inside a @DisLock method or a LockService.withLock callback'
        : `Lock "${lockName}" is not held by the current call chain: run this code inside a @DisLock method or a LockService.withLock callback that holds it`,
    );
  }
}
