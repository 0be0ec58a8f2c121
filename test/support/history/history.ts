/**
 * The history of a randomized lock run, and the checker that judges it (Jepsen in miniature).
 *
 * Worker processes record what their critical sections did on one machine-wide clock; the run
 * records the faults it injected. Every hold says what kind it was: exclusive (a plain lock, a
 * write lock, each part of a multi-lock), a reader's (`mode: 'read'`), or one of a semaphore's
 * `permits` (`mode: 'permit'`). `checkHistory` then looks for what must never happen:
 *
 * 1. Holders (rules 'overlap' and 'permits'). A hold is inside from `start` (its handle in hand) to
 *    `end`. It stops counting once it has been told (its `signal` aborted), and a hold told before
 *    it got in never counted; being told late is excused only by as long as its process's event
 *    loop stood still when the report was due (README, "A paused holder"; a hold never told counts
 *    as told when its work ended, see `toldBy`). At the instant each hold H got in, the holds of the
 *    same name by other owners that are inside and still count, with H, must have: no exclusive
 *    hold together with any other ('overlap': a writer with a reader is as wrong as two writers),
 *    and no crowd of shared holds a semaphore would not admit ('permits'): whoever of them was
 *    admitted last in Redis was admitted with the others holding (readers and permits both count
 *    against a bound), so there can be at most its `permits` of them. The last one is known only up
 *    to the order of their calls (see `tooManyPermits`); with one bound for all, at most n permits
 *    at once. Holders only come in at such instants, so this judges every instant.
 *
 * 2. Fencing tokens (rule 'fencing'). Tokens must grow with the order in which holders got the lock
 *    (one token per owner: re-entries share their outer hold's). Which of two holds A and B of a
 *    name got it first is known when
 *    a. A had its handle before B's call even began (`A.start < B.calledAt`): whatever their kinds,
 *       B's token was issued after A's; or
 *    b. one of them is exclusive, `A.start < B.start`, and B had not been told by `B.start`. Had B
 *       got the lock first, A could only have got it once B's hold was gone from Redis, so before
 *       A's start and B's: the library must then have told B by `B.start`. Two shared holders'
 *       handles can come back in any order (their acquisitions overlap), so between those only a.
 *       orders them.
 *    A fenced write (the fence keeps the largest token it accepted, refuses smaller ones) refused
 *    while its holder had not been told: for an exclusive hold, a holder that got the lock after it
 *    wrote first, which it must have been told of. Shared holders hold together, so a reader's or a
 *    permit's write refused by another shared holder's larger token is what a fence does with
 *    concurrent writers, and promised nothing; refused by an exclusive hold's token, it is wrong.
 *    (A holder told late by no more than its event loop stood still is excused, as in rule 1.)
 *
 * 3. A lost wake-up ('lost-wake-up'): a waiter still waiting `WAKE_MARGIN_MS` after a release of its
 *    lock that left room for it, with nobody else taking that room and no fault near any process.
 *    Only an explicit `release()` that answered true counts, and only its freeing of the lock (at
 *    some instant between the end of the releaser's work, when it was sent, and its record): a
 *    release of a shared hold leaves the other holds still in (or ended just before it, their own
 *    release maybe under way). An exclusive waiter or a reader is judged when no hold was left and
 *    nobody took the lock; a permit waiter while the semaphore had room: fewer shared holders left
 *    and shared takers than its `permits`, and no exclusive holder, taker, or caller waiting at the
 *    release (which may be ahead of it in the lock's one line). Stalls of the waiter's and the
 *    releaser's event loops are excused, for a permit also the longest of another process's (the
 *    shared waiters ahead of it in the line must take their permits first).
 *
 * 4. A lock held by nobody ('held-by-nobody'): a call refused while no record can explain what held
 *    the lock in Redis. Every state a lock can have there belongs to some recorded call, and the
 *    records bound when (see `checkHeldByNobody`):
 *    - a hold, from when its fencing token (Redis's clock in µs) says it was taken, to the release
 *      that freed it (`freed`); or just after its work ended, when that release was not seen (every
 *      hold is released as its work ends, lost or not, and a release reaches Redis once its
 *      connection is back); a lease later only where commands in flight may be dropped
 *      (auto-pipelining, a Cluster) and a fault closed the connection; and its `lockAtLeastFor`;
 *    - a call of unknown outcome (a timeout, ioredis's `commandTimeout`, a closed connection, a
 *      multi-lock that gave up, a cancelled Observable) until just after it failed, or its
 *      connection recovered: the library gives such a hold back at once;
 *    - an attempt answered after its lease (its process stood still, or a fault delayed it), given
 *      back, and a call that did not wait refused late for that reason;
 *    - a live waiter's place in the line, from its call to just after it got the lock or gave up;
 *      a place left by a waiter whose first attempt failed (or whose leave was dropped), until it
 *      lapses (3 s).
 *    So
 *    a. a call that did not wait and was refused (`busy`) is wrong when nothing may have held the
 *       lock, no dead place stood in its line, and no live waiter was on its way to a lock freed
 *       less than `LINE_GAP_MS` before (it would have taken it by then);
 *    b. a waiter kept waiting `LINE_GAP_MS` (more its process's stalls) while nothing may have held
 *       the lock and no live waiter was ahead of it is wrong: a free lock is taken by the waiter's
 *       next attempt, at least every second. Dead places ahead of it cost 250 ms for the first and
 *       up to a second for each further one (README: "two dead waiters at the front 1.26 s").
 *    (Findings 5-9 of issue 20: a take-up renewal or an ioredis `commandTimeout` that strands a
 *    lock for a lease, a failed multi-lock or a cancelled call that keeps its parts for
 *    `lockAtLeastFor`, a free lock refused just after a waiter left, a dead shared head that holds
 *    a free lock up for seconds.)
 *
 * 5. Redis forgets ('told-late'; fault records with `forgot`): the run restarts the lock Redis
 *    without persistence (on a Cluster one master, from its own nodes.conf) or sends FLUSHALL (to
 *    one master), now and then. Every lock of that server is gone at once, and another process
 *    may take it while its holder still runs: README's "Losing Redis's memory". The library's
 *    promise (issue 21) is that such a holder is told within `LOSS_TELL_MS` of F, the moment Redis
 *    is reachable again (the restarted server answered, a restarted Cluster master said
 *    `cluster_state:ok`, FLUSHALL answered), late by no more than its process stood still since F
 *    or faults on its own connection kept Redis out of its reach. So
 *    a. every hold Redis surely forgot (its token says it was taken before Redis began to forget,
 *       on the server that forgot) whose work went on past that must have been told in that time
 *       ('told-late'; a hold never told, not before its work ended);
 *    b. a holder that got in beside such a hold (one Redis may have forgotten), taken after Redis
 *       began to forget and within the first one's time to be told, is the documented limit of a
 *       Redis that forgets (the fencing token protects the resource then): rule 1 does not count
 *       it, nor rule 2b's order between the two, nor a write of the first refused by its token.
 *       Beyond that time, or between holds Redis had together before it forgot, nothing is excused;
 *    c. rule 2a stands: a token after a loss is Redis's clock, still past every token issued
 *       before (README, "Fencing tokens");
 *    d. a waiter's place went with the line: a release within a line refresh (1 s) of F is not
 *       judged for it (rule 3); a restarted Redis kept every lock of its from everyone until it
 *       answered and the connections were back (rule 4). FLUSHALL needs no excuse in rule 4:
 *       forgetting frees locks and places, it never holds one.
 *
 * An operator's `forceUnlock` ('force-unlock' records) removes holds on purpose: their holders
 * learn it at their next renewal. A hold is excused (counts as told from the moment the operator's
 * call began) when the call returned it among the holds it removed and its fencing token, which is
 * Redis's clock in µs when it was taken, is smaller than Redis's clock read just before the
 * operator's script ran (a read sent in the same write, on the same connection): it was in Redis
 * when the operator's call got there. A hold taken after that and removed (a re-sent force-unlock
 * script that frees the next holder too, finding 1) is not excused, nor a hold the call removed
 * without returning it. A call that failed may have run or not: every hold taken before Redis's
 * clock was read again on that connection after it is excused.
 *
 * On a Cluster the run also moves the slots of some names to another master and back, now and
 * then stopped mid-way (fault records with `migrated`, one per process's connection, from the first
 * SETSLOT to every node agreeing on the new master; issue 25). Rules 1, 2 and 5 judge those
 * seconds as any others: a migration excuses no second holder and no token out of order. Rule 3
 * does not judge a release near one, as near any fault. Rule 4 counts one as a fault on every
 * connection that closed none, after which what a process sent meanwhile has reached Redis within
 * MIGRATION_RECOVER_MS: a release that failed while its slot moved (TRYAGAIN, a script stopped by a
 * key no longer on the node) is given back by retries at most a second apart.
 *
 * A paused holder is excused (rules 1 and 2) only when its lease is short enough that a pause
 * could have ended it: a fixed lease, or a renewed one shorter than `LONG_LEASE_MS`. A pause of a
 * few hundred ms cannot end a 30 s watchdog lease (renewed every 10 s), so a second holder beside
 * such a hold is wrong, paused or not (finding 3: a grant held at once ran on the grant's 250 ms).
 *
 * Not judged: how long a multi-lock's parts waited (it takes them one after the other, holding the
 * first while it waits for the next; a multi-lock call that failed is recorded as `unknown` on each
 * of its names, as it may have held some), whether readers were admitted together as early as they
 * could have been, and anything near a fault beyond rules 1, 2 and 4. A multi-lock may hand out a set
 * whose part was lost while the next one was waited for: its signal has then aborted already,
 * which rule 1 accepts (the summary counts such holds as "handed out already told").
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

/** How a critical section got its lock: a locked method, `withLock`, or `tryLock`/`lock` and `release()`. */
export type LockPath = 'decorator' | 'withLock' | 'lock' | 'none';

/**
 * Which public call took the hold, for the summary: `tryLock` or `lock` (path 'lock'), a locked
 * method declared to return a Promise, an Observable, or neither ('either': a Promise that is also
 * an Observable), or `withLock`.
 */
export type CallKind = 'tryLock' | 'lock' | 'promise' | 'observable' | 'either' | 'withLock';

/** What a hold shares its lock with: nobody, other readers, or up to `permits` - 1 other permits. */
export type HoldMode = 'exclusive' | 'read' | 'permit';

/** Which kind of call took a hold (for messages): `mode` is what the checker judges. */
export type LockOp = 'mutex' | 'write' | 'read' | 'permit' | 'multi';

/** One critical section, as the worker saw it. A multi-lock's makes one record per part. */
export interface HoldRecord {
  readonly kind: 'hold';
  readonly worker: number;
  readonly name: string;
  readonly owner: string;
  readonly token: number;
  /** Absent: exclusive (a plain lock, a write lock, a multi-lock's part). */
  readonly mode?: HoldMode;
  /** The semaphore's bound the permit was taken with; required with `mode: 'permit'`. */
  readonly permits?: number;
  /** Absent: a plain lock ('mutex'). */
  readonly op?: LockOp;
  /** The lease it was taken with, for messages: 'expire 250', 'watchdog 300'. */
  readonly lease?: string;
  /** The lease in ms (a fixed `expire`, or the watchdog's lease), when the record knows it. */
  readonly leaseMs?: number;
  /** The watchdog renews the lease (false: a fixed `expire`). */
  readonly renewed?: boolean;
  /** Its `lockAtLeastFor`, if any: the lock stays taken that long after it was acquired. */
  readonly lockAtLeastFor?: number;
  /** ms of synchronous work the critical section began with (its event loop did not run meanwhile). */
  readonly syncMs?: number;
  /** Which public call took it (for the summary). */
  readonly call?: CallKind;
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
  /** A refused write: the larger token the fence held then. */
  readonly refusedBy?: number;
  /** Whether the signal had aborted when the write was sent. */
  readonly toldBeforeWrite: boolean;
}

/** A release that freed a lock: an explicit `release()` that answered true (each part of a multi-lock). */
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
  /** What it asked for (absent: exclusive). */
  readonly mode?: HoldMode;
  readonly permits?: number;
  readonly waitedFrom: number;
  readonly at: number;
}

/** Why a call's outcome is unknown (see `UnknownRecord`). */
export type UnknownCause = 'timeout' | 'command-timeout' | 'unavailable' | 'multi' | 'cancelled';

/**
 * A call that failed with Redis unavailable (`to`: when it failed): its acquisition may still have
 * taken the lock in Redis, which the library gives back (at once, queued behind it on its
 * connection, and again if its answer lands later). Also each name of a multi-lock call that
 * failed (it may have held its first parts meanwhile), and a locked method's Observable
 * unsubscribed before its lock came (`to`: when it was unsubscribed; an attempt on its way then is
 * given back when it lands).
 */
export interface UnknownRecord {
  readonly kind: 'unknown';
  readonly worker: number;
  readonly name: string;
  readonly from: number;
  readonly to: number;
  readonly cause?: UnknownCause;
  /** The call waited (`waitTime` > 0): a place it took in the line may be left to lapse. */
  readonly waits?: boolean;
  /** What it asked for (absent: exclusive, or not said). */
  readonly mode?: HoldMode;
  readonly permits?: number;
  /** A multi-lock's call (it took its parts one after the other). */
  readonly multi?: boolean;
  /** The lease it asked for, if the record knows it. */
  readonly leaseMs?: number;
}

/**
 * A call that did not wait (`waitTime` 0) and found the lock busy: `tryLock` answered null, or
 * `lock`, `withLock` or a locked method threw `LockNotAcquiredError`. Its one attempt ran in Redis
 * between `calledAt` and `at`.
 */
export interface BusyRecord {
  readonly kind: 'busy';
  readonly worker: number;
  readonly name: string;
  readonly mode?: HoldMode;
  readonly permits?: number;
  readonly calledAt: number;
  readonly at: number;
}

/**
 * A hold's release freed the lock in Redis (the library's 'released' event, seen when the release
 * was answered): whatever way it was released (a locked method's end, `withLock`, `release()`).
 */
export interface FreedRecord {
  readonly kind: 'freed';
  readonly worker: number;
  readonly name: string;
  readonly owner: string;
  readonly at: number;
}

/**
 * The worker's store was asked to release `owner`'s hold (its `release`, also under `giveBack`),
 * at `at`: what rule 6 needs to tell a release re-sent across a dropped connection from a holder
 * that never released at all.
 */
export interface ReleaseSentRecord {
  readonly kind: 'release-sent';
  readonly worker: number;
  readonly owner: string;
  readonly at: number;
}

/**
 * An operator's `forceUnlock(name)`, called at `calledAt`, settled at `at`. `before` is Redis's
 * clock (µs, as fencing tokens count) read by a script sent just before the force-unlock script
 * on the same connection, in the same write: every hold in Redis when the script ran had a token
 * below it, unless something ran in between. `removed` the owners it returned; absent when the
 * call failed (its outcome unknown), in which case `until`, if known, is Redis's clock read on that
 * connection after it failed: it ran before that, or never.
 */
export interface ForceUnlockRecord {
  readonly kind: 'force-unlock';
  readonly worker: number;
  readonly name: string;
  readonly calledAt: number;
  readonly at: number;
  readonly before?: number;
  readonly removed?: readonly string[];
  readonly until?: number;
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

export type HistoryEvent =
  | HoldRecord
  | ReleaseRecord
  | GiveUpRecord
  | ErrorRecord
  | PauseRecord
  | UnknownRecord
  | BusyRecord
  | FreedRecord
  | ReleaseSentRecord
  | ForceUnlockRecord;

/** A fault injected into one worker's connection to Redis, from when it bit to when it was over. */
export interface FaultRecord {
  readonly worker: number;
  readonly kind: string;
  readonly from: number;
  readonly to: number;
  /** On the operator's connection: it carries no lock of anyone's, so it cannot hide a hold. */
  readonly operator?: boolean;
  /** false: the fault closed no connection (a delay, a blackhole without a reset); absent: it may have. */
  readonly closes?: boolean;
  /**
   * Redis forgot its data set (see `DataLoss`): every process's connection gets a record of it,
   * all with the same `from` (the server killed, or FLUSHALL sent) and `to` (Redis reachable again:
   * the restarted server answered, on a Cluster its master said `cluster_state:ok`; FLUSHALL answered).
   */
  readonly forgot?: DataLoss;
  /**
   * On a Cluster, the slots of some names moved to another master (see `SlotMigration`): every
   * process's connection gets a record of it, all with the same `from` (the first SETSLOT sent)
   * and `to` (every node says the new master serves them).
   */
  readonly migrated?: SlotMigration;
}

/** The slots of some of a Cluster run's names moved master to master (issue 25), as a fault. */
export interface SlotMigration {
  /** The names whose slots moved. */
  readonly names: readonly string[];
  readonly fromPorts: readonly number[];
  readonly toPort: number;
  /** The slots went back to their masters (the second leg of a migration). */
  readonly back: boolean;
  /** How long the slots stood MIGRATING, half of their keys moved, before the rest went: 0 straight through. */
  readonly stalledMs: number;
}

/** One leg of a slot migration, once (each process's connection has a record of it). */
export interface Migration extends SlotMigration {
  readonly from: number;
  readonly to: number;
}

/** The slot migrations of a run, each leg once, in time order. */
export function migrationsOf(faults: readonly FaultRecord[]): Migration[] {
  const byId = new Map<string, Migration>();
  for (const f of faults) {
    if (f.migrated && !byId.has(`${f.from} ${f.to}`))
      byId.set(`${f.from} ${f.to}`, { ...f.migrated, from: f.from, to: f.to });
  }
  return [...byId.values()].sort((a, b) => a.from - b.from);
}

/** How Redis forgot its locks mid-run (issue 21): restarted without persistence, or FLUSHALL. */
export type DataLossKind = 'restart' | 'flushall';

export interface DataLoss {
  readonly kind: DataLossKind;
  /** On a Cluster, the names whose keys lived on the master that forgot; absent: every name (one Redis). */
  readonly names?: readonly string[];
}

/** One data loss of a run: the records of it on every process's connection, as one. */
export interface Loss {
  readonly kind: DataLossKind;
  /** Redis began to forget: the server killed, or FLUSHALL sent. */
  readonly from: number;
  /** Redis reachable again: the loss became observable (F). */
  readonly to: number;
  /** The names it took the locks of; absent: every name. */
  readonly names?: ReadonlySet<string>;
}

/** The data losses of a run, each once, in time order. */
export function lossesOf(faults: readonly FaultRecord[]): Loss[] {
  const byId = new Map<string, Loss>();
  for (const f of faults) {
    if (!f.forgot) continue;
    const id = `${f.forgot.kind} ${f.from} ${f.to}`;
    if (byId.has(id)) continue;
    const names = f.forgot.names === undefined ? {} : { names: new Set(f.forgot.names) };
    byId.set(id, { kind: f.forgot.kind, from: f.from, to: f.to, ...names });
  }
  return [...byId.values()].sort((a, b) => a.from - b.from);
}

export interface Violation {
  readonly rule:
    | 'overlap'
    | 'permits'
    | 'fencing'
    | 'lost-wake-up'
    | 'held-by-nobody'
    | 'told-late'
    | 'released-after-force'
    | 'error';
  readonly text: string;
}

export interface CheckOptions {
  /** The run's operationTimeout: a fault may delay what happens up to this much later. */
  readonly operationTimeoutMs: number;
  /**
   * Redis's clock (ms) less `clock()`, measured by the run: a fencing token (Redis's clock in µs
   * when the lock was taken) then says when a hold began in Redis. Without it, from its call.
   */
  readonly redisClockOffsetMs?: number;
  /** The run's ioredis commandTimeout, if it drew one: an attempt fails after it at the latest too. */
  readonly commandTimeoutMs?: number;
  /**
   * When the run told its workers to stop: they finish the calls under way and close their apps,
   * whose queued releases, give-backs and leaves may then never be sent. Rule 4 judges nothing after.
   */
  readonly stoppedAt?: number;
  /**
   * Commands in flight when a connection closes may be dropped instead of sent again (ioredis
   * auto-pipelining; a Cluster's node connections, to be safe): a release cut off so leaves its
   * key to the lease.
   */
  readonly abortsOnReset?: boolean;
}

/**
 * How long after a release a waiter must have the lock (or see someone else take it). A wake-up
 * that was lost shows as a second or more (the waiter's next refresh of its place in the line, or
 * the holder's lease); a grant to a head that never takes it up as 270 ms (GRANT_MS and the
 * second's look). A hand-over is a few ms on a quiet machine, but CI runs three worker processes,
 * the proxies' process and two redis-servers on 2 cores, and fault-free runs there have taken 148
 * and 170 ms (less the stalls the loops measured) now and then: a scheduling tail, not a path of
 * the library. 200 ms keeps clear of that and still catches both kinds of loss.
 */
export const WAKE_MARGIN_MS = 200;

/** How long after a holder's work ended (its `end`) its release, sent then, may still be on its way. */
const RELEASE_SLACK_MS = 20;

/** How far before the second owner got in a stall of the first holder's loop can have delayed its report. */
const STALL_WINDOW_MS = 50;

/**
 * How long after its event loop came back a report may still come: the code that was running goes
 * on to its next await first (a critical section's first write goes out before it), then what
 * piled up meanwhile, and an overdue renewal is sent before the lease's end is looked at on the
 * next turn of the loop (a lost lease was reported 4.7 ms after a 383 ms pause on a busy machine).
 */
const REPORT_SLACK_MS = 15;

/**
 * How long each worker's event loop stood still within [from, to]: the union of its pauses and the
 * run's own (a worker records both its ticker's late ticks and, exactly, its synchronous work, which
 * overlap; each instant counts once).
 */
function pausedIn(pauses: readonly PauseRecord[]): Paused {
  const byWorker = new Map<number, PauseRecord[]>();
  for (const p of pauses) byWorker.set(p.worker, [...(byWorker.get(p.worker) ?? []), p]);
  const sorted = new Map<number, PauseRecord[]>();
  return (worker, from, to) => {
    let list = sorted.get(worker);
    if (!list) {
      list = [...(byWorker.get(worker) ?? []), ...(worker === -1 ? [] : (byWorker.get(-1) ?? []))].sort(
        (a, b) => a.from - b.from,
      );
      sorted.set(worker, list);
    }
    let total = 0;
    let reached = from;
    for (const p of list) {
      if (p.from >= to) break;
      if (p.to <= reached) continue;
      const begin = Math.max(p.from, reached);
      const end = Math.min(p.to, to);
      if (end > begin) total += end - begin;
      reached = Math.max(reached, end);
    }
    return total;
  };
}

/** The worker's ticker interval, and how much later than that a tick must come to count as a pause. */
export const TICK_MS = 5;
export const PAUSE_MS = 2;

/**
 * A renewed lease at least this long cannot be ended by a pause of the holder's process (renewed
 * every third of it, it would take a pause of two thirds: seconds, where the history's longest
 * pauses, its synchronous work included, are a few hundred ms): a second holder beside it is not
 * excused by the first one's pause.
 */
export const LONG_LEASE_MS = 3_000;

/**
 * Rule 4's margins. A release, a leave or a give-back sent as a call returned reaches Redis within
 * `SETTLE_MS` (more the sender's and the proxies' stalls); a connection hit by a fault carries what
 * waited in its client (ioredis re-sends what was unanswered, in order, then what was queued)
 * within `RECOVER_MS` after the fault ended (the module's first reconnect is 50 ms away; a Cluster
 * re-routes after 100 ms); a place a waiter took with an attempt whose outcome is unknown (it never
 * learnt it was in the line) lapses after `PLACE_LAPSE_MS` (the store's PLACE_MS).
 */
const SETTLE_MS = 150;
const RECOVER_MS = 500;
/**
 * After a slot migration, what a process sent meanwhile has reached Redis within this: a release
 * that failed while its slot moved (TRYAGAIN, a script stopped by a key no longer on the node) is
 * given back by retries at most 1 s apart (give-back.ts), the first after the slot settled
 * within that second; and its client's slot map is refreshed by then (RECOVER_MS).
 */
const MIGRATION_RECOVER_MS = 1_500;
const PLACE_LAPSE_MS = 3_000;
/** A waiter attempts at least every second (the store's lineRefreshMs), the grant lasts 250 ms; and room. */
export const LINE_GAP_MS = 1_500;
/** A refusal that took longer may be an acquisition answered after its lease, given back. */
const SLOW_REFUSAL_MS = 100;
/** The lease of a hold whose record does not say (the module's default watchdog lease). */
const DEFAULT_LEASE_MS = 30_000;

const fmt = (ms: number): string => ms.toFixed(1);

/** A hold's mode; a record without one is exclusive. */
export const modeOf = (hold: { readonly mode?: HoldMode }): HoldMode => hold.mode ?? 'exclusive';

/** How long a worker's event loop stood still within [from, to], in ms (the run's own stalls count for all). */
type Paused = (worker: number, from: number, to: number) => number;

/** A hold as the checker judges it: with what an operator's forceUnlock did to it, if anything. */
interface Judged extends HoldRecord {
  /** An operator's forceUnlock that may have removed it began then: it counts as told from then on. */
  readonly forcedAt?: number;
  /** The forceUnlock that removed it had answered by then: Redis no longer had it. */
  readonly goneBy?: number;
}

/** Whether a pause of the holder's process could have ended this hold's lease (see LONG_LEASE_MS). */
function pauseCanEnd(hold: HoldRecord): boolean {
  return hold.renewed !== true || hold.leaseMs === undefined || hold.leaseMs < LONG_LEASE_MS;
}

/**
 * Whether `hold` had been told it lost the lock by `at`: its signal aborted by then (or an
 * operator's forceUnlock that removed it had begun), or later by no more than its process stood
 * still when the report was due (the library cannot report while its event loop does not run:
 * README, "A paused holder"), if a pause could end its lease at all. A hold never told was not told
 * before its record at `end`: excused when its loop stood still for all of that but a little (its
 * work, frozen too, ended as the loop came back, before the report's timer could run).
 */
function toldBy(hold: Judged, at: number, paused: Paused): boolean {
  if (Math.min(hold.lostAt ?? Infinity, hold.forcedAt ?? Infinity) <= at) return true;
  if (!pauseCanEnd(hold)) return false;
  const told = hold.lostAt ?? hold.end;
  const stood = paused(hold.worker, at - STALL_WINDOW_MS, told);
  return told - at <= stood + (stood > 0 ? REPORT_SLACK_MS : 0);
}

function describe(hold: Judged): string {
  const kind = hold.mode === 'permit' ? `permit of ${hold.permits}` : modeOf(hold);
  const via = hold.op && hold.op !== 'read' && hold.op !== 'permit' ? ` ${hold.op}` : '';
  const lease = hold.lease ? `, ${hold.lease}` : '';
  const call = hold.call ? ` ${hold.call}` : '';
  const extra = [
    hold.lockAtLeastFor ? `lockAtLeastFor ${hold.lockAtLeastFor}` : '',
    hold.syncMs ? `${hold.syncMs.toFixed(0)} ms sync work` : '',
    hold.forcedAt === undefined ? '' : `force-unlocked from ${fmt(hold.forcedAt)}`,
  ].filter(Boolean);
  return (
    `worker ${hold.worker} (owner ${hold.owner.slice(0, 8)}, ${kind}${via}, ${hold.path}${call}${lease}, ` +
    `token ${hold.token}${extra.length > 0 ? `, ${extra.join(', ')}` : ''})`
  );
}

/**
 * Which holds an operator's forceUnlock may have removed, and since when (see the header): a hold
 * it returned whose token is below Redis's clock read just before it ran; for a call whose outcome
 * is unknown, any hold taken before Redis's clock was read again after it (every hold, if never).
 */
function judge(
  holds: readonly HoldRecord[],
  events: readonly HistoryEvent[],
  faults: readonly FaultRecord[],
): Judged[] {
  const calls = new Map<string, ForceUnlockRecord[]>();
  for (const e of events) {
    if (e.kind !== 'force-unlock') continue;
    const list = calls.get(e.name);
    if (list) list.push(e);
    else calls.set(e.name, [e]);
  }
  if (calls.size === 0) return [...holds];
  return holds.map((hold) => {
    let forcedAt: number | undefined;
    let goneBy: number | undefined;
    for (const call of calls.get(hold.name) ?? []) {
      if (call.calledAt > hold.end) continue;
      const removed =
        call.removed !== undefined
          ? call.removed.includes(hold.owner) && (call.before === undefined || hold.token < call.before)
          : call.until === undefined || hold.token < call.until;
      if (!removed) continue;
      forcedAt = Math.min(forcedAt ?? Infinity, call.calledAt);
      // Surely removed: returned by a call whose connection did not drop meanwhile (after a drop, a
      // re-sent copy finds every hold gone, and the call returns every hold it read).
      const dropped = faults.some(
        (f) => f.operator === true && f.closes !== false && f.from <= call.at && f.to >= call.calledAt,
      );
      if (call.removed !== undefined && !dropped) goneBy = Math.min(goneBy ?? Infinity, call.at);
    }
    return forcedAt === undefined ? hold : { ...hold, forcedAt, goneBy };
  });
}

/**
 * How soon a holder whose lock Redis forgot must be told, counted from when Redis is reachable
 * again (issue 21; README, "Losing Redis's memory"): the library checks every held lock when its
 * connection comes back after a drop (a created client reconnects at most 400 ms apart), and reads
 * a marker of the data set every 500 ms while it holds locks (a changed one has the node's locks
 * checked at once).
 */
export const LOSS_TELL_MS = 1_000;

/**
 * A waiter attempts at least this often (the store's lineRefreshMs): its place in a line that Redis
 * forgot is taken again by then.
 */
const LINE_REFRESH_MS = 1_000;

/**
 * Rule 5: what Redis forgetting its data set (a restart without persistence, FLUSHALL) does to
 * the other rules, and what it must not do (see the header).
 */
class Forgetting {
  constructor(
    readonly losses: readonly Loss[],
    private readonly faultsOf: ReadonlyMap<number, readonly FaultRecord[]>,
    private readonly paused: Paused,
    private readonly offset: number | undefined,
  ) {}

  /** The earliest a hold may have been taken in Redis: its call, or its token (Redis's clock in µs) less the slack. */
  earliest(h: HoldRecord): number {
    const byToken = this.offset === undefined ? -Infinity : h.token / 1_000 - this.offset - CLOCK_SLACK_MS;
    // A re-entry shares its outer hold's token, taken before the re-entry's call.
    return h.nested ? byToken : Math.max(h.calledAt, byToken);
  }

  /** The latest a hold may have been taken in Redis: its handle in hand, or its token plus the slack. */
  latest(h: HoldRecord): number {
    return this.offset === undefined ? h.start : Math.min(h.start, h.token / 1_000 - this.offset + CLOCK_SLACK_MS);
  }

  on(loss: Loss, name: string): boolean {
    return loss.names === undefined || loss.names.has(name);
  }

  /** The losses that may have taken `h`'s lock: it may have been in Redis when Redis forgot, its work still going on. */
  mayHaveTaken(h: HoldRecord): Loss[] {
    return this.losses.filter((l) => this.on(l, h.name) && this.earliest(h) <= l.to && h.end > l.from);
  }

  /** `l` surely took `h`'s lock: it was in Redis before Redis began to forget, and its work went on past that. */
  surelyTook(h: HoldRecord, l: Loss): boolean {
    return this.on(l, h.name) && this.latest(h) < l.from && h.end > l.from;
  }

  /**
   * By when `worker` had to report the loss: LOSS_TELL_MS after Redis was back, more the time faults
   * on its own connection took from it meanwhile (each until over, and its reconnection): Redis was
   * not reachable for it then. The run injects no fault for LOSS_TELL_MS after a loss; only one
   * armed before may bite in that second.
   */
  private deadline(worker: number, l: Loss): number {
    let deadline = l.to + LOSS_TELL_MS;
    for (let moved = true; moved;) {
      moved = false;
      let extra = 0;
      for (const f of this.faultsOf.get(worker) ?? []) {
        // A slot migration makes no node unreachable (and none runs near a loss, see run-history.ts).
        if (f.migrated || (f.forgot && f.from === l.from && f.to === l.to) || f.to + RECOVER_MS < l.to) continue;
        if (f.from > deadline) continue;
        extra += f.to + RECOVER_MS - Math.max(f.from, l.to);
      }
      if (l.to + LOSS_TELL_MS + extra > deadline) {
        deadline = l.to + LOSS_TELL_MS + extra;
        moved = true;
      }
    }
    return deadline;
  }

  /**
   * Whether `at` is within the time `worker` had to report the loss: by its deadline, or later by
   * no more than its process stood still since Redis was back (as `toldBy` excuses a late report,
   * whatever the lease: a pause did not cause this loss, it only delays the report).
   */
  inTime(worker: number, l: Loss, at: number): boolean {
    const deadline = this.deadline(worker, l);
    if (at <= deadline) return true;
    const stood = this.paused(worker, l.to, at);
    return at - deadline <= stood + (stood > 0 ? REPORT_SLACK_MS : 0);
  }

  /**
   * Whether `by` getting the lock while `taken`, not told, still held it is the documented limit
   * of a Redis that forgets: Redis may have lost `taken`'s lock, `by` may have got it after that,
   * and at `at` (when `by` got in, or wrote) `taken`'s holder was still within its time to be told.
   * Nothing else is excused: an overlap beyond that time, or between two holds Redis had together
   * before it forgot, is judged as any other.
   */
  excuses(taken: HoldRecord, by: HoldRecord, at: number): boolean {
    return this.mayHaveTaken(taken).some((l) => this.latest(by) >= l.from && this.inTime(taken.worker, l, at));
  }

  /**
   * Whether a release at `r` may have found no place of `wait` in the line: the place went with
   * the data set and is taken again at the waiter's next attempt, within LINE_REFRESH_MS of Redis
   * being back (after a restart, once its connection is back too), more its stalls.
   */
  placeLost(wait: { readonly worker: number; readonly name: string; readonly from: number }, r: number): boolean {
    return this.losses.some((l) => {
      if (!this.on(l, wait.name) || wait.from >= l.to || r < l.from) return false;
      const retaken = l.to + LINE_REFRESH_MS + (l.kind === 'restart' ? RECOVER_MS : 0);
      return r <= retaken + this.paused(wait.worker, l.to, r);
    });
  }

  /** Rule 5: every hold Redis surely forgot, its work going on after Redis was back, told in time. */
  checkTold(holds: readonly Judged[], violations: Violation[]): void {
    for (const l of this.losses) {
      const reported = new Set<string>();
      for (const h of holds) {
        if (reported.has(h.owner) || !this.surelyTook(h, l)) continue;
        const told = Math.min(h.lostAt ?? Infinity, h.forcedAt ?? Infinity);
        // Never told: not before its work ended, which is in time if that was.
        const by = Number.isFinite(told) ? told : h.end;
        if (this.inTime(h.worker, l, by)) continue;
        reported.add(h.owner);
        violations.push({
          rule: 'told-late',
          text:
            `"${h.name}": Redis forgot it (${l.kind === 'restart' ? 'restarted without persistence' : 'FLUSHALL'} ` +
            `from ${fmt(l.from)}, reachable again at ${fmt(l.to)}); ${describe(h)}, in ${fmt(h.start)}–${fmt(h.end)}, ` +
            (Number.isFinite(told) ? `was told only at ${fmt(told)}` : 'was never told') +
            `, ${fmt(by - l.to)} ms after Redis was back (${fmt(this.paused(h.worker, l.to, by))} ms of it stalled; ` +
            `due within ${fmt(this.deadline(h.worker, l) - l.to)} ms)`,
        });
      }
    }
  }
}

export function checkHistory(
  events: readonly HistoryEvent[],
  faults: readonly FaultRecord[],
  options: CheckOptions,
): Violation[] {
  const violations: Violation[] = [];
  const holds = judge(
    events.filter((e): e is HoldRecord => e.kind === 'hold'),
    events,
    faults,
  );
  for (const e of events) {
    if (e.kind === 'error') violations.push({ rule: 'error', text: `worker ${e.worker}: ${e.error}` });
  }
  for (const hold of holds) {
    const { mode, permits } = hold;
    const bad =
      mode === 'permit' ? permits === undefined || !Number.isInteger(permits) || permits < 1 : permits !== undefined;
    if (bad) violations.push({ rule: 'error', text: `malformed record: ${describe(hold)} on "${hold.name}"` });
  }
  const byName = new Map<string, Judged[]>();
  for (const hold of holds) {
    const list = byName.get(hold.name);
    if (list) list.push(hold);
    else byName.set(hold.name, [hold]);
  }
  const paused = pausedIn(events.filter((e): e is PauseRecord => e.kind === 'pause'));
  const faultsOf = new Map<number, FaultRecord[]>();
  for (const f of faults) faultsOf.set(f.worker, [...(faultsOf.get(f.worker) ?? []), f]);
  const forgetting = new Forgetting(lossesOf(faults), faultsOf, paused, options.redisClockOffsetMs);
  for (const list of byName.values()) {
    list.sort((a, b) => a.start - b.start);
    checkHolders(list, paused, forgetting, violations);
    checkTokens(list, paused, forgetting, violations);
    checkRefusedWrites(list, paused, forgetting, violations);
  }
  forgetting.checkTold(holds, violations);
  checkReleasedAfterForce(events, holds, faultsOf, violations);
  checkWakeUps(events, holds, faults, paused, forgetting, options, violations);
  checkHeldByNobody(events, holds, faults, paused, forgetting, options, violations);
  return violations;
}

/**
 * The first instant from `from` on at which a report to `worker` that Redis forgot its locks
 * (`loss`) is late by rule 5, with every excuse the checker gives counted (faults on its
 * connection, its event loop's stalls since Redis was back): for a forged history that must be
 * flagged however loaded the machine was (a holder whose loop stood still half the time is
 * excused a long way past LOSS_TELL_MS).
 */
export function lateReportFrom(
  events: readonly HistoryEvent[],
  faults: readonly FaultRecord[],
  options: CheckOptions,
  worker: number,
  loss: Loss,
  from: number,
): number {
  const paused = pausedIn(events.filter((e): e is PauseRecord => e.kind === 'pause'));
  const faultsOf = new Map<number, FaultRecord[]>();
  for (const f of faults) faultsOf.set(f.worker, [...(faultsOf.get(f.worker) ?? []), f]);
  const forgetting = new Forgetting(lossesOf(faults), faultsOf, paused, options.redisClockOffsetMs);
  let at = from;
  // A loop stands still for a bounded time: the running time since `loss.to` grows past the deadline.
  while (forgetting.inTime(worker, loss, at)) at += 10;
  return at;
}

/**
 * Rule 6: a hold an operator's forceUnlock surely removed (it returned the hold) was never freed by
 * its holder's release, so its holder must not be told "released" (the library's 'released' event):
 * its work ran, at least in part, without the lock, and it must hear so (a hand-over's re-sent copy
 * once told it otherwise: the review of issue 22's hand-overs). The one excuse is the documented
 * one: a release of that hold was sent, and a fault closed the worker's connection while it was on
 * its way; the client then sends it again, and the store cannot tell the copy's "not the owner"
 * from its own first copy's release.
 */
function checkReleasedAfterForce(
  events: readonly HistoryEvent[],
  holds: readonly Judged[],
  faultsOf: ReadonlyMap<number, readonly FaultRecord[]>,
  violations: Violation[],
): void {
  const forced = new Map<string, Judged>();
  for (const h of holds) if (h.goneBy !== undefined) forced.set(h.owner, h);
  if (forced.size === 0) return;
  const sent = new Map<string, number[]>();
  for (const e of events) if (e.kind === 'release-sent') sent.set(e.owner, [...(sent.get(e.owner) ?? []), e.at]);
  for (const e of events) {
    // the 'released' event, or an explicit release() that answered true
    if (e.kind !== 'freed' && e.kind !== 'release') continue;
    const hold = forced.get(e.owner);
    if (!hold) continue;
    const resent = (sent.get(e.owner) ?? []).some((from) =>
      (faultsOf.get(e.worker) ?? []).some(
        (f) => f.closes !== false && f.operator !== true && f.from <= e.at && f.to >= from,
      ),
    );
    if (resent) continue;
    violations.push({
      rule: 'released-after-force',
      text:
        `"${hold.name}": ${describe(hold)}, in ${fmt(hold.start)}–${fmt(hold.end)}, was force-unlocked ` +
        `(from ${fmt(hold.forcedAt ?? hold.start)}) but told "released" at ${fmt(e.at)}` +
        ((sent.get(e.owner) ?? []).length === 0 ? ', with no release of its own sent' : ''),
    });
  }
}

/** Rule 1, for the holds of one name in `start` order. */
function checkHolders(list: readonly Judged[], paused: Paused, forgetting: Forgetting, violations: Violation[]): void {
  const active: Judged[] = [];
  const reported = new Set<string>();
  // Each owner's first record: its acquisition (a re-entry takes nothing new, see `tooManyPermits`).
  const first = new Map<string, Judged>();
  for (const hold of list) if (!first.has(hold.owner)) first.set(hold.owner, hold);
  for (const later of list) {
    for (let i = active.length - 1; i >= 0; i -= 1) if (active[i].end <= later.start) active.splice(i, 1);
    active.push(later);
    // Told before it got in: it never counted (a multi-lock's part that lapsed while the next one was
    // waited for is handed out that way, its signal already aborted).
    if (toldBy(later, later.start, paused)) continue;
    // The other owners inside that still count, one record each (a re-entry is its outer's hold).
    const inside = new Map<string, Judged>();
    for (const earlier of active) {
      if (earlier.owner === later.owner || inside.has(earlier.owner)) continue;
      if (toldBy(earlier, later.start, paused)) continue;
      // Redis forgot one of the two locks (the earlier one's; or the later one's, whose handle came
      // back after the other had taken the lock anew), and its holder was still within its time to
      // be told (rule 5b): the documented limit of a Redis that forgets, for holders and permits alike.
      const forgot = forgetting.excuses(earlier, later, later.start) || forgetting.excuses(later, earlier, later.start);
      if (!forgot) inside.set(earlier.owner, earlier);
    }
    const laterMode = modeOf(later);
    for (const earlier of inside.values()) {
      if (laterMode !== 'exclusive' && modeOf(earlier) !== 'exclusive') continue;
      const pair = `${earlier.owner} ${later.owner}`;
      if (reported.has(pair)) continue; // a re-entry of the same owner got in again beside it
      reported.add(pair);
      violations.push({
        rule: 'overlap',
        text:
          `"${later.name}": ${describe(earlier)} held it ${fmt(earlier.start)}–${fmt(earlier.end)} and ` +
          `${describe(later)} got in at ${fmt(later.start)}` +
          (earlier.lostAt === undefined ? ', the first never told' : `, the first told only at ${fmt(earlier.lostAt)}`),
      });
    }
    if (laterMode === 'permit' && first.get(later.owner) === later) {
      const crowd = tooManyPermits(
        later,
        [...inside.values()].map((h) => first.get(h.owner) ?? h),
      );
      if (crowd) {
        violations.push({
          rule: 'permits',
          text:
            `"${later.name}": ${describe(later)} got in at ${fmt(later.start)} while ${crowd.length - 1} other shared ` +
            `holders were in and not told, ${crowd.length} in all, more than any of them that may have been admitted ` +
            `last allows: ${crowd.map((h) => `${describe(h)} called ${fmt(h.calledAt)}, in ${fmt(h.start)}–${fmt(h.end)}`).join('; ')}`,
        });
      }
    }
  }
}

/**
 * Holders of one name inside together, none of them told, that no semaphore admits: `later` (a
 * permit) and some of `others`, or undefined. Whoever of such a crowd was admitted last in Redis
 * was admitted with all the others holding (none had been told, so none had lost its hold), so the
 * crowd can be no larger than that one's `permits` (a reader admitted last: any size). Which one
 * was last is known only up to the order of their calls: one whose handle was in hand before
 * another's call began was not. So a crowd is too large when it is larger than the bound of each
 * of its members that may have been last. Tried: for each bound b, the permits of b or fewer
 * (with later among them), without and with the readers. Each member is its owner's first record,
 * the one that acquired: the crowd is judged when its last member got in, not at a re-entry.
 */
function tooManyPermits(later: Judged, others: readonly Judged[]): Judged[] | undefined {
  const shared = others.filter((h) => modeOf(h) !== 'exclusive');
  const own = later.permits ?? 1;
  const bounds = [...new Set(shared.map((h) => h.permits ?? 0))].filter((b) => b >= own);
  for (const bound of [own, ...bounds].sort((a, b) => a - b)) {
    const permits = shared.filter((h) => modeOf(h) === 'permit' && (h.permits ?? 1) <= bound);
    for (const crowd of [
      [later, ...permits],
      [later, ...permits, ...shared.filter((h) => modeOf(h) === 'read')],
    ]) {
      const mayBeLast = crowd.filter((h) => !crowd.some((p) => p.calledAt > h.start));
      const allows = Math.max(...mayBeLast.map((h) => (modeOf(h) === 'permit' ? (h.permits ?? 1) : Infinity)));
      if (crowd.length > allows) return crowd;
    }
  }
  return undefined;
}

/** `prefix[i]`: the hold with the largest token among `holds[0..i-1]` (undefined for none). */
function maxTokens(holds: readonly Judged[]): (Judged | undefined)[] {
  const prefix: (Judged | undefined)[] = [undefined];
  for (let i = 0; i < holds.length; i += 1) {
    const best = prefix[i];
    prefix.push(best && best.token >= holds[i].token ? best : holds[i]);
  }
  return prefix;
}

/** How many of `sorted` (ascending `start`) started before `at`. */
function startedBefore(sorted: readonly Judged[], at: number): number {
  let lo = 0;
  let hi = sorted.length;
  while (lo < hi) {
    const mid = (lo + hi) >>> 1;
    if (sorted[mid].start < at) lo = mid + 1;
    else hi = mid;
  }
  return lo;
}

/** Rule 2's token order, for the holds of one name in `start` order. */
function checkTokens(list: readonly Judged[], paused: Paused, forgetting: Forgetting, violations: Violation[]): void {
  // The first hold of each owner (its outer hold; re-entries share its token), in start order.
  const seen = new Set<string>();
  const firsts: Judged[] = [];
  for (const hold of list) {
    if (hold.path === 'none' || seen.has(hold.owner)) continue;
    seen.add(hold.owner);
    firsts.push(hold);
  }
  const exclusives = firsts.filter((h) => modeOf(h) === 'exclusive');
  const best = maxTokens(firsts);
  const bestExclusive = maxTokens(exclusives);
  for (const hold of firsts) {
    // a. Holds in hand before this call began, whatever their kinds.
    const candidates = [best[startedBefore(firsts, hold.calledAt)]];
    // b. With an exclusive one of the two: holds in hand before this one, unless it was told by then.
    if (!toldBy(hold, hold.start, paused)) {
      const exclusive = modeOf(hold) === 'exclusive';
      let b = exclusive
        ? best[startedBefore(firsts, hold.start)]
        : bestExclusive[startedBefore(exclusives, hold.start)];
      if (b && b.token >= hold.token && forgetting.losses.length > 0) {
        // b's argument is that the library must have told this hold by its start if another got the
        // lock after it. When Redis forgot this hold's lock, the library has until its time to be
        // told (rule 5), and a hold taken after the loss may have been in hand first: leave out
        // the holds that excuses. Order a (a hold in hand before this call began) stands: a
        // token after a loss is Redis's clock, still past every earlier one (README, "Fencing tokens").
        b = (exclusive ? firsts : exclusives)
          .filter((a) => a.start < hold.start && !forgetting.excuses(hold, a, hold.start))
          .reduce<Judged | undefined>((top, a) => (!top || a.token > top.token ? a : top), undefined);
      }
      candidates.push(b);
    }
    const before = candidates.reduce<Judged | undefined>(
      (top, h) => (h && (!top || h.token > top.token) ? h : top),
      undefined,
    );
    if (before && before.token >= hold.token) {
      violations.push({
        rule: 'fencing',
        text:
          `"${hold.name}": token ${hold.token} of ${describe(hold)}, called at ${fmt(hold.calledAt)}, in at ` +
          `${fmt(hold.start)}, is not larger than ${before.token} of ${describe(before)}, in at ${fmt(before.start)}, ` +
          `which got the lock before it`,
      });
    }
  }
}

/** Rule 2's refused writes, for the holds of one name. */
function checkRefusedWrites(
  list: readonly Judged[],
  paused: Paused,
  forgetting: Forgetting,
  violations: Violation[],
): void {
  for (const hold of list) {
    if (hold.write !== 'refused' || hold.toldBeforeWrite || toldBy(hold, hold.start, paused)) continue;
    // An operator removed it: the holder it was handed on to may have written first.
    if (hold.forcedAt !== undefined && hold.forcedAt < hold.end) continue;
    const by = hold.refusedBy === undefined ? undefined : list.find((h) => h.token === hold.refusedBy);
    // Redis forgot its lock and the one whose token refused it got in while its holder was still
    // within its time to be told (rule 5): the fence did what it is there for.
    if (by && by.owner !== hold.owner && forgetting.excuses(hold, by, by.start)) continue;
    if (modeOf(hold) === 'exclusive') {
      violations.push({
        rule: 'fencing',
        text: `"${hold.name}": the write of ${describe(hold)} was refused as stale while its signal had not aborted`,
      });
      continue;
    }
    if (by && modeOf(by) === 'exclusive') {
      violations.push({
        rule: 'fencing',
        text: `"${hold.name}": the write of ${describe(hold)} was refused by the token of ${describe(by)}, in at ${fmt(by.start)}, while its signal had not aborted`,
      });
    }
  }
}

/** A waiting call: from when it began to when it got the lock or gave up. */
interface Wait {
  readonly worker: number;
  readonly name: string;
  readonly mode: HoldMode;
  readonly permits: number;
  readonly from: number;
  readonly until: number;
}

/**
 * What places left at the front of a line by waiters that are gone may cost a live waiter behind
 * them: the first a grant's lease (the store's GRANT_MS, after which the second in line looks),
 * each further one up to the next attempt of a live waiter (lineRefreshMs, 1 s). README: "A dead
 * head costs a quarter of a second", "two dead waiters at the front 1.26 s".
 */
const deadPlacesCost = (count: number): number => (count === 0 ? 0 : 250 + (count - 1) * 1_000);

/** How long after a call of unknown outcome failed the wake-up rule lets its hold stand in Redis (a watchdog lease). */
const UNKNOWN_HOLD_MS = 300;

function checkWakeUps(
  events: readonly HistoryEvent[],
  holds: readonly Judged[],
  faults: readonly FaultRecord[],
  stalled: Paused,
  forgetting: Forgetting,
  options: CheckOptions,
  violations: Violation[],
): void {
  const waits: Wait[] = [];
  for (const e of events) {
    if (e.kind === 'hold' && e.waitedFrom !== undefined && !e.nested && e.op !== 'multi') {
      const { worker, name, permits = 0 } = e;
      waits.push({ worker, name, mode: modeOf(e), permits, from: e.waitedFrom, until: e.start });
    } else if (e.kind === 'give-up') {
      const { worker, name, permits = 0 } = e;
      waits.push({ worker, name, mode: modeOf(e), permits, from: e.waitedFrom, until: e.at });
    }
  }
  const holdOf = new Map<string, Judged>();
  for (const h of holds) if (!holdOf.has(h.owner)) holdOf.set(h.owner, h);
  const workers = [...new Set(holds.map((h) => h.worker))];
  const releasedAt = new Map<string, number>();
  for (const e of events)
    if (e.kind === 'release') releasedAt.set(e.owner, Math.min(e.at, releasedAt.get(e.owner) ?? e.at));
  for (const release of events) {
    if (release.kind !== 'release') continue;
    const r = release.at;
    // A re-entry of the same owner still running keeps the lock: this release freed nothing yet.
    if (holds.some((h) => h.owner === release.owner && h.end > r)) continue;
    const released = holdOf.get(release.owner);
    // Within its lockAtLeastFor a release leaves the key to expire, which nothing announces; a
    // hold an operator removed was not freed by its release.
    if (released?.lockAtLeastFor && r < released.start + released.lockAtLeastFor + SETTLE_MS) continue;
    if (released?.forcedAt !== undefined) continue;
    const end = r + WAKE_MARGIN_MS;
    // The release was sent as the owner's work ended and is recorded once its reply is back: it
    // freed the lock somewhere in between, and a waiter woken by it may have its handle before
    // the releaser's record (a loaded releaser reads its reply late).
    const sent = Math.max(-Infinity, ...holds.filter((h) => h.owner === release.owner).map((h) => h.end));
    const freedFrom = Math.min(r - 1, sent);
    // Someone may have taken the lock within the margin: a call under way then that got it first
    // (its acquisition reached Redis before its handle came back), or one whose outcome is unknown.
    // One in before the record counts only while it was still in then: one gone before it left
    // the lock free again by then.
    const takers = holds.filter(
      (h) =>
        h.name === release.name &&
        h.owner !== release.owner &&
        h.calledAt <= end &&
        (h.start >= r - 1 || (h.start >= freedFrom && h.end + RELEASE_SLACK_MS > r)),
    );
    const unknown = events.some(
      (e) => e.kind === 'unknown' && e.name === release.name && e.from <= end && e.to + UNKNOWN_HOLD_MS >= r,
    );
    if (unknown) continue;
    // A shared hold's release leaves the holds still in, and those whose release may still be
    // under way (ended their work just before; a recorded release is over).
    const remaining = new Map<string, Judged>();
    if (released && modeOf(released) !== 'exclusive') {
      for (const h of holds) {
        if (h.name !== release.name || h.owner === release.owner || h.start >= r - 1) continue;
        if ((releasedAt.get(h.owner) ?? Infinity) <= r) continue;
        if (h.end + stalled(h.worker, h.end, r) + RELEASE_SLACK_MS > r) remaining.set(h.owner, h);
      }
    }
    const remainingExclusive = [...remaining.values()].some((h) => modeOf(h) === 'exclusive');
    for (const wait of waits) {
      if (wait.name !== release.name || wait.from >= r || wait.until <= end) continue;
      const others = takers.filter((h) => h.worker !== wait.worker || h.calledAt !== wait.from);
      if (wait.mode !== 'permit') {
        // The lock must have been free for it (no shared holder left), and nobody took it.
        if (remaining.size > 0 || others.length > 0) continue;
      } else {
        // A permit is due while the semaphore has room: no exclusive holder or taker, fewer shared
        // holders and takers than its permits, and no exclusive caller (waiting or under way at
        // the release) that may be ahead of it in the lock's line.
        if (remainingExclusive || others.some((h) => modeOf(h) === 'exclusive')) continue;
        if (new Set([...remaining.keys(), ...others.map((h) => h.owner)]).size >= wait.permits) continue;
        const exclusiveAhead =
          holds.some((h) => h.name === wait.name && modeOf(h) === 'exclusive' && h.calledAt < r && h.start > r) ||
          waits.some((w) => w !== wait && w.name === wait.name && w.mode === 'exclusive' && w.from < r && w.until > r);
        if (exclusiveAhead) continue;
      }
      // A fault in any process near the release may hide a hold nobody reports: an acquisition
      // whose answer came later than its lease is given back, not handed out, but held the lock
      // in Redis until then. Such a window proves nothing either way; the rest must be clean.
      if (!quiet(faults, r, options)) continue;
      // Redis forgot the line with the waiter's place in it: nobody is named to look until the
      // waiter takes a new place at its next attempt (rule 5).
      if (forgetting.placeLost(wait, r)) continue;
      // Time the waiter's process (or the releaser's) could not run does not count against it. A
      // permit waits behind the shared waiters ahead of it in the lock's line, who may be stalled.
      const late = wait.until - r;
      const ahead =
        wait.mode === 'permit'
          ? Math.max(...workers.map((w) => (w === wait.worker ? 0 : stalled(w, r, wait.until))))
          : 0;
      // A waiting call whose attempt failed may have left its place ahead of this one: see
      // deadPlacesCost.
      const deadAhead = events.filter(
        (e) =>
          e.kind === 'unknown' &&
          e.name === wait.name &&
          e.waits === true &&
          e.cause !== 'multi' &&
          e.cause !== 'cancelled' &&
          e.from < wait.from &&
          e.to <= wait.until &&
          e.to + PLACE_LAPSE_MS >= r,
      ).length;
      const excused =
        stalled(wait.worker, r, wait.until) +
        stalled(release.worker, r - WAKE_MARGIN_MS, wait.until) +
        ahead +
        deadPlacesCost(deadAhead);
      if (late - excused <= WAKE_MARGIN_MS) continue;
      const next = holds
        .filter((h) => h.name === release.name && h.start > r)
        .reduce<Judged | undefined>((first, h) => (first && first.start <= h.start ? first : h), undefined);
      const kind = wait.mode === 'permit' ? `a permit of ${wait.permits}` : wait.mode;
      // For whoever reads a failing run: who else waited for the name then, and which event loops
      // stood still between the release and the waiter's turn.
      const alongside = waits
        .filter((w) => w !== wait && w.name === wait.name && w.from < wait.until && w.until > r - WAKE_MARGIN_MS)
        .map((w) => `worker ${w.worker} ${w.mode} ${fmt(w.from - r)}..${fmt(w.until - r)}`);
      const standstills = workers
        .map((w) => [w, stalled(w, r - WAKE_MARGIN_MS, wait.until)] as const)
        .filter(([, ms]) => ms > 0)
        .map(([w, ms]) => `worker ${w} ${fmt(ms)} ms`);
      violations.push({
        rule: 'lost-wake-up',
        text:
          `"${release.name}": worker ${release.worker} released it at ${fmt(r)}` +
          (remaining.size > 0 ? ` (${remaining.size} other shared holders still in)` : '') +
          `; worker ${wait.worker}, waiting (${kind}) since ${fmt(wait.from)}, was still waiting ${fmt(late)} ms ` +
          `later (${fmt(excused)} ms of it stalled) and nobody took it` +
          (next ? ` (the next hold: ${describe(next)} at ${fmt(next.start)})` : '') +
          `; others waiting for it, in ms from the release: ${alongside.join(', ') || 'none'}` +
          `; event loops stood still meanwhile: ${standstills.join(', ') || 'none'}`,
      });
    }
  }
}

/**
 * A window of rule 4. `held`: some call may have held the lock in Redis then (a hold from its
 * acquisition to its release, a call of unknown outcome until it was surely given back, an attempt
 * answered too late to be handed out and given back). Otherwise a place in the line: a live
 * waiter's (`since` it began waiting), or one left by a waiter that is gone (`dead`), which keeps
 * newcomers out until it lapses.
 */
interface Window {
  readonly from: number;
  readonly to: number;
  readonly held: boolean;
  readonly dead?: boolean;
  readonly since?: number;
  /** Whose window it is: a hold's owner, or the record of a call. */
  readonly of: string | HistoryEvent;
  readonly what: string;
}

/** The windows of one name, sorted by `from`, with the furthest `to` reached by each prefix. */
class Windows {
  readonly list: Window[];
  private readonly reach: number[] = [];

  constructor(list: Window[]) {
    this.list = list.sort((a, b) => a.from - b.from);
    this.list.forEach((w, i) => this.reach.push(Math.max(w.to, i > 0 ? this.reach[i - 1] : -Infinity)));
  }

  /** The furthest end of the windows that began by `at` (-Infinity: none). */
  reachBy(at: number): number {
    let lo = 0;
    let hi = this.list.length;
    while (lo < hi) {
      const mid = (lo + hi) >>> 1;
      if (this.list[mid].from <= at) lo = mid + 1;
      else hi = mid;
    }
    return lo > 0 ? this.reach[lo - 1] : -Infinity;
  }

  /** Whether a window is open at some point of [from, to]. */
  open(from: number, to: number): boolean {
    return this.reachBy(to) >= from;
  }

  /** The window that reached furthest among those that began by `at`, for messages. */
  lastBy(at: number): Window | undefined {
    return this.list
      .filter((w) => w.from <= at)
      .reduce<Window | undefined>((a, w) => (a && a.to >= w.to ? a : w), undefined);
  }
}

/** A waiting call, for rule 4: from its call to when it got the lock or gave up. */
interface Waiting {
  readonly worker: number;
  readonly name: string;
  readonly from: number;
  readonly until: number;
  readonly of: string | HistoryEvent;
  readonly multi: boolean;
}

/** How far a hold's acquisition, read from its token on Redis's clock, may be off this machine's clock. */
const CLOCK_SLACK_MS = 25;
/** A pause at least this long may have answered an attempt after its lease (250 ms at the least) ran out. */
const LATE_PAUSE_MS = 150;

/** Rule 4: a lock refused, or waited for, while nothing any record explains held it (see the header). */
function checkHeldByNobody(
  events: readonly HistoryEvent[],
  holds: readonly Judged[],
  faults: readonly FaultRecord[],
  stalled: Paused,
  forgetting: Forgetting,
  options: CheckOptions,
  violations: Violation[],
): void {
  const opT = options.operationTimeoutMs;
  /** The longest a first attempt can take to fail: the timeout at hand, as late as the store's sweep notices it. */
  const firstAttemptMs = Math.min(opT, options.commandTimeoutMs ?? Infinity) * 1.1 + SETTLE_MS;
  const faultsOf = new Map<number, FaultRecord[]>();
  for (const f of faults) faultsOf.set(f.worker, [...(faultsOf.get(f.worker) ?? []), f]);
  const pausesOf = new Map<number, PauseRecord[]>();
  for (const e of events) if (e.kind === 'pause') pausesOf.set(e.worker, [...(pausesOf.get(e.worker) ?? []), e]);
  const workers = [...new Set(holds.map((h) => h.worker))];
  /** Whether a fault hit `worker`'s connection within [from, to]. */
  const touched = (worker: number, from: number, to: number): boolean =>
    (faultsOf.get(worker) ?? []).some((f) => f.from <= to && f.to >= from);
  /** When what `worker` sent by `at` has surely reached Redis: after the faults under way then are over. */
  const recovered = (worker: number, at: number): number => {
    let t = at;
    for (let moved = true; moved;) {
      moved = false;
      for (const f of faultsOf.get(worker) ?? []) {
        const reach = f.to + (f.migrated ? MIGRATION_RECOVER_MS : RECOVER_MS);
        if (f.from <= t && reach > t) {
          t = reach;
          moved = true;
        }
      }
    }
    return t;
  };
  /** What `worker` sends as a call returns at `at` has reached Redis by then (its stalls and the proxies' count). */
  const settled = (worker: number, at: number): number =>
    at + SETTLE_MS + stalled(worker, at, at + SETTLE_MS + RECOVER_MS);
  /**
   * Whether what `worker` sent within [from, to] may never have reached Redis: ioredis sends a
   * command again after its connection closed, but not an auto-pipelined one, nor (conservatively)
   * a Cluster's; so only there, and only when a fault closed a connection. A release (or a give-back)
   * lost so leaves the key to its lease.
   */
  const aborted = (worker: number, from: number, to: number): boolean =>
    options.abortsOnReset === true &&
    (faultsOf.get(worker) ?? []).some((f) => f.closes !== false && f.from <= to && f.to >= from - opT);
  /** The longest any process stood still within [from, to]. */
  const anyStalled = (from: number, to: number): number => Math.max(0, ...workers.map((w) => stalled(w, from, to)));
  /** When a hold was taken in Redis, as its token says (Redis's clock in µs), or at the latest its call. */
  const offset = options.redisClockOffsetMs;
  // A multi-lock's part counts from its call: a round that found a later part busy held the earlier
  // ones meanwhile, gave them back and took them again (with new tokens).
  const acquiredAt = (h: Judged): number =>
    offset === undefined || h.op === 'multi'
      ? h.calledAt
      : Math.min(h.start, Math.max(h.calledAt, h.token / 1_000 - offset - CLOCK_SLACK_MS));

  const byName = new Map<string, Window[]>();
  const add = (name: string, w: Window): void => void (byName.get(name) ?? byName.set(name, []).get(name))?.push(w);
  const freedAt = new Map<string, number>();
  for (const e of events) {
    if (e.kind === 'freed' || e.kind === 'release') freedAt.set(e.owner, Math.min(e.at, freedAt.get(e.owner) ?? e.at));
  }
  // Holds, from their acquisition to the release that freed them. Every hold is released (or,
  // within its lockAtLeastFor, has its lease cut to the minimum) as its work ends, lost or not, and
  // nothing sent before that on the connection can re-create the key after it: so, without a fault
  // near, just after its work; with one, the release may have failed, and the key lasts up to a
  // lease after what was sent last reached Redis.
  const byOwner = new Map<string, Judged[]>();
  for (const h of holds) byOwner.set(h.owner, [...(byOwner.get(h.owner) ?? []), h]);
  for (const [owner, list] of byOwner) {
    const first = list[0];
    const from = Math.min(...list.map(acquiredAt));
    const start = Math.min(...list.map((h) => h.start));
    const end = Math.max(...list.map((h) => h.end));
    const minimum = first.lockAtLeastFor ?? 0;
    const freed = freedAt.get(owner);
    const gone = list.find((h) => h.goneBy !== undefined)?.goneBy;
    const released = settled(first.worker, end);
    let to: number;
    if (freed !== undefined) to = freed;
    else if (gone !== undefined) to = gone;
    else {
      to = recovered(first.worker, released);
      if (aborted(first.worker, end, to)) to += first.leaseMs ?? DEFAULT_LEASE_MS;
    }
    if (minimum > 0) to = Math.max(to, start + minimum + SETTLE_MS);
    add(first.name, { from, to, held: true, of: owner, what: `the hold of ${describe(first)}` });
  }
  // Waiters: their place in the line, until just after they got the lock or gave up; and what an
  // attempt of theirs answered after its lease (their process stood still, or a fault delayed it)
  // held until it was given back.
  const waits: Waiting[] = [];
  for (const e of events) {
    if (e.kind === 'hold' && e.waitedFrom !== undefined && !e.nested) {
      const multi = e.op === 'multi';
      waits.push({ worker: e.worker, name: e.name, from: e.waitedFrom, until: e.start, of: e.owner, multi });
    } else if (e.kind === 'give-up') {
      waits.push({ worker: e.worker, name: e.name, from: e.waitedFrom, until: e.at, of: e, multi: false });
    }
  }
  for (const w of waits) {
    const to = recovered(w.worker, settled(w.worker, w.until));
    const what = `the place of worker ${w.worker}'s wait from ${fmt(w.from)}`;
    add(w.name, { from: w.from, to, held: false, since: w.from, of: w.of, what });
    if (aborted(w.worker, w.until, to)) {
      // Its leave may have been dropped with its connection: the place lapses by itself.
      add(w.name, {
        from: to,
        to: to + PLACE_LAPSE_MS,
        held: false,
        dead: true,
        since: w.from,
        of: w.of,
        what: `${what}, left behind`,
      });
    }
    const late = `an attempt of worker ${w.worker}'s wait from ${fmt(w.from)}, answered late`;
    for (const p of [...(pausesOf.get(w.worker) ?? []), ...(pausesOf.get(-1) ?? [])]) {
      if (p.to - p.from < LATE_PAUSE_MS || p.to < w.from || p.from > w.until) continue;
      add(w.name, { from: p.from - SETTLE_MS, to: settled(w.worker, p.to), held: true, of: w.of, what: late });
    }
    // An attempt caught by a fault was sent just before it bit (a reply answers within a round trip
    // otherwise): it held the lock from then until its give-back reached Redis.
    for (const f of faultsOf.get(w.worker) ?? []) {
      if (f.to < w.from || f.from > w.until) continue;
      add(w.name, {
        from: f.from - SETTLE_MS,
        to: recovered(w.worker, settled(w.worker, f.to)),
        held: true,
        of: w.of,
        what: late,
      });
    }
  }
  for (const e of events) {
    if (e.kind === 'unknown') {
      // Given back at once (an attempt on its way when it was cancelled, once it lands: within the
      // operationTimeout near a fault). A waiting call whose attempt failed leaves the place that
      // attempt may have taken to lapse; one that gave up or was cancelled leaves the line.
      const landed = e.cause === 'cancelled' && touched(e.worker, e.from - opT, e.to + opT) ? opT : 0;
      let to = recovered(e.worker, settled(e.worker, e.to) + landed);
      if (aborted(e.worker, e.from, to)) to += e.leaseMs ?? DEFAULT_LEASE_MS;
      const asked = e.mode === 'permit' ? `permit of ${e.permits}` : (e.mode ?? '');
      const what = `worker ${e.worker}'s ${asked} call of unknown outcome (${e.cause ?? '?'})`;
      add(e.name, { from: e.from, to, held: true, of: e, what });
      // Only a first attempt that failed leaves its place behind (the wait after a refused one leaves
      // the line as it ends, queued behind the failed attempt); it failed within the timeout at hand.
      const failed = e.cause !== 'multi' && e.cause !== 'cancelled';
      const firstAttempt = e.multi || e.to - e.from <= firstAttemptMs + stalled(e.worker, e.from, e.to);
      if (e.waits && failed && firstAttempt)
        add(e.name, {
          from: to,
          to: to + PLACE_LAPSE_MS,
          held: false,
          dead: true,
          since: e.from,
          of: e,
          what: `the place left by ${what}`,
        });
    } else if (e.kind === 'busy' && e.at - e.calledAt > SLOW_REFUSAL_MS) {
      add(e.name, {
        from: e.calledAt,
        to: settled(e.worker, e.at),
        held: true,
        of: e,
        what: `worker ${e.worker}'s slow refusal`,
      });
    }
  }
  // Redis restarted without persistence: nobody could take a lock of that server from the kill until
  // it answered again and the clients' connections were back (RECOVER_MS; a created client
  // reconnects at most 400 ms apart), so a waiter kept out meanwhile was kept out by Redis, not by
  // a lock held by nobody. (A FLUSHALL needs nothing here: forgetting only frees locks and places,
  // and what may have held a lock before it is still explained by its records, if for longer.)
  const names = new Set(events.flatMap((e) => ('name' in e ? [e.name] : [])));
  for (const l of forgetting.losses) {
    if (l.kind !== 'restart') continue;
    for (const name of names) {
      if (!forgetting.on(l, name)) continue;
      const what = `the restart of its Redis from ${fmt(l.from)}, back at ${fmt(l.to)}`;
      add(name, { from: l.from, to: l.to + RECOVER_MS, held: true, of: `restart ${l.from}`, what });
    }
  }
  const heldOf = new Map<string, Windows>();
  const lineOf = new Map<string, Windows>();
  for (const [name, list] of byName) {
    heldOf.set(name, new Windows(list.filter((w) => w.held)));
    lineOf.set(name, new Windows(list.filter((w) => !w.held)));
  }
  const none = new Windows([]);
  const lastHeld = (name: string, at: number): string => {
    const w = (heldOf.get(name) ?? none).lastBy(at);
    return w ? `; the last that may have held it: ${w.what}, ${fmt(w.from)}–${fmt(w.to)}` : '; nothing held it before';
  };

  // a. A call that did not wait, refused while nothing may have held the lock, and no waiter stood
  // in its line (a live waiter only just after a hold ended: it takes a lock left free within LINE_GAP_MS).
  const until = options.stoppedAt ?? Infinity;
  for (const e of events) {
    if (e.kind !== 'busy' || e.at - e.calledAt > SLOW_REFUSAL_MS || e.at > until) continue;
    const held = heldOf.get(e.name) ?? none;
    if (held.open(e.calledAt, e.at)) continue;
    const line = lineOf.get(e.name) ?? none;
    const lastEnd = held.reachBy(e.at);
    const free = e.calledAt - lastEnd - anyStalled(lastEnd, e.at);
    const inLine = line.list.some(
      (w) => w.from <= e.at && w.to >= e.calledAt && (w.dead === true || free <= LINE_GAP_MS),
    );
    if (inLine) continue;
    const kind = e.mode === 'permit' ? `a permit of ${e.permits}` : modeOf(e);
    violations.push({
      rule: 'held-by-nobody',
      text:
        `"${e.name}": worker ${e.worker}'s call (${kind}, no wait) at ${fmt(e.calledAt)}–${fmt(e.at)} found it busy, ` +
        `while no record explains a holder` +
        (Number.isFinite(free) ? ` for ${fmt(free)} ms (more the stalls)` : '') +
        ` nor a waiter in its line` +
        lastHeld(e.name, e.at),
    });
  }

  // b. A waiter through a long stretch in which nothing may have held the lock and no waiter was
  // ahead of it (the places of waiters that are gone do not keep a live one out for long: a dead
  // head's grant lapses in 250 ms, and the second in line looks then; finding 9 of issue 20 is a
  // dead shared head that did for seconds).
  for (const w of waits) {
    if (w.multi) continue; // a multi-lock takes its parts one after the other
    const others = (byName.get(w.name) ?? []).filter(
      (c) =>
        c.of !== w.of &&
        (c.held || (c.dead !== true && (c.since ?? Infinity) < w.from)) &&
        c.from < w.until &&
        c.to > w.from,
    );
    others.sort((a, b) => a.from - b.from);
    let at = w.from;
    const gaps: [number, number][] = [];
    for (const c of others) {
      if (c.from > at) gaps.push([at, Math.min(c.from, w.until)]);
      at = Math.max(at, c.to);
      if (at >= w.until) break;
    }
    if (at < w.until) gaps.push([at, w.until]);
    // Once the run stopped, processes shut down and what they still had queued may never be sent.
    for (const gap of gaps) gap[1] = Math.min(gap[1], until);
    // Places left ahead of it by waiters that are gone: each costs it a grant's lease and, when the
    // second in line is gone too, up to the next attempt of a live waiter (README: two dead waiters
    // at the front, 1.26 s), until it lapses by itself.
    const dead = (byName.get(w.name) ?? []).filter((c) => c.dead === true && (c.since ?? Infinity) < w.from);
    for (const [x, y] of gaps) {
      const deadAhead = dead.filter((c) => c.from < y && c.to > x).length;
      if (y - x - stalled(w.worker, x, y) <= LINE_GAP_MS + deadPlacesCost(deadAhead)) continue;
      violations.push({
        rule: 'held-by-nobody',
        text:
          `"${w.name}": worker ${w.worker}, waiting since ${fmt(w.from)} (until ${fmt(w.until)}), ` +
          `did not get it in ${fmt(y - x)} ms (${fmt(x)}–${fmt(y)}, ${fmt(stalled(w.worker, x, y))} ms of it stalled) ` +
          `while no record explains a holder or a waiter ahead of it` +
          lastHeld(w.name, x),
      });
      break;
    }
  }
}

/** Whether no fault, in any process, came near a release at `r` (see the wake-up rule). */
function quiet(faults: readonly FaultRecord[], r: number, options: CheckOptions): boolean {
  const from = r - options.operationTimeoutMs;
  return !faults.some((f) => !f.operator && f.from <= r + WAKE_MARGIN_MS && f.to + options.operationTimeoutMs >= from);
}

/** Releases the wake-up rule judges: those no fault came near. */
export function quietReleases(
  events: readonly HistoryEvent[],
  faults: readonly FaultRecord[],
  options: CheckOptions,
): number {
  return events.filter((e) => e.kind === 'release' && quiet(faults, e.at, options)).length;
}

/** How much the shared holds of a run actually shared (to show that a run exercised them). */
export interface Sharing {
  /** Most readers of one name in at once, none of them told. */
  readonly readers: number;
  /** Permit holds that got in with their semaphore then full (`permits` - 1 others in, none told). */
  readonly fullSemaphores: number;
}

export function sharing(events: readonly HistoryEvent[]): Sharing {
  const holds = events
    .filter((e): e is HoldRecord => e.kind === 'hold' && e.lostAt === undefined && modeOf(e) !== 'exclusive')
    .sort((a, b) => a.start - b.start);
  let readers = 0;
  let fullSemaphores = 0;
  const active: HoldRecord[] = [];
  for (const later of holds) {
    for (let i = active.length - 1; i >= 0; i -= 1) if (active[i].end <= later.start) active.splice(i, 1);
    const owners = new Set(active.filter((h) => h.name === later.name && h.owner !== later.owner).map((h) => h.owner));
    if (later.mode === 'read') readers = Math.max(readers, owners.size + 1);
    if (later.mode === 'permit' && !later.nested && owners.size + 1 === later.permits) fullSemaphores += 1;
    active.push(later);
  }
  return { readers, fullSemaphores };
}

/** What a run drew and did beyond holds, counted (to show that its draws happened). */
export interface Draws {
  readonly forceUnlocks: number;
  /** forceUnlock calls that failed (their outcome unknown). */
  readonly forceUnlocksUnknown: number;
  /** Holds a forceUnlock returned as removed. */
  readonly forcedHolds: number;
  readonly cancelledObservables: number;
  /** Calls rejected by ioredis's own commandTimeout ("Command timed out"). */
  readonly commandTimeouts: number;
  readonly syncWorkHolds: number;
  readonly longestSyncMs: number;
  readonly lockAtLeastForHolds: number;
  readonly longLeaseHolds: number;
  /** Calls that did not wait and found the lock busy. */
  readonly busy: number;
  /** Outer holds by the public call that took them. */
  readonly calls: Readonly<Record<string, number>>;
}

export function draws(events: readonly HistoryEvent[]): Draws {
  const holds = events.filter((e): e is HoldRecord => e.kind === 'hold');
  const forced = events.filter((e): e is ForceUnlockRecord => e.kind === 'force-unlock');
  const unknown = events.filter((e): e is UnknownRecord => e.kind === 'unknown');
  const calls: Record<string, number> = {};
  for (const h of holds) if (!h.nested && h.call) calls[h.call] = (calls[h.call] ?? 0) + 1;
  const synced = holds.filter((h) => (h.syncMs ?? 0) > 0);
  return {
    forceUnlocks: forced.length,
    forceUnlocksUnknown: forced.filter((f) => f.removed === undefined).length,
    forcedHolds: forced.reduce((sum, f) => sum + (f.removed?.length ?? 0), 0),
    cancelledObservables: unknown.filter((u) => u.cause === 'cancelled').length,
    commandTimeouts: unknown.filter((u) => u.cause === 'command-timeout').length,
    syncWorkHolds: synced.length,
    longestSyncMs: Math.max(0, ...synced.map((h) => h.syncMs ?? 0)),
    lockAtLeastForHolds: holds.filter((h) => !h.nested && (h.lockAtLeastFor ?? 0) > 0).length,
    longLeaseHolds: holds.filter((h) => !h.nested && !pauseCanEnd(h)).length,
    busy: events.filter((e) => e.kind === 'busy').length,
    calls,
  };
}

/** A one-line summary of a run, for logs. */
export function summarize(events: readonly HistoryEvent[], faults: readonly FaultRecord[]): string {
  const holds = events.filter((e): e is HoldRecord => e.kind === 'hold');
  const count = (predicate: (h: HoldRecord) => boolean): number => holds.filter(predicate).length;
  const drawn = draws(events);
  const wide =
    Object.keys(drawn.calls).length > 0
      ? `; calls [${Object.entries(drawn.calls)
          .map(([call, n]) => `${call} ${n}`)
          .join(', ')}], ${drawn.busy} refused without waiting, ` +
        `${drawn.forceUnlocks} forceUnlocks (${drawn.forcedHolds} holds removed, ${drawn.forceUnlocksUnknown} unknown), ` +
        `${drawn.cancelledObservables} Observables unsubscribed before their lock, ` +
        `${drawn.commandTimeouts} ioredis command timeouts, ` +
        `${drawn.syncWorkHolds} holds began with sync work (up to ${drawn.longestSyncMs.toFixed(0)} ms), ` +
        `${drawn.lockAtLeastForHolds} with lockAtLeastFor, ${drawn.longLeaseHolds} on a long watchdog lease`
      : '';
  const kinds = new Map<string, number>();
  const injected = faults.filter((f) => !f.forgot && !f.migrated);
  for (const f of injected) kinds.set(f.kind, (kinds.get(f.kind) ?? 0) + 1);
  const losses = lossesOf(faults);
  const forgot =
    losses.length === 0
      ? ''
      : `; Redis forgot its locks ${losses.length} times (${losses
          .map(
            (l) =>
              `${l.kind === 'restart' ? 'restart' : 'FLUSHALL'}${l.names ? ` of ${l.names.size} names` : ''} back after ${fmt(l.to - l.from)} ms`,
          )
          .join(', ')})`;
  const legs = migrationsOf(faults);
  const midway = legs.filter((m) => m.stalledMs > 0);
  const migrated =
    legs.length === 0
      ? ''
      : `; slots of ${legs.filter((m) => !m.back).length} sets of 1-3 names migrated and back (${legs.length} moves, ` +
        `${midway.length} stopped mid-way${midway.length > 0 ? ` up to ${fmt(Math.max(...midway.map((m) => m.stalledMs)))} ms` : ''}, ` +
        `longest ${fmt(Math.max(...legs.map((m) => m.to - m.from)))} ms)`;
  const ops = new Map<string, number>();
  for (const h of holds) if (!h.nested) ops.set(h.op ?? 'mutex', (ops.get(h.op ?? 'mutex') ?? 0) + 1);
  const pauseRecords = events.filter((e): e is PauseRecord => e.kind === 'pause');
  const pauses = pauseRecords.length;
  const stalled = pauseRecords.reduce((sum, p) => sum + p.to - p.from, 0);
  const family =
    ops.size > 1 || !ops.has('mutex')
      ? (() => {
          const shared = sharing(events);
          return (
            ` [${[...ops].map(([op, n]) => `${op} ${n}`).join(', ')}; up to ${shared.readers} readers at once, ` +
            `${shared.fullSemaphores} permits taken with the semaphore full, ` +
            `${count((h) => h.lostAt !== undefined && h.lostAt <= h.start)} handed out already told]`
          );
        })()
      : '';
  return (
    `${holds.length} holds (${count((h) => h.nested)} nested, ${count((h) => h.lostAt !== undefined)} lost, ` +
    `${count((h) => h.waitedFrom !== undefined)} after waiting)${family}${wide}, ` +
    `${events.filter((e) => e.kind === 'give-up').length} waits ran out, ` +
    `${events.filter((e) => e.kind === 'unknown').length} outcomes unknown, ` +
    `${events.filter((e) => e.kind === 'release').length} releases, ` +
    `fenced writes ${count((h) => h.write === 'accepted')} accepted / ${count((h) => h.write === 'refused')} refused; ` +
    `${injected.length} faults (${[...kinds].map(([k, n]) => `${k} ${n}`).join(', ')})${forgot}${migrated}; ` +
    `event loops stood still ${pauses} times (${stalled.toFixed(0)} ms in all)`
  );
}
