import { DisLockError } from './dislock.error';

/**
 * The lock is held by someone else and did not become free within `waitTime`.
 *
 * Shaped like an `http-errors` error (`status`, `statusCode`, `expose`), so that Nest's default
 * exception filter answers **409 Conflict** with `{ statusCode: 409, message }` when this error
 * leaves an HTTP controller, on Nest 11 and 12, Express and Fastify, without any filter installed.
 */
export class LockNotAcquiredError extends DisLockError {
  /** The HTTP status that answers this error: 409 Conflict. */
  readonly status = 409;
  /** The same as `status`: the field Nest's default filter reads. */
  readonly statusCode = 409;
  /** `true`: the message tells the client nothing it should not know, and is sent as it is. */
  readonly expose = true;

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
