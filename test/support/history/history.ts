/**
 * The history of a randomized lock run, and the checker that judges it (Jepsen in miniature).
 *
 * Worker processes record what their critical sections did on one machine-wide clock; the run
 * records the faults it injected. `checkHistory` then looks for what must never happen:
 *
 * 1. two owners inside one lock's critical section at once, unless the earlier one had been told
 *    (its `signal` aborted) before the later one got in;
 * 2. fencing tokens that do not grow with the order in which owners got the lock, and a fenced
 *    write refused (a newer token was seen first) while its writer had not been told of a loss;
 * 3. a lost wake-up: a waiter still waiting `WAKE_MARGIN_MS` after a release of its lock, with
 *    nobody else taking the lock in between and no fault near either process.
 */

/** ms on CLOCK_MONOTONIC, which every process on the machine shares (Linux). */
export function clock(): number {
  return Number(process.hrtime.bigint() / 1_000n) / 1_000;
}

/** A small seeded PRNG (mulberry32): the same seed gives the same choices. */
export function prng(seed: number): () => number {
  let state = seed >>> 0;
  return () => {
    state = (state + 0x6d2b79f5) >>> 0;
    let t = state;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4_294_967_296;
  };
}

/** How a critical section got its lock. */
export type LockPath = 'decorator' | 'withLock' | 'lock' | 'none';

/** One critical section, as the worker saw it. */
export interface HoldRecord {
  readonly kind: 'hold';
  readonly worker: number;
  readonly name: string;
  readonly owner: string;
  readonly token: number;
  /** The handle was in hand (inside the critical section). */
  readonly start: number;
  /** The critical section's work was done (before any release was sent). */
  readonly end: number;
  /** When the lock's signal aborted, if it did before the record was made. */
  readonly lostAt?: number;
  /** When the call that got this hold began, if it waited (`waitTime` > 0). */
  readonly waitedFrom?: number;
  /** When the call that got this hold began (its acquisition reached Redis between this and `start`). */
  readonly calledAt: number;
  readonly path: LockPath;
  /** A reentrant hold inside another hold of the same owner. */
  readonly nested: boolean;
  /** The fenced write: accepted, refused, or not answered (the fence store is never faulted, so rare). */
  readonly write: 'accepted' | 'refused' | 'failed';
  /** Whether the signal had aborted when the write was sent. */
  readonly toldBeforeWrite: boolean;
}

/** A release that freed a lock: an explicit `release()` that answered true. */
export interface ReleaseRecord {
  readonly kind: 'release';
  readonly worker: number;
  readonly name: string;
  readonly owner: string;
  readonly at: number;
}

/** A waiting call that gave up: busy for all of its `waitTime`. */
export interface GiveUpRecord {
  readonly kind: 'give-up';
  readonly worker: number;
  readonly name: string;
  readonly waitedFrom: number;
  readonly at: number;
}

/**
 * A call that failed with Redis unavailable: its acquisition may still have taken the lock in
 * Redis, which then stays taken until the library gives it back or its lease ends (`to`).
 */
export interface UnknownRecord {
  readonly kind: 'unknown';
  readonly worker: number;
  readonly name: string;
  readonly from: number;
  readonly to: number;
}

/** Something unexpected in a worker: an error other than busy or Redis unavailable. */
export interface ErrorRecord {
  readonly kind: 'error';
  readonly worker: number;
  readonly at: number;
  readonly error: string;
}

/**
 * The worker's event loop stood still (its 10 ms ticker fired late): timers, and with them the
 * library's loss reports, could not run. A paused holder is outside what any lock can promise
 * (README, "Not guaranteed"), so the checker excuses what falls into such a window.
 */
export interface PauseRecord {
  readonly kind: 'pause';
  /** The worker, or -1 for the run's own process, whose proxies carry every worker's traffic. */
  readonly worker: number;
  readonly from: number;
  readonly to: number;
}

export type HistoryEvent = HoldRecord | ReleaseRecord | GiveUpRecord | ErrorRecord | PauseRecord | UnknownRecord;

/** A fault injected into one worker's connection to Redis, from when it bit to when it was over. */
export interface FaultRecord {
  readonly worker: number;
  readonly kind: string;
  readonly from: number;
  readonly to: number;
}

export interface Violation {
  readonly rule: 'overlap' | 'fencing' | 'lost-wake-up' | 'error';
  readonly text: string;
}

export interface CheckOptions {
  /** The run's operationTimeout: a fault may delay what happens up to this much later. */
  readonly operationTimeoutMs: number;
}

/** How long after a release a waiter must have the lock (or see someone else take it). */
export const WAKE_MARGIN_MS = 100;

/** How far before the second owner got in a stall of the first holder's loop can have delayed its report. */
const STALL_WINDOW_MS = 50;

/** The worker's ticker interval, and how much later than that a tick must come to count as a pause. */
export const TICK_MS = 5;
export const PAUSE_MS = 2;

const fmt = (ms: number): string => ms.toFixed(1);

export function checkHistory(
  events: readonly HistoryEvent[],
  faults: readonly FaultRecord[],
  options: CheckOptions,
): Violation[] {
  const violations: Violation[] = [];
  const holds = events.filter((e): e is HoldRecord => e.kind === 'hold');
  for (const e of events) {
    if (e.kind === 'error') violations.push({ rule: 'error', text: `worker ${e.worker}: ${e.error}` });
  }
  const byName = new Map<string, HoldRecord[]>();
  for (const hold of holds) {
    const list = byName.get(hold.name);
    if (list) list.push(hold);
    else byName.set(hold.name, [hold]);
  }
  const pauses = events.filter((e): e is PauseRecord => e.kind === 'pause');
  /** How long `worker`'s event loop stood still within [from, to], in ms. */
  const paused = (worker: number, from: number, to: number): number =>
    pauses.reduce(
      (sum, p) =>
        p.worker === worker || p.worker === -1 ? sum + Math.max(0, Math.min(p.to, to) - Math.max(p.from, from)) : sum,
      0,
    );
  for (const list of byName.values()) {
    list.sort((a, b) => a.start - b.start);
    checkOverlaps(list, paused, violations);
    checkTokens(list, violations);
  }
  for (const hold of holds) {
    if (hold.write === 'refused' && !hold.toldBeforeWrite) {
      violations.push({
        rule: 'fencing',
        text: `worker ${hold.worker} wrote "${hold.name}" with token ${hold.token}, refused as stale, while its signal had not aborted`,
      });
    }
  }
  checkWakeUps(events, holds, faults, paused, options, violations);
  return violations;
}

function checkOverlaps(
  list: readonly HoldRecord[],
  paused: (worker: number, from: number, to: number) => number,
  violations: Violation[],
): void {
  const active: HoldRecord[] = [];
  for (const later of list) {
    for (let i = active.length - 1; i >= 0; i -= 1) if (active[i].end <= later.start) active.splice(i, 1);
    for (const earlier of active) {
      if (earlier.owner === later.owner) continue; // the same hold, re-entered
      if (earlier.lostAt !== undefined && earlier.lostAt <= later.start) continue; // told in time
      // Told late, but by no more than its process stood still when the report was due (the
      // library cannot report while its event loop does not run: README, "A paused holder").
      if (earlier.lostAt !== undefined) {
        const late = earlier.lostAt - later.start;
        if (late <= paused(earlier.worker, later.start - STALL_WINDOW_MS, earlier.lostAt)) continue;
      }
      violations.push({
        rule: 'overlap',
        text:
          `"${later.name}": worker ${earlier.worker} (owner ${earlier.owner.slice(0, 8)}, ${earlier.path}) held it ` +
          `${fmt(earlier.start)}–${fmt(earlier.end)} and worker ${later.worker} (owner ${later.owner.slice(0, 8)}, ` +
          `${later.path}) got in at ${fmt(later.start)}` +
          (earlier.lostAt === undefined ? ', the first never told' : `, the first told only at ${fmt(earlier.lostAt)}`),
      });
    }
    active.push(later);
  }
}

function checkTokens(list: readonly HoldRecord[], violations: Violation[]): void {
  // The first hold of each owner, in the order owners got the lock: tokens must grow along it.
  const seen = new Set<string>();
  let previous: HoldRecord | undefined;
  for (const hold of list) {
    if (hold.path === 'none' || seen.has(hold.owner)) continue;
    seen.add(hold.owner);
    if (previous && previous.token >= hold.token) {
      violations.push({
        rule: 'fencing',
        text: `"${hold.name}": token ${hold.token} (worker ${hold.worker}, at ${fmt(hold.start)}) is not larger than the earlier holder's ${previous.token} (worker ${previous.worker}, at ${fmt(previous.start)})`,
      });
    }
    previous = hold;
  }
}

function checkWakeUps(
  events: readonly HistoryEvent[],
  holds: readonly HoldRecord[],
  faults: readonly FaultRecord[],
  stalled: (worker: number, from: number, to: number) => number,
  options: CheckOptions,
  violations: Violation[],
): void {
  /** A waiting call: from when it began to when it got the lock or gave up. */
  const waits: { worker: number; name: string; from: number; until: number }[] = [];
  for (const e of events) {
    if (e.kind === 'hold' && e.waitedFrom !== undefined && !e.nested) {
      waits.push({ worker: e.worker, name: e.name, from: e.waitedFrom, until: e.start });
    } else if (e.kind === 'give-up') {
      waits.push({ worker: e.worker, name: e.name, from: e.waitedFrom, until: e.at });
    }
  }
  for (const release of events) {
    if (release.kind !== 'release') continue;
    const r = release.at;
    // A re-entry of the same owner still running keeps the lock: this release freed nothing yet.
    if (holds.some((h) => h.owner === release.owner && h.end > r)) continue;
    const end = r + WAKE_MARGIN_MS;
    // Someone may have taken the lock within the margin: a call under way then that got it first
    // (its acquisition reached Redis before its handle came back), or one whose outcome is unknown.
    const takers = holds.filter((h) => h.name === release.name && h.start >= r - 1 && h.calledAt <= end);
    const unknown = events.some((e) => e.kind === 'unknown' && e.name === release.name && e.from <= end && e.to >= r);
    if (unknown) continue;
    for (const wait of waits) {
      if (wait.name !== release.name || wait.from >= r || wait.until <= end) continue;
      if (takers.some((h) => h.worker !== wait.worker || h.calledAt !== wait.from)) continue;
      // A fault in any process near the release may hide a hold nobody reports: an acquisition
      // whose answer came later than its lease is given back, not handed out, but held the lock
      // in Redis until then. Such a window proves nothing either way; the rest must be clean.
      if (!quiet(faults, r, options)) continue;
      // Time the waiter's process (or the releaser's) could not run does not count against it.
      const late = wait.until - r;
      const excused = stalled(wait.worker, r, wait.until) + stalled(release.worker, r - WAKE_MARGIN_MS, wait.until);
      if (late - excused <= WAKE_MARGIN_MS) continue;
      const next = holds
        .filter((h) => h.name === release.name && h.start > r)
        .reduce<HoldRecord | undefined>((first, h) => (first && first.start <= h.start ? first : h), undefined);
      violations.push({
        rule: 'lost-wake-up',
        text:
          `"${release.name}": worker ${release.worker} released it at ${fmt(r)}; worker ${wait.worker}, waiting since ` +
          `${fmt(wait.from)}, was still waiting ${fmt(late)} ms later (${fmt(excused)} ms of it stalled) and nobody took it` +
          (next ? ` (the next hold: worker ${next.worker} at ${fmt(next.start)}, ${next.path})` : ''),
      });
    }
  }
}

/** Whether no fault, in any process, came near a release at `r` (see the wake-up rule). */
function quiet(faults: readonly FaultRecord[], r: number, options: CheckOptions): boolean {
  const from = r - options.operationTimeoutMs;
  return !faults.some((f) => f.from <= r + WAKE_MARGIN_MS && f.to + options.operationTimeoutMs >= from);
}

/** Releases the wake-up rule judges: those no fault came near. */
export function quietReleases(
  events: readonly HistoryEvent[],
  faults: readonly FaultRecord[],
  options: CheckOptions,
): number {
  return events.filter((e) => e.kind === 'release' && quiet(faults, e.at, options)).length;
}

/** A one-line summary of a run, for logs. */
export function summarize(events: readonly HistoryEvent[], faults: readonly FaultRecord[]): string {
  const holds = events.filter((e): e is HoldRecord => e.kind === 'hold');
  const count = (predicate: (h: HoldRecord) => boolean): number => holds.filter(predicate).length;
  const kinds = new Map<string, number>();
  for (const f of faults) kinds.set(f.kind, (kinds.get(f.kind) ?? 0) + 1);
  const pauseRecords = events.filter((e): e is PauseRecord => e.kind === 'pause');
  const pauses = pauseRecords.length;
  const stalled = pauseRecords.reduce((sum, p) => sum + p.to - p.from, 0);
  return (
    `${holds.length} holds (${count((h) => h.nested)} nested, ${count((h) => h.lostAt !== undefined)} lost, ` +
    `${count((h) => h.waitedFrom !== undefined)} after waiting), ` +
    `${events.filter((e) => e.kind === 'give-up').length} waits ran out, ` +
    `${events.filter((e) => e.kind === 'release').length} releases, ` +
    `fenced writes ${count((h) => h.write === 'accepted')} accepted / ${count((h) => h.write === 'refused')} refused; ` +
    `${faults.length} faults (${[...kinds].map(([k, n]) => `${k} ${n}`).join(', ')}); ` +
    `event loops stood still ${pauses} times (${stalled.toFixed(0)} ms in all)`
  );
}
