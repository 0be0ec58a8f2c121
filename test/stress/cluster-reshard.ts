/**
 * Issue 25, "A Cluster that reshards", as a measurement of its done-when:
 *
 *   npm run stress -- --reshard [--runs 1] [--slots 300] [--migrations 12] [--gap-ms 3000]
 *     [--apps 2] [--loops 4] [--names 12] [--moving-names 8] [--held 6] [--cs-ms 1]
 *     [--wait-time 10000] [--held-watchdog 30000] [--margin-ms 1000] [--batch 100]
 *     [--full-slots [--fill 30000] [--fill-every]]
 *
 * (= node -r ./test/support/ts-register.js test/stress/mutual-exclusion.ts --reshard ...). The
 * default run takes about a minute and a half.
 *
 * Starts its own 3-master Cluster with 1 replica each (test/support/cluster.ts). Each run builds
 * `--apps` Nest application contexts in this one process, each with its own ioredis `Cluster`
 * client (default options), whose `--loops` loops each race `withLock(name, 1 ms, { waitTime })` on
 * `--names` lock names, `--moving-names` of them on slots of master A that move, the others on B
 * and C; app 0 holds `--held` watchdog locks (`--held-watchdog` lease) on moving slots for the whole
 * run. Meanwhile `--slots` slots of A (those of the moving names and of the held locks, then A's
 * lowest others) move `--migrations` times, master to master and back (A to B, back to A, A to C,
 * back, ...), with `--gap-ms` between migrations (test/support/reshard.ts: IMPORTING/MIGRATING,
 * MIGRATE of every key in batches of `--batch`, SETSLOT NODE on every master once all are moved).
 * `--full-slots` first writes `--fill` other keys (default 30,000) into each moving slot that
 * holds a name or a held lock (`--fill-every`: into every moving slot, which makes each migration
 * take minutes), so that their migrations take seconds, as the slots of a busy Cluster do.
 *
 * Measured and printed, per run and in total:
 * - critical sections; overlaps (two sections of one name inside at once, from the sections'
 *   enter and exit times on this process's one clock, as cluster-overlap.ts checks them) and
 *   fencing tokens that repeat or go down from one section of a name to the next;
 * - errors to callers, by class and message, and how many say the slot was migrating (the message)
 *   or were TRYAGAIN (the cause); how many came on names in slots without other keys; callers
 *   that gave up later than their waitTime (+ 500 ms); and releases that failed, which `withLock`
 *   logs instead of throwing (read from the application's logger);
 * - hand-overs: from the end of a section to the start of the next one on its name, when the next
 *   caller was already waiting: p50/p99/max inside migration windows (from the first SETSLOT to
 *   every node agreeing, and `--margin-ms` after) and outside them;
 * - locks lost (the 'lost' event) by the held locks and by the race;
 * - each failed release: whether its hold was still in Redis (HEXISTS, PTTL) 1.5 s after its slot
 *   settled, the give-back's longest retry interval (1 s) past: stranded;
 * - keys left under the run's prefix on each master (SCAN), by kind, once every hold is released,
 *   and again 3.5 s later (a line place lapses after 3 s); fencing counters and data-set markers
 *   are meant to stay and are counted apart.
 *
 * Exits 1 when a bound of the issue's done-when is broken: an overlap or a repeated or decreasing
 * token; any key left but counters and markers after places lapsed; hand-over p99 outside
 * migrations of 100 ms or more; an error to a caller, or a failed release, on a name whose slot
 * holds no other keys (all of them without `--full-slots`); with `--full-slots`, a stranded lock,
 * or an error that does not say the slot was migrating or came later than its waitTime. Exits 2
 * on a harness failure. Not a vitest test (vitest only picks up *.spec.ts / *.e2e-spec.ts).
 */
import 'reflect-metadata';
import { parseArgs } from 'node:util';
import type { INestApplicationContext, LoggerService } from '@nestjs/common';
import { NestFactory } from '@nestjs/core';
import { type Cluster, Redis } from 'ioredis';
import { DisLockModule, LockService } from 'nestjs-dislock';
import { keySlot, slotTag } from '../../lib/store/redis/fence-key';
import { type ClusterNodeInfo, RedisCluster } from '../support/cluster';
import { Resharder } from '../support/reshard';
import { check, type Incident, integerOptions, type Section, type Violation } from './cluster-overlap';

const usage =
  'usage: npm run stress -- --reshard [--runs 1] [--slots 300] [--migrations 12] [--gap-ms 3000] ' +
  '[--apps 2] [--loops 4] [--names 12] [--moving-names 8] [--held 6] [--cs-ms 1] [--wait-time 10000] ' +
  '[--held-watchdog 30000] [--margin-ms 1000] [--batch 100] [--full-slots [--fill 30000] [--fill-every]]';

/** The done-when's bound on hand-overs outside migrations. */
const HAND_OVER_P99_MS = 100;
/** A caller that gives up may be this late past its waitTime. */
const GIVE_UP_MARGIN_MS = 500;
/** A failed release's hold still in Redis this long after its slot settled is stranded (give-back retries ≤ 1 s apart). */
const STRAND_AFTER_MS = 1_500;
/** A waiter's place in a line lapses 3 s after its last attempt: keys are counted again after this. */
const PLACES_LAPSE_MS = 3_500;
/** Keys per MSET when filling slots. */
const FILL_CHUNK = 1_000;

const now = (): number => performance.now();
const sleep = (ms: number): Promise<void> => new Promise((resolve) => setTimeout(resolve, ms));

interface Settings {
  readonly runs: number;
  readonly slots: number;
  readonly migrations: number;
  readonly gapMs: number;
  readonly apps: number;
  readonly loops: number;
  readonly names: number;
  readonly movingNames: number;
  readonly held: number;
  readonly csMs: number;
  readonly waitTime: number;
  readonly heldWatchdog: number;
  readonly marginMs: number;
  readonly batch: number;
  readonly fullSlots: boolean;
  readonly fill: number;
  readonly fillEvery: boolean;
}

const integer = integerOptions(usage);

function settingsOf(argv: string[]): Settings | undefined {
  const { values } = parseArgs({
    args: argv,
    options: {
      runs: { type: 'string' },
      slots: { type: 'string' },
      migrations: { type: 'string' },
      'gap-ms': { type: 'string' },
      apps: { type: 'string' },
      loops: { type: 'string' },
      names: { type: 'string' },
      'moving-names': { type: 'string' },
      held: { type: 'string' },
      'cs-ms': { type: 'string' },
      'wait-time': { type: 'string' },
      'held-watchdog': { type: 'string' },
      'margin-ms': { type: 'string' },
      batch: { type: 'string' },
      'full-slots': { type: 'boolean' },
      fill: { type: 'string' },
      'fill-every': { type: 'boolean' },
      help: { type: 'boolean' },
    },
  });
  if (values.help) return undefined;
  const settings: Settings = {
    runs: integer('runs', values.runs, 1, 1),
    slots: integer('slots', values.slots, 300, 1),
    migrations: integer('migrations', values.migrations, 12, 1),
    gapMs: integer('gap-ms', values['gap-ms'], 3_000, 0),
    apps: integer('apps', values.apps, 2, 1),
    loops: integer('loops', values.loops, 4, 1),
    names: integer('names', values.names, 12, 1),
    movingNames: integer('moving-names', values['moving-names'], 8, 0),
    held: integer('held', values.held, 6, 0),
    csMs: integer('cs-ms', values['cs-ms'], 1, 0),
    waitTime: integer('wait-time', values['wait-time'], 10_000, 1),
    heldWatchdog: integer('held-watchdog', values['held-watchdog'], 30_000, 3),
    marginMs: integer('margin-ms', values['margin-ms'], 1_000, 0),
    batch: integer('batch', values.batch, 100, 1),
    fullSlots: values['full-slots'] ?? false,
    fill: integer('fill', values.fill, 30_000, 1),
    fillEvery: values['fill-every'] ?? false,
  };
  if (settings.movingNames > settings.names) throw new Error(`--moving-names must be <= --names\n${usage}`);
  if (settings.movingNames + settings.held > settings.slots)
    throw new Error(`--slots must be >= --moving-names + --held (each in a slot of its own)\n${usage}`);
  return settings;
}

/** Where the run's names live and which slots move. */
interface Layout {
  /** The names the loops race on. */
  readonly race: readonly string[];
  /** The names held by watchdog locks for the whole run. */
  readonly held: readonly string[];
  /** Race names and held names on moving slots. */
  readonly moving: ReadonlySet<string>;
  /** The moving slots, ascending. */
  readonly slots: readonly number[];
  /** The moving slots that hold a name (filled with `--full-slots`). */
  readonly nameSlots: ReadonlySet<number>;
  /** Master A, whose slots move, then B and C. */
  readonly masters: readonly [ClusterNodeInfo, ClusterNodeInfo, ClusterNodeInfo];
  /** Each name's master at the start (for messages). */
  readonly masterOf: ReadonlyMap<string, number>;
}

const serves = (master: ClusterNodeInfo, slot: number): boolean =>
  master.slots.some(([a, b]) => slot >= a && slot <= b);

function layoutOf(all: readonly ClusterNodeInfo[], prefix: string, settings: Settings): Layout {
  const sorted = [...all].sort((x, y) => x.slots[0][0] - y.slots[0][0]);
  if (sorted.length !== 3) throw new Error(`Expected 3 masters, found ${sorted.length}`);
  const masters = sorted as unknown as Layout['masters'];
  const [a, b, c] = masters;
  const used = new Set<number>();
  const masterOf = new Map<string, number>();
  let counter = 0;
  /** A name of stem `stem` in a slot of its own that `on` serves. */
  const take = (stem: string, on: ClusterNodeInfo): string => {
    for (;;) {
      const name = `${stem}${counter}`;
      counter += 1;
      const slot = keySlot(prefix + name);
      if (used.has(slot) || !serves(on, slot)) continue;
      used.add(slot);
      masterOf.set(name, on.port);
      return name;
    }
  };
  const race: string[] = [];
  for (let i = 0; i < settings.movingNames; i += 1) race.push(take('n', a));
  for (let i = settings.movingNames; i < settings.names; i += 1) race.push(take('n', i % 2 === 0 ? b : c));
  const held: string[] = [];
  for (let i = 0; i < settings.held; i += 1) held.push(take('h', a));
  const moving = new Set([...race.slice(0, settings.movingNames), ...held]);
  const nameSlots = new Set([...moving].map((name) => keySlot(prefix + name)));
  const slots = new Set(nameSlots);
  for (const [first, last] of a.slots) {
    for (let slot = first; slot <= last && slots.size < settings.slots; slot += 1) {
      if (!used.has(slot)) slots.add(slot);
    }
  }
  return { race, held, moving, slots: [...slots].sort((x, y) => x - y), nameSlots, masters, masterOf };
}

/** Releases that `withLock` logged as failed (it does not throw them), read from the application's logger. */
interface LoggedRelease {
  readonly name: string;
  readonly why: string;
  readonly at: number;
  claimed: boolean;
}

/** The applications' logger: keeps withLock's failed releases, counts the rest by level. */
class CaptureLogger implements LoggerService {
  readonly releases: LoggedRelease[] = [];
  readonly other = new Map<string, number>();

  log(): void {}
  debug(): void {}
  verbose(): void {}
  warn(message: unknown): void {
    const text = String(message);
    const failed = /^Releasing lock "(.+)" failed \((.*)\); it is retried/s.exec(text);
    if (failed) this.releases.push({ name: failed[1], why: failed[2], at: now(), claimed: false });
    else this.count('warn', text);
  }
  error(message: unknown): void {
    this.count('error', String(message));
  }
  private count(level: string, text: string): void {
    const key = `${level}: ${text.slice(0, 160)}`;
    this.other.set(key, (this.other.get(key) ?? 0) + 1);
  }
}

/** A critical section, with when its call began. */
interface Timed extends Section {
  readonly calledAt: number;
}

/** An error a caller saw (thrown by withLock), or a release withLock logged as failed. */
interface CallError {
  readonly name: string;
  readonly what: 'acquire' | 'release (logged by withLock)' | 'held release' | 'other';
  /** Class and message, with the lock's name replaced by <name>. */
  readonly kind: string;
  readonly migrating: boolean;
  readonly tryagain: boolean;
  readonly tookMs: number;
}

interface FailedRelease {
  readonly name: string;
  readonly owner: string;
  readonly at: number;
  verdict?: 'given back' | 'stranded';
  pttl?: number;
}

interface Window {
  readonly from: number;
  readonly to: number;
  readonly start: number;
  readonly end: number;
  readonly keys: number;
}

interface Percentiles {
  readonly n: number;
  readonly p50: number;
  readonly p99: number;
  readonly max: number;
}

function percentiles(values: readonly number[]): Percentiles {
  if (values.length === 0) return { n: 0, p50: 0, p99: 0, max: 0 };
  const sorted = [...values].sort((x, y) => x - y);
  const at = (q: number): number => sorted[Math.min(sorted.length - 1, Math.ceil(q * sorted.length) - 1)];
  return { n: sorted.length, p50: at(0.5), p99: at(0.99), max: sorted[sorted.length - 1] };
}

const showPercentiles = (p: Percentiles): string =>
  p.n === 0 ? 'none' : `n=${p.n}, p50 ${p.p50.toFixed(1)} ms, p99 ${p.p99.toFixed(1)} ms, max ${p.max.toFixed(1)} ms`;

/** Every error's message and its causes', for classifying. */
function messages(error: unknown): string[] {
  const out: string[] = [];
  for (let e: unknown = error, depth = 0; e !== undefined && depth < 5; depth += 1) {
    out.push(e instanceof Error ? e.message : typeof e === 'string' ? e : JSON.stringify(e));
    e = e instanceof Error ? e.cause : undefined;
  }
  return out;
}

function callError(name: string, what: CallError['what'], error: unknown, tookMs: number): CallError {
  const [message, ...causes] = messages(error);
  const cls = error instanceof Error ? error.name : typeof error;
  // The innermost cause, with ports, slots and script digests left out: groups errors of one origin.
  const innermost = causes[causes.length - 1] ?? '';
  const root =
    innermost === '' ? '' : ` [cause: ${innermost.replace(/\b[0-9a-f]{40}\b/g, '<sha>').replace(/\d+/g, 'N')}]`;
  return {
    name,
    what,
    kind: `${cls}: ${message.split(`"${name}"`).join('"<name>"')}${root}`,
    migrating: /migrat/i.test(message),
    tryagain: [message, ...causes].some((m) => m.includes('TRYAGAIN')),
    tookMs,
  };
}

/** What the library's keys under `prefix` are, by their names (see lib/store/redis/fence-key.ts). */
function kindOf(key: string, prefix: string): string {
  const rest = key.slice(prefix.length);
  if (rest.startsWith('#fence:epoch')) return 'data-set marker';
  if (rest.startsWith('#fence:')) return 'fencing counter';
  const line = /^#line:\{[^}]*\}([qti]):/.exec(rest);
  if (line) return ({ q: 'line', t: 'line deadlines', i: 'holder records' } as Record<string, string>)[line[1]];
  return 'lock';
}
const MEANT_TO_STAY = new Set(['fencing counter', 'data-set marker']);

/** Keys under `prefix` on each master (SCAN), by kind. */
async function keysLeft(cluster: RedisCluster, prefix: string): Promise<Map<number, Map<string, string[]>>> {
  const found = new Map<number, Map<string, string[]>>();
  for (const master of await cluster.masters()) {
    const node = new Redis({ host: '127.0.0.1', port: master.port, maxRetriesPerRequest: 1 });
    node.on('error', () => undefined);
    const byKind = new Map<string, string[]>();
    try {
      let cursor = '0';
      do {
        const [next, keys] = await node.scan(cursor, 'MATCH', `${prefix}*`, 'COUNT', 1_000);
        cursor = next;
        for (const key of keys) {
          const kind = kindOf(key, prefix);
          byKind.set(kind, [...(byKind.get(kind) ?? []), key]);
        }
      } while (cursor !== '0');
    } finally {
      node.disconnect();
    }
    found.set(master.port, byKind);
  }
  return found;
}

const leftover = (scan: Map<number, Map<string, string[]>>): number =>
  [...scan.values()].reduce(
    (sum, byKind) => sum + [...byKind].reduce((n, [kind, keys]) => n + (MEANT_TO_STAY.has(kind) ? 0 : keys.length), 0),
    0,
  );

function showScan(scan: Map<number, Map<string, string[]>>): string {
  return [...scan]
    .map(([port, byKind]) => {
      const left = [...byKind].filter(([kind]) => !MEANT_TO_STAY.has(kind));
      const stay = [...byKind].filter(([kind]) => MEANT_TO_STAY.has(kind));
      const show = (list: [string, string[]][]): string =>
        list.map(([kind, keys]) => `${keys.length} ${kind}`).join(', ');
      return `:${port} ${left.length === 0 ? 'none' : show(left)}${stay.length > 0 ? ` (${show(stay)} meant to stay)` : ''}`;
    })
    .join('; ');
}

/** Write `count` keys of no lock's into `slot` on the master on `port`. */
async function fill(port: number, slot: number, count: number): Promise<void> {
  const node = new Redis({ host: '127.0.0.1', port, maxRetriesPerRequest: 1 });
  node.on('error', () => undefined);
  try {
    const tag = slotTag(slot);
    for (let from = 0; from < count; from += FILL_CHUNK) {
      const pairs: string[] = [];
      for (let i = from; i < Math.min(count, from + FILL_CHUNK); i += 1) pairs.push(`fill:{${tag}}:${i}`, 'x');
      await node.call('MSET', ...pairs);
    }
  } finally {
    node.disconnect();
  }
}

async function flushAll(cluster: RedisCluster): Promise<void> {
  for (const master of await cluster.masters()) {
    const node = new Redis({ host: '127.0.0.1', port: master.port, maxRetriesPerRequest: 1 });
    node.on('error', () => undefined);
    try {
      await node.flushall();
    } finally {
      node.disconnect();
    }
  }
}

interface RunResult {
  readonly sections: number;
  readonly ms: number;
  readonly violations: Violation[];
  readonly errors: CallError[];
  readonly failedReleases: FailedRelease[];
  readonly emptySlotErrors: number;
  readonly lateGiveUps: number;
  readonly handOutside: Percentiles;
  readonly handInside: Percentiles;
  readonly deafOutside: number;
  readonly heldLost: number;
  readonly raceLost: number;
  readonly keysAtOnce: number;
  readonly keysAfterLapse: number;
  readonly broken: string[];
}

async function oneRun(cluster: RedisCluster, settings: Settings, run: number): Promise<RunResult> {
  const prefix = `reshard:${run}:${Date.now().toString(36)}:`;
  const layout = layoutOf(await cluster.masters(), prefix, settings);
  const [home, b, c] = layout.masters;
  const filled = settings.fullSlots
    ? settings.fillEvery
      ? new Set(layout.slots)
      : layout.nameSlots
    : new Set<number>();
  const inFilledSlot = (name: string): boolean => filled.has(keySlot(prefix + name));
  console.log(
    `run ${run}/${settings.runs}: ${layout.slots.length} slots of :${home.port} (${layout.nameSlots.size} of them holding ` +
      `${settings.movingNames} race names and ${layout.held.length} held locks) move ${settings.migrations} times ` +
      `(:${home.port} to :${b.port} and back, to :${c.port} and back, ...), ${settings.gapMs} ms apart; ` +
      `${settings.apps} apps x ${settings.loops} loops race withLock on ${layout.race.length} names ` +
      `(${settings.movingNames} on moving slots), ${settings.csMs} ms sections, waitTime ${settings.waitTime} ms`,
  );
  if (filled.size > 0) {
    const started = now();
    for (const slot of filled) await fill(home.port, slot, settings.fill);
    console.log(
      `  filled ${filled.size} moving slots with ${settings.fill} other keys each in ${((now() - started) / 1_000).toFixed(1)} s`,
    );
  }

  const logger = new CaptureLogger();
  const clients: Cluster[] = [];
  const apps: INestApplicationContext[] = [];
  const sections: Timed[] = [];
  const incidents: Incident[] = [];
  const errors: CallError[] = [];
  const failedReleases: FailedRelease[] = [];
  const windows: Window[] = [];
  const heldOwners = new Set<string>();
  let migrating = false;
  let stopping = false;
  let finished = false;
  const resharder = new Resharder(cluster);
  const admin = await cluster.readyClient();
  try {
    for (let a = 0; a < settings.apps; a += 1) {
      const client = await cluster.readyClient();
      clients.push(client);
      const app = await NestFactory.createApplicationContext(
        DisLockModule.forRoot({ redis: client, keyPrefix: prefix }),
        { logger },
      );
      apps.push(app);
      app
        .get(LockService)
        .on('lost', (e) =>
          incidents.push({ at: now(), app: a, name: e.name, owner: e.owner, what: `lost (${e.reason})` }),
        );
    }
    const services = apps.map((app) => app.get(LockService));
    const held = await Promise.all(
      layout.held.map((name) => services[0].lock(name, { lockWatchdogTimeout: settings.heldWatchdog })),
    );
    for (const handle of held) heldOwners.add(handle.owner);

    const loop = async (app: number, index: number): Promise<void> => {
      while (!stopping) {
        const name = layout.race[Math.floor(Math.random() * layout.race.length)];
        const calledAt = now();
        let section: Timed | undefined;
        try {
          await services[app].withLock(
            name,
            async (handle) => {
              const enter = now();
              await sleep(settings.csMs);
              const exit = now();
              const { owner, fencingToken: token } = handle;
              section = {
                name,
                app,
                loop: index,
                owner,
                token,
                calledAt,
                enter,
                exit,
                lostInside: handle.signal.aborted,
              };
              sections.push(section);
            },
            { waitTime: settings.waitTime },
          );
          // withLock logs a failed release instead of throwing it. Only this section's holder
          // releases its name now, so the line logged for it since its end is its release's.
          const done = section;
          const logged = done && logger.releases.find((l) => !l.claimed && l.name === name && l.at >= done.exit);
          if (done && logged) {
            logged.claimed = true;
            errors.push(callError(name, 'release (logged by withLock)', new Error(logged.why), now() - done.exit));
            failedReleases.push({ name, owner: done.owner, at: logged.at });
          }
        } catch (error) {
          errors.push(callError(name, section ? 'other' : 'acquire', error, now() - calledAt));
        }
      }
    };

    /** Whether each failed release's hold was still in Redis STRAND_AFTER_MS after its slot settled. */
    const judgeReleases = async (final: boolean): Promise<void> => {
      for (const failed of failedReleases) {
        if (failed.verdict !== undefined) continue;
        const settledAt = windows.find((w) => failed.at >= w.start && failed.at <= w.end)?.end ?? failed.at;
        if (!final && (migrating || now() - settledAt < STRAND_AFTER_MS)) continue;
        const key = prefix + failed.name;
        const [[, there], [, pttl]] = ((await admin.pipeline().hexists(key, failed.owner).pttl(key).exec()) ?? []) as [
          unknown,
          unknown,
        ][];
        failed.verdict = Number(there) === 1 ? 'stranded' : 'given back';
        failed.pttl = Number(pttl);
      }
    };
    const judging = (async () => {
      while (!finished) {
        await sleep(250);
        if (!migrating) await judgeReleases(false).catch(() => undefined);
      }
    })();

    const started = now();
    const loops = services.flatMap((_, app) => Array.from({ length: settings.loops }, (__, i) => loop(app, i)));
    let current = home.port;
    const away = [b.port, c.port];
    for (let m = 0; m < settings.migrations; m += 1) {
      await sleep(settings.gapMs);
      const to = current === home.port ? away[Math.floor(m / 2) % 2] : home.port;
      migrating = true;
      const start = now();
      const report = await resharder.move(layout.slots, to, { batch: settings.batch });
      const end = now();
      migrating = false;
      const keys = [...report.keys.values()].reduce((sum, n) => sum + n, 0);
      windows.push({ from: current, to, start, end, keys });
      console.log(
        `  migration ${m + 1}/${settings.migrations}: :${current} -> :${to}, ${report.keys.size} slots, ${keys} keys, ` +
          `${Math.round(end - start)} ms`,
      );
      current = to;
    }
    await sleep(settings.gapMs);
    stopping = true;
    await Promise.all(loops);
    const took = now() - started;
    await sleep(STRAND_AFTER_MS);
    await judgeReleases(true);
    finished = true;
    await judging;
    for (const [i, handle] of held.entries()) {
      const at = now();
      await handle
        .release()
        .catch((error: unknown) => errors.push(callError(layout.held[i], 'held release', error, now() - at)));
    }
    const atOnce = await keysLeft(cluster, prefix);
    await sleep(PLACES_LAPSE_MS);
    const afterLapse = await keysLeft(cluster, prefix);

    // Hand-overs: a section's end to the next section of its name, when that one's call had begun before.
    const byName = new Map<string, Timed[]>();
    for (const s of sections) byName.set(s.name, [...(byName.get(s.name) ?? []), s]);
    const inWindow = (from: number, to: number): boolean =>
      windows.some((w) => from <= w.end + settings.marginMs && to >= w.start);
    const inside: number[] = [];
    const outside: number[] = [];
    for (const list of byName.values()) {
      list.sort((x, y) => x.enter - y.enter);
      for (let i = 1; i < list.length; i += 1) {
        const [previous, next] = [list[i - 1], list[i]];
        if (next.calledAt >= previous.exit) continue; // nobody was waiting
        (inWindow(previous.exit, next.enter) ? inside : outside).push(next.enter - previous.exit);
      }
    }
    const handOutside = percentiles(outside);
    const handInside = percentiles(inside);
    const deafOutside = outside.filter((ms) => ms >= 1_000).length;
    const violations = check(sections, incidents, layout.masterOf, started);
    const emptySlotErrors = errors.filter((e) => !inFilledSlot(e.name)).length;
    const lateGiveUps = errors.filter(
      (e) => e.what === 'acquire' && e.tookMs > settings.waitTime + GIVE_UP_MARGIN_MS,
    ).length;
    const earlyGiveUps = errors.filter((e) => e.what === 'acquire' && e.tookMs < settings.waitTime).length;
    const heldLost = incidents.filter((i) => heldOwners.has(i.owner)).length;
    const raceLost = incidents.length - heldLost;
    const stranded = failedReleases.filter((f) => f.verdict === 'stranded');

    const overlaps = violations.filter((v) => v.kind === 'overlap').length;
    const broken: string[] = [];
    if (overlaps > 0) broken.push(`${overlaps} overlaps`);
    if (violations.length > overlaps) broken.push(`${violations.length - overlaps} repeated or decreasing tokens`);
    if (leftover(afterLapse) > 0) broken.push(`${leftover(afterLapse)} keys left after every hold was released`);
    if (handOutside.p99 >= HAND_OVER_P99_MS)
      broken.push(`hand-over p99 outside migrations ${handOutside.p99.toFixed(1)} ms`);
    if (emptySlotErrors > 0) broken.push(`${emptySlotErrors} errors on names in slots without other keys`);
    if (settings.fullSlots) {
      if (stranded.length > 0) broken.push(`${stranded.length} locks stranded by a failed release`);
      const unsaid = errors.filter((e) => inFilledSlot(e.name) && !e.migrating).length;
      if (unsaid > 0) broken.push(`${unsaid} errors on full slots that do not say the slot was migrating`);
      if (lateGiveUps > 0) broken.push(`${lateGiveUps} callers gave up later than their waitTime`);
    }

    // The run's paragraph.
    const kinds = new Map<string, number>();
    for (const e of errors) kinds.set(`${e.what}: ${e.kind}`, (kinds.get(`${e.what}: ${e.kind}`) ?? 0) + 1);
    const migratingErrors = errors.filter((e) => e.migrating || e.tryagain).length;
    const tokens = violations.length - overlaps;
    console.log(
      `  critical sections: ${sections.length} in ${(took / 1_000).toFixed(1)} s ` +
        `(${Math.round((sections.length / took) * 1_000)}/s); ${overlaps} overlaps, ${tokens} repeated or decreasing tokens`,
    );
    console.log(
      `  errors to callers and failed releases: ${errors.length} (${migratingErrors} say migrating or were TRYAGAIN; ` +
        `${emptySlotErrors} on names in slots without other keys; ${earlyGiveUps} acquisitions gave up before their waitTime, ` +
        `${lateGiveUps} later than waitTime + ${GIVE_UP_MARGIN_MS} ms)`,
    );
    for (const [kind, n] of [...kinds].sort((x, y) => y[1] - x[1])) console.log(`    ${n} x ${kind}`);
    console.log(
      `  hand-over (end of a section to the next waiter's): outside migrations ${showPercentiles(handOutside)}` +
        `${deafOutside > 0 ? ` (${deafOutside} of 1 s or more)` : ''}; inside (+${settings.marginMs} ms) ${showPercentiles(handInside)}`,
    );
    console.log(
      `  locks lost: ${heldLost} of ${layout.held.length} held locks, ${raceLost} in the race` +
        `${incidents.length > 0 ? ` (${[...new Set(incidents.map((i) => i.what))].join(', ')})` : ''}`,
    );
    console.log(
      `  failed releases: ${failedReleases.length}; stranded (still held ${STRAND_AFTER_MS} ms after the slot settled): ${stranded.length}` +
        stranded.map((f) => `\n    "${f.name}" owner ${f.owner}: PTTL ${f.pttl} ms`).join(''),
    );
    console.log(`  keys left once every hold was released: ${showScan(atOnce)}`);
    console.log(`  keys left ${PLACES_LAPSE_MS} ms later: ${showScan(afterLapse)}`);
    for (const [kind, keys] of [...afterLapse.values()].flatMap((byKind) => [...byKind])) {
      if (!MEANT_TO_STAY.has(kind))
        console.log(`    ${kind}: ${keys.slice(0, 5).join(' ')}${keys.length > 5 ? ' ...' : ''}`);
    }
    if (logger.other.size > 0) {
      console.log(`  the applications logged: ${[...logger.other].map(([line, n]) => `${n} x ${line}`).join('; ')}`);
    }
    for (const violation of violations.slice(0, 10)) console.log(`  ${violation.kind.toUpperCase()} ${violation.text}`);
    console.log(`  bounds: ${broken.length === 0 ? 'OK' : `BROKEN: ${broken.join('; ')}`}`);
    return {
      sections: sections.length,
      ms: took,
      violations,
      errors,
      failedReleases,
      emptySlotErrors,
      lateGiveUps,
      handOutside,
      handInside,
      deafOutside,
      heldLost,
      raceLost,
      keysAtOnce: leftover(atOnce),
      keysAfterLapse: leftover(afterLapse),
      broken,
    };
  } finally {
    stopping = true;
    finished = true;
    await Promise.all(apps.map((app) => app.close().catch(() => undefined)));
    for (const client of clients) client.disconnect();
    admin.disconnect();
    resharder.close();
    await flushAll(cluster).catch(() => undefined);
  }
}

export async function clusterReshard(argv: string[]): Promise<number> {
  const settings = settingsOf(argv);
  if (!settings) {
    console.log(usage);
    return 0;
  }
  const cluster = await RedisCluster.start();
  const stop = (): void => void cluster.dispose().finally(() => process.exit(130));
  process.once('SIGINT', stop);
  process.once('SIGTERM', stop);
  const results: RunResult[] = [];
  try {
    for (let run = 1; run <= settings.runs; run += 1) results.push(await oneRun(cluster, settings, run));
  } finally {
    await cluster.dispose();
  }
  const sum = (f: (r: RunResult) => number): number => results.reduce((n, r) => n + f(r), 0);
  const brokenRuns = results.filter((r) => r.broken.length > 0).length;
  console.log(
    `total: ${sum((r) => r.sections)} critical sections in ${settings.runs} runs; ` +
      `${sum((r) => r.violations.filter((v) => v.kind === 'overlap').length)} overlaps, ` +
      `${sum((r) => r.violations.filter((v) => v.kind !== 'overlap').length)} token faults; ` +
      `${sum((r) => r.errors.length)} errors and failed releases (${sum((r) => r.emptySlotErrors)} on slots without other keys); ` +
      `${sum((r) => r.failedReleases.filter((f) => f.verdict === 'stranded').length)} stranded; ` +
      `hand-over p99 outside migrations up to ${Math.max(...results.map((r) => r.handOutside.p99)).toFixed(1)} ms; ` +
      `${sum((r) => r.keysAfterLapse)} keys left; bounds broken in ${brokenRuns} of ${settings.runs} runs`,
  );
  return brokenRuns > 0 ? 1 : 0;
}

// Run directly (not when `npm run stress -- --reshard` imports it).
if (require.main === module) {
  clusterReshard(process.argv.slice(2)).then(
    (code) => process.exit(code),
    (error: unknown) => {
      console.error(error instanceof Error ? (error.stack ?? error.message) : error);
      process.exit(2);
    },
  );
}
