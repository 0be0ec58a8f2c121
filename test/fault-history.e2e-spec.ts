/**
 * The randomized history check (test/support/history/): three processes, each a Nest app behind
 * its own fault proxies, take locks every way the library offers (the whole lock family, through
 * `@DisLock` on Promise, Observable and untyped methods, `withLock`, `tryLock` and `lock`, with
 * `lockAtLeastFor` now and then, Observables unsubscribed before their lock came, critical sections
 * that begin with synchronous work), with the client options their seed drew (`operationTimeout`
 * 50 ms-5 s, ioredis's `commandTimeout`, auto-pipelining), while an operator force-unlocks now and
 * then and random faults hit every connection, on one Redis and on a 3-master Cluster. The checker
 * then looks for two holders at once, fencing tokens out of order, lost wake-ups and locks held by
 * nobody. Now and then Redis forgets its locks mid-run (a restart without persistence, FLUSHALL; on
 * a Cluster one master): every holder it took them from must be told within LOSS_TELL_MS of Redis
 * being back (seeds 3 and 11 draw one restart and one FLUSHALL each). On the Cluster, the slots of
 * 1-3 names move to another master and back, now and then stopped mid-way (MIGRATING, half of
 * their keys moved) for up to 2 s (issue 25). Fixed seeds here (a failure prints its seed: replay it with
 * `npm run stress -- --faults --topology single --seed N --minutes 1`, or `--topology cluster`);
 * random ones in `npm run stress -- --faults`.
 */
import {
  checkHistory,
  draws,
  type HistoryEvent,
  type HoldRecord,
  lateReportFrom,
  LOSS_TELL_MS,
  lossesOf,
  migrationsOf,
  sharing,
} from './support/history/history';
import { type HistoryRun, lossPlan, migrationPlan, runHistory, type Topology } from './support/history/run-history';

/** Each seed runs this long, start-up and shutdown not counted (5-15 s more, on a busy machine). */
const RUN_MS = 10_000;

/** Seeds in which each forged history below was flagged more than the history as it was; most readers in at once. */
const shown = { forced: 0, nobody: 0, longLease: 0, readers: 0, toldLate: 0 };

/** The data losses each topology's seeds met (rule 5): CI's seeds 3 and 11 draw a restart and a FLUSHALL each. */
const forgot: Record<Topology, Set<string>> = { single: new Set(), cluster: new Set() };

/**
 * Observables unsubscribed before their lock came, by topology. Counted over the seeds, not asked
 * of each: a cancellation is a timer racing the lock's arrival, and on a loaded machine a seed can
 * see every lock come first.
 */
const cancelled: Record<Topology, number> = { single: 0, cluster: 0 };

/** The Cluster seeds' slot migrations (there and back), and how many of those moves stopped mid-way. */
const migrated = { moves: 0, midway: 0 };

const count = (run: HistoryRun, events: readonly HistoryEvent[], rule: string): number =>
  checkHistory(events, run.faults, run.check).filter((v) => v.rule === rule).length;

/**
 * The same history, told wrong, is flagged more by the new rules (counted in `shown`, asserted over
 * all seeds below; a seed may lack what one of them forges):
 * - no operator's call removed anything: a hold one did remove, with a later holder beside it, is
 *   then an overlap;
 * - nobody held or waited for the name of the first refusal: that refusal is then a lock held by
 *   nobody;
 * - every hold on a long lease: a paused holder with a second holder beside it is then not excused;
 * - where Redis forgot its locks (a restart without persistence, FLUSHALL), the last hold taken
 *   before it on a name it took (its token older than the loss) working on past it, told at least
 *   LOSS_TELL_MS and a half after Redis was back and past what the checker excuses (its loop's
 *   stalls, faults on its connection): rule 5 then flags it ('told-late'). (A real hold
 *   caught mid-flight by the loss is not there in every seed: most sections last a few ms.)
 */
function forgeries(run: HistoryRun): void {
  const overlaps = count(run, run.events, 'overlap');
  const unforced = run.events.filter((e) => e.kind !== 'force-unlock');
  if (count(run, unforced, 'overlap') > overlaps) shown.forced += 1;
  const refused = run.events.find((e) => e.kind === 'busy');
  if (refused) {
    const nobody = run.events.filter(
      (e) => !(e.kind === 'hold' || e.kind === 'give-up' || e.kind === 'unknown') || e.name !== refused.name,
    );
    if (count(run, nobody, 'held-by-nobody') > count(run, run.events, 'held-by-nobody')) shown.nobody += 1;
  }
  const longLease = run.events.map((e) =>
    e.kind === 'hold' ? { ...e, leaseMs: 30_000, renewed: true, lockAtLeastFor: undefined } : e,
  );
  if (count(run, longLease, 'overlap') > overlaps) shown.longLease += 1;
  const offset = run.check.redisClockOffsetMs ?? 0;
  const late = new Map<HoldRecord, number>();
  for (const loss of lossesOf(run.faults)) {
    const before = run.events.filter(
      (e): e is HoldRecord =>
        e.kind === 'hold' &&
        !e.nested &&
        (loss.names === undefined || loss.names.has(e.name)) &&
        Math.min(e.start, e.token / 1_000 - offset) < loss.from - 50,
    );
    const last = before.reduce<HoldRecord | undefined>((a, h) => (a && a.start >= h.start ? a : h), undefined);
    // Told once late with every excuse counted: on a loaded machine a holder whose loop stood
    // still for half a second since Redis was back is excused that much (a fixed "1.5 s after"
    // was, in both of two copies of this file run side by side).
    if (last)
      late.set(
        last,
        lateReportFrom(run.events, run.faults, run.check, last.worker, loss, loss.to + LOSS_TELL_MS * 1.5),
      );
  }
  if (late.size > 0) {
    const forged = run.events.map((e): HistoryEvent => {
      const told = e.kind === 'hold' ? late.get(e) : undefined;
      return e.kind !== 'hold' || told === undefined ? e : { ...e, lostAt: told, end: Math.max(e.end, told + 100) };
    });
    if (count(run, forged, 'told-late') > count(run, run.events, 'told-late')) shown.toldLate += 1;
  }
}

function expectWidened(run: HistoryRun, seed: number, topology: Topology): void {
  console.log(`seed ${seed}: ${run.summary}`);
  const holds = run.events.filter((e): e is HoldRecord => e.kind === 'hold');
  const drawn = draws(run.events);
  // A run that took few locks, met no faults or skipped a draw would prove little.
  expect(holds.length).toBeGreaterThan(60);
  expect(run.faults.length).toBeGreaterThan(15);
  expect(new Set(holds.map((h) => h.op))).toEqual(new Set(['mutex', 'write', 'read', 'permit', 'multi']));
  expect(holds.some((h) => h.lostAt !== undefined)).toBe(true);
  expect(holds.some((h) => h.waitedFrom !== undefined)).toBe(true);
  expect(drawn.forceUnlocks).toBeGreaterThan(0);
  cancelled[topology] += drawn.cancelledObservables;
  expect(drawn.syncWorkHolds).toBeGreaterThan(0);
  expect(drawn.lockAtLeastForHolds).toBeGreaterThan(0);
  expect(drawn.longLeaseHolds).toBeGreaterThan(0);
  expect(drawn.busy).toBeGreaterThan(0);
  expect(Object.keys(drawn.calls).sort()).toEqual(['either', 'lock', 'observable', 'promise', 'tryLock', 'withLock']);
  expect(run.topology).toBe(topology);
  // Every data loss the seed drew happened (rule 5).
  const losses = lossesOf(run.faults);
  expect(losses.map((l) => l.kind).sort()).toEqual(
    lossPlan(seed, RUN_MS, topology)
      .map((p) => p.kind)
      .sort(),
  );
  for (const l of losses) forgot[topology].add(l.kind);
  // Every slot migration the seed drew happened, there and back (a Cluster's faults).
  const legs = migrationsOf(run.faults);
  const planned = topology === 'cluster' ? migrationPlan(seed, RUN_MS, run.names.length).length : 0;
  expect(legs.filter((m) => !m.back).length).toBe(planned);
  expect(legs.filter((m) => m.back).length).toBeGreaterThanOrEqual(planned);
  migrated.moves += legs.length;
  migrated.midway += legs.filter((m) => m.stalledMs > 0).length;
  forgeries(run);
  expect(run.violations.map((v) => `seed ${seed} (${topology}), ${v.rule}: ${v.text}`)).toEqual([]);
}

describe('randomized lock history under network faults', () => {
  it.each([1, 2, 3])(
    'one Redis, seed %i: no two holders, tokens in order, no lost wake-up, no lock held by nobody',
    async (seed) => {
      const run = await runHistory({ seed, durationMs: RUN_MS });
      shown.readers = Math.max(shown.readers, sharing(run.events).readers);
      expectWidened(run, seed, 'single');
    },
    150_000,
  );

  it.each([11, 12])(
    'a 3-master Cluster, seed %i, faults on every node through natMap: the same',
    async (seed) => {
      const run = await runHistory({ seed, durationMs: RUN_MS, topology: 'cluster' });
      expectWidened(run, seed, 'cluster');
    },
    150_000,
  );

  it('the forged histories were flagged in at least one seed each (the new rules can fail), readers shared, Observables cancelled and Redis forgot on both topologies', () => {
    console.log(`forgeries flagged in: ${JSON.stringify(shown)} seeds`);
    expect(shown.readers).toBeGreaterThanOrEqual(2);
    expect(shown.nobody).toBeGreaterThan(0);
    expect(shown.forced).toBeGreaterThan(0);
    expect(shown.longLease).toBeGreaterThan(0);
    expect(shown.toldLate).toBeGreaterThan(0);
    expect([...forgot.single].sort()).toEqual(['flushall', 'restart']);
    expect([...forgot.cluster].sort()).toEqual(['flushall', 'restart']);
    // Observables were unsubscribed before their lock came, on both topologies.
    console.log(`cancelled Observables: ${JSON.stringify(cancelled)}`);
    expect(cancelled.single).toBeGreaterThan(0);
    expect(cancelled.cluster).toBeGreaterThan(0);
    // The Cluster seeds moved slots of their names, some of the moves stopped mid-way (MIGRATING).
    console.log(`slot migrations: ${JSON.stringify(migrated)}`);
    expect(migrated.moves).toBeGreaterThan(0);
    expect(migrated.midway).toBeGreaterThan(0);
  });

  it('without faults, every rule holds with nothing excused: each release wakes a waiter within 200 ms', async () => {
    const run = await runHistory({ seed: 5, durationMs: 8_000, faults: false });
    console.log(`seed 5, no faults: ${run.summary}`);
    expect(run.quietReleases).toBeGreaterThan(20);
    expect(run.violations.map((v) => `seed 5, ${v.rule}: ${v.text}`)).toEqual([]);
  }, 90_000);

  it('the checker sees the overlaps of the same work done without a lock (the control run)', async () => {
    const run = await runHistory({ seed: 4, durationMs: 2_000, plain: true, lockless: true, faults: false });
    expect(run.violations.some((v) => v.rule === 'overlap')).toBe(true);
  }, 60_000);
});
