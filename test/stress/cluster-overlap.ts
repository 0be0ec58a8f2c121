/**
 * Mutual exclusion on a real Redis Cluster at the density of "Two holders never", finding 4:
 *
 *   npm run stress -- --cluster-overlap --runs N [--loops 8] [--apps 2]
 *     [--names 6] [--sections 40] [--repeat 30] [--cs-ms 1] [--wait-time 10000] [--watchdog 30000] [--hogs 0]
 *     [--keep-scripts]
 *
 * Starts its own 3-master Cluster with 1 replica each (test/support/cluster.ts). Each run builds
 * `apps` Nest application contexts in this one process, each with its own ioredis `Cluster` client,
 * and runs `loops` concurrent loops per application, each doing `sections` x
 * `locks.withLock(name, cs, { waitTime })` on `names` lock names spread over the three masters
 * (a `cs-ms` critical section); all of that `repeat` times (2 x 8 x 40 x 30 = 19,200 critical
 * sections per run with the defaults). Every critical section's enter and exit is recorded with
 * performance.now() (one process, one clock), with its handle's owner and fencing token (an owner
 * `<waiting line>:<token>` is a grant held without a round trip of its own, which versions before
 * "Two holders never" did). Reported: two critical sections of one name inside at
 * once, and a fencing token that repeats or decreases from one critical section of a name to the
 * next, each with its details. Exits 1 on any, 0 otherwise.
 *
 * Before each run every master's script cache is flushed (SCRIPT FLUSH), so that each run starts
 * on masters that know no script, as a freshly started Cluster, a restarted master or a promoted
 * replica (Redis does not replicate its script cache) does: the library's first EVALSHA of each
 * script on each master is answered NOSCRIPT and sent again as EVAL, one round trip later, and
 * commands sent after it may run before it. `--keep-scripts` leaves the caches alone (only the
 * first run then starts cold). `--hogs K` runs K busy-looping node processes beside it (killed at
 * the end), as a busy machine would; `--watchdog` sets lockWatchdogTimeout (an ordinary hold's lease).
 * Not a vitest test (vitest only picks up *.spec.ts / *.e2e-spec.ts).
 */
import 'reflect-metadata';
import { type ChildProcess, spawn } from 'node:child_process';
import { parseArgs } from 'node:util';
import { NestFactory } from '@nestjs/core';
import type { INestApplicationContext } from '@nestjs/common';
import { type Cluster, Redis } from 'ioredis';
import { DisLockModule, type LockHandle, LockService } from 'nestjs-dislock';
import { keySlot } from '../../lib/store/redis/fence-key';
import { type ClusterNodeInfo, RedisCluster } from '../support/cluster';

const usage =
  'usage: npm run stress -- --cluster-overlap --runs N [--loops 8] [--apps 2] ' +
  '[--names 6] [--sections 40] [--repeat 30] [--cs-ms 1] [--wait-time 10000] [--watchdog 30000] [--hogs 0] ' +
  '[--keep-scripts]';

const now = (): number => performance.now();
const sleep = (ms: number): Promise<void> => new Promise((resolve) => setTimeout(resolve, ms));

interface Settings {
  readonly runs: number;
  readonly apps: number;
  readonly loops: number;
  readonly names: number;
  readonly sections: number;
  readonly repeat: number;
  readonly csMs: number;
  readonly waitTime: number;
  readonly watchdog: number;
  readonly hogs: number;
  readonly flushScripts: boolean;
}

/** One critical section as it ran. */
export interface Section {
  readonly name: string;
  readonly app: number;
  readonly loop: number;
  readonly owner: string;
  readonly token: number;
  readonly enter: number;
  readonly exit: number;
  /** The handle's signal had aborted (the lock was reported lost) by the end of the section. */
  readonly lostInside: boolean;
}

/** A lock event worth keeping beside the sections: a loss or a failed renewal. */
export interface Incident {
  readonly at: number;
  readonly app: number;
  readonly name: string;
  readonly owner: string;
  readonly what: string;
}

export interface Violation {
  readonly kind: 'overlap' | 'duplicate token' | 'decreasing token';
  readonly text: string;
}

interface RunResult {
  readonly sections: number;
  readonly ms: number;
  readonly failures: Map<string, number>;
  readonly incidents: Incident[];
  readonly violations: Violation[];
}

/** Reads integer options (`--name value`), naming the option and showing `usage` when one is wrong. */
export function integerOptions(
  usage: string,
): (name: string, value: string | undefined, fallback: number | undefined, min: number) => number {
  return (name, value, fallback, min) => {
    if (value === undefined) {
      if (fallback === undefined) throw new Error(`--${name} is required\n${usage}`);
      return fallback;
    }
    const n = Number(value);
    if (!Number.isInteger(n) || n < min)
      throw new Error(`--${name} must be an integer >= ${min}, got '${value}'\n${usage}`);
    return n;
  };
}

const integer = integerOptions(usage);

function settingsOf(argv: string[]): Settings | undefined {
  const { values } = parseArgs({
    args: argv,
    options: {
      runs: { type: 'string' },
      apps: { type: 'string' },
      loops: { type: 'string' },
      names: { type: 'string' },
      sections: { type: 'string' },
      repeat: { type: 'string' },
      'cs-ms': { type: 'string' },
      'wait-time': { type: 'string' },
      watchdog: { type: 'string' },
      hogs: { type: 'string' },
      'keep-scripts': { type: 'boolean' },
      help: { type: 'boolean' },
    },
  });
  if (values.help) return undefined;
  return {
    runs: integer('runs', values.runs, undefined, 1),
    apps: integer('apps', values.apps, 2, 1),
    loops: integer('loops', values.loops, 8, 1),
    names: integer('names', values.names, 6, 1),
    sections: integer('sections', values.sections, 40, 1),
    repeat: integer('repeat', values.repeat, 30, 1),
    csMs: integer('cs-ms', values['cs-ms'], 1, 0),
    waitTime: integer('wait-time', values['wait-time'], 10_000, 1),
    watchdog: integer('watchdog', values.watchdog, 30_000, 3),
    hogs: integer('hogs', values.hogs, 0, 0),
    flushScripts: !(values['keep-scripts'] ?? false),
  };
}

/** `count` lock names under `prefix`, taken in turn from each master's slots (name i on master i % 3). */
function namesOverMasters(masters: readonly ClusterNodeInfo[], prefix: string, count: number): Map<string, number> {
  const serving = (slot: number): number | undefined =>
    masters.find((m) => m.slots.some(([a, b]) => slot >= a && slot <= b))?.port;
  const byMaster = masters.map((m) => ({ port: m.port, names: [] as string[] }));
  for (let i = 0; byMaster.some((m) => m.names.length < Math.ceil(count / masters.length)); i += 1) {
    const name = `n${i}`;
    const port = serving(keySlot(prefix + name));
    const entry = byMaster.find((m) => m.port === port);
    if (entry) entry.names.push(name);
  }
  const names = new Map<string, number>();
  for (let i = 0; names.size < count; i += 1) {
    const entry = byMaster[i % byMaster.length];
    names.set(entry.names[Math.floor(i / byMaster.length)], entry.port);
  }
  return names;
}

const ms = (t: number, origin: number): string => (t - origin).toFixed(3);

function describeSection(s: Section, origin: number): string {
  const via = s.owner.includes(':') ? 'grant to its line' : 'own attempt';
  return (
    `app ${s.app} loop ${s.loop} owner ${s.owner} (${via}) token ${s.token} ` +
    `in [${ms(s.enter, origin)}, ${ms(s.exit, origin)}] ms${s.lostInside ? ', reported lost inside' : ''}`
  );
}

/** Overlapping sections of one name, and fencing tokens that repeat or go down from one section to the next. */
export function check(
  sections: readonly Section[],
  incidents: readonly Incident[],
  masterOf: ReadonlyMap<string, number>,
  origin: number,
): Violation[] {
  const byName = new Map<string, Section[]>();
  for (const s of sections) {
    const list = byName.get(s.name);
    if (list) list.push(s);
    else byName.set(s.name, [s]);
  }
  const related = (...owners: string[]): string => {
    const found = incidents.filter((i) => owners.includes(i.owner));
    return found.length === 0
      ? ''
      : `\n    events: ${found.map((i) => `${i.what} of ${i.owner} at ${ms(i.at, origin)} ms`).join('; ')}`;
  };
  const violations: Violation[] = [];
  for (const [name, list] of byName) {
    const where = `"${name}" (master :${masterOf.get(name)})`;
    list.sort((a, b) => a.enter - b.enter);
    let open: Section[] = [];
    const seen = new Map<number, Section>();
    list.forEach((s, i) => {
      open = open.filter((o) => o.exit > s.enter);
      for (const o of open) {
        violations.push({
          kind: 'overlap',
          text:
            `${where}: ${(Math.min(o.exit, s.exit) - s.enter).toFixed(3)} ms inside together\n` +
            `    first:  ${describeSection(o, origin)}\n    second: ${describeSection(s, origin)}` +
            related(o.owner, s.owner),
        });
      }
      open.push(s);
      const twin = seen.get(s.token);
      if (twin) {
        violations.push({
          kind: 'duplicate token',
          text:
            `${where}: token ${s.token} twice\n    first:  ${describeSection(twin, origin)}\n` +
            `    second: ${describeSection(s, origin)}` +
            related(twin.owner, s.owner),
        });
      }
      seen.set(s.token, s);
      const previous = list[i - 1];
      if (previous && s.token < previous.token) {
        violations.push({
          kind: 'decreasing token',
          text:
            `${where}: token went down\n    before: ${describeSection(previous, origin)}\n` +
            `    after:  ${describeSection(s, origin)}` +
            related(previous.owner, s.owner),
        });
      }
    });
  }
  return violations;
}

async function oneRun(cluster: RedisCluster, settings: Settings, run: number): Promise<RunResult> {
  const prefix = `overlap:${run}:${Date.now().toString(36)}:`;
  const masters = await cluster.masters();
  if (settings.flushScripts) await Promise.all(masters.map((m) => flushScripts(m.port)));
  const names = namesOverMasters(masters, prefix, settings.names);
  const nameList = [...names.keys()];
  const clients: Cluster[] = [];
  const apps: INestApplicationContext[] = [];
  const sections: Section[] = [];
  const incidents: Incident[] = [];
  const failures = new Map<string, number>();
  try {
    for (let a = 0; a < settings.apps; a += 1) {
      const client = await cluster.readyClient();
      clients.push(client);
      const app = await NestFactory.createApplicationContext(
        DisLockModule.forRoot({ redis: client, keyPrefix: prefix, lockWatchdogTimeout: settings.watchdog }),
        { logger: ['error'] },
      );
      apps.push(app);
      const locks = app.get(LockService);
      locks.on('lost', (e) =>
        incidents.push({ at: now(), app: a, name: e.name, owner: e.owner, what: `lost (${e.reason})` }),
      );
      locks.on('renewal-failed', (e) =>
        incidents.push({ at: now(), app: a, name: e.name, owner: e.owner, what: 'renewal failed' }),
      );
    }
    const services = apps.map((app) => app.get(LockService));
    const started = now();
    const loop = async (app: number, index: number): Promise<void> => {
      for (let s = 0; s < settings.sections; s += 1) {
        const name = nameList[Math.floor(Math.random() * nameList.length)];
        try {
          await services[app].withLock(
            name,
            async (handle: LockHandle) => {
              const enter = now();
              await sleep(settings.csMs);
              const exit = now();
              const { owner, fencingToken: token } = handle;
              sections.push({ name, app, loop: index, owner, token, enter, exit, lostInside: handle.signal.aborted });
            },
            { waitTime: settings.waitTime },
          );
        } catch (error) {
          const kind = error instanceof Error ? error.name : typeof error;
          failures.set(kind, (failures.get(kind) ?? 0) + 1);
        }
      }
    };
    for (let r = 0; r < settings.repeat; r += 1) {
      await Promise.all(
        services.flatMap((_, app) => Array.from({ length: settings.loops }, (__, index) => loop(app, index))),
      );
    }
    const took = now() - started;
    return {
      sections: sections.length,
      ms: took,
      failures,
      incidents,
      violations: check(sections, incidents, names, started),
    };
  } finally {
    await Promise.all(apps.map((app) => app.close().catch(() => undefined)));
    for (const client of clients) client.disconnect();
  }
}

/** SCRIPT FLUSH on one node: as a master that was restarted, promoted or just deployed, it knows no script. */
async function flushScripts(port: number): Promise<void> {
  const admin = new Redis({ port, host: '127.0.0.1', maxRetriesPerRequest: 1 });
  admin.on('error', () => undefined);
  try {
    await admin.script('FLUSH');
  } finally {
    admin.disconnect();
  }
}

/** `count` busy-looping node processes, as a busy machine would have. */
function startHogs(count: number): ChildProcess[] {
  return Array.from({ length: count }, () => {
    const hog = spawn(process.execPath, ['-e', 'for(;;){}'], { stdio: 'ignore' });
    hog.on('error', () => undefined);
    return hog;
  });
}

export async function clusterOverlap(argv: string[]): Promise<number> {
  const settings = settingsOf(argv);
  if (!settings) {
    console.log(usage);
    return 0;
  }
  const perRun = settings.apps * settings.loops * settings.sections * settings.repeat;
  console.log(
    `${settings.runs} runs of ${settings.apps} apps x ${settings.loops} loops x ${settings.sections} sections x ` +
      `${settings.repeat} on ${settings.names} names (${perRun} critical sections of ${settings.csMs} ms per run), ` +
      `waitTime ${settings.waitTime} ms, lockWatchdogTimeout ${settings.watchdog} ms, ${settings.hogs} CPU hogs, ` +
      (settings.flushScripts ? 'script caches flushed before each run' : 'script caches kept'),
  );
  const cluster = await RedisCluster.start();
  const hogs = startHogs(settings.hogs);
  const stop = (): void => {
    for (const hog of hogs) hog.kill('SIGKILL');
    void cluster.dispose().finally(() => process.exit(130));
  };
  process.once('SIGINT', stop);
  process.once('SIGTERM', stop);
  const totals = { sections: 0, overlaps: 0, tokens: 0, runsWithViolation: 0, lost: 0, failed: 0 };
  try {
    for (let run = 1; run <= settings.runs; run += 1) {
      const result = await oneRun(cluster, settings, run);
      const overlaps = result.violations.filter((v) => v.kind === 'overlap').length;
      const tokens = result.violations.length - overlaps;
      const lost = result.incidents.filter((i) => i.what.startsWith('lost')).length;
      const failed = [...result.failures.values()].reduce((sum, n) => sum + n, 0);
      totals.sections += result.sections;
      totals.overlaps += overlaps;
      totals.tokens += tokens;
      totals.lost += lost;
      totals.failed += failed;
      if (result.violations.length > 0) totals.runsWithViolation += 1;
      const failures = [...result.failures].map(([kind, n]) => `${n} ${kind}`).join(', ');
      console.log(
        `run ${run}/${settings.runs}: ${result.sections} sections in ${(result.ms / 1_000).toFixed(1)} s ` +
          `(${Math.round((result.sections / result.ms) * 1_000)}/s); ${overlaps} overlaps, ${tokens} token faults, ` +
          `${lost} locks lost, ${failed} calls failed${failures ? ` (${failures})` : ''}`,
      );
      for (const violation of result.violations) console.log(`  ${violation.kind.toUpperCase()} ${violation.text}`);
    }
  } finally {
    for (const hog of hogs) hog.kill('SIGKILL');
    await cluster.dispose();
  }
  console.log(
    `total: ${totals.sections} critical sections; ${totals.overlaps} overlaps, ${totals.tokens} token faults ` +
      `in ${totals.runsWithViolation} of ${settings.runs} runs; ${totals.lost} locks lost, ${totals.failed} calls failed`,
  );
  return totals.overlaps + totals.tokens > 0 ? 1 : 0;
}

// Run directly (not when `npm run stress -- --cluster-overlap` imports it).
if (require.main === module) {
  clusterOverlap(process.argv.slice(2)).then(
    (code) => process.exit(code),
    (error: unknown) => {
      console.error(error instanceof Error ? (error.stack ?? error.message) : error);
      process.exit(2);
    },
  );
}
