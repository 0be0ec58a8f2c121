/**
 * `npm run bench`: nestjs-dislock against redlock, redis-semaphore and raw ioredis baselines,
 * through public APIs only. Starts its own redis-server (and, for the cluster group, its own
 * 3-master Redis Cluster), runs every cell of the matrix in fresh child processes
 * (bench/dist/cell.js), several repeats, and reports medians with ratios to the baseline measured
 * in the same run. `--help` for the flags.
 */
import { type ChildProcess, execFileSync, fork, spawnSync } from 'node:child_process';
import { mkdirSync, readFileSync, writeFileSync } from 'node:fs';
import { cpus, loadavg, release, totalmem, type as osType } from 'node:os';
import { join } from 'node:path';
import { parseArgs } from 'node:util';
import type { Redis } from 'ioredis';
import { baselineId, FULL, plan, type Profile, QUICK } from './plan';
import { type ContendedPart, contendedMetrics } from './scenarios/contended';
import { familyHeadline, familyMetrics, type FamilyPart } from './scenarios/family';
import { httpMetrics } from './scenarios/http';
import { type RenewalPart, renewalMetrics } from './scenarios/renewal';
import { type UncontendedPart, uncontendedMetrics } from './scenarios/uncontended';
import { type Meta, type Outcome, renderMarkdown, renderSvg, renderText, tables } from './report';
import { hr, sleep } from './support/clock';
import { OwnCluster, SLOT_RANGES, slotTag } from './support/cluster';
import {
  type CellSpec,
  type ChildMessage,
  GROUPS,
  type Group,
  type Metrics,
  type ParentMessage,
  type RedisTarget,
} from './support/protocol';
import { adminClients, OwnRedis, plainClient, ready, redisServerOnPath, redisVersion } from './support/redis';
import { median } from './support/stats';

const HELP = `npm run bench [-- flags]          (builds the library and the benchmark first)
node bench/dist/run.js [flags]     (after a build)

  --quick              1 repeat, short windows (about 3.5 minutes)
  --only <groups>      comma-separated: ${GROUPS.join(', ')}
  --contenders <list>  comma-separated contender names (their baselines are added), e.g. dislock-service
  --repeats <n>        repeats per cell (default 3, --quick 1)
  --label <name>       name of the results file (default: the profile, "full" or "quick")
  --no-write           print only; write nothing to bench/results
  --help`;

const ROOT = join(__dirname, '..', '..');
const RESULTS = join(ROOT, 'bench', 'results');
const CELL_JS = join(__dirname, 'cell.js');
/** Start-up of a cell's processes (Nest bootstrap, connections). */
const SETUP_TIMEOUT_MS = 60_000;
/** Beyond warm-up + window: draining waiters, taking and releasing 10,000 locks, closing. */
const RUN_SLACK_MS = 90_000;
const EXIT_GRACE_MS = 10_000;

const live = new Set<ChildProcess>();
let redis: OwnRedis | undefined;
let cluster: OwnCluster | undefined;

function killEverything(): void {
  for (const child of live) if (child.exitCode === null && child.signalCode === null) child.kill('SIGKILL');
  live.clear();
  redis?.killNow();
  redis = undefined;
  cluster?.killNow();
  cluster = undefined;
}

process.on('exit', killEverything);
for (const signal of ['SIGINT', 'SIGTERM', 'SIGHUP'] as const) {
  process.once(signal, () => {
    console.error(`\n${signal}: stopping every child process, redis-server and the Redis Cluster`);
    killEverything();
    process.exit(130);
  });
}

interface Options {
  readonly profile: Profile;
  readonly repeats: number;
  readonly groups: readonly Group[];
  readonly contenders: readonly string[] | undefined;
  readonly label: string;
  readonly write: boolean;
}

function options(): Options {
  const { values } = parseArgs({
    options: {
      quick: { type: 'boolean', default: false },
      only: { type: 'string' },
      contenders: { type: 'string' },
      repeats: { type: 'string' },
      label: { type: 'string' },
      'no-write': { type: 'boolean', default: false },
      help: { type: 'boolean', default: false },
    },
  });
  if (values.help) {
    console.log(HELP);
    process.exit(0);
  }
  const profile = values.quick ? QUICK : FULL;
  const groups = values.only ? values.only.split(',').map((group) => group.trim()) : [...GROUPS];
  for (const group of groups) {
    if (!GROUPS.includes(group as Group)) throw new Error(`--only: unknown group "${group}" (${GROUPS.join(', ')})`);
  }
  const repeats = values.repeats === undefined ? profile.repeats : Number(values.repeats);
  if (!Number.isInteger(repeats) || repeats < 1 || repeats > 20) throw new Error('--repeats: a whole number 1..20');
  const label = values.label ?? profile.name;
  if (!/^[\w.-]+$/.test(label)) throw new Error('--label: letters, digits, ".", "_" and "-" only');
  return {
    profile,
    repeats,
    groups: groups as Group[],
    contenders: values.contenders?.split(',').map((name) => name.trim()),
    label,
    write: !values['no-write'],
  };
}

/** The child's last output, shown when it fails. */
function tail(chunks: string[]): string {
  return chunks.join('').slice(-3_000);
}

function waitFor<T extends ChildMessage['type']>(
  child: ChildProcess,
  type: T,
  timeoutMs: number,
  output: string[],
): Promise<Extract<ChildMessage, { type: T }>> {
  return new Promise((resolve, reject) => {
    const onMessage = (message: ChildMessage): void => {
      if (message.type === 'failed') {
        done();
        reject(new Error(message.error));
      } else if (message.type === type) {
        done();
        resolve(message as Extract<ChildMessage, { type: T }>);
      }
    };
    const onExit = (code: number | null, signal: string | null): void => {
      done();
      reject(new Error(`exited (${signal ?? `code ${code}`}) before "${type}"\n${tail(output)}`));
    };
    const timer = setTimeout(() => {
      done();
      reject(new Error(`no "${type}" within ${timeoutMs} ms\n${tail(output)}`));
    }, timeoutMs);
    const done = (): void => {
      clearTimeout(timer);
      child.off('message', onMessage);
      child.off('exit', onExit);
    };
    child.on('message', onMessage);
    child.on('exit', onExit);
  });
}

async function reap(child: ChildProcess): Promise<void> {
  if (child.exitCode === null && child.signalCode === null) {
    const exited = new Promise<void>((resolve) => child.once('exit', () => resolve()));
    const timer = setTimeout(() => child.kill('SIGKILL'), EXIT_GRACE_MS);
    await exited;
    clearTimeout(timer);
  }
  live.delete(child);
}

/** One repeat of one cell: its processes start, set up, go at the same instant, report, exit. */
async function runCell(spec: CellSpec, target: RedisTarget): Promise<{ parts: unknown[]; setupMs: number }> {
  const started = hr();
  const children = Array.from({ length: spec.processes }, () => {
    const output: string[] = [];
    const child = fork(CELL_JS, [], { stdio: ['ignore', 'pipe', 'pipe', 'ipc'] });
    live.add(child);
    for (const stream of [child.stdout, child.stderr]) {
      stream?.setEncoding('utf8').on('data', (chunk: string) => {
        output.push(chunk);
        if (output.length > 200) output.splice(0, 100);
      });
    }
    return { child, output };
  });
  try {
    const readies = children.map(({ child, output }) => waitFor(child, 'ready', SETUP_TIMEOUT_MS, output));
    children.forEach(({ child }, rank) =>
      child.send({ type: 'setup', spec, rank, redis: target } satisfies ParentMessage),
    );
    await Promise.all(readies);
    const setupMs = hr() - started;
    const results = children.map(({ child, output }) =>
      waitFor(child, 'result', spec.warmupMs + spec.measureMs + RUN_SLACK_MS, output),
    );
    const t0 = hr() + 250; // the same instant for every process of the cell
    for (const { child } of children) child.send({ type: 'go', t0 } satisfies ParentMessage);
    const parts = (await Promise.all(results)).map((message) => message.part);
    await Promise.all(children.map(({ child }) => reap(child)));
    return { parts, setupMs };
  } finally {
    for (const { child } of children) {
      if (child.exitCode === null && child.signalCode === null) child.kill('SIGKILL');
      live.delete(child);
    }
  }
}

function metricsOf(spec: CellSpec, parts: unknown[]): Metrics {
  switch (spec.scenario) {
    case 'uncontended':
      return uncontendedMetrics(parts as UncontendedPart[]);
    case 'contended':
      return contendedMetrics(spec, parts as ContendedPart[]);
    case 'renewal':
      return renewalMetrics(parts as RenewalPart[]);
    case 'http':
      return httpMetrics(parts as Metrics[]);
    case 'family':
      return familyMetrics(spec, parts as FamilyPart[]);
  }
}

function headline(spec: CellSpec, m: Metrics): string {
  switch (spec.scenario) {
    case 'uncontended':
      return `${Math.round(m.cyclesPerSec)} cycles/s, p99 ${Math.round(m.p99Us)} us`;
    case 'contended':
      return `${Math.round(m.csPerSec)} CS/s, handover p50 ${m.handoverP50Ms.toFixed(2)} ms, Jain ${m.jain.toFixed(2)}`;
    case 'renewal':
      return `${Math.round(m.roundTripsPerSec)} round trips/s, alive ${m.alive}/${spec.locks}`;
    case 'http':
      return `${Math.round(m.reqPerSec)} req/s, p99 ${m.latencyP99Ms.toFixed(2)} ms`;
    case 'family':
      return familyHeadline(spec, m);
  }
}

/**
 * A second of traffic on the fresh server (or on each master of the Cluster, on keys of its own
 * slots), so that the first cell does not pay for Redis's own start.
 */
async function warmRedis(admins: readonly Redis[]): Promise<void> {
  const until = hr() + 1_000;
  await Promise.all(
    admins.map(async (admin, node) => {
      const prefix = admins.length > 1 ? `warm:{${slotTag(SLOT_RANGES[node][0])}}:` : 'warm:';
      for (let round = 0; round < 1_000 && hr() < until; round += 1) {
        const pipeline = admin.pipeline();
        for (let i = 0; i < 100; i += 1) pipeline.set(`${prefix}${i}`, String(round), 'PX', 1_000).get(`${prefix}${i}`);
        await pipeline.exec();
      }
    }),
  );
  await flushAll(admins);
}

/** FLUSHALL on the server, or on every master of the Cluster. */
async function flushAll(admins: readonly Redis[]): Promise<void> {
  await Promise.all(admins.map((admin) => admin.flushall()));
}

function git(args: string[]): string {
  try {
    return execFileSync('git', args, { cwd: ROOT, encoding: 'utf8', stdio: ['ignore', 'pipe', 'ignore'] }).trim();
  } catch {
    return '';
  }
}

async function main(): Promise<void> {
  const opts = options();
  if (!redisServerOnPath()) {
    console.error('The benchmark needs redis-server on PATH (apt-get install redis-server / brew install redis).');
    process.exit(1);
  }
  let cells = plan(opts.profile).filter((spec) => opts.groups.includes(spec.group));
  if (opts.contenders) {
    const wanted = new Set(cells.filter((spec) => opts.contenders?.includes(spec.contender)).map((spec) => spec.id));
    for (const id of [...wanted]) wanted.add(baselineId(cells.find((spec) => spec.id === id) as CellSpec));
    cells = cells.filter((spec) => wanted.has(spec.id));
  }
  if (cells.length === 0) throw new Error('no cell matches --only / --contenders');

  const startedAt = new Date();
  const started = hr();
  // The single server for the groups that run there, the Cluster for the cluster group; each only if needed.
  let serverTarget: RedisTarget | undefined;
  let serverAdmin: Redis[] = [];
  if (cells.some((spec) => spec.group !== 'cluster')) {
    redis = await OwnRedis.start();
    serverTarget = { kind: 'server', url: redis.url };
    serverAdmin = [plainClient(redis.url, 'bench-orchestrator')];
  }
  let clusterTarget: RedisTarget | undefined;
  let clusterAdmin: Redis[] = [];
  if (cells.some((spec) => spec.group === 'cluster')) {
    cluster = new OwnCluster(); // held before it starts: Ctrl-C while it builds kills it too
    await cluster.start();
    clusterTarget = { kind: 'cluster', seeds: cluster.seeds };
    clusterAdmin = adminClients(clusterTarget, 'bench-orchestrator');
  }
  const allAdmins = [...serverAdmin, ...clusterAdmin];
  await Promise.all(allAdmins.map((admin) => ready(admin)));
  const meta: Omit<Meta, 'durationS' | 'loadAtEnd'> = {
    label: opts.label,
    profile: opts.profile.name,
    startedAt: startedAt.toISOString(),
    repeats: opts.repeats,
    cpuModel: cpus()[0]?.model ?? 'unknown',
    cores: cpus().length,
    memoryGb: Math.round(totalmem() / 2 ** 30),
    os: `${osType()} ${release()}`,
    node: process.version,
    redis: await redisVersion(allAdmins[0]),
    cluster: cluster ? `3 masters (ports ${cluster.ports.join(', ')}), no replicas` : undefined,
    nestjsDislock: (JSON.parse(readFileSync(join(ROOT, 'package.json'), 'utf8')) as { version: string }).version,
    gitCommit: git(['rev-parse', '--short', 'HEAD']) || 'unknown',
    gitDirty: git(['status', '--porcelain', '--', 'lib']) ? 'lib/' : '',
    timing: opts.profile.timing,
    loadAtStart: loadavg()[0],
  };
  const servers = [
    ...(redis ? [`on ${redis.url}`] : []),
    ...(cluster ? [`a Cluster of 3 masters on ports ${cluster.ports.join(', ')}`] : []),
  ];
  console.log(
    `nestjs-dislock benchmark (${opts.profile.name}): ${cells.length} cells x ${opts.repeats} repeat(s); ` +
      `redis-server ${meta.redis} ${servers.join(' and ')}; ${meta.cpuModel.trim()}, ${meta.cores} cores, Node ${meta.node}`,
  );
  if (meta.loadAtStart > meta.cores / 2) {
    console.log(
      `Warning: load average ${meta.loadAtStart.toFixed(1)} on ${meta.cores} cores; other work will skew the numbers`,
    );
  }

  await Promise.all([serverAdmin, clusterAdmin].filter((admins) => admins.length > 0).map(warmRedis));

  const runs = new Map<string, { spec: CellSpec; runs: Metrics[]; failures: string[] }>(
    cells.map((spec) => [spec.id, { spec, runs: [], failures: [] }]),
  );
  const total = cells.length * opts.repeats;
  let done = 0;
  for (let repeat = 1; repeat <= opts.repeats; repeat += 1) {
    for (const spec of cells) {
      done += 1;
      const prefix = `[${String(done).padStart(String(total).length)}/${total}] ${spec.id} #${repeat}`;
      const onCluster = spec.group === 'cluster';
      await flushAll(onCluster ? clusterAdmin : serverAdmin);
      await sleep(100); // let Redis settle after the flush
      const cellStart = hr();
      const entry = runs.get(spec.id) as { runs: Metrics[]; failures: string[] };
      try {
        const { parts, setupMs } = await runCell(spec, (onCluster ? clusterTarget : serverTarget) as RedisTarget);
        const metrics = metricsOf(spec, parts);
        entry.runs.push(metrics);
        const seconds = (ms: number): string => (ms / 1000).toFixed(1);
        console.log(
          `${prefix}: ${headline(spec, metrics)} (${seconds(hr() - cellStart)} s, start-up ${seconds(setupMs)} s)`,
        );
      } catch (error) {
        const message = error instanceof Error ? error.message : String(error);
        entry.failures.push(message);
        console.log(`${prefix}: FAILED\n${message.replace(/^/gm, '    ')}`);
      }
    }
  }
  await Promise.all(allAdmins.map((admin) => admin.quit()));
  await redis?.stop();
  redis = undefined;
  await cluster?.stop();
  cluster = undefined;

  const outcomes: Outcome[] = [...runs.values()].map(({ spec, runs: cellRuns, failures }) => {
    const keys = [...new Set(cellRuns.flatMap((metrics) => Object.keys(metrics)))];
    return {
      spec,
      runs: cellRuns,
      failures,
      median: Object.fromEntries(keys.map((key) => [key, median(cellRuns.map((metrics) => metrics[key]))])),
    };
  });
  const fullMeta: Meta = { ...meta, durationS: (hr() - started) / 1000, loadAtEnd: loadavg()[0] };
  const allTables = tables(outcomes);
  console.log('');
  for (const table of allTables) console.log(`${renderText(table)}\n`);
  console.log(`${outcomes.length} cells in ${Math.round(fullMeta.durationS)} s`);

  if (opts.write) {
    mkdirSync(RESULTS, { recursive: true });
    const stamp = startedAt.toISOString().slice(0, 16).replace('T', '-').replace(':', '');
    const jsonFile = join(RESULTS, `${stamp}-${opts.label}.json`);
    writeFileSync(jsonFile, `${JSON.stringify({ meta: fullMeta, cells: outcomes }, null, 2)}\n`);
    writeFileSync(join(RESULTS, 'latest.md'), renderMarkdown(allTables, fullMeta));
    const svg = join(RESULTS, 'latest.svg');
    writeFileSync(svg, renderSvg(outcomes, fullMeta));
    // A PNG too when librsvg's converter is installed (Debian: apt-get install librsvg2-bin); optional.
    const png = spawnSync('rsvg-convert', [svg, '-o', join(RESULTS, 'latest.png')], { stdio: 'ignore' }).status === 0;
    console.log(`Wrote ${jsonFile}, bench/results/latest.md, latest.svg${png ? ', latest.png' : ''}`);
  }
  const failed = outcomes.filter((outcome) => outcome.failures.length > 0);
  if (failed.length > 0) {
    console.error(
      `${failed.length} cell(s) had failed repeats: ${failed.map((outcome) => outcome.spec.id).join(', ')}`,
    );
    process.exitCode = 1;
  }
}

main().catch((error: unknown) => {
  console.error(error);
  killEverything();
  process.exit(1);
});
