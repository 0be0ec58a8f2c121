import { DisLockError } from './dislock.error';

/**
 * The lock is held by someone else and did not become free within `waitTime`.
 *
 * `statusCode` makes Nest's default exception filter answer **409 Conflict** when this error
 * leaves a controller, without the library installing a filter of its own.
 */
export class LockNotAcquiredError extends DisLockError {
  readonly statusCode = 409;

  constructor(
    /** The lock name (without the key prefix). */
    readonly lockName: string,
    /** How long the caller waited, in ms. */
    readonly waitedMs: number,
  ) {
    super(
      waitedMs > 0
        ? `Lock "${lockName}" is held by another owner and was not released within ${waitedMs} ms`
        : `Lock "${lockName}" is held by another owner`,
    );
  }
}
