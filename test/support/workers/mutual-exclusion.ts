/**
 * The mutual-exclusion experiment, shared by test/multi-process.e2e-spec.ts and the stress script:
 * `workers` processes run counter.worker.ts, all released at once, each doing `iterations`
 * read-sleep-write increments of one Redis counter inside `@DisLock`. Without mutual exclusion
 * increments get lost and the holders gauge goes above 1.
 */
import { Redis } from 'ioredis';
import { counterKeys, type CounterReport, type CounterWorkerConfig, type Lease } from './protocol';
import type { Exit, WorkerSet } from './worker-process';

export interface MutualExclusionRun {
  redis: string;
  keyPrefix: string;
  workers: number;
  iterations: number;
  waitTime: number;
  lease: Lease;
  /** `false` for the control run without the lock. Default `true`. */
  locked?: boolean;
  /** ms for all workers to start and say 'ready'. */
  startTimeoutMs: number;
  /** ms for all workers to finish their iterations after 'go' (each also exits by itself after it). */
  runTimeoutMs: number;
  /** Echo the workers' output to this process's stderr. */
  echo?: boolean;
}

export interface MutualExclusionResult {
  expected: number;
  /** The counter's final value. */
  counter: number;
  /** High-water mark of processes inside the critical section at once (must be 1). */
  maxHolders: number;
  /** High-water mark of processes calling the locked method at once (> 1 shows they contended). */
  maxCallers: number;
  /** Gauges after the run (both must be back to 0). */
  holdersAfter: number;
  callersAfter: number;
  /** Whether the lock key still exists after the run (it must not). */
  lockKeyAfter: number;
  reports: CounterReport[];
  exits: Exit[];
  /** From 'go' to the last worker's 'done'. */
  ms: number;
  /** Successful lock acquisitions (one per increment) per second. */
  acquisitionsPerSecond: number;
  /** LockNotAcquiredError rejections, retried (with waitTime > 0: waits that ran out). */
  conflicts: number;
  /** Longest successful call of the locked method, waiting included. */
  maxCallMs: number;
  lost: number;
  foreign: number;
}

export async function runMutualExclusion(run: MutualExclusionRun, workers: WorkerSet): Promise<MutualExclusionResult> {
  const keys = counterKeys(run.keyPrefix);
  const redis = new Redis(run.redis, { maxRetriesPerRequest: 1 });
  try {
    await redis.del(...Object.values(keys));
    const config: CounterWorkerConfig = {
      redis: run.redis,
      keyPrefix: run.keyPrefix,
      iterations: run.iterations,
      waitTime: run.waitTime,
      lease: run.lease,
      locked: run.locked ?? true,
      // The worker's own safety net, past the parent's timeouts: it never outlives a stuck run by much.
      deadlineMs: run.startTimeoutMs + run.runTimeoutMs + 5_000,
    };
    const started = Array.from({ length: run.workers }, () => workers.start('counter', config, { echo: run.echo }));
    await Promise.all(started.map((worker) => worker.next('ready', run.startTimeoutMs)));

    const go = performance.now();
    for (const worker of started) worker.send({ type: 'go' });
    const reports = await Promise.all(
      started.map(async (worker) => (await worker.next('done', run.runTimeoutMs)).report),
    );
    const ms = performance.now() - go;
    // Each worker closes its Nest app and must then end on its own (no handle left open).
    const exits = await Promise.all(started.map((worker) => worker.exitWithin(5_000)));

    const number = async (key: string): Promise<number> => Number((await redis.get(key)) ?? '0');
    const expected = run.workers * run.iterations;
    const sum = (field: 'conflicts' | 'lost' | 'foreign'): number => reports.reduce((n, r) => n + r[field], 0);
    return {
      expected,
      counter: await number(keys.counter),
      maxHolders: await number(keys.maxHolders),
      maxCallers: await number(keys.maxCallers),
      holdersAfter: await number(keys.holders),
      callersAfter: await number(keys.callers),
      lockKeyAfter: await redis.exists(keys.lock),
      reports,
      exits,
      ms,
      acquisitionsPerSecond: (expected / ms) * 1_000,
      conflicts: sum('conflicts'),
      maxCallMs: Math.max(...reports.map((r) => r.maxCallMs)),
      lost: sum('lost'),
      foreign: sum('foreign'),
    };
  } finally {
    redis.disconnect();
  }
}

/** One paragraph on a run, for humans. */
export function describeRun(run: MutualExclusionRun, result: MutualExclusionResult): string {
  const lease =
    'expire' in run.lease ? `expire ${run.lease.expire} ms` : `watchdog ${run.lease.lockWatchdogTimeout} ms`;
  const seconds = (result.ms / 1_000).toFixed(2);
  return (
    `${run.workers} processes x ${run.iterations} ${run.locked === false ? 'UNLOCKED' : 'locked'} ` +
    'read-sleep-write increments ' +
    `(waitTime ${run.waitTime} ms, ${lease}): final counter ${result.counter}, expected ${result.expected}; ` +
    `max holders at once ${result.maxHolders}, max callers at once ${result.maxCallers}; ` +
    `${result.conflicts} LockNotAcquiredError ${run.waitTime > 0 ? `(waited ${run.waitTime} ms in vain) ` : ''}` +
    `retries, longest successful call ${result.maxCallMs.toFixed(0)} ms; ${result.lost} lost signals, ` +
    `${result.foreign} critical sections with a foreign hash; ${seconds} s, ` +
    `${result.acquisitionsPerSecond.toFixed(0)} acquisitions/s; ` +
    `worker exits: ${result.exits.map((e) => e.signal ?? e.code).join(',')}.`
  );
}

/** What is wrong with a locked run, or an empty list. */
export function violations(result: MutualExclusionResult): string[] {
  const found: string[] = [];
  if (result.counter !== result.expected) found.push(`counter ${result.counter} != ${result.expected}`);
  if (result.maxHolders !== 1) found.push(`max holders ${result.maxHolders} != 1`);
  if (result.lost > 0) found.push(`${result.lost} critical sections ended with the lock lost`);
  if (result.foreign > 0) found.push(`${result.foreign} critical sections saw a foreign lock hash`);
  if (result.holdersAfter !== 0 || result.callersAfter !== 0) found.push('gauges not back to 0');
  if (result.lockKeyAfter !== 0) found.push('lock key left behind');
  const badExits = result.exits.filter((e) => e.code !== 0);
  if (badExits.length > 0) found.push(`${badExits.length} workers exited abnormally`);
  return found;
}
