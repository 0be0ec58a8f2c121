import { DisLockError } from './dislock.error';

/**
 * Redis did not answer a lock operation in time, or answered with an error. The lock state is
 * unknown to the caller; nothing was left held on its behalf that it can see.
 *
 * `statusCode` makes Nest's default exception filter answer **503 Service Unavailable**.
 */
export class RedisUnavailableError extends DisLockError {
  readonly statusCode = 503;

  constructor(
    /** The operation that failed: `acquire`, `renew` or `release`. */
    readonly operation: string,
    /** The lock name (without the key prefix). */
    readonly lockName: string,
    message: string,
    options?: { cause?: unknown },
  ) {
    super(message, options);
  }
}
