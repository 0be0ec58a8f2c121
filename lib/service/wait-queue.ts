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

/** How a holder's offer to hand its lock over ended (see `HandOver`). */
export type HandOverOutcome =
  /** The head's attempt replaced the holder's hold with its own: the holder has nothing to release. */
  | 'handed-over'
  /** Not taken (no head came for it in time, the head asks for another kind of hold, or the store did not hand over): release as usual. */
  | 'declined'
  /** The head's attempt failed with no answer: whether the hold went over cannot be known. */
  | { readonly error: unknown };

/**
 * A holder here that has finished offers its hold (exclusive, or a semaphore's permit) to the head
 * of this process's line for the key, to be taken over in one step (see `AcquireOptions.from`)
 * rather than released and taken again: one round trip instead of two, with no other process
 * woken. Settled once.
 */
export interface HandOver {
  /** The finished holder's owner id. */
  readonly from: string;
  /** The kind of hold offered, as `shareOf` gives it: only a head that asks for the same takes it. */
  readonly share: number | undefined;
  /** How many more times the lock may be handed over here after this one, before it is released. */
  readonly handOversLeft: number;
  settle(outcome: HandOverOutcome): void;
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
  /** A finished holder's offer, until the head takes it to its next attempt (see `HandOver`). */
  private offered: { readonly handOver: HandOver; readonly timer: NodeJS.Timeout } | undefined;

  constructor(
    /** This line's place in the store's line of waiters for the key (shared by its waiters, one at a time). */
    readonly place: LineSeat,
    /** Subscribed before the first waiter's retry, so that no release in between is missed. */
    readonly watch: Promise<ReleaseWatch>,
  ) {}

  get empty(): boolean {
    return this.line.length === 0;
  }

  /** How many wait here, the head included. */
  get size(): number {
    return this.line.length;
  }

  /**
   * Offer the head a hand-over and wake it; declined unless its next attempt takes it within
   * `withinMs`. False (nothing offered) while another offer is pending.
   */
  offer(handOver: HandOver, withinMs: number): boolean {
    if (this.offered || this.line.length === 0) return false;
    const timer = setTimeout(() => this.decline(), withinMs);
    timer.unref();
    this.offered = { handOver, timer };
    this.wake();
    return true;
  }

  /** The pending offer, for the head's attempt about to be sent (it settles it); undefined if none. */
  take(): HandOver | undefined {
    const offered = this.offered;
    if (!offered) return undefined;
    clearTimeout(offered.timer);
    this.offered = undefined;
    return offered.handOver;
  }

  /** The pending offer, if any, is declined: its holder releases the lock as usual. */
  decline(): void {
    this.take()?.settle('declined');
  }

  join(): WaitTicket {
    const entry = ticket();
    this.line.push(entry);
    if (this.line.length === 1) entry.start();
    return entry;
  }

  /**
   * Leave the line (at the head or anywhere in it); the next waiter's turn comes if the head left.
   * An offer made to a head that leaves (it gave up, or its attempt already on its way took a
   * permit) passes to the next head, whose first attempt takes it (the offer's wake-up is still
   * pending on the line's watch); with nobody left, it is declined at once.
   */
  leave(entry: WaitTicket): void {
    const index = this.line.indexOf(entry as Ticket);
    if (index === -1) return;
    this.line.splice(index, 1);
    if (index !== 0) return;
    const next = this.line[0];
    if (next) next.start();
    else this.decline();
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
