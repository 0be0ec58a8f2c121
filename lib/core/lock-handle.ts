import type { LockEventSubject, LockHoldKind } from '../events/lock-events';
import { eventSubjectOf, holdKindOf, type ResolvedLockOptions } from '../options/dislock.options';
import { leaseMarginMs } from '../options/lease-margin';
import type { Scheduled } from './due-heap';
import type { WatchdogDue } from './watchdog-due';

/** One acquisition of a lock, as the caller holds it. */
export interface LockHandle {
  /** The lock name, without the key prefix. */
  readonly name: string;
  /** The Redis key: prefix + name. */
  readonly key: string;
  /** Random owner id (128 bits) of the outermost acquisition; reentrant acquisitions share it. */
  readonly owner: string;
  /**
   * Fencing token of this acquisition: larger than every token issued for this lock name before
   * it (across releases, expiries and owners). Reentrant acquisitions share the holder's token.
   * Pass it along with every write to a resource that can refuse a token smaller than the
   * largest it has seen: then a holder that lost the lock without noticing cannot overwrite the
   * next holder's work. See docs/failure-semantics.md for what the ordering rests on.
   */
  readonly fencingToken: number;
  /**
   * Aborted, with a `LockLostError` as reason, when the lock is lost while held: a renewal found
   * another owner, the lease ran out (fixed `expire`, Redis unreachable, `maxRenewTimes` reached),
   * or the application shut down; also when `release()` finds the lock already gone or taken.
   * Quiet after a successful `release()` and after `stopRenewal()`.
   */
  readonly signal: AbortSignal;
  /**
   * Drop this hold. Owner-safe: never touches a key another owner holds. `true` when this call
   * freed the lock; `false` while another hold of the same owner (outer or reentrant) still runs
   * under it, for a second call, or for a lock that was already lost (a loss first noticed here
   * is reported like any other: `signal`, `onLockLost`). Within `lockAtLeastFor` of acquisition
   * the key is not deleted but left to expire at that moment (renewal stops): `false` as well.
   */
  release(): Promise<boolean>;
  /**
   * Stop the watchdog and keep the key until it expires; while reentrant holds of the lock still
   * run, renewal goes on until the last of them is released. Has no effect on a reentrant hold.
   */
  stopRenewal(): void;
  /** `await using lock = await locks.lock('x')`: releases at the end of the block; never throws. */
  [Symbol.asyncDispose](): Promise<void>;
}

/** What a handle calls back into; implemented by `HeldLocks` (lib/service/held-locks.ts). */
export interface HoldKeeper {
  releaseHold(lock: HeldLock, reentrant: boolean): Promise<boolean>;
  stopRenewal(lock: HeldLock): void;
  disposeHold(handle: LockHandle): Promise<void>;
}

export type HeldLockState =
  /** Held, and renewed by the watchdog or waiting for its fixed lease to end. */
  | 'held'
  /** Renewal stopped on purpose; the key is left to expire. */
  | 'detached'
  /** Every hold was released. */
  | 'released'
  /** Lost: see the signal's reason. */
  | 'lost'
  /** Given up at application shutdown (released, or left to expire). */
  | 'shut-down';

/**
 * Until when (`performance.now()`) a lease asked for at `sentAt` certainly still runs in Redis: the
 * lease less its margin of 2 ms + 1 % of it (`leaseMarginMs`, which says why). Leases too short to
 * outlast it are refused by the option checks (`MIN_LEASE_MS`).
 */
export function leaseValidUntil(sentAt: number, leaseMs: number): number {
  return sentAt + leaseMs - leaseMarginMs(leaseMs);
}

/**
 * The state one owner keeps for one lock while it holds it: the owner id, the lease, the
 * watchdog's timer and the abort signal shared by the outermost and every reentrant handle.
 * Exists from acquisition to release, so memory is bounded by the locks held, not names seen.
 */
export class HeldLock implements Scheduled {
  state: HeldLockState = 'held';
  /**
   * Handles of this owner not yet released: the outermost and every reentrant one. Counted here,
   * not in Redis, which holds one entry per owner whatever the count: a command that a client
   * re-sends after a lost reply can then never count a hold twice, nor free a lock still in use.
   */
  holds = 1;
  /** The outermost handle has finished (released, or its method ended with `ifExpireWhenFinish: false`). */
  outerDone = false;
  /** `stopRenewal()` was asked for: renewal ends once no reentrant hold needs it any more. */
  stopAsked = false;
  /** When the last hold ends, leave the key to expire instead of deleting it (`ifExpireWhenFinish: false`). */
  keepKey = false;
  /** Given back with no code run under it: released at once, whatever `lockAtLeastFor` says. */
  abandoned = false;
  /** Renewals done so far. */
  renewals = 0;
  /**
   * How many more times this lock may be handed over to a waiter of this process in one step
   * (see `HandOver`) before it is released to the store's line: the local waiters that were behind
   * it when the lock came to this process, so that one process keeps it for one turn of its line
   * while other processes wait, never longer.
   */
  handOversLeft = 0;
  /** `performance.now()` until which the lease surely runs in Redis (see `leaseValidUntil`). */
  leaseEndsAt: number;
  /** What the watchdog has due for this lock next, and when (`performance.now()`); see `Watchdog`. */
  due: WatchdogDue | undefined;
  dueAt = 0;
  /** Position in the watchdog's schedule; -1 when nothing is due. */
  heapIndex = -1;
  /** When the renewal on its way (or the last one) was due: how late it went is its lag. */
  renewDueAt = 0;
  /** The last renewal error, kept to explain a lease that ran out while Redis was unreachable. */
  lastError: unknown;
  /**
   * Settles when the watchdog's renewal (or check) on its way for this lock has been answered, or
   * has failed: a lease cut to an exact end must be set after it, or it could run later and
   * lengthen that lease again.
   */
  renewal: Promise<void> | undefined;
  /** `performance.now()` from which `lockAtLeastFor` counts: when the acquisition was sent. */
  readonly lockedAt: number;
  private abortController: AbortController | undefined;
  private subject: LockEventSubject | undefined;

  constructor(
    readonly name: string,
    readonly key: string,
    readonly owner: string,
    readonly fencingToken: number,
    readonly options: ResolvedLockOptions,
    /** `performance.now()` when the acquisition was sent: the lease in Redis began no earlier. */
    readonly acquiredAt: number,
    /** Leave the key to expire at shutdown instead of deleting it (`ifExpireWhenFinish: false`). */
    readonly keepOnShutdown: boolean,
    /**
     * How long after an acquisition or renewal is sent the store says the lock surely holds, when
     * it knows less than the lease (Redlock: the lease less its clock-drift allowance; see
     * `AcquireResult`). Infinity: the lease less the usual margin.
     */
    private readonly validMs = Infinity,
  ) {
    this.leaseEndsAt = this.validUntil(acquiredAt);
    this.lockedAt = acquiredAt;
  }

  /** `performance.now()` until which a lease (re)set by a command sent at `sentAt` surely runs. */
  validUntil(sentAt: number): number {
    return Math.min(leaseValidUntil(sentAt, this.leaseMs), sentAt + this.validMs);
  }

  /** Made on first use: most locks are released without anyone reading their signal. */
  get controller(): AbortController {
    return (this.abortController ??= new AbortController());
  }

  /** A shared hold (a reader's, or a semaphore's permit) rather than an exclusive one. */
  get shared(): boolean {
    return this.kind !== 'exclusive';
  }

  get kind(): LockHoldKind {
    return holdKindOf(this.options);
  }

  /** Which lock, for its events; made once, on first use (the lock's name, key and options never change). */
  get eventBase(): LockEventSubject {
    return (this.subject ??= eventSubjectOf(this.name, this.key, this.options));
  }

  /** Whether the watchdog renews this lock (no fixed `expire`). */
  get renewing(): boolean {
    return this.options.expire <= 0;
  }

  /** The lease asked of Redis at acquisition and on each renewal. */
  get leaseMs(): number {
    return this.renewing ? this.options.lockWatchdogTimeout : this.options.expire;
  }
}

/** The handle given to callers; one per acquisition, outermost or reentrant. */
export class Handle implements LockHandle {
  private released = false;

  constructor(
    readonly lock: HeldLock,
    /** A reentrant acquisition inside the outermost one's async call chain. */
    readonly reentrant: boolean,
    private readonly keeper: HoldKeeper,
  ) {}

  get name(): string {
    return this.lock.name;
  }

  get key(): string {
    return this.lock.key;
  }

  get owner(): string {
    return this.lock.owner;
  }

  get fencingToken(): number {
    return this.lock.fencingToken;
  }

  get signal(): AbortSignal {
    return this.lock.controller.signal;
  }

  /** Whether `release()` has been called on this handle. */
  get isReleased(): boolean {
    return this.released;
  }

  release(): Promise<boolean> {
    if (this.released) return Promise.resolve(false);
    this.released = true;
    return this.keeper.releaseHold(this.lock, this.reentrant);
  }

  /** @internal Mark this handle finished without releasing through it (`ifExpireWhenFinish: false`). */
  finishKeeping(): boolean {
    if (this.released) return false;
    this.released = true;
    return true;
  }

  stopRenewal(): void {
    if (!this.reentrant && !this.released) this.keeper.stopRenewal(this.lock);
  }

  [Symbol.asyncDispose](): Promise<void> {
    return this.keeper.disposeHold(this);
  }
}
