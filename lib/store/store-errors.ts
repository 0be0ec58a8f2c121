/*
 * The failures a store reports besides the public errors (`RedlockQuorumError`): store-level facts
 * that `LockService` turns into what its caller sees (see `redisFailed`). Any store may throw them.
 */

/**
 * Thrown by a store when its backend does not answer within `operationTimeout`. Its message names the
 * connection error of a client the store created (if any), for logs; `LockService` keeps it as the `cause`
 * of a `RedisUnavailableError` whose own message tells only `timeoutMs`.
 */
export class StoreTimeoutError extends Error {
  constructor(
    /** The `operationTimeout` that ran out, in ms. */
    readonly timeoutMs: number,
    /** The connection error last seen, if the connection is down. */
    readonly connectionError?: Error,
  ) {
    super(
      `Redis did not answer within ${timeoutMs} ms` +
        (connectionError ? ` (the connection is down: ${connectionError.message})` : ''),
    );
    this.name = 'StoreTimeoutError';
  }
}

/**
 * The operation was not sent: the client is known to be cut off from Redis (not connected, and a
 * connection attempt has failed since it last was), and the module's `whenDisconnected` is
 * `'fail'`. Nothing ran, so there is nothing to give back. `cause` is the connection error (it may
 * name the server's address: for logs only); `LockService` turns this into a
 * `RedisUnavailableError` that says Redis is unreachable.
 */
export class StoreDisconnectedError extends Error {
  constructor(cause: Error) {
    super(`Redis is unreachable, the operation was not sent: ${cause.message}`, { cause });
    this.name = 'StoreDisconnectedError';
  }
}

/**
 * Fewer replicas than asked confirmed an acquisition in time. Thrown by the store (the hold has
 * been given back); `LockService` turns it into the public `ReplicationNotConfirmedError`.
 */
export class ReplicaShortfallError extends Error {
  constructor(
    readonly confirmed: number,
    readonly required: number,
    readonly timeoutMs: number,
  ) {
    super(`${confirmed} of ${required} replica(s) confirmed the lock within ${timeoutMs} ms`);
    this.name = 'ReplicaShortfallError';
  }
}

/**
 * A Redis Cluster kept refusing a lock operation because the lock's hash slot was migrating
 * between masters (`TRYAGAIN`: the lock's keys were split between the two, and the script did not
 * run; a copy the client still holds back may run later) for as long as the operation could wait.
 * `LockService` turns it into a `RedisUnavailableError` that says so; Redis's refusal is its `cause`.
 */
export class SlotMigratingError extends Error {
  constructor(
    /** The hash slot that was migrating. */
    readonly slot: number,
    cause: unknown,
  ) {
    super(
      `Redis Cluster hash slot ${slot} was migrating between masters (TRYAGAIN) for as long as the operation could wait`,
      {
        cause,
      },
    );
    this.name = 'SlotMigratingError';
  }
}

/**
 * A key the library keeps a lock in holds another type than it writes there: someone else's key
 * sits at the lock's name (`'lock'`), or at the fencing counter of its slot (`'fence'`). Thrown by
 * the Redis store for an acquisition (which then wrote no hold), for `inspect`, and for a release
 * whose hand-on to the line met a foreign fencing counter (its hold was dropped already);
 * `LockService` turns it into the public `LockKeyConflictError`. No wait would ever see such a key
 * released.
 */
export class ForeignKeyError extends Error {
  constructor(
    /** The key as the store names it (with the module's keyPrefix). */
    readonly key: string,
    /** Which of the lock's keys it is. */
    readonly role: 'lock' | 'fence',
    /** The type Redis reports for it (`string`, `list`...), when known. */
    readonly type: string | undefined,
    cause: unknown,
  ) {
    const expected = role === 'lock' ? 'a lock hash' : "a lock slot's fencing counter";
    super(`The Redis key "${key}" holds ${type ? `a ${type}` : 'another type'}, not ${expected}`, { cause });
    this.name = 'ForeignKeyError';
  }
}

/**
 * Marks `error`, thrown by an acquisition with `from` (a local hand-over) after `from`'s hold was
 * already replaced (the new hold's replicas then fell short, and it was given back): the holder's
 * hold is gone by its own hand-over, whatever became of the new one.
 */
export function markHandedOver(error: unknown): void {
  if (typeof error === 'object' && error !== null) Object.assign(error, { handedOver: true });
}

/** Whether `error` says the hand-over it ended had replaced the holder's hold (see `markHandedOver`). */
export function wasHandedOver(error: unknown): boolean {
  return typeof error === 'object' && error !== null && (error as { handedOver?: unknown }).handedOver === true;
}
