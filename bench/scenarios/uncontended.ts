import { type Body, createLocker, type Locker } from '../contenders/locker';
import { cpuMicros, hr, sleepUntil } from '../support/clock';
import { spreadKey } from '../support/cluster';
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
import { percentile, Samples } from '../support/stats';
import { type CellRun, describeError } from './cell-run';

/**
 * Acquire + release on distinct keys (one per worker loop, never contended), `spec.workers` loops
 * at once, in one process. Counts cycles completed inside the measuring window. On a Cluster, the
 * keys sit at evenly spaced slots (`spreadKey`), so the loops spread evenly over the masters.
 */
export interface UncontendedPart {
  readonly cycles: number;
  readonly windowMs: number;
  readonly p50Us: number;
  readonly p99Us: number;
  readonly cpuUs: number;
  readonly sent: number;
  readonly info: InfoDelta;
  readonly failures: number;
  readonly errors: number;
  readonly firstError?: string;
  readonly logged: { warnings: number; errors: number; first: string[] };
}

const noop: Body = () => Promise.resolve();

/** `given`: a contender made elsewhere (the family group's); by default, `spec.contender`'s. */
export async function setupUncontended(
  spec: CellSpec,
  rank: number,
  target: RedisTarget,
  given?: Locker,
): Promise<CellRun> {
  const locker = given ?? (await createLocker(spec.contender, 'uncontended', target));
  const admin = adminClients(target, `bench-admin-${process.pid}`);
  await Promise.all(admin.map((client) => ready(client)));
  return {
    async go(t0: number): Promise<UncontendedPart> {
      const start = t0 + spec.warmupMs;
      const end = start + spec.measureMs;
      const latencies = new Samples();
      let cycles = 0;
      let failures = 0;
      let errors = 0;
      let firstError: string | undefined;

      const window = (async () => {
        await sleepUntil(start);
        const cpu = cpuMicros();
        const sent = locker.sent();
        const info = await infoSnapshot(admin);
        await sleepUntil(end);
        const cpuUs = cpuMicros() - cpu;
        const sentInWindow = locker.sent() - sent;
        return { cpuUs, sent: sentInWindow, info: infoDelta(info, await infoSnapshot(admin)) };
      })();
      window.catch(() => undefined); // awaited below; this only keeps an early failure from being "unhandled"

      const loop = async (worker: number): Promise<void> => {
        const key = target.kind === 'cluster' ? spreadKey(worker, spec.workers) : `u:${rank}:${worker}`;
        await sleepUntil(t0);
        for (let began = hr(); began < end; began = hr()) {
          try {
            if (!(await locker.critical(key, noop))) failures += 1;
          } catch (error) {
            errors += 1;
            firstError ??= describeError(error);
            if (errors > 100) throw new Error(`too many errors, the first: ${firstError}`);
          }
          const done = hr();
          if (done >= start && done < end) cycles += 1;
          if (began >= start && done < end) latencies.push((done - began) * 1000);
        }
      };

      await Promise.all(Array.from({ length: spec.workers }, (_, worker) => loop(worker)));
      const measured = await window;
      const sorted = latencies.sorted();
      return {
        cycles,
        windowMs: spec.measureMs,
        p50Us: percentile(sorted, 50),
        p99Us: percentile(sorted, 99),
        ...measured,
        failures,
        errors,
        firstError,
        logged: locker.logged(),
      };
    },
    async close() {
      await locker.close();
      await Promise.all(admin.map((client) => client.quit()));
    },
  };
}

export function uncontendedMetrics(parts: readonly UncontendedPart[]): Metrics {
  const [part] = parts;
  const cycles = Math.max(1, part.cycles);
  return {
    cyclesPerSec: part.cycles / (part.windowMs / 1000),
    p50Us: part.p50Us,
    p99Us: part.p99Us,
    cpuUsPerCycle: part.cpuUs / cycles,
    roundTripsPerCycle: part.sent / cycles,
    redisCallsPerCycle: part.info.totalCalls / cycles,
    redisCpuUsPerCycle: (part.info.redisCpuMs * 1000) / cycles,
    failures: part.failures,
    errors: part.errors,
    warnings: part.logged.warnings,
    ...clusterMetrics(part.info),
    ...perCommand(part.info, cycles),
  };
}
