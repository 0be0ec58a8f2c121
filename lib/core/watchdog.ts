import type { Logger } from '@nestjs/common';
import { describeError } from '../errors/describe-error';
import { DueHeap } from './due-heap';
import type { LockLostReason } from '../errors';
import type { HeldLock } from './lock-handle';
import type { WatchdogDue } from './watchdog-due';
import type { LockEvents } from '../events/lock-events';
import type { LockStore } from '../store/lock-store.interface';

const now = (): number => performance.now();

/** Renewals due within this many ms (at most a quarter of a lock's interval) go out with the batch at hand. */
const BATCH_WINDOW_MS = 50;

/**
 * Renewals handled per timer callback, at most: more due at once (thousands of locks taken
 * together) go out in the next callbacks, so that no single one blocks the event loop for long.
 */
const MAX_RENEWALS_PER_TICK = 500;

/** Renewal lag is reported for the current and the previous window of this many ms. */
const LAG_WINDOW_MS = 15_000;

/**
 * Keeps held locks alive and notices when they are not any more: one schedule (a heap ordered by
 * due time) and one timer for all the locks of a `LockService`, however many there are.
 *
 * - Renewing locks (no fixed `expire`) are renewed every `lockWatchdogTimeout / 3`. When the timer
 *   fires, every renewal due within a short window goes to Redis together, in one script call per
 *   batch, and each answer applies to its own lock: "not owner" loses that lock alone. A renewal
 *   that fails is retried on the next interval (or at the end of the lease, whichever comes
 *   first); once the lease is past, the lock is lost, on time even while a renewal is still
 *   waiting for an answer. At `maxRenewTimes` renewal stops with a warning and the lock counts as
 *   lost when its last lease runs out.
 * - Fixed leases (`expire`) are not renewed, but checked on the same schedule (every `expire / 3`,
 *   batched with the renewals: a key evicted, flushed or deleted under its holder is noticed within
 *   an interval); the lock counts as lost if it is still held when the lease ends.
 * - `verify` checks locks at once, out of their schedule (Redis may have lost them: its connection
 *   came back, its data set changed).
 *
 * A lost lock is handed to `onLost` (which aborts its signal and tells the hooks). The timer is
 * unref'd and its callback never throws.
 */
export class Watchdog {
  private readonly schedule = new DueHeap<HeldLock>();
  private timer: NodeJS.Timeout | undefined;
  private timerAt = Infinity;
  /** The largest lag of a renewal due in the current and the previous window (how late the timer got to it). */
  private lag = { minute: 0, current: 0, previous: 0 };

  constructor(
    private readonly store: LockStore,
    private readonly logger: Logger,
    private readonly onLost: (lock: HeldLock, reason: LockLostReason, detail: string, cause?: unknown) => void,
    /** Runs the timer's setup outside every caller's lock scope (see LockScope.outside). */
    private readonly outside: <T>(fn: () => T) => T,
    private readonly events: LockEvents,
  ) {}

  /**
   * Start watching a freshly acquired lock. Its lease began when the acquisition was sent, not
   * when the answer came: the first renewal is due an interval after the send (at once, when a
   * slow answer took longer than that), and a fixed lease is lost at the send + `expire`.
   */
  start(lock: HeldLock): void {
    if (lock.renewing) this.plan(lock, lock.acquiredAt + this.interval(lock), 'renew');
    else this.planCheck(lock, lock.acquiredAt + this.interval(lock));
  }

  /**
   * Check `locks` now, out of their schedule: Redis may have lost them (`why`). One batch; a lock
   * found gone is lost (`not-owner`); a check that fails changes nothing (the schedule goes on).
   */
  verify(locks: readonly HeldLock[], why: string): void {
    const held = locks.filter((lock) => lock.state === 'held');
    if (held.length === 0) return;
    this.store
      .renew(held.map((lock) => ({ key: lock.key, owner: lock.owner, leaseMs: lock.leaseMs, check: true })))
      .then((outcomes) =>
        held.forEach((lock, i) => {
          if (outcomes[i] === false)
            this.lose(lock, 'not-owner', `${why}, and a check found it gone or held by another owner`);
        }),
      )
      .catch((error: unknown) => this.report(error));
  }

  /** A fixed lease: its next check at `at`, or its end if that comes first. */
  private planCheck(lock: HeldLock, at: number): void {
    if (at < lock.leaseEndsAt) this.plan(lock, at, 'check');
    else this.plan(lock, lock.leaseEndsAt, 'expired');
  }

  /**
   * How far behind the watchdog runs, in ms: the largest lag of a renewal due in the last 15 to 30
   * s, or how overdue its next due work is now (a blocked event loop), whichever is larger.
   */
  lagMs(): number {
    this.rollLag(now());
    const head = this.schedule.peek();
    const overdue = head && (head.due === 'renew' || head.due === 'check') ? Math.max(0, now() - head.dueAt) : 0;
    return Math.max(this.lag.current, this.lag.previous, overdue);
  }

  private rollLag(at: number): void {
    const minute = Math.floor(at / LAG_WINDOW_MS);
    if (minute === this.lag.minute) return;
    this.lag = { minute, current: 0, previous: minute === this.lag.minute + 1 ? this.lag.current : 0 };
  }

  /**
   * Stop watching: released, detached, lost or shut down. Idempotent. The timer stays set even
   * when nothing is left to watch: a lock taken soon after (the next one of a loop) is due later
   * and needs no timer of its own, and a timer that finds nothing due sets none (see `tick`).
   */
  stop(lock: HeldLock): void {
    lock.due = undefined;
    this.schedule.remove(lock);
  }

  /** Shutdown: nothing is watched any more; no timer is left behind. */
  close(): void {
    this.disarm();
  }

  /** Stop watching a lock and report it lost. Does nothing if it is not held. */
  lose(lock: HeldLock, reason: LockLostReason, detail: string, cause?: unknown): void {
    if (lock.state !== 'held') return;
    this.stop(lock);
    this.onLost(lock, reason, detail, cause);
  }

  /** A third of the lease: between renewals, or between the checks of a fixed lease. */
  private interval(lock: HeldLock): number {
    return Math.max(1, Math.floor(lock.leaseMs / 3));
  }

  private plan(lock: HeldLock, at: number, due: WatchdogDue): void {
    lock.due = due;
    this.schedule.schedule(lock, at);
    this.arm();
  }

  /**
   * One timer, set for the earliest due lock; a timer set for earlier than that is left as it is
   * (it finds nothing due, and sets the next). Never one timer per lock.
   */
  private arm(): void {
    const first = this.schedule.peek();
    if (!first) return this.disarm();
    if (this.timer && this.timerAt <= first.dueAt) return;
    clearTimeout(this.timer);
    this.timerAt = first.dueAt;
    const timer = this.outside(() => setTimeout(() => this.tick(), Math.max(0, first.dueAt - now())));
    timer.unref();
    this.timer = timer;
  }

  private disarm(): void {
    clearTimeout(this.timer);
    this.timer = undefined;
    this.timerAt = Infinity;
  }

  private tick(): void {
    this.timer = undefined;
    this.timerAt = Infinity;
    try {
      const at = now();
      const batch: HeldLock[] = [];
      for (let lock = this.schedule.peek(); lock && batch.length < MAX_RENEWALS_PER_TICK; lock = this.schedule.peek()) {
        const periodic = lock.due === 'renew' || lock.due === 'check';
        const early = periodic ? Math.min(BATCH_WINDOW_MS, this.interval(lock) / 4) : 0;
        if (lock.dueAt > at + early) break;
        this.schedule.pop();
        const due = lock.due;
        lock.due = undefined;
        if (lock.state !== 'held') continue;
        if (due === 'renew' || due === 'check') {
          lock.renewDueAt = lock.dueAt;
          this.rollLag(at);
          this.lag.current = Math.max(this.lag.current, at - lock.dueAt);
          batch.push(lock);
        } else if (due) this.leaseEnded(lock, due);
      }
      if (batch.length > 0) {
        this.renew(batch).catch((error: unknown) => this.report(error));
      }
    } catch (error) {
      this.report(error);
    }
    this.arm();
  }

  private report(error: unknown): void {
    this.logger.error(`Lock watchdog failed unexpectedly: ${describeError(error)}`);
  }

  private leaseEnded(lock: HeldLock, due: Exclude<WatchdogDue, 'renew' | 'check'>): void {
    if (due === 'expired') {
      this.lose(lock, due, `its fixed lease of ${lock.options.expire} ms ran out while it was still held`);
    } else if (due === 'max-renewals') {
      this.lose(lock, due, `renewal stopped at maxRenewTimes (${lock.options.maxRenewTimes}) and the lease ran out`);
    } else {
      const why = lock.lastError === undefined ? 'no answer' : describeError(lock.lastError);
      this.lose(lock, due, `its lease ran out before Redis confirmed a renewal (${why})`, lock.lastError);
    }
  }

  private async renew(locks: HeldLock[]): Promise<void> {
    const sentAt = now();
    const sending: HeldLock[] = [];
    for (const lock of locks) {
      if (!lock.renewing) {
        // A fixed lease's check: its end stays where it is, whenever the answer comes.
        this.plan(lock, lock.leaseEndsAt, 'expired');
        sending.push(lock);
        continue;
      }
      if (sentAt >= lock.leaseEndsAt) {
        this.leaseEnded(lock, 'lease-expired');
        continue;
      }
      // The lease keeps running while the renewal is on its way: if it ends first, the lock is
      // lost then, not whenever Redis finally answers (up to operationTimeout later).
      this.plan(lock, lock.leaseEndsAt, 'lease-expired');
      sending.push(lock);
    }
    if (sending.length === 0) return;
    const answered = this.store.renew(
      sending.map((lock) => ({ key: lock.key, owner: lock.owner, leaseMs: lock.leaseMs, check: !lock.renewing })),
    );
    const settled = answered.then(
      () => undefined,
      () => undefined,
    );
    for (const lock of sending) lock.renewal = settled;
    const outcomes = await answered;
    for (const lock of sending) if (lock.renewal === settled) lock.renewal = undefined;
    sending.forEach((lock, i) =>
      lock.renewing ? this.renewed(lock, outcomes[i], sentAt) : this.checked(lock, outcomes[i]),
    );
  }

  /** Apply a fixed lease's check from a batch: gone is lost; otherwise on to the next check. */
  private checked(lock: HeldLock, outcome: boolean | { readonly error: unknown }): void {
    if (lock.state !== 'held') return;
    if (outcome === false) {
      this.lose(lock, 'not-owner', 'a check of its fixed lease found it gone or held by another owner');
      return;
    }
    if (lock.due === 'expired') this.planCheck(lock, now() + this.interval(lock));
  }

  /** Apply one lock's answer from a batch. */
  private renewed(lock: HeldLock, outcome: boolean | { readonly error: unknown }, sentAt: number): void {
    if (lock.state !== 'held') return;
    // Gone is gone, whatever else is on its way (a renewal never re-creates a key).
    if (outcome === false) {
      this.lose(lock, 'not-owner', 'a renewal found it gone or held by another owner');
      return;
    }
    if (lock.due !== 'lease-expired') return; // moved on meanwhile
    if (typeof outcome === 'object') {
      lock.lastError = outcome.error;
      if (this.events.listens('renewal-failed')) {
        this.events.emit('renewal-failed', lock.eventBase, { owner: lock.owner, error: outcome.error });
      }
      this.plan(lock, now() + Math.min(this.interval(lock), lock.leaseEndsAt - now()), 'renew');
      return;
    }
    lock.lastError = undefined;
    lock.leaseEndsAt = lock.validUntil(sentAt);
    if (this.events.listens('renewed')) {
      this.events.emit('renewed', lock.eventBase, { owner: lock.owner, lagMs: Math.max(0, sentAt - lock.renewDueAt) });
    }
    lock.renewals += 1;
    const max = lock.options.maxRenewTimes;
    if (max > 0 && lock.renewals >= max) {
      this.logger.warn(
        `Lock "${lock.name}" reached maxRenewTimes (${max}); renewal stops and the lock expires in ${lock.leaseMs} ms`,
      );
      this.plan(lock, lock.leaseEndsAt, 'max-renewals');
      return;
    }
    this.plan(lock, now() + this.interval(lock), 'renew');
  }
}
