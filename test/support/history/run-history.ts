/**
 * One randomized run: a lock Redis and a fence Redis (both test-owned), one fault proxy and one
 * history worker (a Nest app, see ../workers/history.worker.ts, or with `family` the lock-family
 * worker ./family.worker.ts) per process, and a scheduler that injects a random fault into a random
 * worker's connection every 100-400 ms. Everything the run chooses comes from `seed`, so a failing
 * seed replays the same schedule of faults and the same choices in the workers (the interleaving,
 * of course, differs run to run).
 */
import { ACQUIRE_SHARED_SCRIPT } from '../../../lib/store/redis/scripts/acquire-shared.script';
import { ACQUIRE_SCRIPT } from '../../../lib/store/redis/scripts/acquire.script';
import { CHECK_SCRIPT } from '../../../lib/store/redis/scripts/check.script';
import type { LuaScript } from '../../../lib/store/redis/scripts/lua-script';
import { RELEASE_SCRIPT } from '../../../lib/store/redis/scripts/release.script';
import { RENEW_SCRIPT } from '../../../lib/store/redis/scripts/renew.script';
import { type ConnectionKind, FaultProxy, isScript } from '../fault-proxy';
import { RedisServer } from '../redis-server';
import type { HistoryWorkerConfig } from '../workers/history.worker';
import { type WorkerProcess, WorkerSet } from '../workers/worker-process';
import type { FamilyWorkerConfig } from './family.worker';
import {
  checkHistory,
  clock,
  type FaultRecord,
  type HistoryEvent,
  PAUSE_MS,
  prng,
  quietReleases,
  summarize,
  TICK_MS,
  type Violation,
} from './history';

export interface HistoryRunOptions {
  readonly seed: number;
  readonly workers?: number;
  /** How long the workers take locks, faults and all (start-up and shutdown come on top). */
  readonly durationMs: number;
  /** How many lock names the workers share (3); in a family run, read-write locks beside its semaphore (2). */
  readonly names?: number;
  /** Inject faults (default) or not. */
  readonly faults?: boolean;
  /** The control run: the same work without any lock. The checker must then find overlaps. */
  readonly lockless?: boolean;
  /**
   * The whole lock family (./family.worker.ts): read-write locks on `names` names, semaphores,
   * plain locks and multi-locks, with faults on the shared acquisition script too. Not with
   * `lockless`.
   */
  readonly family?: boolean;
  /** Inject no fault in the last this many ms of the run, so that the wake-up rule judges them all. */
  readonly calmTailMs?: number;
  readonly operationTimeoutMs?: number;
  /** Copy the workers' output to stderr. */
  readonly echo?: boolean;
}

export interface HistoryRun {
  readonly seed: number;
  /** A family run's semaphores, with the permits the seed gave them. */
  readonly semaphores: readonly { readonly name: string; readonly permits: number }[];
  readonly events: HistoryEvent[];
  readonly faults: FaultRecord[];
  readonly violations: Violation[];
  readonly summary: string;
  /** Releases no fault came near: the ones the wake-up rule could judge. */
  readonly quietReleases: number;
}

/** Faults are injected for FAULTY_MS of every CYCLE_MS. */
const CYCLE_MS = 3_000;
const FAULTY_MS = 2_000;

const SCRIPTS: readonly LuaScript[] = [ACQUIRE_SCRIPT, CHECK_SCRIPT, RELEASE_SCRIPT, RENEW_SCRIPT];
const FAMILY_SCRIPTS: readonly LuaScript[] = [...SCRIPTS, ACQUIRE_SHARED_SCRIPT];
const sleep = (ms: number): Promise<void> => new Promise((resolve) => setTimeout(resolve, ms));

/**
 * The locks of a family run: `names` read-write locks, and one semaphore (2 or 3 permits, from
 * the seed; one, so that it is often full) that plain locks and multi-locks take too.
 */
function familyLocks(seed: number, names: number): Pick<FamilyWorkerConfig, 'rwNames' | 'semaphores'> {
  const random = prng(seed ^ 0x5e3a);
  return {
    rwNames: Array.from({ length: names }, (_, i) => `rw-${i}`),
    semaphores: [{ name: 'sem-0', permits: 2 + Math.floor(random() * 2) }],
  };
}

export async function runHistory(options: HistoryRunOptions): Promise<HistoryRun> {
  const count = options.workers ?? 3;
  const operationTimeout = options.operationTimeoutMs ?? 400;
  const random = prng(options.seed);
  if (options.family && options.lockless) throw new Error('runHistory: a family run has no lockless control');
  const locks = familyLocks(options.seed, options.names ?? 2);
  const scripts = options.family ? FAMILY_SCRIPTS : SCRIPTS;
  const lockServer = await RedisServer.start();
  const fenceServer = await RedisServer.start();
  const proxies: FaultProxy[] = [];
  const set = new WorkerSet();
  const events: HistoryEvent[] = [];
  const faults: FaultRecord[] = [];
  let ticker: NodeJS.Timeout | undefined;
  try {
    for (let i = 0; i < count; i += 1) proxies.push(await FaultProxy.start(lockServer.port));
    const workers = proxies.map((proxy, worker) => {
      const seed = (options.seed * 7_919 + worker * 104_729) >>> 0;
      if (options.family) {
        const config: FamilyWorkerConfig = {
          worker,
          redis: proxy.url,
          fence: fenceServer.url,
          keyPrefix: `history:${options.seed}:`,
          ...locks,
          seed,
          operationTimeout,
          loops: 3,
          deadlineMs: options.durationMs + 120_000,
        };
        // WorkerSet resolves `<name>.worker.ts` next to ../workers/worker-process.ts.
        return set.start('../history/family', config, { echo: options.echo });
      }
      const config: HistoryWorkerConfig = {
        worker,
        redis: proxy.url,
        fence: fenceServer.url,
        keyPrefix: `history:${options.seed}:`,
        names: Array.from({ length: options.names ?? 3 }, (_, i) => `name-${i}`),
        seed,
        operationTimeout,
        loops: 2,
        lockless: options.lockless ?? false,
        deadlineMs: options.durationMs + 120_000,
      };
      return set.start('history', config, { echo: options.echo });
    });
    await Promise.all(workers.map((w) => w.next('ready', 60_000)));
    for (const w of workers) w.send({ type: 'go' });
    // The proxies run in this process: when its event loop stands still, every worker's traffic
    // does too, which the checker must count like a stall of the worker itself.
    let lastTick = clock();
    ticker = setInterval(() => {
      const at = clock();
      const due = lastTick + TICK_MS;
      if (at - due > PAUSE_MS) events.push({ kind: 'pause', worker: -1, from: due, to: at });
      lastTick = at;
    }, TICK_MS);
    const collect = (w: WorkerProcess): void => {
      for (const message of w.drain('history')) events.push(...message.events);
    };
    const startedAt = clock();
    const until = startedAt + options.durationMs;
    const injected: Promise<void>[] = [];
    while (clock() < until) {
      await sleep(100 + random() * 300);
      // Two seconds of faults, then one of calm: what happens once the network has recovered is
      // what the wake-up rule can judge (near a fault, a hold may hide from the records).
      const calm = (clock() - startedAt) % CYCLE_MS >= FAULTY_MS || clock() > until - (options.calmTailMs ?? 0);
      if (options.faults !== false && !calm) injected.push(inject(random, proxies, scripts, faults));
      workers.forEach(collect);
    }
    for (const w of workers) w.send({ type: 'stop' });
    for (const w of workers) {
      const done = await w.next('history-done', 60_000);
      collect(w);
      events.push(...done.events);
    }
    // Faults armed but never triggered are cancelled by close() below; none of them bit.
    await Promise.all(proxies.map((proxy) => proxy.close()));
    await Promise.all(injected);
  } finally {
    clearInterval(ticker);
    await set.killAll();
    await Promise.all(proxies.map((proxy) => proxy.close()));
    await lockServer.dispose();
    await fenceServer.dispose();
  }
  const violations = checkHistory(events, faults, { operationTimeoutMs: operationTimeout });
  const quietCount = quietReleases(events, faults, { operationTimeoutMs: operationTimeout });
  const summary = `${summarize(events, faults)}; ${quietCount} releases far from any fault checked for wake-ups`;
  const semaphores = options.family ? locks.semaphores : [];
  return { seed: options.seed, semaphores, events, faults, violations, summary, quietReleases: quietCount };
}

/** One random fault on one random worker's proxy; its record is added once it has bitten. */
async function inject(
  random: () => number,
  proxies: readonly FaultProxy[],
  scripts: readonly LuaScript[],
  faults: FaultRecord[],
): Promise<void> {
  const worker = Math.floor(random() * proxies.length);
  const proxy = proxies[worker];
  const script = scripts[Math.floor(random() * scripts.length)];
  const roll = random();
  const note = (kind: string, from: number, to = clock()): void => void faults.push({ worker, kind, from, to });
  try {
    if (roll < 0.3) {
      await proxy.dropReply(isScript(script));
      note(`drop ${script.name} + reset`, clock());
    } else if (roll < 0.42) {
      const stallMs = 100 + random() * 500;
      await proxy.dropReply(isScript(script), { then: 'stall' });
      const from = clock();
      await sleep(stallMs);
      proxy.resetConnections('command');
      note(`drop ${script.name} + stall`, from);
    } else if (roll < 0.64) {
      const delayMs = 20 + random() * 580;
      await proxy.delayReply(isScript(script), delayMs);
      note(`delay ${script.name}`, clock() - delayMs);
    } else if (roll < 0.82) {
      const kind: ConnectionKind = (['subscriber', 'command', 'all'] as const)[Math.floor(random() * 3)];
      proxy.resetConnections(kind);
      note(`reset ${kind}`, clock());
    } else {
      const ms = 50 + random() * 450;
      const thenReset = random() < 0.5;
      const from = clock();
      await proxy.blackhole(ms, { thenReset });
      note(thenReset ? 'blackhole + reset' : 'blackhole', from);
    }
  } catch {
    // The proxy closed before this fault bit: it never happened.
  }
}
