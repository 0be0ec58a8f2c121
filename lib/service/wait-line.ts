import { randomBytes } from 'node:crypto';
import { Handle, type HeldLock } from '../core/lock-handle';
import type { LockScope } from '../core/lock-scope';
import { wakeOrTimeout } from '../core/wake-or-timeout';
import { type ResolvedLockOptions, shareOf } from '../options/dislock.options';
import type { LockStore, ReleaseWatch } from '../store/lock-store.interface';
import type { ShutdownGate } from './shutdown-gate';
import { type HandOver, type HandOverOutcome, type LineSeat, WaitQueue } from './wait-queue';

const now = (): number => performance.now();

/**
 * How long the head of a line waits for its key's subscription before its first attempt. A waiter
 * never waits for it past its own deadline: a subscriber connection that cannot be made (its node
 * is gone, Redis is slow) turns the wait into polling, not into a wait of `operationTimeout`.
 */
const SUBSCRIBE_GRACE_MS = 100;

/**
 * How long a finished holder's offer of a hand-over waits for the head of the local line to take
 * it to its next attempt (the head is asleep, waiting for this very release: one wake-up away),
 * before the holder releases the lock as usual.
 */
const HAND_OVER_WAIT_MS = 20;

/** The most hand-overs in a row one process makes (see `HeldLock.handOversLeft`). */
const MAX_HAND_OVERS = 64;

/** Poll back-off while the release channel is not heard: 5, 10, 20, 40, 80, then 100 ms, each +-50 %. */
function backoff(attempt: number): number {
  return Math.min(100, 5 * 2 ** Math.min(attempt, 8)) * (0.5 + Math.random());
}

/** What the line asks to take the lock when a waiter's turn comes. */
export interface Attempter {
  /**
   * One fresh attempt: the handle, or the holder's remaining lease in ms when the lock is busy.
   * With the line's `seat`, it keeps the line's place in the store's line, or takes up a grant to it.
   * An attempt the store cannot run yet (a Cluster slot migrating) is sent again until `until`.
   */
  attempt(
    name: string,
    key: string,
    options: ResolvedLockOptions,
    keepOnShutdown: boolean,
    seat?: LineSeat,
    until?: number,
    /** A finished holder's offer: the attempt takes its hold over in one step, and settles it. */
    handOver?: HandOver,
  ): Promise<Handle | number>;
}

/**
 * Waiting for a busy lock, across calls: one local first-come-first-served line per key (see
 * `WaitQueue`), whose head sleeps until a release is heard or the holder's lease ends, and which
 * holds one place in the store's line of waiters for the key (fairness across processes).
 */
export class WaitLine {
  /** Waits in progress, one controller each: shutdown ends them. */
  private readonly waits = new Set<AbortController>();
  /** The local waiters of each key someone here is waiting for; an entry lives while it has waiters. */
  private readonly queues = new Map<string, WaitQueue>();
  /** Leaves of the store's line still on their way, by key; an entry lives until they are answered. */
  private readonly leaves = new Map<string, Promise<void>>();

  constructor(
    private readonly store: LockStore,
    private readonly scope: LockScope,
    private readonly gate: ShutdownGate,
  ) {}

  /** Whether someone here waits for `key`. */
  hasWaiters(key: string): boolean {
    return this.queues.has(key);
  }

  /**
   * `lock` (exclusive or a semaphore's permit, held, its code finished) is about to be released:
   * hand it over instead to the head of this process's line for its key, if one waits and the
   * lock's turn here is not over. Resolves with how that went (`declined`: release it as usual);
   * undefined when there is nobody to offer it to. A reader's hold is never offered: a reader that
   * waits here waits for a writer, and passing it a hold would let it overtake that writer.
   */
  handOver(lock: HeldLock): Promise<HandOverOutcome> | undefined {
    const share = shareOf(lock.options);
    if (lock.handOversLeft <= 0 || !this.store.handsOver || share === 0 || this.gate.closing) return undefined;
    const queue = this.queues.get(lock.key);
    // The head must have time to take it while the lease surely runs (no renewal runs meanwhile).
    if (!queue || lock.leaseEndsAt - now() <= 4 * HAND_OVER_WAIT_MS) return undefined;
    return new Promise((settle) => {
      const offered = queue.offer(
        { from: lock.owner, share, handOversLeft: lock.handOversLeft - 1, settle },
        HAND_OVER_WAIT_MS,
      );
      if (!offered) settle('declined');
    });
  }

  /** No release will announce that `key` became free (or will be): let the head of its line look. */
  wake(key: string): void {
    this.queues.get(key)?.wake();
  }

  /** Shutdown: end every wait in progress. */
  stopWaits(): void {
    for (const wait of this.waits) wait.abort();
  }

  /**
   * Wait for the lock behind the local waiters that came first. Only the head of the line tries
   * (through `taker`); between tries it sleeps until a release is announced (pub/sub, or this
   * process's own release), the holder's lease runs out, `waitTime` ends, or the wait is cancelled
   * or shut down.
   */
  async wait(
    taker: Attempter,
    name: string,
    key: string,
    options: ResolvedLockOptions,
    keepOnShutdown: boolean,
    deadline: number,
    cancel: AbortSignal | undefined,
    /** The place the caller's first attempt took in the store's line, if it took one. */
    placed?: { readonly place: LineSeat; readonly ttl: number },
  ): Promise<Handle | null> {
    const share = shareOf(options);
    let queue = this.queues.get(key);
    if (!queue) {
      const place = placed?.place ?? this.newSeat(share !== undefined);
      // Outside the caller's lock scope: the subscriber connection this may open outlives the call.
      queue = new WaitQueue(
        place,
        this.scope.outside(() => this.store.watch(key, place, place.missedAt)),
      );
      this.queues.set(key, queue);
    } else if (placed) {
      // Another caller here started waiting meanwhile: this line's place serves both.
      this.leave(key, placed.place.id);
      placed = undefined;
    }
    let holding = false;
    const stop = new AbortController();
    const abort = (): void => stop.abort();
    cancel?.addEventListener('abort', abort, { once: true });
    this.waits.add(stop);
    const place = queue.join();
    try {
      const wait = deadline - now();
      const myTurn = wait > 0 && (await wakeOrTimeout(wait, stop.signal, (wake) => void place.turn.then(wake)));
      this.gate.assertOpen(name);
      if (!myTurn) return null;
      let watch = await this.watchWithin(queue, Math.min(deadline - now(), SUBSCRIBE_GRACE_MS), stop.signal);
      // The previous head left holding the lock: wait for its release before asking Redis (the
      // line has no place in Redis then, so that release wakes it whoever is next there).
      // A caller whose first attempt took the line's place still tries once more, now that it
      // listens: a release between that attempt and the subscription was not heard. Unless the
      // key's releases were heard since before that attempt (the store kept listening after an
      // earlier wait): a release since then has woken this watch already.
      let ttl = queue.heldLocally ? queue.heldLease : -1;
      let tryNow = !queue.heldLocally;
      if (placed && watch?.listening && watch.listeningSince <= placed.place.missedAt) {
        ttl = placed.ttl;
        tryNow = false;
      }
      queue.heldLocally = false;
      const seat = queue.place;
      const holdingNow = (handle: Handle, handOver: HandOver | undefined): Handle => {
        // A shared hold leaves room for the next local waiter: it tries at once.
        queue.heldLocally = !handle.lock.shared;
        queue.heldLease = handle.lock.leaseMs;
        // This process's turn with the lock: the waiters behind it now, or what is left of the
        // turn it was handed over in.
        handle.lock.handOversLeft = handOver ? handOver.handOversLeft : Math.min(MAX_HAND_OVERS, queue.size - 1);
        holding = true;
        return handle;
      };
      for (let attempt = 0; ; attempt += 1) {
        this.gate.assertOpen(name); // shutdown may have ended the wait while it was subscribing
        if (stop.signal.aborted) return null;
        // A release that handed the lock to this line (a grant to its place, the head of the
        // store's line) wakes it as any release does: this attempt takes the grant up, and the
        // hold starts on its reply, with the caller's own lease.
        if (tryNow) {
          // A holder here that finished meanwhile may have offered its hold, if of the kind asked for.
          let handOver = queue.take();
          if (handOver && handOver.share !== share) {
            handOver.settle('declined');
            handOver = undefined;
          }
          const result = await taker.attempt(name, key, options, keepOnShutdown, seat, deadline, handOver);
          // A fresh attempt that did not take the lock holds (or renewed) a place in the line.
          seat.inLine = !(result instanceof Handle);
          if (result instanceof Handle) return holdingNow(result, handOver);
          ttl = result;
        }
        tryNow = true;
        const remaining = deadline - now();
        if (remaining <= 0) return null;
        // Listening: sleep until a release is heard, or the holder's lease ends. Not listening
        // (the subscription failed): poll with a short back-off, never past the lease either.
        // PTTL 0 is a lease with under a millisecond left (retry right after it), -1 a key with no
        // expiry at all (only a release can free it), -2 a key already gone (retry at once).
        // -3: free, but others are ahead in the line (their release announcement names the head;
        // a store that knows how long the head's turn lasts says so instead of -3).
        // A place in the line lapses unless renewed by an attempt every lineRefreshMs.
        const lease = Math.min(ttl === -1 || ttl === -3 ? Infinity : Math.max(0, ttl) + 1, this.store.lineRefreshMs);
        if (!watch) {
          // Still subscribing (a slow or unreachable subscriber connection): poll meanwhile, and
          // once it listens, try again at once, since a release before that was not heard.
          watch = await this.watchWithin(queue, Math.min(remaining, lease, backoff(attempt)), stop.signal);
          this.gate.assertOpen(name);
          continue;
        }
        const sleep = watch.listening ? lease : Math.min(lease, backoff(attempt));
        await watch.wait(Math.min(remaining, sleep), stop.signal);
        this.gate.assertOpen(name);
      }
    } finally {
      this.waits.delete(stop);
      cancel?.removeEventListener('abort', abort);
      queue.leave(place);
      if (queue.empty && this.queues.get(key) === queue) {
        this.queues.delete(key);
        // Outside the caller's lock scope: a channel kept subscribed a while keeps a timer.
        void queue.watch.then((watch) => this.scope.outside(() => watch.close()));
        // The last waiter here gives up: give up the line's place too, so that the next waiter
        // elsewhere need not wait for it to lapse.
        if (!holding && queue.place.inLine) this.leave(key, queue.place.id);
      }
    }
  }

  /** The key's watch once subscribed, or `undefined` when that takes longer than `maxMs` or the wait stops. */
  private async watchWithin(queue: WaitQueue, maxMs: number, signal: AbortSignal): Promise<ReleaseWatch | undefined> {
    let watch: ReleaseWatch | undefined;
    await wakeOrTimeout(Math.max(1, maxMs), signal, (wake) => {
      void queue.watch.then((subscribed) => {
        watch = subscribed;
        wake();
      });
    });
    return watch;
  }

  /**
   * A fresh place for a line in the store's line of waiters (not taken yet). A line that begins
   * with a shared waiter (a reader, a permit) has an id starting with 's': the store never grants
   * it an exclusive hold, it names it in the announcement instead, to look at once (see GRANT_LUA).
   */
  newSeat(shared = false): LineSeat {
    const id = randomBytes(12).toString('hex');
    return { id: shared ? `s${id}` : id, inLine: false, missedAt: -Infinity };
  }

  /**
   * Give up a place in the store's line (at most a lapsed place if it fails: it expires by itself).
   * Until Redis has answered, `leaving(key)` hands it to the next attempt on the key.
   */
  leave(key: string, id: string): void {
    const left = this.scope.outside(() => this.store.leave(key, id).catch(() => undefined));
    const previous = this.leaves.get(key);
    const settled = previous ? Promise.all([previous, left]).then(() => undefined) : left;
    this.leaves.set(key, settled);
    void settled.then(() => {
      if (this.leaves.get(key) === settled) this.leaves.delete(key);
    });
  }

  /**
   * The leaves of `key`'s line still on their way, if any. An attempt waits for them: sent behind
   * a leave on the same connection it may still run first (a script the server has not loaded is
   * answered NOSCRIPT and sent again), find the place that left still heading the line, and be
   * refused a free lock.
   */
  leaving(key: string): Promise<void> | undefined {
    return this.leaves.get(key);
  }
}
