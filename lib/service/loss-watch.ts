import type { HeldLock } from '../core/lock-handle';
import type { LockStore } from '../store/lock-store.interface';

/**
 * How often the store is asked whether Redis lost held locks behind their holders' backs (see
 * `LockStore.suspect`), while any is held: a loss becomes a report within this and a round trip.
 */
export const PROBE_MS = 500;

const CHANGED = "Redis's data set changed (a restart without persistence, or FLUSHALL)";

/**
 * Notices when Redis may have lost the locks this application holds, without any renewal being
 * due: its connection came back after a drop (a restart without persistence), or its data set was
 * replaced (FLUSHALL, a restart between two probes). The locks concerned are checked at once.
 * One store call per `PROBE_MS` while locks are held, none otherwise; its timer never keeps the
 * process alive.
 */
export class LossWatch {
  private timer: NodeJS.Timeout | undefined;
  private probing = false;
  /**
   * `performance.now()` when the latest probe that found the data set changed was sent: a lock
   * whose acquisition was sent before it may have been taken before the change, whenever its
   * answer came, and is checked as it is handed out.
   */
  private changedBefore = -Infinity;
  private readonly stopListening: () => void;

  constructor(
    private readonly store: LockStore,
    /** The locks held now. */
    private readonly held: () => readonly HeldLock[],
    /** Check these locks at once: Redis may have lost them (`why`). */
    private readonly check: (locks: readonly HeldLock[], why: string) => void,
    /** Runs the timer's setup outside every caller's lock scope (see LockScope.outside). */
    private readonly outside: <T>(fn: () => T) => T,
  ) {
    this.stopListening = store.onReconnect(() => {
      const locks = this.held();
      if (locks.length > 0) {
        this.check(locks, 'the connection to Redis came back after a drop (Redis may have restarted without its data)');
      }
    });
  }

  /**
   * A lock is held now: probe while any is (the probe stops by itself once none is, rather than
   * at every release: a loop of lock and release would set and clear a timer per cycle); check it
   * at once if Redis may have lost it already.
   */
  added(lock: HeldLock): void {
    if (lock.acquiredAt < this.changedBefore) this.check([lock], CHANGED);
    if (this.timer) return;
    this.timer = this.outside(() => setInterval(() => this.probe(), PROBE_MS));
    this.timer.unref();
  }

  /** No lock is held any more: stop probing. */
  private idle(): void {
    clearInterval(this.timer);
    this.timer = undefined;
  }

  close(): void {
    this.idle();
    this.stopListening();
  }

  private probe(): void {
    const locks = this.held();
    if (locks.length === 0) return this.idle();
    if (this.probing) return; // the last probe is still on its way (Redis is slow, or away)
    this.probing = true;
    const asked = new Set(locks);
    const sentAt = performance.now();
    this.store
      .suspect([...new Set(locks.map((lock) => lock.key))])
      .then((suspects) => {
        if (suspects.length === 0) return;
        // The keys named, and every lock held since the probe was sent (and, through `added`, every
        // lock handed out later whose acquisition was sent before it): it may have been taken
        // before the change and answered after, and the next probe compares with the marker read now.
        this.changedBefore = Math.max(this.changedBefore, sentAt);
        const named = new Set(suspects);
        this.check(
          this.held().filter((lock) => named.has(lock.key) || !asked.has(lock)),
          CHANGED,
        );
      })
      .catch(() => undefined)
      .finally(() => (this.probing = false));
  }
}
