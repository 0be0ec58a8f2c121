/** One waiter's interest in the releases of one lock key. */
export interface ReleaseWatch {
  /**
   * Whether releases of the key are heard. `false` when subscribing failed (Redis unreachable):
   * the waiter must then poll instead of relying on a wake-up.
   */
  readonly listening: boolean;
  /**
   * `performance.now()` since when releases of the key have been heard without a break (Infinity
   * when not listening). An attempt sent after it needs no second attempt once watching: a
   * release after it was heard, and is passed on to a watch started with that `since`.
   */
  readonly listeningSince: number;
  /**
   * Resolves at the next release heard since the previous call (at once if one came in between),
   * after `maxWaitMs`, or when `signal` aborts. Never rejects.
   */
  wait(maxWaitMs: number, signal: AbortSignal): Promise<void>;
  /** A release seen locally (this process freed the lock): wake the wait as a message would. */
  wake(): void;
  /** Stop listening; the channel is unsubscribed when the last watch of the key closes. */
  close(): void;
}

/**
 * One process's waiting line for one lock, as it stands in the store's line of waiters (the
 * fairness across processes): its id, and whether its last attempt left it a place there.
 *
 * Grants: a release (or a leave, or an attempt that finds the lock free with a line) may hand the
 * lock straight to the head of its line, in the store, under a short lease of its own. The head's
 * process learns it from the watch (only the head's line wakes), and its next attempt with its
 * `waiter` id takes the grant up: the answer says taken, with the grant's fencing token and the
 * attempt's own lease. A hold always starts on such an answer; a grant nobody takes up lapses,
 * and the next in line gets its turn.
 */
export interface LinePlace {
  readonly id: string;
  inLine: boolean;
}

/** Outcome of one acquire attempt. */
export type AcquireResult =
  /**
   * Taken: `token` is the fencing token issued to this acquisition. `validMs`, when set, is how long
   * after the acquire was sent the lock surely still holds, when the store knows a shorter time than
   * the lease less the usual margin (Redlock: the lease less its clock-drift allowance).
   */
  | {
      readonly acquired: true;
      readonly token: number;
      readonly validMs?: number;
      /**
       * With `from` (a local hand-over): whether `from`'s hold was replaced by this one (true), or
       * `from` held nothing and the lock was taken as by any attempt (false), also when the client
       * re-sent the command. An acquisition with `from` that rejects after `from`'s hold was
       * replaced (the new hold's replicas fell short) says so on its error (`wasHandedOver`).
       */
      readonly handedOver?: boolean;
    }
  /**
   * Not taken: `ttl` is the holder's remaining lease in ms (-1 when the key has none), or -3 when
   * the lock is free but other waiters are ahead in its line; then `turnMs`, when the store knows
   * it, is how long the head of the line has to take it before its turn passes (a head that died
   * is out of the way by then).
   */
  | { readonly acquired: false; readonly ttl: number; readonly turnMs?: number };

/** What an acquisition asks of the store besides the key, owner and lease. */
export interface AcquireOptions {
  /** The waiting line's id, for a caller that waits (see `LockStore.lineRefreshMs`). */
  readonly waiter?: string;
  /**
   * A shared hold (a reader, a semaphore's permit), taken while fewer than `share` shared holds
   * (0: any number) and no exclusive one have the key; unset: an exclusive hold.
   */
  readonly share?: number;
  /** A description of the holder (JSON), kept with the hold for `inspect`, and gone with it. */
  readonly describe?: string;
  /**
   * A local hand-over (stores with `handsOver` only): the owner id of a hold of this same
   * application, of the kind this attempt asks for, whose holder has finished and hands it to this
   * attempt instead of releasing it. While `from` still holds `key`, its hold (with its description
   * and waiting mark) is replaced by the new owner's in one atomic step, with a fresh fencing token
   * and the new owner's own lease: the lock is never free in between, whoever waits in the store's
   * line, and the number of holds never changes. A shared hold passes only while the others leave
   * room under this attempt's own `share`. Otherwise the attempt is an ordinary one. See
   * `handedOver`.
   */
  readonly from?: string;
  /**
   * A `performance.now()` time until which an attempt the store could not run, because the lock's
   * place is moving (a Cluster slot migrating), is sent again; never past `operationTimeout`.
   * Unset: until `operationTimeout`.
   */
  readonly retryUntil?: number;
}

/** One hold of a lock, as `inspect` finds it in the store. */
export interface StoredHold {
  readonly owner: string;
  /** A plain lock or a writer; otherwise a reader or a permit. */
  readonly exclusive: boolean;
  /** ms left of its lease (-1: no expiry). */
  readonly ttl: number;
  /** Handed to the head of the line by a release, and not taken up yet. */
  readonly granted: boolean;
  /** What its acquisition recorded: when (epoch ms), its fencing token, and the holder's description. */
  readonly recorded?: { readonly since: number; readonly fencingToken?: number; readonly description: string };
}

/** A lock as `inspect` finds it in the store. */
export interface StoredLock {
  /** Whether anyone holds it. */
  readonly held: boolean;
  /** The holds, exclusive or shared. */
  readonly holds: readonly StoredHold[];
  /** Processes with a place in its line of waiters. */
  readonly waiting: number;
}

/** What `LockStore.health` finds: the backend answers and runs the lock scripts, or why not. */
export type StoreHealth =
  /** `warnings`: what answers but endangers locks (a Redis that may evict them when full). */
  | { readonly up: true; readonly latencyMs: number; readonly warnings?: readonly string[] }
  | { readonly up: false; readonly problem: string };

/** Whether an owner still holds its lock, and the key's remaining lease in ms (-2: no key). */
export interface CheckResult {
  readonly held: boolean;
  readonly ttl: number;
}

/** One lock to renew: its key, the owner expected in it and the lease to reset it to. */
export interface RenewRequest {
  readonly key: string;
  readonly owner: string;
  readonly leaseMs: number;
  /**
   * Set the lease to exactly `leaseMs`, even when that shortens it (a hold that ended before its
   * `lockAtLeastFor`: the key is to expire then, not later). Default: the lease is at least
   * `leaseMs` afterwards, never shortened.
   */
  readonly exact?: boolean;
  /**
   * Only tell whether the owner still holds it, changing nothing (a fixed lease, verified on the
   * renewal schedule but never extended); `leaseMs` is then ignored.
   */
  readonly check?: boolean;
}

/** Outcome of one renewal: `true` renewed, `false` not the owner (nothing changed), or why it could not be asked. */
export type RenewOutcome = boolean | { readonly error: unknown };

/** Outcome of one release call. */
export type ReleaseResult =
  /** The key is gone: this call freed the lock. */
  | 'released'
  /** The caller does not own the lock (any more); nothing was changed. */
  | 'not-owner';

/**
 * The narrow seam between the lock logic and a backend. Every method is atomic on the backend,
 * owner-checked, and has its effect once even when the backend sees it twice (a client may re-send
 * a command whose reply a dropped connection lost). The lock for `key` is a hash `{ [owner]: 1 }`
 * whose TTL is the lease, or with shared holds `{ [owner]: end of its lease }` whose TTL is the
 * latest of those; reentrant holds are counted by the process that holds the lock.
 *
 * Single-instance Redis implements it today; Cluster, Sentinel, Redlock and an in-memory store
 * for unit tests slot in beside it.
 */
export interface LockStore {
  /**
   * Take the free lock for a new `owner` (an id never used before) with a lease of `leaseMs` and
   * issue a fencing token that is larger than every token issued for `key` before. When the
   * outcome cannot be known (any rejection once the command may have been sent: no answer in
   * time, a client-side command timeout, a connection closed in flight), the store gives the hold
   * back by itself (see `giveBack`), so that a lock nobody was told about never outlives the call
   * by more than that.
   *
   * With `options.share` set, the hold is shared (a reader of a read-write lock, a permit of a semaphore):
   * taken while no exclusive hold has `key` and fewer than `share` shared holds (0: any number)
   * do, each with a lease of its own; a shared holder that died stops counting when its lease
   * ends. Without it the hold is exclusive (a mutex, a writer): taken only when nobody holds
   * `key`. `check`, `renew` and `release` treat both kinds alike; a release of a shared hold
   * leaves the others in place. Refused (`ttl`): the holder's remaining lease, or with shared
   * holds in the way the time until the first of their leases ends.
   *
   * The id says the kind: a shared hold's `owner` starts with `SHARED_OWNER_PREFIX` (`s`) and an
   * exclusive one's never does (`OwnerIds` makes them so), so that a store can release either
   * without first reading which it is. A store may refuse an id of the wrong kind.
   */
  acquire(key: string, owner: string, leaseMs: number, options?: AcquireOptions): Promise<AcquireResult>;
  /**
   * What the store holds for `key`, for an operator (`LockService.inspect`). Read only.
   */
  inspect(key: string): Promise<StoredLock>;
  /**
   * Drop every hold of `key`, whoever holds it (`LockService.forceUnlock`); the lock goes to the
   * next waiter as after a release, and each holder finds out at its next renewal. The holds
   * removed: not one its holder released meanwhile (one that ended by itself while this ran may be
   * among them, and after a dropped connection, every hold it found). Has its effect once: a
   * copy the client re-sends never drops a hold taken after the first copy ran.
   */
  forceUnlock(key: string): Promise<StoredHold[]>;
  /**
   * With a `waiter` id, acquire is fair: a caller that must wait takes a place in the lock's line
   * (kept by its attempts, at least every `lineRefreshMs`; it lapses by itself otherwise), a free
   * lock goes to the head of the line, and a newcomer (with or without an id) cannot jump it
   * (`ttl` -3). A store without a line ignores the id (`lineRefreshMs` Infinity).
   */
  readonly lineRefreshMs: number;
  /**
   * Name prefixes the store keeps its own keys under, beside the locks (fencing counters, lines of
   * waiters): a lock name starting with one is refused before the store is asked.
   */
  readonly reservedPrefixes: readonly string[];
  /**
   * Whether `acquire` takes `from` (a hand-over between two owners of this application in one
   * step, see `AcquireOptions.from`); a store that cannot is never asked to.
   */
  readonly handsOver: boolean;
  /**
   * Whether `acquire` can bound the number of shared holds (`share` > 0: a semaphore's permits)
   * safely; a store that cannot is never asked to.
   */
  readonly boundsShares: boolean;
  /** `waiter` gives up its place (timed out, aborted, shut down); the new head, if any, is told. */
  leave(key: string, waiter: string): Promise<void>;
  /** Whether `owner` still holds `key` (for a reentrant acquisition); changes nothing. */
  check(key: string, owner: string): Promise<CheckResult>;
  /**
   * Reset the lease of each lock whose owner still holds it (never re-creating a key), in as few
   * round trips as the backend allows. One outcome per request, in order; never rejects (a failed call gives its requests an
   * `{ error }` outcome).
   */
  renew(requests: readonly RenewRequest[]): Promise<RenewOutcome[]>;
  /**
   * Give back a hold its caller will not use (an answer that came too late to rely on, a shutdown
   * under way, an outcome that cannot be known): released now, owner-checked, and again while the
   * store does not answer, until a lease of `leaseMs` taken now would have ended anyway. Resolves
   * once the first try has settled (the retries go on by themselves); never rejects.
   */
  giveBack(key: string, owner: string, leaseMs: number): Promise<void>;
  /**
   * Drop `owner`'s hold. Never touches a lock of another owner. Local watchers of `key` (see
   * `watch`) are woken whenever the release is known to have freed the lock, whether its own
   * reply said so or, when that reply was lost or late, its announcement came back; with a line
   * of waiters, the lock goes to its head (a grant, see above), and only the watch whose turn it is wakes.
   */
  release(key: string, owner: string): Promise<ReleaseResult>;
  /**
   * Listen for releases of `key` (by any process). Resolves once listening, or once that failed
   * (`listening: false`); never rejects. Call before the retry that follows a failed attempt, so
   * that a release in between is not missed (unless `listeningSince` says it was heard: the last
   * release heard since `since` wakes the new watch, as a grant to `place` would). Every
   * watch is also woken when the listening connection comes back after a drop: a release
   * announced meanwhile was not heard.
   */
  watch(key: string, place?: LinePlace, since?: number): Promise<ReleaseWatch>;
  /**
   * Which of `held` (keys this application holds locks on) the backend may have lost since the
   * previous call: those on a server whose data set was flushed or replaced meanwhile (a restart
   * without persistence, FLUSHALL), none otherwise. One small command per server; `LockService`
   * asks about twice a second while it holds locks, and checks the keys named at once (a dropped
   * connection is `onReconnect`'s). Never rejects (a probe that fails names none).
   */
  suspect(held: readonly string[]): Promise<readonly string[]>;
  /**
   * Call `listener` each time the store's connection to the backend comes back after a drop: the
   * backend may have restarted without its data, so held locks are checked at once. Returns a
   * function that stops it.
   */
  onReconnect(listener: () => void): () => void;
  /**
   * Check once, at startup, that the backend allows every operation the store needs. Rejects with
   * `RedisAccessError` naming what is refused (an ACL permission, scripting); a backend that does
   * not answer is only logged (it may come up later), within `operationTimeout`.
   */
  verify(): Promise<void>;
  /**
   * Run one read-only lock script against the backend, within `operationTimeout`, for a health
   * check: up with its round trip, or down with why (unreachable, scripting refused). Never rejects.
   */
  health(): Promise<StoreHealth>;
  /** Close what the store opened itself; a client handed in by the application stays open. */
  close(): Promise<void>;
}
