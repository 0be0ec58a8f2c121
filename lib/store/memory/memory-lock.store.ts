import { Wakeable } from '../../core/wake-or-timeout';
import type {
  AcquireOptions,
  AcquireResult,
  CheckResult,
  LinePlace,
  LockStore,
  ReleaseResult,
  ReleaseWatch,
  RenewOutcome,
  RenewRequest,
  StoreHealth,
  StoredHold,
  StoredLock,
} from '../lock-store.interface';
// The same names as the Redis store refuses, so that a name a test accepts also works in production.
import { FENCE_MARKER, LINE_MARKER } from '../redis/fence-key';

/** How long a waiter's place in a line lasts without another attempt: as on Redis. */
const PLACE_MS = 3_000;

/** Every clock read goes through here: `performance.now()`, which Jest's and Vitest's fake timers move. */
const now = (): number => performance.now();

/** One hold of a lock: exclusive (a plain lock, a writer) or shared (a reader, a permit), until `endsAt`. */
interface Hold {
  readonly exclusive: boolean;
  endsAt: number;
  /** What the acquisition recorded, for `inspect`. */
  readonly recorded?: StoredHold['recorded'];
}

/** A waiter's place in a lock's line. */
interface Place {
  readonly id: string;
  deadline: number;
}

/** What the store keeps for one lock name while anyone holds it, waits for it or watches it. */
interface Entry {
  readonly holds: Map<string, Hold>;
  /** Waiters in arrival order. */
  readonly line: Place[];
  readonly watches: Set<MemoryWatch>;
  /** Attempts still to refuse as busy (`MemoryLockStore.refuseNext`). */
  refusals: number;
}

class MemoryWatch extends Wakeable implements ReleaseWatch {
  readonly listening = true;
  readonly listeningSince = now();

  constructor(private readonly onClose: (watch: MemoryWatch) => void) {
    super();
  }

  close(): void {
    this.wakeWaiting();
    this.onClose(this);
  }
}

/**
 * A real lock store inside the process, for an application's own tests: no Redis needed. It keeps
 * the Redis store's semantics (see `LockStore`): leases that end, owner-checked renewal and
 * release, exclusive and shared holds (readers, permits) each with its own lease, fencing tokens
 * that only grow, a line of waiters per name served in arrival order, and wake-ups on release. Its
 * clock is `performance.now()` and its timers are `setTimeout`, so Jest's and Vitest's fake timers
 * move every lease, renewal and wait.
 *
 * Every application given the same instance shares its locks, as processes sharing one Redis do:
 * `new MemoryLockStore()` passed to several test apps stands for several instances of a service.
 * What it cannot show: network faults, and timing across real processes.
 *
 * Memory is bounded by the names held, waited for or watched: an entry goes with its last hold,
 * place and watch.
 */
export class MemoryLockStore implements LockStore {
  readonly lineRefreshMs = Math.floor(PLACE_MS / 3);
  readonly reservedPrefixes = [FENCE_MARKER, LINE_MARKER];
  readonly boundsShares = true;
  readonly handsOver = true;
  private readonly entries = new Map<string, Entry>();
  private lastToken = 0;

  // ---- for tests (see DisLockTesting) ---------------------------------------------------------

  /**
   * Make `key` held by an owner of its own for `ms` (default: until `free`), exclusively: every
   * acquisition of it is busy meanwhile. Returns that owner id.
   */
  occupy(key: string, ms = Infinity): string {
    const entry = this.entry(key);
    const owner = `dislock-testing:${(this.lastToken += 1)}`;
    entry.holds.set(owner, { exclusive: true, endsAt: now() + ms });
    return owner;
  }

  /** Refuse the next `times` acquisition attempts of `key` as busy, whoever holds it. */
  refuseNext(key: string, times = 1): void {
    this.entry(key).refusals += times;
  }

  /** Drop every hold of `key` (and its pending refusals); waiters are woken. The names of the owners dropped. */
  free(key: string): string[] {
    const entry = this.entries.get(key);
    if (!entry) return [];
    const owners = [...entry.holds.keys()];
    entry.holds.clear();
    entry.refusals = 0;
    this.announce(entry);
    this.tidy(key, entry);
    return owners;
  }

  /** The owners holding `key` now, with what is left of each lease in ms. */
  holders(key: string): { owner: string; exclusive: boolean; ttl: number }[] {
    const entry = this.entries.get(key);
    if (!entry) return [];
    const at = now();
    this.prune(entry, at);
    return [...entry.holds].map(([owner, hold]) => ({ owner, exclusive: hold.exclusive, ttl: hold.endsAt - at }));
  }

  // ---- LockStore ------------------------------------------------------------------------------

  private acquireNow(key: string, owner: string, leaseMs: number, options: AcquireOptions): AcquireResult {
    const { waiter, share } = options;
    const at = now();
    const entry = this.entry(key);
    this.prune(entry, at);
    const busy = (ttl: number, turnMs?: number): AcquireResult => {
      if (waiter) this.takePlace(entry, waiter, at);
      this.tidy(key, entry);
      return turnMs === undefined ? { acquired: false, ttl } : { acquired: false, ttl, turnMs };
    };
    if (entry.refusals > 0) {
      entry.refusals -= 1;
      return busy(this.remaining(entry, at));
    }
    const { from } = options;
    if (from !== undefined && this.passes(entry, from, share)) {
      // A local hand-over: the holder's hold becomes the new owner's in one step (never free between).
      entry.holds.delete(from);
      const index = waiter ? entry.line.findIndex((place) => place.id === waiter) : -1;
      if (index !== -1) entry.line.splice(index, 1);
      const handed = this.hold(entry, owner, leaseMs, options, at);
      // Its place left the line with a permit still free: the next in line looks, as on Redis.
      if (index !== -1 && share !== undefined && entry.line.length > 0 && (share === 0 || entry.holds.size < share)) {
        this.announce(entry);
      }
      return { ...handed, handedOver: true };
    }
    const holds = [...entry.holds.values()];
    const exclusive = holds.find((hold) => hold.exclusive);
    if (share === undefined ? holds.length > 0 : exclusive !== undefined) return busy(this.remaining(entry, at));
    if (share !== undefined && share > 0 && holds.length >= share) {
      return busy(Math.min(...holds.map((hold) => hold.endsAt)) - at);
    }
    const head = entry.line[0];
    // Free for the head of the line only; the head looks by itself (a release woke it, or its own
    // wait for the lease it was refused with ends now).
    if (head && head.id !== waiter) return busy(-3, head.deadline - at);
    if (head) entry.line.shift();
    const taken = this.hold(entry, owner, leaseMs, options, at);
    // Room left for the next in line (shared holds): let it look.
    if (share !== undefined && entry.line.length > 0 && (share === 0 || holds.length + 1 < share)) {
      this.announce(entry);
    }
    return from === undefined ? taken : { ...taken, handedOver: false };
  }

  /**
   * Whether `from` holds a hold of the kind asked for (`share`, see `AcquireOptions`) that can pass
   * to a new owner: an exclusive one always, a shared one while the other shared holds leave room
   * under `share`. Expects the lapsed holds pruned.
   */
  private passes(entry: Entry, from: string, share: number | undefined): boolean {
    const passing = entry.holds.get(from);
    if (!passing || passing.exclusive !== (share === undefined)) return false;
    return share === undefined || share === 0 || entry.holds.size - 1 < share;
  }

  /** Write `owner`'s hold with a new fencing token. */
  private hold(
    entry: Entry,
    owner: string,
    leaseMs: number,
    options: AcquireOptions,
    at: number,
  ): { acquired: true; token: number } {
    const token = (this.lastToken += 1);
    const recorded = options.describe
      ? { since: Date.now(), fencingToken: token, description: options.describe }
      : undefined;
    entry.holds.set(owner, { exclusive: options.share === undefined, endsAt: at + leaseMs, recorded });
    return { acquired: true, token };
  }

  private leaveNow(key: string, waiter: string): void {
    const entry = this.entries.get(key);
    if (!entry) return;
    const index = entry.line.findIndex((place) => place.id === waiter);
    if (index !== -1) entry.line.splice(index, 1);
    this.prune(entry, now());
    // The head left: the next one looks (as on Redis, where the leave names it), whether the lock
    // is free or shared holds leave room for it.
    if (index === 0) this.announce(entry);
    this.tidy(key, entry);
  }

  private checkNow(key: string, owner: string): CheckResult {
    const entry = this.entries.get(key);
    if (!entry) return { held: false, ttl: -2 };
    const at = now();
    this.prune(entry, at);
    const hold = entry.holds.get(owner);
    return hold ? { held: true, ttl: hold.endsAt - at } : { held: false, ttl: this.remaining(entry, at) };
  }

  private renewNow(requests: readonly RenewRequest[]): RenewOutcome[] {
    const at = now();
    return requests.map(({ key, owner, leaseMs, exact, check }) => {
      const entry = this.entries.get(key);
      if (!entry) return false;
      this.prune(entry, at);
      const hold = entry.holds.get(owner);
      if (!hold) return false;
      if (!check) hold.endsAt = exact ? at + leaseMs : Math.max(hold.endsAt, at + leaseMs);
      return true;
    });
  }

  private releaseNow(key: string, owner: string): ReleaseResult {
    const entry = this.entries.get(key);
    if (!entry) return 'not-owner';
    this.prune(entry, now());
    if (!entry.holds.delete(owner)) return 'not-owner';
    this.announce(entry);
    this.tidy(key, entry);
    return 'released';
  }

  private watchNow(key: string): ReleaseWatch {
    const entry = this.entry(key);
    const watch = new MemoryWatch((closing) => {
      entry.watches.delete(closing);
      this.tidy(key, entry);
    });
    entry.watches.add(watch);
    return watch;
  }

  acquire(key: string, owner: string, leaseMs: number, options: AcquireOptions = {}): Promise<AcquireResult> {
    return Promise.resolve(this.acquireNow(key, owner, leaseMs, options));
  }

  inspect(key: string): Promise<StoredLock> {
    const entry = this.entries.get(key);
    if (!entry) return Promise.resolve({ held: false, holds: [], waiting: 0 });
    const at = now();
    this.prune(entry, at);
    const holds = [...entry.holds].map(([owner, hold]) => this.stored(owner, hold, at));
    return Promise.resolve({ held: holds.length > 0, holds, waiting: entry.line.length });
  }

  forceUnlock(key: string): Promise<StoredHold[]> {
    const entry = this.entries.get(key);
    if (!entry) return Promise.resolve([]);
    const at = now();
    this.prune(entry, at);
    const removed = [...entry.holds].map(([owner, hold]) => this.stored(owner, hold, at));
    this.free(key);
    return Promise.resolve(removed);
  }

  leave(key: string, waiter: string): Promise<void> {
    return Promise.resolve(this.leaveNow(key, waiter));
  }

  check(key: string, owner: string): Promise<CheckResult> {
    return Promise.resolve(this.checkNow(key, owner));
  }

  renew(requests: readonly RenewRequest[]): Promise<RenewOutcome[]> {
    return Promise.resolve(this.renewNow(requests));
  }

  release(key: string, owner: string): Promise<ReleaseResult> {
    return Promise.resolve(this.releaseNow(key, owner));
  }

  /** Nothing here can fail to answer: released at once. */
  giveBack(key: string, owner: string): Promise<void> {
    this.releaseNow(key, owner);
    return Promise.resolve();
  }

  /** Every watch of a key is woken by each release of it: the place and `since` change nothing here. */
  watch(key: string, _place?: LinePlace, _since?: number): Promise<ReleaseWatch> {
    return Promise.resolve(this.watchNow(key));
  }

  /** Nothing here is lost behind its holders' backs. */
  suspect(): Promise<readonly string[]> {
    return Promise.resolve([]);
  }

  /** No connection to lose. */
  onReconnect(): () => void {
    return () => undefined;
  }

  async verify(): Promise<void> {}

  health(): Promise<StoreHealth> {
    return Promise.resolve({ up: true, latencyMs: 0 });
  }

  /** Nothing to close; the store may be shared by other applications that are still running. */
  async close(): Promise<void> {}

  // ---- internals ------------------------------------------------------------------------------

  private entry(key: string): Entry {
    let entry = this.entries.get(key);
    if (!entry) this.entries.set(key, (entry = { holds: new Map(), line: [], watches: new Set(), refusals: 0 }));
    return entry;
  }

  private stored(owner: string, hold: Hold, at: number): StoredHold {
    return {
      owner,
      exclusive: hold.exclusive,
      ttl: hold.endsAt === Infinity ? -1 : Math.max(0, Math.ceil(hold.endsAt - at)),
      granted: false,
      recorded: hold.recorded,
    };
  }

  /** Drop the holds whose lease has ended and the places that have lapsed. */
  private prune(entry: Entry, at: number): void {
    for (const [owner, hold] of entry.holds) if (hold.endsAt <= at) entry.holds.delete(owner);
    for (let i = entry.line.length - 1; i >= 0; i -= 1) if (entry.line[i].deadline <= at) entry.line.splice(i, 1);
  }

  /** The key's remaining lease as Redis would answer PTTL: the latest hold's end (-2 when none). */
  private remaining(entry: Entry, at: number): number {
    if (entry.holds.size === 0) return -2;
    const latest = Math.max(...[...entry.holds.values()].map((hold) => hold.endsAt));
    return latest === Infinity ? -1 : Math.max(0, Math.ceil(latest - at));
  }

  private takePlace(entry: Entry, waiter: string, at: number): void {
    const place = entry.line.find((p) => p.id === waiter);
    if (place) place.deadline = at + PLACE_MS;
    else entry.line.push({ id: waiter, deadline: at + PLACE_MS });
  }

  /** A hold has gone (or room was left): every waiter of the key looks. */
  private announce(entry: Entry): void {
    for (const watch of entry.watches) watch.wake();
  }

  /** Forget an entry nobody holds, waits for or watches. */
  private tidy(key: string, entry: Entry): void {
    if (entry.holds.size === 0 && entry.line.length === 0 && entry.watches.size === 0 && entry.refusals === 0) {
      if (this.entries.get(key) === entry) this.entries.delete(key);
    }
  }
}
