import type { LinePlace, ReleaseWatch } from '../store/lock-store.interface';

/** This process's waiting line for one lock as it stands in the store's line (see `LinePlace`). */
export interface LineSeat extends LinePlace {
  /** When the line's last attempt that did not take the lock was sent. */
  missedAt: number;
}

/** One waiter's place in a `WaitQueue`. */
export interface WaitTicket {
  /** Resolves when this waiter is at the head of the line. */
  readonly turn: Promise<void>;
}

interface Ticket extends WaitTicket {
  start(): void;
}

function ticket(): Ticket {
  let start!: () => void;
  const turn = new Promise<void>((resolve) => (start = resolve));
  return { turn, start };
}

/**
 * The local waiters of one lock key, first come first served. Only the head tries the lock; the
 * others wait for their turn, so a release wakes one attempt from this process, not a herd, and a
 * newcomer cannot jump the line. The queue shares one release watch (pub/sub subscription) and
 * exists only while someone waits, so there is never more than one per key being waited for.
 */
export class WaitQueue {
  private readonly line: Ticket[] = [];
  /**
   * Set when the head left holding the lock: the next head then waits for a release before its
   * first attempt instead of asking Redis what it already knows. `heldLease` bounds that wait.
   */
  heldLocally = false;
  heldLease = 0;

  constructor(
    /** This line's place in the store's line of waiters for the key (shared by its waiters, one at a time). */
    readonly place: LineSeat,
    /** Subscribed before the first waiter's retry, so that no release in between is missed. */
    readonly watch: Promise<ReleaseWatch>,
  ) {}

  get empty(): boolean {
    return this.line.length === 0;
  }

  join(): WaitTicket {
    const entry = ticket();
    this.line.push(entry);
    if (this.line.length === 1) entry.start();
    return entry;
  }

  /** Leave the line (at the head or anywhere in it); the next waiter's turn comes if the head left. */
  leave(entry: WaitTicket): void {
    const index = this.line.indexOf(entry as Ticket);
    if (index === -1) return;
    this.line.splice(index, 1);
    if (index === 0) this.line[0]?.start();
  }

  /** A release seen locally: wake the head at once, or after `delayMs`. */
  wake(delayMs = 0): void {
    if (delayMs <= 0) {
      void this.watch.then((watch) => watch.wake());
      return;
    }
    setTimeout(() => this.wake(), delayMs).unref();
  }
}
