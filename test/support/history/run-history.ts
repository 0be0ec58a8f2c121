/**
 * One randomized run: the lock topology (one Redis, or a Cluster of 3 masters with a replica each)
 * and a fence Redis (all test-owned), fault proxies for every worker process (one, or on a Cluster
 * one per node, which the worker's Cluster client reaches through its `natMap`), the workers, an
 * operator process that force-unlocks now and then, and a scheduler that injects a random fault
 * into a random worker's connection every 100-400 ms. Now and then (`lossPlan`) Redis forgets its
 * locks: the lock Redis, or one Cluster master, restarted without persistence or flushed (FLUSHALL),
 * recorded as a fault on every process's connection with what it took (`FaultRecord.forgot`); no
 * other fault is injected in the second after it, which rule 5 judges. On a Cluster, now and then
 * (`migrationPlan`) the slots of 1-3 names move to another master and back (test/support/reshard.ts),
 * either way sometimes stopped mid-way for up to 2 s, beside the other faults; recorded as a fault on
 * every process's connection with the names it moved (`FaultRecord.migrated`). Redis forgets only
 * once such a move is done.
 *
 * Everything the run chooses comes from `seed`: the client options users set (`operationTimeout`
 * from 50 ms to 5 s, ioredis's `commandTimeout` sometimes, `enableAutoPipelining` on or off), how
 * often a critical section begins with synchronous work, the faults, and the choices in the
 * workers. So a failing seed replays the same schedule (the interleaving, of course, differs run to
 * run). With HISTORY_DUMP set to a directory, each run writes there what the checker saw (events,
 * faults, draws, violations) as JSON. The workers are the lock-family worker (./family.worker.ts: every kind of lock, every public
 * way to take one), or with `plain` the plain worker (../workers/history.worker.ts: plain locks on
 * the default client options), which the lockless control run uses.
 */
import { mkdirSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { Redis } from 'ioredis';
import { keySlot } from '../../../lib/store/redis/fence-key';
import { ACQUIRE_SHARED_SCRIPT } from '../../../lib/store/redis/scripts/acquire-shared.script';
import { ACQUIRE_SCRIPT } from '../../../lib/store/redis/scripts/acquire.script';
import { CHECK_SCRIPT } from '../../../lib/store/redis/scripts/check.script';
import { FORCE_UNLOCK_SCRIPT } from '../../../lib/store/redis/scripts/force-unlock.script';
import { LEAVE_SCRIPT } from '../../../lib/store/redis/scripts/leave.script';
import type { LuaScript } from '../../../lib/store/redis/scripts/lua-script';
import { RELEASE_SCRIPT } from '../../../lib/store/redis/scripts/release.script';
import { RENEW_SCRIPT } from '../../../lib/store/redis/scripts/renew.script';
import { RedisCluster } from '../cluster';
import { Resharder, type SlotMigration as SlotMove } from '../reshard';
import { type ConnectionKind, FaultProxy, isScript } from '../fault-proxy';
import { RedisServer } from '../redis-server';
import type { HistoryWorkerConfig } from '../workers/history.worker';
import { type WorkerProcess, WorkerSet } from '../workers/worker-process';
import type { FamilyWorkerConfig } from './family.worker';
import type { HistoryClientConfig } from './history-client';
import {
  type CheckOptions,
  checkHistory,
  clock,
  type DataLossKind,
  type FaultRecord,
  type HistoryEvent,
  LOSS_TELL_MS,
  PAUSE_MS,
  prng,
  quietReleases,
  summarize,
  TICK_MS,
  type SlotMigration,
  type Violation,
} from './history';
import type { OperatorWorkerConfig } from './operator.worker';

export type Topology = 'single' | 'cluster';

/** The client options and workload a seed drew (see `drawFor`). */
export interface RunDraws {
  /** The module's `operationTimeout` for every process of the run (the checker's windows use it). */
  readonly operationTimeout: number;
  /** ioredis's own `commandTimeout`, when drawn. */
  readonly commandTimeout?: number;
  readonly autoPipelining: boolean;
  /** Share of critical sections that begin with 0-400 ms of synchronous work. */
  readonly syncShare: number;
}

export interface HistoryRunOptions {
  readonly seed: number;
  readonly workers?: number;
  /** How long the workers take locks, faults and all (start-up and shutdown come on top). */
  readonly durationMs: number;
  /** One Redis (default) or a 3-master Cluster. */
  readonly topology?: Topology;
  /**
   * How many lock names the workers share: the plain worker's names (3), or the family's read-write
   * locks beside its semaphore (2 on one Redis, 5 on a Cluster: two names per master).
   */
  readonly names?: number;
  /** Inject faults (default) or not. */
  readonly faults?: boolean;
  /** The plain worker (plain locks, the default client options) instead of the lock family. */
  readonly plain?: boolean;
  /** The control run (with `plain`): the same work without any lock. The checker must then find overlaps. */
  readonly lockless?: boolean;
  /** An operator force-unlocks a held name every 0.3-1 s (default: yes, except with `plain`). */
  readonly operator?: boolean;
  /** Inject no fault in the last this many ms of the run, so that the wake-up rule judges them all. */
  readonly calmTailMs?: number;
  /** Draws to use instead of the seed's (some or all). */
  readonly draws?: Partial<RunDraws>;
  /** Copy the workers' output to stderr. */
  readonly echo?: boolean;
}

export interface HistoryRun {
  readonly seed: number;
  readonly topology: Topology;
  readonly draws: RunDraws;
  /** A family run's semaphores, with the permits the seed gave them. */
  readonly semaphores: readonly { readonly name: string; readonly permits: number }[];
  /** The lock names the workers shared (a family run's read-write locks, then its semaphores). */
  readonly names: readonly string[];
  readonly events: HistoryEvent[];
  readonly faults: FaultRecord[];
  readonly violations: Violation[];
  readonly summary: string;
  /** Releases no fault came near: the ones the wake-up rule could judge. */
  readonly quietReleases: number;
  /** What the checker was told besides the events (to check a forged history the same way). */
  readonly check: CheckOptions;
}

/** Faults are injected for FAULTY_MS of every CYCLE_MS. */
const CYCLE_MS = 3_000;
const FAULTY_MS = 2_000;

/**
 * Redis forgets (a restart without persistence, or FLUSHALL) in this share of the fault stretches,
 * at most MAX_LOSSES times a run: it frees every lock of the server at once and disturbs
 * everything, so now and then, not every round.
 */
const LOSS_SHARE = 0.25;
const MAX_LOSSES = 3;

/**
 * A Cluster's node timeout for the history: a master restarted without persistence comes back
 * within a few hundred ms, and the Cluster takes it back as it was (its slots, empty) only if its
 * replica has not been promoted meanwhile; 5 s keeps a loaded machine well clear of that. Nothing
 * else in the history depends on it (its faults are between the clients and the nodes, never on
 * the Cluster bus).
 */
const CLUSTER_NODE_TIMEOUT_MS = 5_000;

/** When a run makes Redis forget, how, and on a Cluster which master (an index into the masters at the start). */
export interface PlannedLoss {
  readonly atMs: number;
  readonly kind: DataLossKind;
  readonly master: number;
}

/** How long a restart keeps Redis away, about: a Cluster master serves again only ~2 s after it answers. */
const RESTART_AWAY_MS: Readonly<Record<Topology, number>> = { single: 300, cluster: 2_500 };

/**
 * The seed's data losses, from a PRNG of their own (so that the seed's other draws stay as they
 * were; the salt is arbitrary, and this one has CI's seeds 3 and 11 draw one restart and one
 * FLUSHALL each, and its other seeds none): in a quarter of the fault stretches, at a random
 * moment of it, a restart or a FLUSHALL, on a Cluster of a random master; only where Redis is
 * back LOSS_TELL_MS and a half before the run ends (the second after it must be judged).
 */
export function lossPlan(seed: number, durationMs: number, topology: Topology, calmTailMs = 0): PlannedLoss[] {
  const random = prng(seed ^ 0x1055_056b);
  const plan: PlannedLoss[] = [];
  for (let cycle = 0; cycle * CYCLE_MS < durationMs && plan.length < MAX_LOSSES; cycle += 1) {
    const drawn = random() < LOSS_SHARE;
    const atMs = cycle * CYCLE_MS + 300 + random() * (FAULTY_MS - 300);
    const kind: DataLossKind = random() < 0.5 ? 'restart' : 'flushall';
    const master = Math.floor(random() * 3);
    const backMs = atMs + (kind === 'restart' ? RESTART_AWAY_MS[topology] : 0);
    if (drawn && backMs < durationMs - calmTailMs - LOSS_TELL_MS * 1.5) plan.push({ atMs, kind, master });
  }
  return plan;
}

/**
 * A Cluster run's slot migration (issue 25): the slots of 1-3 of its names move to another master
 * and, a while later, back to where they were. Either way may stop mid-way: each slot MIGRATING,
 * half of its keys moved, for `stallMs` before the rest go (a slot of many keys takes seconds).
 */
export interface PlannedMigration {
  readonly atMs: number;
  /** Indexes into the run's names (its read-write locks, then its semaphore). */
  readonly names: readonly number[];
  /** The master that takes them: this many places on from the first name's, in port order. */
  readonly step: 1 | 2;
  readonly thereStallMs: number;
  /** How long after the slots arrived they go back. */
  readonly backAfterMs: number;
  readonly backStallMs: number;
}

/** A slot migration in this share of a Cluster run's fault stretches, at least one a run, at most one per 10 s (2 at least). */
const MIGRATION_SHARE = 0.5;
const MIGRATIONS_PER_MS = 1 / 10_000;
/** A way there or back stops mid-way this often, for 200 ms to 2 s (past ioredis's 16 TRYAGAIN retries at 100 ms). */
const MIGRATION_STALL_SHARE = 0.4;
/** Room for the moves themselves (a few slots of a few keys: tens of ms) on a loaded machine. */
const MIGRATION_MOVES_MS = 1_000;

/**
 * The seed's slot migrations on a Cluster, from a PRNG of their own (the seed's other draws stay as
 * they were): in half of the fault stretches, at a random moment of it, 1-3 of the `names` names,
 * at least once a run; only where the way back ends before the run's calm tail. The run starts one
 * only when the one before is back, and never in the second after Redis forgot (rule 5).
 */
export function migrationPlan(seed: number, durationMs: number, names: number, calmTailMs = 0): PlannedMigration[] {
  const random = prng(seed ^ 0x3e5a_2d01);
  const plan: PlannedMigration[] = [];
  const fitting: PlannedMigration[] = [];
  const stall = (): number => (random() < MIGRATION_STALL_SHARE ? Math.round(200 + random() * 1_800) : 0);
  for (let cycle = 0; cycle * CYCLE_MS < durationMs; cycle += 1) {
    const drawn = random() < MIGRATION_SHARE;
    const atMs = cycle * CYCLE_MS + random() * FAULTY_MS;
    const order = Array.from({ length: names }, (_, i) => i);
    for (let i = order.length - 1; i > 0; i -= 1) {
      const j = Math.floor(random() * (i + 1));
      [order[i], order[j]] = [order[j], order[i]];
    }
    const picked = order.slice(0, Math.min(names, 1 + Math.floor(random() * 3)));
    const step: 1 | 2 = random() < 0.5 ? 1 : 2;
    const migration = {
      atMs,
      names: picked,
      step,
      thereStallMs: stall(),
      backAfterMs: Math.round(300 + random() * 900),
      backStallMs: stall(),
    };
    const endsMs = atMs + migration.thereStallMs + migration.backAfterMs + migration.backStallMs + MIGRATION_MOVES_MS;
    if (endsMs >= durationMs - calmTailMs) continue;
    fitting.push(migration);
    const last = plan[plan.length - 1];
    const most = Math.max(2, Math.floor(durationMs * MIGRATIONS_PER_MS));
    if (drawn && plan.length < most && (!last || last.atMs + CYCLE_MS <= atMs)) plan.push(migration);
  }
  return plan.length === 0 && fitting.length > 0 ? [fitting[0]] : plan;
}

const SCRIPTS: readonly LuaScript[] = [ACQUIRE_SCRIPT, CHECK_SCRIPT, RELEASE_SCRIPT, RENEW_SCRIPT];
const FAMILY_SCRIPTS: readonly LuaScript[] = [...SCRIPTS, ACQUIRE_SHARED_SCRIPT, LEAVE_SCRIPT];
const sleep = (ms: number): Promise<void> => new Promise((resolve) => setTimeout(resolve, ms));

/**
 * What a seed draws for its clients and workload: `operationTimeout` mostly short (50-150 ms, where
 * a delayed reply outlives it), sometimes medium or up to the 5 s default; ioredis's
 * `commandTimeout` in a third of the seeds (50-500 ms, often below the operationTimeout: ioredis
 * then rejects first); auto-pipelining in half; synchronous work in 5-25 % of critical sections.
 */
export function drawFor(seed: number): RunDraws {
  const random = prng(seed ^ 0xd4a3);
  const roll = random();
  const operationTimeout = Math.round(
    roll < 0.45 ? 50 + random() * 100 : roll < 0.75 ? 150 + random() * 850 : 1_000 + random() * 4_000,
  );
  const commandTimeout = random() < 0.35 ? Math.round(50 + random() * 450) : undefined;
  const autoPipelining = random() < 0.5;
  const syncShare = [0.05, 0.12, 0.25][Math.floor(random() * 3)];
  return { operationTimeout, ...(commandTimeout === undefined ? {} : { commandTimeout }), autoPipelining, syncShare };
}

/** One line: what the run drew. */
export function describeDraws(topology: Topology, draws: RunDraws): string {
  return (
    `topology ${topology}, operationTimeout ${draws.operationTimeout} ms, ` +
    `commandTimeout ${draws.commandTimeout === undefined ? 'none' : `${draws.commandTimeout} ms`}, ` +
    `auto-pipelining ${draws.autoPipelining ? 'on' : 'off'}, sync work in ${draws.syncShare * 100} % of sections`
  );
}

/**
 * The locks of a family run: `names` read-write locks, and one semaphore (2 or 3 permits, from
 * the seed; one, so that it is often full) that plain locks and multi-locks take too. On a Cluster
 * the names are picked so that each master serves the same number of them.
 */
async function familyLocks(
  seed: number,
  names: number,
  prefix: string,
  cluster: RedisCluster | undefined,
): Promise<Pick<FamilyWorkerConfig, 'rwNames' | 'semaphores'>> {
  const random = prng(seed ^ 0x5e3a);
  const permits = 2 + Math.floor(random() * 2);
  if (!cluster) {
    return {
      rwNames: Array.from({ length: names }, (_, i) => `rw-${i}`),
      semaphores: [{ name: 'sem-0', permits }],
    };
  }
  const masters = await cluster.masters();
  const perMaster = Math.ceil((names + 1) / masters.length);
  const served = new Map<number, number>(masters.map((m) => [m.port, 0]));
  // The slot of the name as the lock's key has it (`keyPrefix` + name), the name it is given.
  const take = (stem: string, wanted: number): string[] => {
    const taken: string[] = [];
    for (let i = 0; taken.length < wanted; i += 1) {
      const name = `${stem}-${i}`;
      const slot = keySlot(prefix + name);
      const owner = masters.find((m) => m.slots.some(([a, b]) => slot >= a && slot <= b));
      const count = owner ? (served.get(owner.port) ?? 0) : perMaster;
      if (!owner || count >= perMaster) continue;
      served.set(owner.port, count + 1);
      taken.push(name);
    }
    return taken;
  };
  const rwNames = take('rw', names);
  return { rwNames, semaphores: [{ name: take('sem', 1)[0], permits }] };
}

/** One process's fault proxies: the one to a single Redis, or one per Cluster node. */
interface ProxyGroup {
  readonly proxies: FaultProxy[];
  /** The proxies that carry lock commands (to the single Redis, or to the Cluster's masters). */
  readonly masters: FaultProxy[];
  readonly client: Omit<HistoryClientConfig, 'autoPipelining' | 'commandTimeout'>;
}

async function proxyGroup(server: RedisServer | undefined, cluster: RedisCluster | undefined): Promise<ProxyGroup> {
  if (server) {
    const proxy = await FaultProxy.start(server.port);
    return { proxies: [proxy], masters: [proxy], client: { url: proxy.url } };
  }
  const masterPorts = (await (cluster as RedisCluster).masters()).map((m) => m.port);
  const ports = [...masterPorts, ...(await (cluster as RedisCluster).replicas()).map((r) => r.port)];
  const proxies = await Promise.all(ports.map((port) => FaultProxy.start(port)));
  const natMap: Record<string, { host: string; port: number }> = {};
  ports.forEach((port, i) => (natMap[`127.0.0.1:${port}`] = { host: '127.0.0.1', port: proxies[i].port }));
  const masters = proxies.slice(0, masterPorts.length);
  return {
    proxies,
    masters,
    client: { cluster: { seeds: masters.map((p) => ({ host: '127.0.0.1', port: p.port })), natMap } },
  };
}

/**
 * Redis's clock (ms) less `clock()` on this machine: the best of a few reads of TIME (the one with
 * the shortest round trip), so that the checker can read when a hold was taken from its token.
 */
async function redisClockOffset(port: number): Promise<number> {
  const client = new Redis({ port, host: '127.0.0.1', maxRetriesPerRequest: 1 });
  client.on('error', () => undefined);
  try {
    let best = { rtt: Infinity, offset: 0 };
    for (let i = 0; i < 7; i += 1) {
      const sent = clock();
      const [seconds, micros] = await client.time();
      const answered = clock();
      const redisMs = Number(seconds) * 1_000 + Number(micros) / 1_000;
      if (answered - sent < best.rtt) best = { rtt: answered - sent, offset: redisMs - (sent + answered) / 2 };
    }
    return best.offset;
  } finally {
    client.disconnect();
  }
}

/** Loads the force-unlock script on every node, so that the operator's first call is one EVALSHA, not two commands. */
async function preload(ports: readonly number[]): Promise<void> {
  await Promise.all(
    ports.map(async (port) => {
      const client = new Redis({ port, host: '127.0.0.1', maxRetriesPerRequest: 1 });
      client.on('error', () => undefined);
      try {
        await client.script('LOAD', FORCE_UNLOCK_SCRIPT.source);
      } finally {
        client.disconnect();
      }
    }),
  );
}

export async function runHistory(options: HistoryRunOptions): Promise<HistoryRun> {
  const topology = options.topology ?? 'single';
  const plain = options.plain ?? false;
  if (options.lockless && !plain) throw new Error('runHistory: the lockless control run is a plain one');
  if (plain && topology === 'cluster') throw new Error('runHistory: the plain worker runs on one Redis');
  const drawn = drawFor(options.seed);
  const draws: RunDraws = plain
    ? { operationTimeout: 400, autoPipelining: false, syncShare: 0, ...options.draws }
    : { ...drawn, ...options.draws };
  const count = options.workers ?? 3;
  const withOperator = options.operator ?? !plain;
  const random = prng(options.seed);
  const prefix = `history:${options.seed}:`;
  const scripts = plain ? SCRIPTS : FAMILY_SCRIPTS;
  const fenceServer = await RedisServer.start();
  let lockServer: RedisServer | undefined;
  let cluster: RedisCluster | undefined;
  const groups: ProxyGroup[] = [];
  const set = new WorkerSet();
  const events: HistoryEvent[] = [];
  const faults: FaultRecord[] = [];
  let semaphores: FamilyWorkerConfig['semaphores'] = [];
  let names: readonly string[] = [];
  let redisClockOffsetMs: number | undefined;
  let stoppedAt: number | undefined;
  let ticker: NodeJS.Timeout | undefined;
  let resharder: Resharder | undefined;
  try {
    if (topology === 'cluster') {
      cluster = await RedisCluster.start({ nodeTimeoutMs: CLUSTER_NODE_TIMEOUT_MS });
      resharder = new Resharder(cluster);
    } else lockServer = await RedisServer.start();
    await preload(cluster ? (await cluster.topology()).map((node) => node.port) : [(lockServer as RedisServer).port]);
    const locks = await familyLocks(options.seed, options.names ?? (cluster ? 5 : 2), prefix, cluster);
    const allNames = [...locks.rwNames, ...locks.semaphores.map((sem) => sem.name)];
    // The masters at the start (a loss picks one by its index), and where each name lives when a
    // master forgets (slot migrations move some of them, and back), for the names it takes with it.
    const masters = cluster ? await cluster.masters() : [];
    const namesOn = async (port: number): Promise<string[]> => {
      const now = await (cluster as RedisCluster).masters();
      return allNames.filter((name) => {
        const slot = keySlot(prefix + name);
        return now.find((m) => m.slots.some(([a, b]) => slot >= a && slot <= b))?.port === port;
      });
    };
    const clockPort = cluster ? (await cluster.masters())[0].port : (lockServer as RedisServer).port;
    redisClockOffsetMs = await redisClockOffset(clockPort);
    semaphores = plain ? [] : locks.semaphores;
    names = allNames;
    for (let i = 0; i < count + (withOperator ? 1 : 0); i += 1) groups.push(await proxyGroup(lockServer, cluster));
    const timeouts = draws.commandTimeout === undefined ? {} : { commandTimeout: draws.commandTimeout };
    const workers = groups.slice(0, count).map((group, worker) => {
      const seed = (options.seed * 7_919 + worker * 104_729) >>> 0;
      if (!plain) {
        const config: FamilyWorkerConfig = {
          worker,
          client: { ...group.client, autoPipelining: draws.autoPipelining, ...timeouts },
          fence: fenceServer.url,
          keyPrefix: prefix,
          ...locks,
          seed,
          operationTimeout: draws.operationTimeout,
          // The density of issue 20's Cluster finding: several processes, a few names, 1 ms holds.
          loops: cluster ? 6 : 3,
          syncShare: draws.syncShare,
          dense: cluster !== undefined,
          deadlineMs: options.durationMs + 120_000,
        };
        // WorkerSet resolves `<name>.worker.ts` next to ../workers/worker-process.ts.
        return set.start('../history/family', config, { echo: options.echo });
      }
      const config: HistoryWorkerConfig = {
        worker,
        redis: group.client.url ?? '',
        fence: fenceServer.url,
        keyPrefix: prefix,
        names: Array.from({ length: options.names ?? 3 }, (_, i) => `name-${i}`),
        seed,
        operationTimeout: draws.operationTimeout,
        loops: 2,
        lockless: options.lockless ?? false,
        deadlineMs: options.durationMs + 120_000,
      };
      return set.start('history', config, { echo: options.echo });
    });
    const operatorGroup = withOperator ? groups[count] : undefined;
    if (operatorGroup) {
      const config: OperatorWorkerConfig = {
        worker: count,
        client: { ...operatorGroup.client, autoPipelining: true, ...timeouts },
        keyPrefix: prefix,
        names: [...locks.rwNames, ...locks.semaphores.map((s) => s.name)],
        seed: (options.seed * 31 + 7) >>> 0,
        operationTimeout: draws.operationTimeout,
        everyMs: [300, 1_000],
        deadlineMs: options.durationMs + 120_000,
      };
      workers.push(set.start('../history/operator', config, { echo: options.echo }));
    }
    await Promise.all(workers.map((w) => w.next('ready', 90_000)));
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
    let nextOperatorFault = startedAt;
    let operatorFault: Promise<void> = Promise.resolve();
    let operatorFaultDone = true;
    const groupsOfWorkers = groups.slice(0, count);
    const plan =
      options.faults === false ? [] : lossPlan(options.seed, options.durationMs, topology, options.calmTailMs);
    const migrations =
      options.faults === false || !cluster
        ? []
        : migrationPlan(options.seed, options.durationMs, allNames.length, options.calmTailMs);
    /** The slot migration under way (it runs beside the other faults), if any, and why one failed. */
    let migrating: Promise<void> | undefined;
    let migrationFailed: unknown;
    /** No fault is injected until then: the second after Redis forgot is judged on a clean network (rule 5). */
    let cleanUntil = 0;
    while (clock() < until) {
      await sleep(100 + random() * 300);
      const move = migrations[0];
      if (move !== undefined && !migrating && clock() >= cleanUntil && clock() - startedAt >= move.atMs) {
        migrations.shift();
        const record = (migrated: SlotMigration, from: number, to: number): void => {
          const kind =
            `migrate the slots of ${migrated.names.length} names ${migrated.back ? 'back ' : ''}to :${migrated.toPort}` +
            (migrated.stalledMs > 0 ? ', stopped mid-way' : '');
          for (let worker = 0; worker < count; worker += 1)
            faults.push({ worker, kind, from, to, closes: false, migrated });
          if (operatorGroup) faults.push({ worker: count, kind, from, to, closes: false, operator: true, migrated });
        };
        const names = move.names.map((i) => allNames[i]);
        migrating = migrate(cluster as RedisCluster, resharder as Resharder, prefix, allNames, names, move, record)
          .catch((error: unknown) => void (migrationFailed = error))
          .finally(() => (migrating = undefined));
        continue;
      }
      const due = plan[0];
      if (due !== undefined && clock() - startedAt >= due.atMs) {
        plan.shift();
        // Redis forgets on settled slots: a master restarted mid-migration would come back with
        // half a slot.
        await migrating;
        const where = cluster ? masters[due.master % masters.length].port : (lockServer as RedisServer).port;
        const lost = await forget(due.kind, lockServer, cluster, where, cluster ? await namesOn(where) : undefined);
        const record = { kind: lost.label, from: lost.from, to: lost.to, closes: due.kind === 'restart' };
        for (let worker = 0; worker < count; worker += 1) faults.push({ worker, ...record, forgot: lost.forgot });
        if (operatorGroup) faults.push({ worker: count, ...record, operator: true, forgot: lost.forgot });
        cleanUntil = lost.to + LOSS_TELL_MS;
        workers.forEach(collect);
        continue;
      }
      // Two seconds of faults, then one of calm: what happens once the network has recovered is
      // what the wake-up rule can judge (near a fault, a hold may hide from the records).
      const calm =
        (clock() - startedAt) % CYCLE_MS >= FAULTY_MS ||
        clock() > until - (options.calmTailMs ?? 0) ||
        clock() < cleanUntil;
      if (options.faults !== false && !calm) {
        injected.push(inject(random, groupsOfWorkers, scripts, draws, faults));
        if (operatorGroup && operatorFaultDone && clock() >= nextOperatorFault) {
          operatorFaultDone = false;
          operatorFault = injectOperator(random, operatorGroup, count, draws, faults).finally(
            () => (operatorFaultDone = true),
          );
          injected.push(operatorFault);
          nextOperatorFault = clock() + 300 + random() * 500;
        }
      }
      workers.forEach(collect);
    }
    // A migration still under way ends (the plan has its way back end before the run does).
    await migrating;
    if (migrationFailed !== undefined) {
      throw migrationFailed instanceof Error ? migrationFailed : new Error(JSON.stringify(migrationFailed));
    }
    stoppedAt = clock();
    for (const w of workers) w.send({ type: 'stop' });
    for (const w of workers) {
      const done = await w.next('history-done', 90_000);
      collect(w);
      events.push(...done.events);
    }
    // Faults armed but never triggered are cancelled by close() below; none of them bit.
    await Promise.all(groups.flatMap((g) => g.proxies.map((proxy) => proxy.close())));
    await Promise.all(injected);
  } finally {
    clearInterval(ticker);
    await set.killAll();
    await Promise.all(groups.flatMap((g) => g.proxies.map((proxy) => proxy.close())));
    resharder?.close();
    await lockServer?.dispose();
    await cluster?.dispose();
    await fenceServer.dispose();
  }
  const check: CheckOptions = {
    operationTimeoutMs: draws.operationTimeout,
    redisClockOffsetMs,
    commandTimeoutMs: draws.commandTimeout,
    abortsOnReset: draws.autoPipelining || topology === 'cluster',
    stoppedAt,
  };
  const violations = checkHistory(events, faults, check);
  const dumpDir = process.env.HISTORY_DUMP;
  if (dumpDir) {
    // Everything the checker saw, to read a failing seed's history afterwards.
    mkdirSync(dumpDir, { recursive: true });
    const file = join(dumpDir, `history-${topology}-${options.seed}-${Date.now()}.json`);
    writeFileSync(file, JSON.stringify({ seed: options.seed, topology, draws, check, events, faults, violations }));
  }
  const quietCount = quietReleases(events, faults, check);
  const summary =
    `${plain ? 'plain worker' : describeDraws(topology, draws)}; ${summarize(events, faults)}; ` +
    `${quietCount} releases far from any fault checked for wake-ups`;
  return {
    seed: options.seed,
    topology,
    draws,
    semaphores,
    names,
    events,
    faults,
    violations,
    summary,
    quietReleases: quietCount,
    check,
  };
}

/**
 * One random fault on one random worker's connection (on a Cluster, on one node's proxy, or for a
 * reset or a blackhole sometimes on all of them); its record is added once it has bitten. Besides
 * dropped, stalled and delayed replies, resets and blackholes: a reply held past the run's short
 * operationTimeout (an acquisition's also held 10-60 ms on its way, so that it lands after a grant
 * made meanwhile: finding 2 of issue 20; a take-up renewal's: finding 5), and one held past
 * ioredis's commandTimeout (finding 6).
 */
async function inject(
  random: () => number,
  groups: readonly ProxyGroup[],
  scripts: readonly LuaScript[],
  draws: RunDraws,
  faults: FaultRecord[],
): Promise<void> {
  const worker = Math.floor(random() * groups.length);
  const group = groups[worker];
  const proxy = group.masters[Math.floor(random() * group.masters.length)];
  const everywhere = group.proxies.length > 1 && random() < 0.5 ? group.proxies : [proxy];
  const script = scripts[Math.floor(random() * scripts.length)];
  const roll = random();
  const note = (kind: string, from: number, closes = true): void =>
    void faults.push({ worker, kind, from, to: clock(), closes });
  try {
    if (roll < 0.22) {
      await proxy.dropReply(isScript(script));
      note(`drop ${script.name} + reset`, clock());
    } else if (roll < 0.3) {
      const stallMs = 100 + random() * 500;
      await proxy.dropReply(isScript(script), { then: 'stall' });
      const from = clock();
      await sleep(stallMs);
      proxy.resetConnections('command');
      note(`drop ${script.name} + stall`, from);
    } else if (roll < 0.46) {
      const delayMs = 20 + random() * 580;
      await proxy.delayReply(isScript(script), delayMs);
      note(`delay ${script.name}`, clock() - delayMs, false);
    } else if (roll < 0.58 && draws.operationTimeout <= 1_000) {
      // Past the operationTimeout: the caller gives up while Redis has run it.
      const late = pickLate(random, scripts);
      const requestMs = late === ACQUIRE_SCRIPT ? 10 + random() * 50 : 0;
      const delayMs = draws.operationTimeout + 20 + random() * 280;
      await proxy.delayReply(isScript(late), delayMs, { requestMs });
      const held = requestMs > 0 ? ' (held on its way)' : '';
      note(`${late.name} past operationTimeout${held}`, clock() - delayMs - requestMs, false);
    } else if (roll < 0.64 && draws.commandTimeout !== undefined) {
      const delayMs = draws.commandTimeout + 50 + random() * 350;
      await proxy.delayReply(isScript(script), delayMs);
      note(`${script.name} past commandTimeout`, clock() - delayMs, false);
    } else if (roll < 0.82) {
      const kind: ConnectionKind = (['subscriber', 'command', 'all'] as const)[Math.floor(random() * 3)];
      for (const p of everywhere) p.resetConnections(kind);
      note(`reset ${kind}${everywhere.length > 1 ? ' (every node)' : ''}`, clock());
    } else {
      const ms = 50 + random() * 450;
      const thenReset = random() < 0.5;
      const from = clock();
      await Promise.all(everywhere.map((p) => p.blackhole(ms, { thenReset })));
      const where = everywhere.length > 1 ? ' (every node)' : '';
      note(`${thenReset ? 'blackhole + reset' : 'blackhole'}${where}`, from, thenReset);
    }
  } catch {
    // The proxy closed before this fault bit: it never happened.
  }
}

/**
 * One planned slot migration: the slots of `names` (and so of any other name in them) to the
 * master `move.step` places on from the first name's, in port order, then after `backAfterMs` back
 * to the masters they came from. Each way is recorded (`record`) once every node agrees, from the
 * first SETSLOT; a way that stops mid-way leaves each slot MIGRATING with half of its keys moved
 * (the first half `CLUSTER GETKEYSINSLOT` names) for its stall before the rest go.
 */
async function migrate(
  cluster: RedisCluster,
  resharder: Resharder,
  prefix: string,
  allNames: readonly string[],
  names: readonly string[],
  move: PlannedMigration,
  record: (migrated: SlotMigration, from: number, to: number) => void,
): Promise<void> {
  const slots = [...new Set(names.map((name) => keySlot(prefix + name)))];
  const ports = (await cluster.masters()).map((m) => m.port).sort((a, b) => a - b);
  const owners = new Map<number, number>();
  for (const slot of slots) owners.set(slot, await resharder.ownerOf(slot));
  const target = ports[(ports.indexOf(owners.get(slots[0]) as number) + move.step) % ports.length];
  const namesIn = (moved: readonly number[]): string[] =>
    allNames.filter((name) => moved.includes(keySlot(prefix + name)));
  const leg = async (moved: readonly number[], to: number, stallMs: number, back: boolean): Promise<void> => {
    if (moved.length === 0) return;
    const fromPorts = [...new Set(moved.map((slot) => owners.get(slot) as number))];
    const from = clock();
    if (stallMs === 0) await resharder.move(moved, to);
    else {
      const stopped: SlotMove[] = [];
      for (const slot of moved) {
        const source = await resharder.ownerOf(slot);
        const keys = Number(await resharder.node(source).call('CLUSTER', 'COUNTKEYSINSLOT', String(slot)));
        stopped.push(await resharder.begin(slot, to, { keys: Math.floor(keys / 2) }));
      }
      await sleep(stallMs);
      for (const migration of stopped) await migration.finish();
    }
    record(
      { names: namesIn(moved), fromPorts: back ? [target] : fromPorts, toPort: to, back, stalledMs: stallMs },
      from,
      clock(),
    );
  };
  await leg(
    slots.filter((slot) => owners.get(slot) !== target),
    target,
    move.thereStallMs,
    false,
  );
  await sleep(move.backAfterMs);
  for (const home of new Set(owners.values())) {
    if (home === target) continue;
    await leg(
      slots.filter((slot) => owners.get(slot) === home),
      home,
      move.backStallMs,
      true,
    );
  }
}

/**
 * Make the lock Redis forget: FLUSHALL on it (on a Cluster, on one master), or kill it and start
 * it again empty on the same port (nothing is persisted; a Cluster master from its own nodes.conf,
 * so that it comes back with its slots). `from`: just before the kill or FLUSHALL was sent; `to`:
 * when Redis is reachable again (the restarted server answered, a Cluster master said
 * `cluster_state:ok`; FLUSHALL answered).
 */
async function forget(
  kind: DataLossKind,
  server: RedisServer | undefined,
  cluster: RedisCluster | undefined,
  port: number,
  names: readonly string[] | undefined,
): Promise<{ label: string; from: number; to: number; forgot: FaultRecord['forgot'] }> {
  const where = cluster ? ` (master :${port}, ${names?.length ?? 0} names)` : '';
  const forgot = { kind, ...(names === undefined ? {} : { names }) };
  if (kind === 'flushall') {
    const admin = new Redis({ port, host: '127.0.0.1', maxRetriesPerRequest: 1 });
    admin.on('error', () => undefined);
    try {
      await admin.ping();
      const from = clock();
      await admin.flushall();
      return { label: `FLUSHALL${where}`, from, to: clock(), forgot };
    } finally {
      admin.disconnect();
    }
  }
  const from = clock();
  if (server) {
    await server.stop();
    await server.startProcess();
  } else if (cluster) {
    await cluster.restartNode(port);
    await cluster.awaitNodeOk(port);
  }
  const to = clock();
  if (cluster && (await cluster.node(port)).role !== 'master') {
    // Its replica took over: the Cluster failed over rather than forgot, which is not this fault.
    throw new Error(`runHistory: the master on port ${port} was failed over while it restarted`);
  }
  return { label: `restart without persistence${where}`, from, to, forgot };
}

/** Which script to answer past the operationTimeout: the acquisition or a renewal mostly. */
function pickLate(random: () => number, scripts: readonly LuaScript[]): LuaScript {
  const roll = random();
  if (roll < 0.45) return ACQUIRE_SCRIPT;
  if (roll < 0.8) return RENEW_SCRIPT;
  return scripts[Math.floor(random() * scripts.length)];
}

/**
 * One fault on the operator's connection, armed for its next forceUnlock: the reply dropped with a
 * reset (ioredis sends the script again: finding 1 of issue 20), held past a short operationTimeout
 * (or 20-600 ms), a blackhole, or a reset. Recorded as the operator's (it holds no lock, so the
 * wake-up rule does not need its quiet).
 */
async function injectOperator(
  random: () => number,
  group: ProxyGroup,
  worker: number,
  draws: RunDraws,
  faults: FaultRecord[],
): Promise<void> {
  const proxy = group.masters[Math.floor(random() * group.masters.length)];
  const roll = random();
  const note = (kind: string, from: number, to = clock()): void =>
    void faults.push({ worker, kind, from, to, operator: true });
  try {
    if (roll < 0.7) {
      await proxy.dropReply(isScript(FORCE_UNLOCK_SCRIPT));
      note('drop force-unlock + reset', clock());
    } else if (roll < 0.85) {
      const delayMs =
        draws.operationTimeout <= 1_000 ? draws.operationTimeout + 20 + random() * 280 : 20 + random() * 580;
      await proxy.delayReply(isScript(FORCE_UNLOCK_SCRIPT), delayMs);
      note('delay force-unlock', clock() - delayMs);
    } else if (roll < 0.95) {
      const ms = 50 + random() * 350;
      const from = clock();
      await Promise.all(group.proxies.map((p) => p.blackhole(ms, { thenReset: random() < 0.5 })));
      note('blackhole', from);
    } else {
      for (const p of group.proxies) p.resetConnections('all');
      note('reset all', clock());
    }
  } catch {
    // The proxy closed before this fault bit: it never happened.
  }
}
