import { DisLockError } from './dislock.error';

/**
 * Redis did not answer a lock operation in time, or answered with an error. The lock state is
 * unknown to the caller; nothing was left held on its behalf that it can see.
 *
 * The message says only what failed (`Could not acquire lock "x": Redis is unavailable`); what
 * Redis or the connection reported (addresses, ports, `ECONNREFUSED`, `WRONGPASS`) is in `cause`,
 * for logs, which print it (`util.inspect`, Nest's `Logger`). Shaped like an `http-errors` error
 * (`status`, `statusCode`, `expose: false`), so that Nest's default exception filter answers
 * **503 Service Unavailable** when this error leaves an HTTP controller.
 */
export class RedisUnavailableError extends DisLockError {
  /** The HTTP status that answers this error: 503 Service Unavailable. */
  readonly status = 503;
  /** The same as `status`: the field Nest's default filter reads. */
  readonly statusCode = 503;
  /** `false`: a server-side failure; an HTTP answer carries the standard status text, not the message. */
  readonly expose = false;

  constructor(
    /** The operation that failed: `acquire`, `renew`, `release` or `inspect`. */
    readonly operation: string,
    /** The lock name (without the key prefix). */
    readonly lockName: string,
    /** What failed, with no connection detail: it may reach a client (Nest 11 before 11.2.8 sends it as the body). */
    message: string,
    /** `cause`: the error Redis or the client reported. */
    options?: { cause?: unknown },
  ) {
    super(message, options);
  }
}
