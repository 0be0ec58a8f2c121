import { DisLockError } from './dislock.error';

/**
 * What a busy caller asked for, which decides what stands in its way: another owner of a plain
 * (write) lock; a writer, holding or waiting, for a reader; every permit, for a semaphore.
 */
export type BusyHold =
  | { readonly kind: 'exclusive' | 'read'; readonly permits?: undefined }
  | { readonly kind: 'permit'; readonly permits: number };

/**
 * What a busy lock says: `Lock "x" is held by another owner`, `Lock "catalog" is not open to
 * readers: ...`, `All 2 permits of "exports" are taken`; with how long the caller waited, when it did.
 */
function describeBusy(lockName: string, waitedMs: number, hold: BusyHold): string {
  const waited = waitedMs > 0;
  switch (hold.kind) {
    case 'permit':
      return (
        `All ${hold.permits} permit${hold.permits === 1 ? '' : 's'} of "${lockName}" are taken` +
        (waited ? ` and none came free within ${waitedMs} ms` : '')
      );
    case 'read':
      return (
        `Lock "${lockName}" is not open to readers: another owner holds it for writing, or a writer waits for it` +
        (waited ? `, and it did not open within ${waitedMs} ms` : '')
      );
    default:
      return (
        `Lock "${lockName}" is held by another owner` + (waited ? ` and was not released within ${waitedMs} ms` : '')
      );
  }
}

/**
 * The lock is held by someone else and did not become free within `waitTime`. The message says
 * what is in the way for the hold asked for: another owner (a plain or write lock), a writer (a
 * read lock), or every permit (a semaphore: `All 2 permits of "exports" are taken`).
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
  /** The hold asked for: `'exclusive'` (a plain or write lock, a multi-lock), `'read'` or `'permit'`. */
  readonly kind: BusyHold['kind'];
  /** A semaphore's permits, as the caller asked for them; undefined for other locks. */
  readonly permits: number | undefined;

  constructor(
    /** The lock name (without the key prefix). */
    readonly lockName: string,
    /** How long the caller waited, in ms. */
    readonly waitedMs: number,
    hold: BusyHold = { kind: 'exclusive' },
  ) {
    super(describeBusy(lockName, waitedMs, hold));
    this.kind = hold.kind;
    this.permits = hold.permits;
  }
}
