/**
 * Thrown by a store when its backend does not answer within `operationTimeout`. Its message names the
 * connection error of a client the store created (if any), for logs; `LockService` keeps it as the `cause`
 * of a `RedisUnavailableError` whose own message tells only `timeoutMs`.
 */
export class StoreTimeoutError extends Error {
  constructor(
    /** The `operationTimeout` that ran out, in ms. */
    readonly timeoutMs: number,
    connectionError?: Error,
  ) {
    super(
      `Redis did not answer within ${timeoutMs} ms` +
        (connectionError ? ` (the connection is down: ${connectionError.message})` : ''),
    );
    this.name = 'StoreTimeoutError';
  }
}
