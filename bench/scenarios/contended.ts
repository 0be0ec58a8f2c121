import type { Redis } from 'ioredis';
import { createLocker } from '../contenders/locker';
import { cpuMicros, hr, sleep, sleepUntil } from '../support/clock';
import {
  adminClients,
  clusterMetrics,
  type InfoDelta,
  infoDelta,
  infoSnapshot,
  perCommand,
  ready,
} from '../support/redis';
import type { CellSpec, Metrics, RedisTarget } from '../support/protocol';
import { jain, percentile, sortedCopy } from '../support/stats';
import { type CellRun, describeError } from './cell-run';

const KEY = 'c:hot';

/**
 * One critical section, times in ms after `t0` on the machine-wide monotonic clock:
 * [worker (global), wanted (started trying), acquired (body began), released (body ended, release
 * sent next), answered (release answered)].
 */
type Turn = [number, number, number, number, number];

export interface ContendedPart {
  readonly turns: Turn[];
  /** When a contender gave up waiting (its whole wait ran out); the worker then tries again. */
  readonly failures: number[];
  readonly cpuUs: number;
  readonly sent: number;
  /** Rank 0 only. */
  readonly info?: InfoDelta;
  readonly errors: number;
  readonly firstError?: string;
  readonly logged: { warnings: number; errors: number; first: string[] };
}

/**
 * `spec.workers` workers in this process (and as many in each of the cell's other processes) take
 * turns on one key: acquire (waiting as the contender does), hold for `holdMs` (a real timer
 * await), release, pause `thinkMs`, again. New turns start until the window ends; a worker still
 * waiting then finishes its turn (bounded by the contender's own wait).
 */
export async function setupContended(spec: CellSpec, rank: number, target: RedisTarget): Promise<CellRun> {
  const locker = await createLocker(spec.contender, 'contended', target);
  // INFO of the server, or of every master of the Cluster (summed).
  const admin = rank === 0 ? adminClients(target, `bench-admin-${process.pid}`) : undefined;
  if (admin) await Promise.all(admin.map((client) => ready(client)));
  return {
    async go(t0: number): Promise<ContendedPart> {
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
        while (hr() < end) {
          const wanted = at();
          // Try until this turn is had: a contender whose wait ran out counts a failure and tries again.
          for (;;) {
            let acquired = NaN;
            let released = NaN;
            let ok: boolean;
            try {
              ok = await locker.critical(KEY, async () => {
                acquired = at();
                await sleep(spec.holdMs);
                released = at();
              });
            } catch (error) {
              errors += 1;
              firstError ??= describeError(error);
              if (errors > 100) throw new Error(`too many errors, the first: ${firstError}`);
              ok = false;
            }
            if (ok) {
              turns.push([id, wanted, acquired, released, at()]);
              break;
            }
            failures.push(at());
            if (hr() >= end) break;
          }
          if (spec.thinkMs > 0) await sleep(spec.thinkMs);
        }
      };

      const base = rank * spec.workers;
      await Promise.all(Array.from({ length: spec.workers }, (_, i) => worker(base + i)));
      return { turns, failures, ...(await window), errors, firstError, logged: locker.logged() };
    },
    async close() {
      await locker.close();
      await Promise.all((admin ?? []).map((client) => client.quit()));
    },
  };
}

/** Merges the parts of every process of the cell (one clock) and measures the window. */
export function contendedMetrics(spec: CellSpec, parts: readonly ContendedPart[]): Metrics {
  const windowStart = spec.warmupMs;
  const windowEnd = windowStart + spec.measureMs;
  const inWindow = (time: number): boolean => time >= windowStart && time < windowEnd;
  const turns = parts.flatMap((part) => part.turns).sort((a, b) => a[2] - b[2]);
  const workers = spec.processes * spec.workers;
  const perWorker = new Array<number>(workers).fill(0);
  const handovers: number[] = [];
  const waits: number[] = [];
  const holds: number[] = [];
  let count = 0;
  let retaken = 0;
  let overlaps = 0;
  for (let i = 0; i < turns.length; i += 1) {
    const [worker, wanted, acquired, released] = turns[i];
    if (acquired >= windowStart && wanted < windowEnd) waits.push(acquired - wanted);
    if (!inWindow(acquired)) continue;
    count += 1;
    perWorker[worker] += 1;
    holds.push(released - acquired);
    if (i === 0) continue;
    const previous = turns[i - 1];
    handovers.push(acquired - previous[3]);
    if (previous[0] === worker) retaken += 1;
    if (acquired < previous[3]) overlaps += 1; // this one began before the previous holder was done
  }
  const sortedHandovers = sortedCopy(handovers);
  const sortedWaits = sortedCopy(waits);
  const cs = Math.max(1, count);
  const info = parts[0].info;
  const seconds = spec.measureMs / 1000;
  return {
    csPerSec: count / seconds,
    handoverP50Ms: percentile(sortedHandovers, 50),
    handoverP99Ms: percentile(sortedHandovers, 99),
    retakenPct: handovers.length > 0 ? (100 * retaken) / handovers.length : NaN,
    longestWaitMs: sortedWaits.length > 0 ? sortedWaits[sortedWaits.length - 1] : NaN,
    waitP99Ms: percentile(sortedWaits, 99),
    jain: jain(perWorker),
    redisCallsPerCs: info ? info.totalCalls / cs : NaN,
    roundTripsPerCs: parts.reduce((sum, part) => sum + part.sent, 0) / cs,
    nodeCpuUsPerCs: parts.reduce((sum, part) => sum + part.cpuUs, 0) / cs,
    redisCpuPct: info ? (100 * info.redisCpuMs) / info.ms : NaN,
    holdP50Ms: percentile(sortedCopy(holds), 50),
    failures: parts.reduce((sum, part) => sum + part.failures.filter(inWindow).length, 0),
    overlaps,
    errors: parts.reduce((sum, part) => sum + part.errors, 0),
    warnings: parts.reduce((sum, part) => sum + part.logged.warnings, 0),
    ...clusterMetrics(info),
    ...perCommand(info, cs),
  };
}

/**
 * What a cell's measuring window costs, from `start` to `end` (hr ms): this process's CPU, the
 * commands its locker sent, and (from one process of the cell) the server's INFO deltas.
 */
export async function measureWindow(
  start: number,
  end: number,
  locker: { sent(): number },
  admin: Redis | readonly Redis[] | undefined,
): Promise<{ cpuUs: number; sent: number; info: InfoDelta | undefined }> {
  await sleepUntil(start);
  const cpu = cpuMicros();
  const sent = locker.sent();
  const info = admin ? await infoSnapshot(admin) : undefined;
  await sleepUntil(end);
  const cpuUs = cpuMicros() - cpu;
  const sentInWindow = locker.sent() - sent;
  return {
    cpuUs,
    sent: sentInWindow,
    info: admin && info ? infoDelta(info, await infoSnapshot(admin)) : undefined,
  };
}
