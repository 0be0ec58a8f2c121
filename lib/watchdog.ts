import type { Logger } from '@nestjs/common';
import type { LockLostReason } from './errors';
import type { HeldLock } from './lock-handle';
import type { LockStore } from './store/lock-store.interface';

const now = (): number => performance.now();

const describe = (error: unknown): string => (error instanceof Error ? error.message : String(error));

/**
 * Keeps held locks alive and notices when they are not any more.
 *
 * - Renewing locks (no fixed `expire`) are renewed every `lockWatchdogTimeout / 3` with an
 *   owner-checked script that never re-creates a key. "Not owner" means the lock is lost. A renewal
 *   that fails is retried on the next tick (or at the end of the lease, whichever comes first);
 *   once the lease is past, the lock is lost. At `maxRenewTimes` renewal stops with a warning and
 *   the lock counts as lost when its last lease runs out.
 * - Fixed leases (`expire`) are not renewed; the lock counts as lost if it is still held when the
 *   lease ends.
 *
 * A lost lock is handed to `onLost` (which aborts its signal and tells the hooks). Timers are
 * unref'd and their callbacks never throw.
 */
export class Watchdog {
  constructor(
    private readonly store: LockStore,
    private readonly logger: Logger,
    private readonly onLost: (lock: HeldLock, reason: LockLostReason, detail: string, cause?: unknown) => void,
  ) {}

  /** Start watching a freshly acquired lock. */
  start(lock: HeldLock): void {
    if (lock.renewing) this.schedule(lock, this.interval(lock), () => this.renew(lock));
    else this.scheduleLeaseEnd(lock, 'expired');
  }

  /** Stop watching: released, detached or shut down. Idempotent. */
  stop(lock: HeldLock): void {
    clearTimeout(lock.timer);
    lock.timer = undefined;
  }

  /** Stop watching a lock and report it lost. Does nothing if it is not held. */
  lose(lock: HeldLock, reason: LockLostReason, detail: string, cause?: unknown): void {
    if (lock.state !== 'held') return;
    this.stop(lock);
    this.onLost(lock, reason, detail, cause);
  }

  private leaseRanOut(lock: HeldLock): void {
    const why = lock.lastError === undefined ? 'no answer' : describe(lock.lastError);
    this.lose(lock, 'lease-expired', `its lease ran out before Redis confirmed a renewal (${why})`, lock.lastError);
  }

  private interval(lock: HeldLock): number {
    return Math.max(1, Math.floor(lock.options.lockWatchdogTimeout / 3));
  }

  private schedule(lock: HeldLock, delayMs: number, task: () => Promise<void> | void): void {
    clearTimeout(lock.timer);
    lock.timer = setTimeout(
      () => {
        lock.timer = undefined;
        try {
          void Promise.resolve(task()).catch((error: unknown) => this.report(lock, error));
        } catch (error) {
          this.report(lock, error);
        }
      },
      Math.max(0, delayMs),
    );
    lock.timer.unref();
  }

  private report(lock: HeldLock, error: unknown): void {
    this.logger.error(`Watchdog of lock "${lock.name}" failed unexpectedly: ${String(error)}`);
  }

  private scheduleLeaseEnd(lock: HeldLock, reason: 'expired' | 'max-renewals'): void {
    this.schedule(lock, lock.leaseEndsAt - now(), () => {
      if (reason === 'expired') {
        this.lose(lock, reason, `its fixed lease of ${lock.options.expire} ms ran out while it was still held`);
      } else {
        this.lose(
          lock,
          reason,
          `renewal stopped at maxRenewTimes (${lock.options.maxRenewTimes}) and the lease ran out`,
        );
      }
    });
  }

  private async renew(lock: HeldLock): Promise<void> {
    if (lock.state !== 'held') return;
    const sentAt = now();
    if (sentAt >= lock.leaseEndsAt) {
      this.leaseRanOut(lock);
      return;
    }
    // The lease keeps running while the renewal is on its way: if it ends first, the lock is lost
    // then, not whenever Redis finally answers (up to operationTimeout later).
    this.schedule(lock, lock.leaseEndsAt - sentAt, () => this.leaseRanOut(lock));
    let renewed: boolean;
    try {
      renewed = await this.store.renew(lock.key, lock.owner, lock.leaseMs);
    } catch (error) {
      if (lock.state !== 'held') return;
      lock.lastError = error;
      this.schedule(lock, Math.min(this.interval(lock), lock.leaseEndsAt - now()), () => this.renew(lock));
      return;
    }
    if (lock.state !== 'held') return; // released or detached while the renewal was on its way
    if (!renewed) {
      this.lose(lock, 'not-owner', 'a renewal found it gone or held by another owner');
      return;
    }
    lock.lastError = undefined;
    lock.leaseEndsAt = sentAt + lock.leaseMs;
    lock.renewals += 1;
    const max = lock.options.maxRenewTimes;
    if (max > 0 && lock.renewals >= max) {
      this.logger.warn(
        `Lock "${lock.name}" reached maxRenewTimes (${max}); renewal stops and the lock expires in ${lock.leaseMs} ms`,
      );
      this.scheduleLeaseEnd(lock, 'max-renewals');
      return;
    }
    this.schedule(lock, this.interval(lock), () => this.renew(lock));
  }
}
