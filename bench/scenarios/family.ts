/**
 * The lock family (`--only family`): nestjs-dislock's semaphore, read-write lock and multi-lock,
 * each against its closest peer measured in the same run:
 * - semaphore: `lock(name, { permits: 4 })` against redis-semaphore's `Semaphore` (limit 4), 16
 *   workers on one name (1 process x 16, 4 x 4), hold 0 and 2 ms; and uncontended (a name per loop).
 * - rw: 90% reads, 10% writes, 16 workers on one name: `lock(name, { mode })` against nestjs-dislock's
 *   plain lock for every operation (what sharing among readers buys).
 * - multi: `lock([a, b])` against `lock(a)` then `lock(b)`, uncontended.
 * Every turn's critical section is timestamped on the machine-wide clock, and the merged turns are
 * checked for more holders than the lock allows (semaphore: more than 4; read-write: a writer with
 * anyone; mutex: any two).
 */
import { type Access, createFamilyLocker, PERMITS } from '../contenders/family';
import type { Timing } from '../plan';
import { hr, sleep, sleepUntil } from '../support/clock';
import { type InfoDelta, perCommand, plainClient, ready, serverUrl } from '../support/redis';
import type { CellSpec, ContenderId, FamilyCase, Metrics, RedisTarget } from '../support/protocol';
import { jain, percentile, sortedCopy } from '../support/stats';
import { type CellRun, describeError } from './cell-run';
import { measureWindow } from './contended';
import { setupUncontended, type UncontendedPart, uncontendedMetrics } from './uncontended';

/** [processes, workers per process]: 16 workers on one name, in one process and over 4. */
export const FAMILY_LAYOUTS = [
  [1, 16],
  [4, 4],
] as const;
/** Critical section of the contended cases: none at all, and a ~2 ms timer await. */
export const FAMILY_HOLD_MS = [0, 2] as const;
export const FAMILY_UNCONTENDED_CONCURRENCY = [1, 64] as const;
/** Read-write case: every 10th turn of a worker is a write (staggered over the workers): 10% writes. */
export const WRITE_EVERY = 10;

/** Each case's closest peer, the baseline of its ratios; listed first in `FAMILY_CONTENDERS`. */
export const FAMILY_BASELINE: Record<FamilyCase, ContenderId> = {
  semaphore: 'redis-semaphore',
  'semaphore-uncontended': 'redis-semaphore',
  rw: 'dislock-mutex',
  multi: 'dislock-two-locks',
};

const FAMILY_CONTENDERS: Record<FamilyCase, readonly ContenderId[]> = {
  semaphore: ['redis-semaphore', 'dislock-semaphore'],
  'semaphore-uncontended': ['redis-semaphore', 'dislock-semaphore'],
  rw: ['dislock-mutex', 'dislock-rw'],
  multi: ['dislock-two-locks', 'dislock-multi'],
};

/** The part of a cell id after the contender that names the case. */
const TAG: Record<FamilyCase, string> = { semaphore: 'sem', 'semaphore-uncontended': 'sem', rw: 'rw', multi: 'multi' };

const contended = (family: FamilyCase | undefined): boolean => family === 'semaphore' || family === 'rw';

/** The family group's cells, in the order they run within one repeat (the baseline first in each block). */
export function familyCells(timing: Timing): CellSpec[] {
  const cells: CellSpec[] = [];
  const add = (family: FamilyCase, name: string, rest: Partial<CellSpec>): void => {
    for (const contender of FAMILY_CONTENDERS[family]) {
      cells.push({
        id: `family/${contender}/${TAG[family]}/${name}`,
        group: 'family',
        scenario: 'family',
        family,
        contender,
        processes: 1,
        workers: 1,
        holdMs: 0,
        thinkMs: 0,
        locks: 0,
        ...timing,
        ...rest,
      });
    }
  };
  for (const family of ['semaphore', 'rw'] as const) {
    for (const [processes, workers] of FAMILY_LAYOUTS) {
      for (const holdMs of FAMILY_HOLD_MS) {
        add(family, `${processes}x${workers}/hold${holdMs}`, { processes, workers, holdMs });
      }
    }
  }
  for (const family of ['semaphore-uncontended', 'multi'] as const) {
    for (const concurrency of FAMILY_UNCONTENDED_CONCURRENCY) add(family, `c${concurrency}`, { workers: concurrency });
  }
  return cells;
}

const KEY = 'f:hot';

/**
 * One critical section, times in ms after `t0` on the machine-wide monotonic clock: [worker
 * (global), wanted, acquired (body began), released (body ended, release sent next), answered
 * (release answered), 1 for a write turn of the read-write case else 0].
 */
type Turn = [number, number, number, number, number, number];

export interface FamilyTurnsPart {
  readonly turns: Turn[];
  /** When a wait ran out (the worker then tries again). */
  readonly failures: number[];
  readonly cpuUs: number;
  readonly sent: number;
  /** Rank 0 only. */
  readonly info?: InfoDelta;
  readonly errors: number;
  readonly firstError?: string;
  readonly logged: { warnings: number; errors: number; first: string[] };
}

export type FamilyPart = FamilyTurnsPart | UncontendedPart;

export async function setupFamily(spec: CellSpec, rank: number, target: RedisTarget): Promise<CellRun> {
  if (!contended(spec.family)) {
    // Uncontended cases: the uncontended group's loops, with the family's contender.
    return setupUncontended(spec, rank, target, await createFamilyLocker(spec.contender, 'uncontended', target));
  }
  const locker = await createFamilyLocker(spec.contender, 'contended', target);
  const admin = rank === 0 ? plainClient(serverUrl(target), `bench-admin-${process.pid}`) : undefined;
  if (admin) await ready(admin);
  return {
    async go(t0: number): Promise<FamilyTurnsPart> {
      const start = t0 + spec.warmupMs;
      const end = start + spec.measureMs;
      const at = (): number => hr() - t0;
      const turns: Turn[] = [];
      const failures: number[] = [];
      let errors = 0;
      let firstError: string | undefined;

      const window = measureWindow(start, end, locker, admin);
      window.catch(() => undefined); // awaited below

      const worker = async (id: number): Promise<void> => {
        await sleepUntil(t0);
        for (let n = 0; hr() < end; n += 1) {
          const access: Access = spec.family === 'rw' && (n + id) % WRITE_EVERY === 0 ? 'write' : 'read';
          const wanted = at();
          for (;;) {
            let acquired = NaN;
            let released = NaN;
            let ok: boolean;
            try {
              ok = await locker.critical(
                KEY,
                async () => {
                  acquired = at();
                  if (spec.holdMs > 0) await sleep(spec.holdMs);
                  released = at();
                },
                access,
              );
            } catch (error) {
              errors += 1;
              firstError ??= describeError(error);
              if (errors > 100) throw new Error(`too many errors, the first: ${firstError}`);
              ok = false;
            }
            if (ok) {
              turns.push([id, wanted, acquired, released, at(), access === 'write' ? 1 : 0]);
              break;
            }
            failures.push(at());
            if (hr() >= end) break;
          }
        }
      };

      const base = rank * spec.workers;
      await Promise.all(Array.from({ length: spec.workers }, (_, i) => worker(base + i)));
      return { turns, failures, ...(await window), errors, firstError, logged: locker.logged() };
    },
    async close() {
      await locker.close();
      await admin?.quit();
    },
  };
}

/**
 * Holds beyond what the lock allows, over every turn of the cell (warm-up included), by a sweep
 * over the critical sections' [acquired, released] intervals. Each interval lies inside the real
 * hold (acquired after the acquisition was answered, released before the release is sent), so an
 * overlap seen here is a real one. A shared hold may overlap `limit - 1` other shared holds and no
 * exclusive one; an exclusive hold, nothing.
 */
function sweep(
  turns: readonly Turn[],
  exclusive: (turn: Turn) => boolean,
  limit: number,
): { violations: number; maxHolders: number } {
  // [time, +1 acquired / -1 released, exclusive]; at equal times a release goes first.
  const events: [number, number, boolean][] = [];
  for (const turn of turns) {
    const ex = exclusive(turn);
    events.push([turn[2], 1, ex], [turn[3], -1, ex]);
  }
  events.sort((a, b) => a[0] - b[0] || a[1] - b[1]);
  let shared = 0;
  let exclusives = 0;
  let violations = 0;
  let maxHolders = 0;
  for (const [, delta, ex] of events) {
    if (delta > 0 && (ex ? shared + exclusives > 0 : exclusives > 0 || shared >= limit)) violations += 1;
    if (ex) exclusives += delta;
    else shared += delta;
    maxHolders = Math.max(maxHolders, shared + exclusives);
  }
  return { violations, maxHolders };
}

function turnsMetrics(spec: CellSpec, parts: readonly FamilyTurnsPart[]): Metrics {
  const windowStart = spec.warmupMs;
  const windowEnd = windowStart + spec.measureMs;
  const inWindow = (time: number): boolean => time >= windowStart && time < windowEnd;
  const turns = parts.flatMap((part) => part.turns);
  const counted = turns.filter((turn) => inWindow(turn[2]));
  const waits = (write?: number): Float64Array =>
    sortedCopy(counted.filter((turn) => write === undefined || turn[5] === write).map((turn) => turn[2] - turn[1]));
  const all = waits();
  const reads = waits(0);
  const writes = waits(1);
  // What the lock allows: the semaphore, 4 holders; the read-write lock, readers together or one
  // writer; the plain mutex, one holder whatever the turn asked for.
  const { violations, maxHolders } =
    spec.family === 'semaphore'
      ? sweep(turns, () => false, PERMITS)
      : spec.contender === 'dislock-rw'
        ? sweep(turns, (turn) => turn[5] === 1, Infinity)
        : sweep(turns, () => true, 1);
  const perWorker = new Array<number>(spec.processes * spec.workers).fill(0);
  for (const turn of counted) perWorker[turn[0]] += 1;
  const held = counted.reduce((sum, turn) => sum + Math.min(turn[3], windowEnd) - turn[2], 0);
  const ops = Math.max(1, counted.length);
  const info = parts[0].info;
  return {
    opsPerSec: counted.length / (spec.measureMs / 1000),
    waitP50Ms: percentile(all, 50),
    waitP99Ms: percentile(all, 99),
    readWaitP50Ms: percentile(reads, 50),
    readWaitP99Ms: percentile(reads, 99),
    writeWaitP50Ms: percentile(writes, 50),
    writeWaitP99Ms: percentile(writes, 99),
    longestWaitMs: all.length > 0 ? all[all.length - 1] : NaN,
    jain: jain(perWorker),
    writesPct: (100 * writes.length) / ops,
    maxHolders,
    meanHolders: held / spec.measureMs,
    redisCallsPerOp: info ? info.totalCalls / ops : NaN,
    roundTripsPerOp: parts.reduce((sum, part) => sum + part.sent, 0) / ops,
    cpuUsPerOp: parts.reduce((sum, part) => sum + part.cpuUs, 0) / ops,
    failures: parts.reduce((sum, part) => sum + part.failures.filter(inWindow).length, 0),
    violations,
    errors: parts.reduce((sum, part) => sum + part.errors, 0),
    warnings: parts.reduce((sum, part) => sum + part.logged.warnings, 0),
    ...perCommand(info, ops),
  };
}

/** Merges the parts of every process of the cell. `opsPerSec` is every case's throughput (the chart's). */
export function familyMetrics(spec: CellSpec, parts: readonly FamilyPart[]): Metrics {
  if (contended(spec.family)) return turnsMetrics(spec, parts as FamilyTurnsPart[]);
  const metrics = uncontendedMetrics(parts as UncontendedPart[]);
  return { ...metrics, opsPerSec: metrics.cyclesPerSec };
}

export function familyHeadline(spec: CellSpec, m: Metrics): string {
  if (!contended(spec.family)) return `${Math.round(m.cyclesPerSec)} cycles/s, p99 ${Math.round(m.p99Us)} us`;
  return (
    `${Math.round(m.opsPerSec)} acquisitions/s, acquire p50 ${m.waitP50Ms.toFixed(2)} ms p99 ${m.waitP99Ms.toFixed(2)} ms, ` +
    `max holders ${m.maxHolders}, violations ${m.violations}, errors ${m.errors}`
  );
}
