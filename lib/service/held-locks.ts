import type { Logger } from '@nestjs/common';
import { describeError } from '../errors/describe-error';
import type { Handle, HeldLock, HoldKeeper, LockHandle } from '../core/lock-handle';
import type { LockScope } from '../core/lock-scope';
import { Watchdog } from '../core/watchdog';
import { LockLostError, type LockLostReason, RedisUnavailableError } from '../errors';
import type { LockEvents } from '../events/lock-events';
import type { LockStore, RenewOutcome } from '../store/lock-store.interface';
import type { LossReporter } from './loss-reporter';
import { LossWatch } from './loss-watch';
import { redisFailed } from './redis-failed';
import type { WaitLine } from './wait-line';

const now = (): number => performance.now();

/**
 * How long `lockAtLeastFor` still keeps `lock` taken, in whole ms rounded up (so that the key
 * lasts at least that long after acquisition); 0 when it sets no minimum or the minimum has passed.
 */
function minimumLeft(lock: HeldLock): number {
  const { lockAtLeastFor } = lock.options;
  if (lockAtLeastFor <= 0 || lock.abandoned) return 0;
  return Math.max(0, Math.ceil(lock.lockedAt + lockAtLeastFor - now()));
}

/**
 * The locks a `LockService` holds, from acquisition to release: the holds of each (outermost and
 * reentrant), the watchdog that renews them, releasing, leaving a key to expire, and noticing a
 * loss. What every handle calls back into.
 */
export class HeldLocks implements HoldKeeper {
  /** Locks held now, released at shutdown; an entry lives only while held. */
  private readonly held = new Set<HeldLock>();
  private readonly watchdog: Watchdog;
  private readonly lossWatch: LossWatch;

  constructor(
    private readonly store: LockStore,
    private readonly logger: Logger,
    scope: LockScope,
    private readonly reporter: LossReporter,
    private readonly line: WaitLine,
    private readonly events: LockEvents,
  ) {
    this.watchdog = new Watchdog(
      store,
      logger,
      (lock, reason, detail, cause) => this.markLost(lock, reason, detail, cause),
      (fn) => scope.outside(fn),
      events,
    );
    this.lossWatch = new LossWatch(
      store,
      () => [...this.held],
      (locks, why) => this.watchdog.verify(locks, why),
      (fn) => scope.outside(fn),
    );
  }

  /** Start keeping a lock just taken in Redis: renewed, or watched until its fixed lease ends. */
  add(lock: HeldLock): void {
    this.held.add(lock);
    if (this.events.followsHeld) this.events.heldChanged(1, lock.eventBase);
    this.watchdog.start(lock);
    this.lossWatch.added(lock);
  }

  /** Shutdown: nothing is held any more, nothing to watch. */
  close(): void {
    this.watchdog.close();
    this.lossWatch.close();
  }

  /** How many locks are held now. */
  get count(): number {
    return this.held.size;
  }

  /** How far behind renewal runs, in ms (see `Watchdog.lagMs`). */
  renewalLagMs(): number {
    return this.watchdog.lagMs();
  }

  /** How many holds this application has of `owner`'s lock `key`; undefined when it holds none. */
  holdsOf(key: string, owner: string): number | undefined {
    for (const lock of this.held) if (lock.key === key && lock.owner === owner) return lock.holds;
    return undefined;
  }

  /** Report the locks of `key` held here by any of `owners` lost now (their holds were dropped: forceUnlock). */
  loseOwners(key: string, owners: readonly string[], detail: string): void {
    const dropped = new Set(owners);
    for (const lock of [...this.held]) {
      if (lock.key === key && dropped.has(lock.owner)) this.markLost(lock, 'not-owner', detail);
    }
  }

  /** Report every lock of `key` held here lost now (for tests: see DisLockTesting); how many there were. */
  loseKey(key: string, detail: string): number {
    const locks = [...this.held].filter((lock) => lock.key === key);
    for (const lock of locks) this.markLost(lock, 'not-owner', detail);
    return locks.length;
  }

  /** Report a held lock lost (does nothing if it is not held any more). */
  lose(lock: HeldLock, reason: LockLostReason, detail: string): void {
    this.watchdog.lose(lock, reason, detail);
  }

  /**
   * End one acquisition: release it, or (`release: false`, outermost only) leave the key to
   * expire: renewal goes on while reentrant holds of it still run, then stops. Never rejects: a
   * failure is logged, the lease then ends the lock on its own.
   */
  finish(handle: Handle, release: boolean): Promise<void> {
    if (!release && !handle.reentrant) return this.finishKeeping(handle);
    // Not an async function around the release: every @DisLock call ends here.
    return handle.release().then(
      () => undefined,
      (error: unknown) => {
        // The log says what Redis reported: the error's own message leaves that to its cause.
        const why = error instanceof RedisUnavailableError ? error.cause : error;
        this.logger.warn(
          `Releasing lock "${handle.name}" failed (${describeError(why)}); it is retried while Redis does not answer, and the lock expires within its lease at the latest`,
        );
      },
    );
  }

  /** The outermost hold ends with `ifExpireWhenFinish: false`: the key is left to expire once no reentrant hold runs. */
  private async finishKeeping(handle: Handle): Promise<void> {
    if (!handle.finishKeeping()) return;
    const lock = handle.lock;
    lock.outerDone = true;
    lock.keepKey = true;
    lock.stopAsked = true;
    lock.holds -= 1;
    if (lock.holds === 0 && lock.state === 'held') await this.leaveToExpire(lock);
  }

  /**
   * Give back a hold no code ran under (a part of a multi-lock that could not take every part, an
   * acquisition whose caller had gone when it arrived): released at once, never kept for
   * `lockAtLeastFor`, which is a minimum for work that ran. Never rejects.
   */
  async abandon(handle: Handle): Promise<void> {
    if (!handle.reentrant) handle.lock.abandoned = true;
    await this.finish(handle, true);
  }

  // ---- HoldKeeper (called by handles) --------------------------------------------------------------------------

  async releaseHold(lock: HeldLock, reentrant: boolean): Promise<boolean> {
    if (!reentrant) lock.outerDone = true;
    lock.holds -= 1;
    if (lock.state === 'shut-down') return false; // shutdown already released (or kept) every hold
    if (lock.holds > 0) {
      // Another hold of this owner still runs under the lock: nothing changes in Redis, and the
      // watchdog goes on renewing (or watching the fixed lease) for it.
      this.detachIfAsked(lock);
      return false;
    }
    if (lock.keepKey) {
      // The outermost method ended with `ifExpireWhenFinish: false` and this was the last
      // reentrant hold after it: leave the key to expire, as the outermost asked.
      if (lock.state === 'held') await this.leaveToExpire(lock);
      return false;
    }
    // A lock whose renewal was stopped (`stopRenewal()`) keeps its minimum hold as well.
    const left = lock.state === 'held' || lock.state === 'detached' ? minimumLeft(lock) : 0;
    if (left > 0) {
      await this.holdOn(lock, left);
      return false;
    }
    const wasHeld = lock.state === 'held';
    const wasLost = lock.state === 'lost';
    // A waiter of this process is next: hand the lock over in one step instead (see `HandOver`).
    const handOver = wasHeld ? this.line.handOver(lock) : undefined;
    this.settle(lock, wasHeld ? 'released' : lock.state);
    let result;
    try {
      // Handed over: released by the waiter's attempt. Declined: released as usual. Neither
      // answered: as a release with no answer.
      const outcome = handOver && (await handOver);
      if (typeof outcome === 'object') throw outcome.error;
      // Owner-checked: even for a lock known to be lost this only ever drops this owner's own hold.
      result = outcome === 'handed-over' ? 'released' : await this.store.release(lock.key, lock.owner);
    } catch (error) {
      // It may not have run (or its answer was lost): give the hold back in the background, retried
      // while Redis does not answer, rather than leave the lock taken for the rest of its lease.
      void this.store.giveBack(lock.key, lock.owner, lock.leaseMs);
      if (wasLost) return false; // already reported
      throw redisFailed('release', lock.name, error);
    }
    // The store has woken the local line's head if it is next (the head of the lock's line, or
    // nobody waits there); otherwise the announcement has told the process that is next.
    if (result === 'not-owner' && wasHeld) {
      // Expired or taken over before the watchdog noticed: the work it protected was not protected.
      this.markLost(lock, 'not-owner', 'its release found it gone or held by another owner');
    }
    return result === 'released' && !wasLost ? this.released(lock) : false;
  }

  /** This owner's hold of `lock` is gone by its own release (or hand-over): `true`, and the event. */
  private released(lock: HeldLock): true {
    if (this.events.listens('released')) {
      this.events.emit('released', lock.eventBase, { owner: lock.owner, heldMs: now() - lock.lockedAt });
    }
    return true;
  }

  stopRenewal(lock: HeldLock): void {
    if (lock.state !== 'held') return;
    lock.stopAsked = true;
    this.detachIfAsked(lock);
  }

  async disposeHold(handle: LockHandle): Promise<void> {
    await this.finish(handle as Handle, true);
  }

  // ---- shutdown ----------------------------------------------------------------------------

  /** Give up every held lock: release it (those of `ifExpireWhenFinish: false` are left to expire). */
  async giveUpAll(): Promise<void> {
    const locks = [...this.held];
    await Promise.all(
      locks.map(async (lock) => {
        this.settle(lock, 'shut-down');
        this.reporter.announce(
          lock,
          new LockLostError(lock.name, 'shutdown', `Lock "${lock.name}" given up: the application is shutting down`),
        );
        if (lock.keepOnShutdown) return;
        try {
          const left = minimumLeft(lock);
          // Within its lockAtLeastFor the lock is not given up early, not even at shutdown.
          if (left > 0) {
            const outcome = await this.cutLease(lock, left);
            if (typeof outcome === 'object') throw outcome.error;
          } else {
            await this.store.release(lock.key, lock.owner);
          }
        } catch (error) {
          this.logger.warn(
            `Could not release lock "${lock.name}" at shutdown (${describeError(error)}); it expires on its own`,
          );
        }
      }),
    );
  }

  // ---- internals ---------------------------------------------------------------------------

  /**
   * Renewal was asked to stop: stop it once only the hold that asked is left (a reentrant hold
   * still running keeps it renewed, or watched, until it ends).
   */
  private detachIfAsked(lock: HeldLock): void {
    if (lock.state === 'held' && lock.stopAsked && lock.holds === (lock.outerDone ? 0 : 1)) this.detach(lock);
  }

  /**
   * The last hold ended within `lockAtLeastFor`: stop renewing and set the lease (owner-checked,
   * never re-creating the key) to the `left` ms of that minimum, so that the key expires then
   * instead of being deleted now; a renewal lease longer than that is cut to it. Rejects with
   * `RedisUnavailableError` when Redis cannot be asked (the key then expires within its lease).
   */
  private async holdOn(lock: HeldLock, left: number): Promise<void> {
    this.watchdog.stop(lock); // no renewal may lengthen the lease again
    const outcome = await this.cutLease(lock, left);
    if (outcome === false) {
      this.markLost(lock, 'not-owner', 'setting its lease for lockAtLeastFor found it gone or held by another owner');
      return;
    }
    if (lock.state === 'held') this.detach(lock);
    if (typeof outcome === 'object') throw redisFailed('release', lock.name, outcome.error);
  }

  /**
   * Stop renewing and leave the key to expire (`ifExpireWhenFinish: false`); its lease is only
   * lengthened, never cut, when `lockAtLeastFor` reaches past it (a watchdog lock's lease). A
   * failure is logged: the key then expires within its lease.
   */
  private async leaveToExpire(lock: HeldLock): Promise<void> {
    const left = minimumLeft(lock);
    this.detach(lock);
    if (left === 0 || !lock.renewing) return; // a fixed lease is never shorter than lockAtLeastFor
    const outcome = await this.setLease(lock, left, false);
    if (typeof outcome === 'object') {
      this.logger.warn(
        `Keeping lock "${lock.name}" for its lockAtLeastFor failed (${describeError(outcome.error)}); it expires within its lease`,
      );
    }
  }

  /** One renewal of `lock` outside the watchdog: its lease made `leaseMs`, or at least that unless `exact`. */
  private async setLease(lock: HeldLock, leaseMs: number, exact: boolean): Promise<RenewOutcome> {
    const [outcome] = await this.store.renew([{ key: lock.key, owner: lock.owner, leaseMs, exact }]);
    return outcome;
  }

  /**
   * Cut the lease of a stopped lock to exactly what is left of its `lockAtLeastFor` (`left` ms,
   * counted again if it had to wait). Sent once the watchdog's renewal on its way, if any, has been
   * answered: sent before that, the renewal could still run after it (re-sent by the client after
   * a lost connection, or as EVAL after a NOSCRIPT) and lengthen the cut lease to a full one, with
   * no code under the lock.
   */
  private async cutLease(lock: HeldLock, left: number): Promise<RenewOutcome> {
    if (lock.renewal) {
      await lock.renewal;
      left = Math.max(1, minimumLeft(lock));
    }
    return this.setLease(lock, left, true);
  }

  /** Stop renewing and leave the key to expire. */
  private detach(lock: HeldLock): void {
    this.settle(lock, 'detached');
    // A local waiter may be sleeping on this holder's release; it will now come at expiry, or
    // never: let the head ask Redis for the real remaining lease.
    this.line.wake(lock.key);
  }

  /**
   * A held lock is no longer safe to rely on. Called by the watchdog (renewal answered "not owner",
   * lease ran out) and by a release that found the lock gone; a lock already lost, given up at
   * shutdown or detached is left alone, so each loss is reported once.
   */
  private markLost(lock: HeldLock, reason: LockLostReason, detail: string, cause?: unknown): void {
    if (lock.state === 'lost' || lock.state === 'shut-down' || lock.state === 'detached') return;
    this.settle(lock, 'lost');
    this.line.wake(lock.key); // no release will announce it: let the next local waiter look
    const message = `Lock "${lock.name}" lost: ${detail}`;
    this.reporter.announce(
      lock,
      new LockLostError(lock.name, reason, message, cause === undefined ? undefined : { cause }),
    );
  }

  /** Leave the `held` state: stop the watchdog and forget the lock. */
  private settle(lock: HeldLock, state: HeldLock['state']): void {
    this.watchdog.stop(lock);
    if (this.held.delete(lock) && this.events.followsHeld) this.events.heldChanged(-1, lock.eventBase);
    lock.state = state;
  }
}
