/**
 * Every Lua script of the Redis store is safe to run twice (issue 20, "Two holders never").
 *
 * ioredis re-sends a command whose reply was lost with its connection (`autoResendUnfulfilledCommands`,
 * on by default), so Redis may run any script of the library a second time. For each script, each
 * test here:
 *  1. builds a realistic state on the suite's own redis-server with the store's own calls: a lock held
 *     with waiters in its line, a grant to the head of the line not taken up yet, shared holds...;
 *  2. makes the call through the library's own path (a `RedisLockStore` on an ioredis client behind a
 *     FaultProxy, or `LockService.forceUnlock` in a Nest application behind it) with the script's reply
 *     dropped and the connection reset: Redis runs it, the client reconnects and re-sends it, Redis runs
 *     it again. The proxy's log shows both runs, on two connections;
 *  3. checks that Redis ends where ONE run leaves it. The yardstick is a control: the same setup on a
 *     fresh key, the same call run once with no fault. Compared: the holds (their kinds and lease ends),
 *     the line in order and its deadlines, the holders' descriptions (`=<owner>` fields of the lock hash), the grants; and, on the
 *     key run twice, that the re-sent copy changed nothing the first run had left (a snapshot taken
 *     between the two runs, before the re-sent copy can reach Redis). And the caller's answer must be
 *     the one a single run gives.
 *
 * In some tests others act between the two runs, as they can in the time a reconnect takes: the head
 * of the line takes up the grant the first run handed it. The re-sent copy must not undo that. The
 * proxy holds the re-sent copy back (a blackhole on its connections) while they act, and the test
 * checks from the proxy's log that the copy reached Redis only after they had acted.
 *
 * The force-unlock tests also run the old force-unlock script (before 3c88ec6 it dropped every hold it
 * found) the same way: the same checks fail on it. So they can fail on a script that is not safe
 * to run twice.
 *
 * Places in a line lapse 3 s after a waiter's last attempt. Nobody refreshes them here, so every scene
 * pushes the deadlines of the places it made far out (`keepPlaces`). Then a slow run on a busy machine
 * cannot drop a place that the control kept. Leases are tens of seconds, a different one for each
 * holder, so that a lease that moved to another hold shows. The only short times are the library's
 * own: a grant's 250 ms (GRANT_MS), which the calls meet within a few ms of making it.
 */
import { Logger } from '@nestjs/common';
import { Redis } from 'ioredis';
import type { DisLockModuleOptions, LockHandle } from 'nestjs-dislock';
import { fenceKeyFor, lineKeysFor } from '../lib/store/redis/fence-key';
import { GRANT_MS, RedisLockStore } from '../lib/store/redis/redis-lock.store';
import { ACQUIRE_SHARED_SCRIPT } from '../lib/store/redis/scripts/acquire-shared.script';
import { ACQUIRE_SCRIPT } from '../lib/store/redis/scripts/acquire.script';
import { CHECK_SCRIPT } from '../lib/store/redis/scripts/check.script';
import { FORCE_UNLOCK_SCRIPT } from '../lib/store/redis/scripts/force-unlock.script';
import { INSPECT_SCRIPT } from '../lib/store/redis/scripts/inspect.script';
import { LEAVE_SCRIPT } from '../lib/store/redis/scripts/leave.script';
import { HAND_ON_LUA } from '../lib/store/redis/scripts/line.lua';
import { LuaScript } from '../lib/store/redis/scripts/lua-script';
import { RELEASE_SCRIPT } from '../lib/store/redis/scripts/release.script';
import { RENEW_SCRIPT } from '../lib/store/redis/scripts/renew.script';
import type {
  AcquireResult,
  CheckResult,
  ReleaseResult,
  RenewOutcome,
  StoredHold,
  StoredLock,
} from '../lib/store/lock-store.interface';
import { createTestApp, type TestApp } from './support/app';
import { gate, settle, waitFor } from './support/async';
import { FaultProxy, isScript } from './support/fault-proxy';
import { RedisServer } from './support/redis-server';
import { uniquePrefix } from './support/shared-redis';

/** The store's bound on each call: far above a reconnect, so that the re-sent copy is what answers. */
const OPERATION_TIMEOUT = 10_000;
/** How soon the store's client reconnects after the reset (the library's default is 50 ms). */
const RECONNECT_MS = 5;
/** How long the proxy holds the re-sent copy back while others act between the two runs. */
const HOLD_MS = 600;
/** The same, when the one acting is a waiter in a Nest application that must first hear the announcement. */
const APP_HOLD_MS = 1_500;
/** How far apart two lease ends (or deadlines) may be and still be the same. */
const SLACK_MS = 1_000;
/** Far beyond any test: where `keepPlaces` puts the deadlines of the places a scene made. */
const KEEP_PLACES_MS = 600_000;

/** Leases of the holders, each its own (at least 5 s apart), so that a lease moved to another hold shows. */
const LEASE = {
  oA: 60_000,
  oN: 70_000,
  oW1: 80_000,
  oW2: 85_000,
  oW3: 75_000,
  soR1: 50_000,
  soR2: 40_000,
  soR3: 35_000,
  soP0: 25_000,
  soP1: 55_000,
  soP2: 45_000,
  /** A waiter's attempts that are refused: never a hold. */
  attempt: 30_000,
} as const;

/** The four keys a lock's scripts touch (the store's `lineScriptKeys`, on one server without a keyPrefix). */
interface LockKeys {
  readonly lock: string;
  readonly fence: string;
  readonly line: string;
  readonly deadlines: string;
}

function keysOf(prefix: string, lock: string): LockKeys {
  const [line, deadlines] = lineKeysFor(prefix, lock, lock);
  return { lock, fence: fenceKeyFor(prefix, lock), line, deadlines };
}

const listOf = (k: LockKeys): string[] => [k.lock, k.fence, k.line, k.deadlines];

/** Everything the scripts keep for one lock, read in one go (a script: nothing runs in between). */
const SNAPSHOT_SCRIPT = new LuaScript(
  'snapshot',
  `
local clock = redis.call('time')
local kind = redis.call('type', KEYS[1]).ok
return {
  string.format('%.0f', tonumber(clock[1]) * 1000 + math.floor(tonumber(clock[2]) / 1000)),
  kind,
  redis.call('pttl', KEYS[1]),
  kind == 'hash' and redis.call('hgetall', KEYS[1]) or {},
  redis.call('zrange', KEYS[3], 0, -1, 'WITHSCORES'),
  redis.call('zrange', KEYS[4], 0, -1, 'WITHSCORES'),
  redis.call('get', KEYS[2]) or '',
}
`,
);

/** The places of a line no longer lapse while a test runs (nobody here refreshes them, see above). */
const KEEP_PLACES_SCRIPT = new LuaScript(
  'keep-places',
  `
local clock = redis.call('time')
local ms = tonumber(clock[1]) * 1000 + math.floor(tonumber(clock[2]) / 1000)
local keep = tonumber(ARGV[1])
for _, waiter in ipairs(redis.call('zrange', KEYS[2], 0, -1)) do
  redis.call('zadd', KEYS[2], ms + keep, waiter)
end
for _, key in ipairs(KEYS) do
  if redis.call('exists', key) == 1 then redis.call('pexpire', key, keep) end
end
`,
);

/**
 * The force-unlock script as it was before 3c88ec6: it dropped whatever holds it found, then handed
 * the lock on. Run twice, its second run drops the hold its first run handed to the next waiter.
 * Here only as the control that shows the force-unlock tests can fail.
 */
const OLD_FORCE_UNLOCK_SCRIPT = new LuaScript(
  'old-force-unlock',
  `
local key, fence, line, deadlines = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local message, sharded, grant = ARGV[1], ARGV[2], tonumber(ARGV[3])
if redis.call('type', key).ok ~= 'hash' then return {} end
local removed = redis.call('hgetall', key)
redis.call('del', key)
${HAND_ON_LUA('true')}
return removed
`,
);

const ALL_SCRIPTS = [
  ACQUIRE_SCRIPT,
  ACQUIRE_SHARED_SCRIPT,
  RELEASE_SCRIPT,
  RENEW_SCRIPT,
  LEAVE_SCRIPT,
  CHECK_SCRIPT,
  INSPECT_SCRIPT,
  FORCE_UNLOCK_SCRIPT,
  OLD_FORCE_UNLOCK_SCRIPT,
  SNAPSHOT_SCRIPT,
  KEEP_PLACES_SCRIPT,
];

/** What Redis keeps for one lock at one moment. */
interface Snapshot {
  /** The server's time in ms when it was read. */
  readonly at: number;
  readonly type: string;
  readonly pttl: number;
  readonly hash: ReadonlyMap<string, string>;
  /** Waiters by arrival. */
  readonly line: readonly string[];
  /** Each waiter's arrival score (µs), as Redis has it. */
  readonly arrivals: ReadonlyMap<string, string>;
  /** When each place lapses (server ms). */
  readonly deadlines: ReadonlyMap<string, number>;
  readonly info: ReadonlyMap<string, string>;
  /** The slot's last fencing token (0: none yet). */
  readonly fence: number;
}

function pairsOf(flat: readonly string[]): Map<string, string> {
  const map = new Map<string, string>();
  for (let i = 0; i + 1 < flat.length; i += 2) map.set(flat[i], flat[i + 1]);
  return map;
}

type Kind = 'granted' | 'exclusive' | 'shared';

const kindOf = (value: string): Kind => (value === '0' ? 'granted' : value === '1' ? 'exclusive' : 'shared');

/** A grant's field, `<waiter>:<token>`, with its token left out (another run issues another token). */
const GRANT_FIELD = /^(.+):(\d+)$/;

/**
 * A snapshot as two runs are compared: what is held and by whom, the line, the descriptions, and the
 * lease ends and deadlines counted from `since` (server ms). With tokens 'hidden', the fencing tokens
 * are left out (a grant's field keeps its waiter, a description says whether it has a token) and so are
 * the arrival scores: for a control on another key, at another moment.
 */
interface Judged {
  readonly discrete: Record<string, unknown>;
  readonly times: Record<string, number>;
}

function judged(s: Snapshot, tokens: 'kept' | 'hidden', since: number): Judged {
  const field = (name: string): string => (tokens === 'kept' ? name : name.replace(GRANT_FIELD, '$1:<token>'));
  const sorted = <T>(entries: [string, T][]): Record<string, T> =>
    Object.fromEntries(entries.sort(([a], [b]) => (a < b ? -1 : a > b ? 1 : 0)));
  const holds = sorted([...s.hash].map(([owner, value]): [string, Kind] => [field(owner), kindOf(value)]));
  const info = sorted(
    [...s.info].map(([who, entry]): [string, string] => {
      const [, token = '', ...description] = entry.split('|');
      const shown = tokens === 'kept' || token === '' ? token : '<token>';
      return [field(who), `${shown}|${description.join('|')}`];
    }),
  );
  const times: Record<string, number> = {};
  if (s.type === 'hash' && s.pttl >= 0) times.lease = s.at + s.pttl - since;
  for (const [owner, value] of s.hash)
    if (kindOf(value) === 'shared') times[`hold ${field(owner)}`] = Number(value) - since;
  for (const [waiter, lapses] of s.deadlines) times[`place ${waiter}`] = lapses - since;
  const discrete: Record<string, unknown> = {
    type: s.type,
    // -1: a key without expiry, -2: no key; a lease that runs is compared among the times.
    lease: s.pttl < 0 ? s.pttl : 'runs',
    holds,
    line: s.line,
    info,
  };
  if (tokens === 'kept') {
    discrete.arrivals = sorted([...s.arrivals]);
    discrete.fence = s.fence;
  }
  return { discrete, times };
}

/** Where `actual` differs from `expected` (empty: the same), for a test to assert or to show. */
function differences(
  actual: Snapshot,
  expected: Snapshot,
  how: { readonly tokens: 'kept' | 'hidden'; readonly since: readonly [number, number] },
): string[] {
  const a = judged(actual, how.tokens, how.since[0]);
  const e = judged(expected, how.tokens, how.since[1]);
  const found: string[] = [];
  for (const part of new Set([...Object.keys(a.discrete), ...Object.keys(e.discrete)])) {
    const [got, wanted] = [JSON.stringify(a.discrete[part]), JSON.stringify(e.discrete[part])];
    if (got !== wanted) found.push(`${part}: ${got}, expected ${wanted}`);
  }
  for (const name of new Set([...Object.keys(a.times), ...Object.keys(e.times)])) {
    const [got, wanted] = [a.times[name], e.times[name]];
    if (got === undefined || wanted === undefined || Math.abs(got - wanted) > SLACK_MS) {
      found.push(`${name}: ends at ${got} ms, expected ${wanted} ms (±${SLACK_MS})`);
    }
  }
  return found;
}

/** A grant not taken up keeps its own short lease (GRANT_MS), never one of a hold's. */
function expectGrantsShort(s: Snapshot, what: string): void {
  if (![...s.hash.values()].includes('0')) return;
  expect(s.pttl, `${what}: a grant's lease`).toBeGreaterThan(0);
  expect(s.pttl, `${what}: a grant's lease`).toBeLessThanOrEqual(GRANT_MS);
}

/** A holder's description, as the library records it (JSON): here only the role it plays. */
const described = (who: string): string => JSON.stringify({ app: 'scripts-twice', label: who });

function deferred<T>(): { readonly promise: Promise<T>; readonly resolve: (value: T) => void } {
  let resolve!: (value: T) => void;
  const promise = new Promise<T>((done) => (resolve = done));
  return { promise, resolve };
}

describe('every script is safe to run twice: its reply lost, ioredis re-sends it, Redis ends where one run leaves it', () => {
  vi.spyOn(Logger.prototype, 'warn').mockImplementation(() => undefined);
  vi.spyOn(Logger.prototype, 'error').mockImplementation(() => undefined);

  let server: RedisServer;
  /** Straight to Redis: snapshots, and the scenes' own calls. */
  let redis: Redis;
  let proxy: FaultProxy;
  let prefix: string;
  /** The store under test: its client goes through the proxy. */
  let store: RedisLockStore;
  /** The same store's calls straight to Redis, for the scenes and for what others do between the two runs. */
  let others: RedisLockStore;
  /** Other clients through the proxy (the old force-unlock script's), closed after each test. */
  const rawClients: Redis[] = [];
  const apps: TestApp[] = [];
  let cases = 0;
  let attempts = 0;

  beforeAll(async () => {
    server = await RedisServer.start();
    redis = server.client();
    // Loaded up front: a first EVALSHA answered NOSCRIPT would take the dropped reply, and the
    // script would then run once, by the EVAL that follows it.
    for (const script of ALL_SCRIPTS) await redis.script('LOAD', script.source);
  });

  afterAll(async () => {
    redis.disconnect();
    await server.dispose();
  });

  beforeEach(async () => {
    proxy = await FaultProxy.start(server.port);
    prefix = uniquePrefix('twice');
    store = new RedisLockStore(viaProxy(), true, OPERATION_TIMEOUT, prefix);
    others = new RedisLockStore(redis, false, OPERATION_TIMEOUT, prefix);
  });

  afterEach(async () => {
    // The clients behind the proxy first, while it still passes their QUIT (no fault here stalls it).
    await store.close();
    await others.close();
    await Promise.all(apps.splice(0).map((app) => app.close()));
    for (const client of rawClients.splice(0)) client.disconnect();
    await proxy.close();
  });

  /** An ioredis client through the proxy, as the library makes it but quicker to reconnect. */
  function viaProxy(): Redis {
    const client = new Redis({ host: '127.0.0.1', port: proxy.port, retryStrategy: () => RECONNECT_MS });
    client.on('error', () => undefined);
    return client;
  }

  async function snapshot(k: LockKeys): Promise<Snapshot> {
    const [at, type, pttl, fields, line, deadlines, fence] = (await SNAPSHOT_SCRIPT.run(redis, listOf(k), [])) as [
      string,
      string,
      number,
      string[],
      string[],
      string[],
      string,
    ];
    const order = pairsOf(line);
    // A holder's description is the lock hash's field `=<owner>`, beside its hold.
    const all = [...pairsOf(fields)];
    const hash = new Map(all.filter(([field]) => !field.startsWith('=')));
    const info = new Map(all.flatMap(([field, entry]) => (field.startsWith('=') ? [[field.slice(1), entry]] : [])));
    return {
      at: Number(at),
      type,
      pttl,
      hash,
      line: [...order.keys()],
      arrivals: order,
      deadlines: new Map([...pairsOf(deadlines)].map(([waiter, lapses]) => [waiter, Number(lapses)])),
      info,
      fence: fence === '' ? 0 : Number(fence),
    };
  }

  // ---- scenes: built with the store's own calls, straight to Redis --------------------------------

  async function hold(k: LockKeys, owner: keyof typeof LEASE): Promise<number> {
    const taken = await others.acquire(k.lock, owner, LEASE[owner], { describe: described(owner) });
    if (!taken.acquired) throw new Error(`scene: ${owner} could not take ${k.lock}`);
    return taken.token;
  }

  async function share(k: LockKeys, owner: keyof typeof LEASE, permits = 0): Promise<void> {
    const taken = await others.acquire(k.lock, owner, LEASE[owner], { share: permits, describe: described(owner) });
    if (!taken.acquired) throw new Error(`scene: ${owner} could not take a shared hold of ${k.lock}`);
  }

  /** `waiter` attempts and is refused: it takes a place at the end of the line. */
  async function queue(k: LockKeys, waiter: string, permits?: number): Promise<void> {
    const refused = await others.acquire(k.lock, `${waiter}.attempt${++attempts}`, LEASE.attempt, {
      waiter,
      share: permits,
      describe: described(waiter),
    });
    if (refused.acquired) throw new Error(`scene: ${waiter} took ${k.lock} instead of waiting`);
  }

  async function keepPlaces(k: LockKeys): Promise<void> {
    await KEEP_PLACES_SCRIPT.run(redis, [k.line, k.deadlines], [KEEP_PLACES_MS]);
  }

  async function release(k: LockKeys, owner: string): Promise<void> {
    expect(await others.release(k.lock, owner)).toBe('released');
  }

  /** What the head of the line's process does when it hears its grant (or its turn): its next attempt takes it up. */
  async function takeUp(k: LockKeys, waiter: string, owner: keyof typeof LEASE, permits?: number): Promise<number> {
    const taken = await others.acquire(k.lock, owner, LEASE[owner], {
      waiter,
      share: permits,
      describe: described(owner),
    });
    if (!taken.acquired) throw new Error(`${waiter} could not take up its turn on ${k.lock}`);
    return taken.token;
  }

  // ---- one run, and two ------------------------------------------------------------------------------

  /** The call run once, no fault: the proxy sees the script once. */
  async function runOnce<T>(script: LuaScript, call: () => Promise<T>): Promise<T> {
    proxy.clearLog();
    const result = await call();
    expect(
      proxy.log.filter((command) => isScript(script)(command.argv)),
      `${script.name} ran once`,
    ).toHaveLength(1);
    return result;
  }

  /**
   * The call with the script's reply dropped after Redis ran it and the connection reset: ioredis
   * reconnects and re-sends it. Returns the caller's answer and Redis as the first run left it, read
   * when the proxy dropped the reply. `between`: what others do then, before the re-sent copy may pass
   * (the proxy holds it back for `holdMs`; the test fails if it passed before they were done).
   * `alsoDropped`: scripts of the same call whose replies are lost too (each runs twice as well).
   */
  async function runTwice<T>(
    script: LuaScript,
    k: LockKeys,
    call: () => Promise<T>,
    options: {
      readonly between?: () => Promise<void>;
      readonly holdMs?: number;
      readonly alsoDropped?: readonly LuaScript[];
    } = {},
  ): Promise<{ readonly result: T; readonly first: Snapshot }> {
    const { between, holdMs = HOLD_MS, alsoDropped = [] } = options;
    proxy.clearLog();
    const earlier = alsoDropped.map((other) => proxy.dropReply(isScript(other)));
    const firstRun = proxy.dropReply(isScript(script)).then(async () => {
      // Here the reply has just been dropped and the client's connection destroyed; the client has
      // not even heard of it yet, so the snapshot (written now) reaches Redis before the re-sent copy.
      const passes = between ? proxy.blackhole(holdMs) : Promise.resolve();
      const first = await snapshot(k);
      let done = 0;
      if (between) {
        await between();
        done = proxy.log.length;
      }
      return { first, passes, done };
    });
    void firstRun.catch(() => undefined); // awaited below; a fault that never bit rejects at close()
    const result = await call();
    for (const dropped of [script, ...alsoDropped]) {
      const runs = proxy.log.filter((command) => isScript(dropped)(command.argv));
      expect(runs, `${dropped.name} ran twice`).toHaveLength(2);
      expect(runs[1].connection, `${dropped.name} was re-sent on a new connection`).not.toBe(runs[0].connection);
    }
    await Promise.all(earlier);
    const { first, passes, done } = await firstRun;
    await passes;
    if (between) {
      const resent = proxy.log.filter((command) => isScript(script)(command.argv))[1];
      expect(
        proxy.log.indexOf(resent),
        'the re-sent copy reached Redis after the others had acted',
      ).toBeGreaterThanOrEqual(done);
    }
    return { result, first };
  }

  interface Case<T> {
    /** The script whose reply is lost. */
    readonly script: LuaScript;
    /** Builds the state the call meets, on `k`. */
    readonly scene: (k: LockKeys) => Promise<void>;
    readonly call: (k: LockKeys) => Promise<T>;
    /** What others do between the two runs; after the control's one run too. */
    readonly between?: (k: LockKeys) => Promise<void>;
    /** The re-sent copy issues a new fencing token (the acquire scripts do: see the acquire tests). */
    readonly reissues?: boolean;
    readonly alsoDropped?: readonly LuaScript[];
  }

  interface Played<T> {
    readonly once: T;
    readonly twice: T;
    /** The key run twice: before the call, after the first run, after the re-sent copy. */
    readonly keys: LockKeys;
    readonly before: Snapshot;
    readonly first: Snapshot;
    readonly after: Snapshot;
    /** The control's key: before its one run, and after it. */
    readonly controlBefore: Snapshot;
    readonly control: Snapshot;
  }

  /** The control (the scene on a fresh key, one run), then the same scene on another key with the call run twice. */
  async function play<T>(c: Case<T>): Promise<Played<T>> {
    const name = `${prefix}case${++cases}`;
    const controlKeys = keysOf(prefix, `${name}:once`);
    await c.scene(controlKeys);
    const controlBefore = await snapshot(controlKeys);
    const once = await runOnce(c.script, () => c.call(controlKeys));
    if (c.between) await c.between(controlKeys);
    const control = await snapshot(controlKeys);

    const keys = keysOf(prefix, `${name}:twice`);
    await c.scene(keys);
    const before = await snapshot(keys);
    const between = c.between;
    const { result: twice, first } = await runTwice(c.script, keys, () => c.call(keys), {
      between: between && (() => between(keys)),
      alsoDropped: c.alsoDropped,
    });
    const after = await snapshot(keys);
    return { once, twice, keys, before, first, after, controlBefore, control };
  }

  /** Redis ends where one run leaves it, and the re-sent copy changed nothing the first run had left. */
  function expectOneRun<T>(p: Played<T>, c: Case<T>): void {
    expect(
      differences(p.after, p.control, { tokens: 'hidden', since: [p.before.at, p.controlBefore.at] }),
      'Redis after the re-sent copy, against the control run once',
    ).toEqual([]);
    if (!c.between) {
      expect(
        differences(p.after, p.first, { tokens: c.reissues ? 'hidden' : 'kept', since: [0, 0] }),
        'Redis after the re-sent copy, against Redis after the first run',
      ).toEqual([]);
      if (c.reissues) expect(p.after.fence).toBeGreaterThan(p.first.fence);
      else expect(p.after.fence, 'no token issued by the re-sent copy').toBe(p.first.fence);
    }
    expectGrantsShort(p.after, 'after the re-sent copy');
    expectGrantsShort(p.control, 'the control');
  }

  async function judge<T>(c: Case<T>): Promise<Played<T>> {
    const played = await play(c);
    expectOneRun(played, c);
    return played;
  }

  const fields = (s: Snapshot): Record<string, string> => Object.fromEntries(s.hash);

  const grantOf = (s: Snapshot, waiter: string): number => {
    const granted = [...s.hash].find(([field, value]) => value === '0' && field.startsWith(`${waiter}:`));
    if (!granted) throw new Error(`no grant to ${waiter} in ${JSON.stringify(fields(s))}`);
    return Number(granted[0].slice(waiter.length + 1));
  };

  // ---- acquire ---------------------------------------------------------------------------------------

  describe('acquire', () => {
    it("a free lock: taken, one hold with the first run's lease; the caller gets the latest token", async () => {
      const c: Case<AcquireResult> = {
        script: ACQUIRE_SCRIPT,
        scene: async () => undefined,
        call: (k) => store.acquire(k.lock, 'oN', LEASE.oN, { describe: described('oN') }),
        reissues: true,
      };
      const p = await judge(c);
      expect(p.once).toMatchObject({ acquired: true });
      expect(p.twice).toMatchObject({ acquired: true });
      expect(fields(p.after)).toEqual({ oN: '1' });
      expect(p.after.pttl).toBeGreaterThan(LEASE.oN - SLACK_MS);
      // The re-sent copy finds the caller's own owner id holding (only its first run can have put it
      // there) and answers "taken" with a new token. That is the intended outcome: the first run's
      // token never reached anyone, the one the caller gets is the latest the slot has issued, larger
      // than every token issued before it (the first run's included), and the hold in Redis is
      // described with it.
      const firstToken = p.first.fence;
      const token = p.twice.acquired ? p.twice.token : NaN;
      expect(firstToken).toBeGreaterThan(p.before.fence);
      expect(token).toBeGreaterThan(firstToken);
      expect(token).toBe(p.after.fence);
      expect(p.after.info.get('oN')?.split('|')[1]).toBe(String(token));
    });

    it("taking up a grant to its line: one hold with the caller's lease, the grant gone, the line as it was", async () => {
      const c: Case<AcquireResult> = {
        script: ACQUIRE_SCRIPT,
        scene: async (k) => {
          await hold(k, 'oA');
          await queue(k, 'w1');
          await queue(k, 'w2');
          await keepPlaces(k);
          await release(k, 'oA'); // the lock goes to w1, who has GRANT_MS to take it up
        },
        call: (k) => store.acquire(k.lock, 'oW1', LEASE.oW1, { waiter: 'w1', describe: described('oW1') }),
        reissues: true,
      };
      const p = await judge(c);
      const granted = grantOf(p.before, 'w1');
      expect(p.once).toEqual({ acquired: true, token: grantOf(p.controlBefore, 'w1') });
      expect(p.twice).toMatchObject({ acquired: true });
      expect(fields(p.first)).toEqual({ oW1: '1' });
      expect(fields(p.after)).toEqual({ oW1: '1' });
      expect(p.after.line).toEqual(['w2']);
      expect(p.after.pttl).toBeGreaterThan(LEASE.oW1 - SLACK_MS);
      // The first run took the grant up with the grant's token, the re-sent copy finds the caller's
      // owner id holding and answers a new one: still the latest issued, larger than the grant's.
      expect(p.first.fence).toBe(granted);
      const token = p.twice.acquired ? p.twice.token : NaN;
      expect(token).toBeGreaterThan(granted);
      expect(token).toBe(p.after.fence);
      expect(p.after.info.get('oW1')?.split('|')[1]).toBe(String(token));
    });

    it("a local hand-over: the holder's hold replaced by the caller's once, its place gone; the re-sent copy answers taken", async () => {
      const c: Case<AcquireResult> = {
        script: ACQUIRE_SCRIPT,
        scene: async (k) => {
          await hold(k, 'oA');
          await queue(k, 'w1'); // the caller's line
          await queue(k, 'w2'); // another process's, which the hand-over passes by
          await keepPlaces(k);
        },
        call: (k) => store.acquire(k.lock, 'oW1', LEASE.oW1, { waiter: 'w1', describe: described('oW1'), from: 'oA' }),
        reissues: true,
      };
      const p = await judge(c);
      expect(p.once).toMatchObject({ acquired: true, handedOver: true });
      // The re-sent copy finds the caller in (only the first run can have put it there): taken,
      // with a new token, and `from` gone either way.
      expect(p.twice).toMatchObject({ acquired: true, handedOver: true });
      expect(fields(p.first)).toEqual({ oW1: '1' });
      expect(fields(p.after)).toEqual({ oW1: '1' });
      expect(p.after.line).toEqual(['w2']);
      expect(p.after.pttl).toBeGreaterThan(LEASE.oW1 - SLACK_MS);
      expect(p.first.fence).toBeGreaterThan(p.before.fence);
      const token = p.twice.acquired ? p.twice.token : NaN;
      expect(token).toBeGreaterThan(p.first.fence);
      expect(token).toBe(p.after.fence);
      expect(p.after.info.get('oW1')?.split('|')[1]).toBe(String(token));
      expect(p.after.info.has('oA')).toBe(false);
    });

    it('a hand-over from a holder that holds nothing: taken as by any attempt; the re-sent copy says nothing was handed over', async () => {
      const c: Case<AcquireResult> = {
        script: ACQUIRE_SCRIPT,
        scene: async () => undefined, // oA's hold is gone (lost) before it hands over
        call: (k) => store.acquire(k.lock, 'oW1', LEASE.oW1, { waiter: 'w1', describe: described('oW1'), from: 'oA' }),
        reissues: true,
      };
      const p = await judge(c);
      // A holder told "handed over" would never learn that its lock was lost while its code ran.
      expect(p.once).toMatchObject({ acquired: true, handedOver: false });
      expect(p.twice).toMatchObject({ acquired: true, handedOver: false });
      expect(fields(p.after)).toEqual({ oW1: '1' });
    });

    it('busy: refused, with one place at the end of the line (its arrival from the first run)', async () => {
      const c: Case<AcquireResult> = {
        script: ACQUIRE_SCRIPT,
        scene: async (k) => {
          await hold(k, 'oA');
          await queue(k, 'w1');
          await keepPlaces(k);
        },
        call: (k) => store.acquire(k.lock, 'w2.try', LEASE.attempt, { waiter: 'w2', describe: described('w2') }),
      };
      const p = await judge(c);
      for (const answer of [p.once, p.twice]) {
        expect(answer.acquired).toBe(false);
        expect(answer.acquired ? 0 : answer.ttl).toBeGreaterThan(LEASE.oA - 2 * SLACK_MS);
      }
      expect(fields(p.after)).toEqual({ oA: '1' });
      expect(p.after.line).toEqual(['w1', 'w2']);
      expect(p.after.arrivals.get('w2')).toBe(p.first.arrivals.get('w2'));
    });

    it('a free lock with others ahead in its line: refused; the head is granted it once, not twice', async () => {
      const c: Case<AcquireResult> = {
        script: ACQUIRE_SCRIPT,
        scene: async (k) => {
          await hold(k, 'oA');
          await queue(k, 'w1');
          await keepPlaces(k);
          await redis.del(k.lock); // oA's lease ran out: nothing announced it
        },
        call: (k) => store.acquire(k.lock, 'w2.try', LEASE.attempt, { waiter: 'w2', describe: described('w2') }),
      };
      const p = await judge(c);
      expect(p.once).toEqual({ acquired: false, ttl: -3, turnMs: GRANT_MS }); // w1 has its grant's 250 ms
      // The re-sent copy finds the grant its first run made to w1 and answers as to any busy lock:
      // refused, with the grant's remaining lease instead of -3. Either way the caller waits.
      expect(p.twice.acquired).toBe(false);
      const ttl = p.twice.acquired ? NaN : p.twice.ttl;
      expect(ttl === -3 || (ttl > 0 && ttl <= GRANT_MS), `refused, ttl ${ttl}`).toBe(true);
      expect(fields(p.after)).toEqual({ [`w1:${grantOf(p.first, 'w1')}`]: '0' });
      expect(p.after.line).toEqual(['w2']);
      expect(p.first.fence).toBeGreaterThan(p.before.fence);
    });
  });

  // ---- acquire-shared --------------------------------------------------------------------------------

  describe('acquire-shared', () => {
    it('a reader at the head of the line takes its turn: one shared hold, the writer behind it named once', async () => {
      const c: Case<AcquireResult> = {
        script: ACQUIRE_SHARED_SCRIPT,
        scene: async (k) => {
          await hold(k, 'oA');
          await queue(k, 'sR2', 0);
          await queue(k, 'w3');
          await keepPlaces(k);
          await release(k, 'oA'); // a reader heads the line: named to look, granted nothing
        },
        call: (k) =>
          store.acquire(k.lock, 'soR2', LEASE.soR2, { share: 0, waiter: 'sR2', describe: described('soR2') }),
        reissues: true,
      };
      const p = await judge(c);
      expect(p.once).toMatchObject({ acquired: true });
      expect(p.twice).toMatchObject({ acquired: true });
      expect([...p.after.hash.keys()]).toEqual(['soR2']);
      expect(p.after.line).toEqual(['w3']);
      // Named to look by the first run (HEAD_TURN_LUA): the re-sent copy does not move its deadline.
      expect(p.after.deadlines.get('w3')).toBe(p.first.deadlines.get('w3'));
      const token = p.twice.acquired ? p.twice.token : NaN;
      expect(token).toBeGreaterThan(p.first.fence);
      expect(token).toBe(p.after.fence);
    });

    it('a reader joining another: two shared holds, each with its own lease', async () => {
      const c: Case<AcquireResult> = {
        script: ACQUIRE_SHARED_SCRIPT,
        scene: (k) => share(k, 'soR1'),
        call: (k) => store.acquire(k.lock, 'soR2', LEASE.soR2, { share: 0, describe: described('soR2') }),
        reissues: true,
      };
      const p = await judge(c);
      expect(p.twice).toMatchObject({ acquired: true });
      expect([...p.after.hash.keys()].sort()).toEqual(['soR1', 'soR2']);
      expect(p.after.pttl).toBeGreaterThan(LEASE.soR1 - SLACK_MS); // the latest lease, soR1's
      expect(p.twice.acquired && p.twice.token).toBe(p.after.fence); // the latest token, as for acquire
    });

    it('the last permit of a semaphore: the re-sent copy answers taken (its own hold is not counted against it)', async () => {
      const c: Case<AcquireResult> = {
        script: ACQUIRE_SHARED_SCRIPT,
        scene: async (k) => {
          await share(k, 'soP0', 2);
          await share(k, 'soP1', 2);
          await queue(k, 'sP2', 2);
          await queue(k, 'sP3', 2);
          await keepPlaces(k);
          await release(k, 'soP0'); // a permit is free: sP2, at the head, is named to look
        },
        call: (k) =>
          store.acquire(k.lock, 'soP2', LEASE.soP2, { share: 2, waiter: 'sP2', describe: described('soP2') }),
        reissues: true,
      };
      const p = await judge(c);
      expect(p.once).toMatchObject({ acquired: true });
      // Two permits are held when the copy comes, one of them the caller's own: "taken", not "busy"
      // (which would leave a hold in Redis that its caller never heard of).
      expect(p.twice).toMatchObject({ acquired: true });
      expect([...p.after.hash.keys()].sort()).toEqual(['soP1', 'soP2']);
      expect(p.after.line).toEqual(['sP3']);
      expect(p.twice.acquired && p.twice.token).toBe(p.after.fence);
      expect(p.after.fence).toBeGreaterThan(p.first.fence);
    });
  });

  describe('acquire-shared, a local hand-over of a permit', () => {
    it("the holder's permit replaced by the caller's once, its place gone, the other line passed by; the re-sent copy answers handed over", async () => {
      const c: Case<AcquireResult> = {
        script: ACQUIRE_SHARED_SCRIPT,
        scene: async (k) => {
          await share(k, 'soP0', 2);
          await share(k, 'soP1', 2);
          await queue(k, 'sP2', 2); // the caller's line
          await queue(k, 'sP3', 2); // another process's, which the hand-over passes by
          await keepPlaces(k);
        },
        call: (k) =>
          store.acquire(k.lock, 'soP2', LEASE.soP2, {
            share: 2,
            waiter: 'sP2',
            describe: described('soP2'),
            from: 'soP0',
          }),
        reissues: true,
      };
      const p = await judge(c);
      expect(p.once).toMatchObject({ acquired: true, handedOver: true });
      // The re-sent copy finds the caller holding (only its first run can have put it there), with
      // its description saying it was handed over: taken, handed over, with a new token.
      expect(p.twice).toMatchObject({ acquired: true, handedOver: true });
      expect([...p.first.hash.keys()].sort()).toEqual(['soP1', 'soP2']);
      expect([...p.after.hash.keys()].sort()).toEqual(['soP1', 'soP2']);
      expect(p.after.line).toEqual(['sP3']);
      expect(p.first.fence).toBeGreaterThan(p.before.fence);
      const token = p.twice.acquired ? p.twice.token : NaN;
      expect(token).toBeGreaterThan(p.first.fence);
      expect(token).toBe(p.after.fence);
      expect(p.after.info.get('soP2')?.split('|')[1]).toBe(String(token));
      expect(p.after.info.has('soP0')).toBe(false);
    });

    it('from a holder that holds nothing: a permit taken as by any attempt; the re-sent copy says nothing was handed over', async () => {
      const c: Case<AcquireResult> = {
        script: ACQUIRE_SHARED_SCRIPT,
        scene: async (k) => void (await share(k, 'soP1', 2)), // soP0's permit is gone before it hands over
        call: (k) => store.acquire(k.lock, 'soP2', LEASE.soP2, { share: 2, describe: described('soP2'), from: 'soP0' }),
        reissues: true,
      };
      const p = await judge(c);
      // A holder told "handed over" would never learn that its permit was lost while its code ran.
      expect(p.once).toMatchObject({ acquired: true, handedOver: false });
      expect(p.twice).toMatchObject({ acquired: true, handedOver: false });
      expect([...p.after.hash.keys()].sort()).toEqual(['soP1', 'soP2']);
    });
  });

  // ---- release ---------------------------------------------------------------------------------------

  describe('release', () => {
    const lineScene = async (k: LockKeys): Promise<void> => {
      await hold(k, 'oA');
      await queue(k, 'w1');
      await queue(k, 'w2');
      await keepPlaces(k);
    };

    it('exclusive with a line: released; the grant to the head survives the re-sent copy, nobody else is granted', async () => {
      const c: Case<ReleaseResult> = {
        script: RELEASE_SCRIPT,
        scene: lineScene,
        call: (k) => store.release(k.lock, 'oA'),
      };
      const p = await judge(c);
      expect(p.once).toBe('released');
      expect(p.twice).toBe('released'); // the re-sent copy's "not the owner", after a connection close
      const granted = grantOf(p.first, 'w1');
      expect(fields(p.after)).toEqual({ [`w1:${granted}`]: '0' });
      expect(p.after.line).toEqual(['w2']);
      expect(p.first.fence).toBeGreaterThan(p.before.fence); // one grant, one token
    });

    it('exclusive with a line, the head taking its grant up before the copy comes: it still holds', async () => {
      const c: Case<ReleaseResult> = {
        script: RELEASE_SCRIPT,
        scene: lineScene,
        call: (k) => store.release(k.lock, 'oA'),
        between: async (k) => void (await takeUp(k, 'w1', 'oW1')),
      };
      const p = await judge(c);
      expect(p.twice).toBe('released');
      expect(fields(p.after)).toEqual({ oW1: '1' });
      expect(p.after.pttl).toBeGreaterThan(LEASE.oW1 - SLACK_MS);
      expect(p.after.line).toEqual(['w2']);
    });

    it('a shared hold while another remains: released; the other keeps its hold, the writer waiting is named once', async () => {
      const c: Case<ReleaseResult> = {
        script: RELEASE_SCRIPT,
        scene: async (k) => {
          await share(k, 'soR1');
          await share(k, 'soR2');
          await queue(k, 'w3');
          await keepPlaces(k);
        },
        call: (k) => store.release(k.lock, 'soR1'),
      };
      const p = await judge(c);
      expect(p.once).toBe('released');
      expect(p.twice).toBe('released');
      expect([...p.after.hash.keys()]).toEqual(['soR2']);
      expect(p.after.line).toEqual(['w3']);
      expect(p.after.pttl).toBeLessThanOrEqual(LEASE.soR2);
    });
  });

  // ---- renew -----------------------------------------------------------------------------------------

  describe('renew', () => {
    type Renewed = RenewOutcome[];

    it('an exclusive hold, extended: renewed, the lease as one renewal sets it', async () => {
      const p = await judge<Renewed>({
        script: RENEW_SCRIPT,
        scene: async (k) => void (await hold(k, 'oA')),
        call: (k) => store.renew([{ key: k.lock, owner: 'oA', leaseMs: 90_000 }]),
      });
      expect(p.once).toEqual([true]);
      expect(p.twice).toEqual([true]);
      expect(fields(p.after)).toEqual({ oA: '1' });
      expect(p.after.pttl).toBeGreaterThan(90_000 - SLACK_MS);
    });

    it('a shared hold, extended: its own lease moves, the other reader keeps its', async () => {
      const p = await judge<Renewed>({
        script: RENEW_SCRIPT,
        scene: async (k) => {
          await share(k, 'soR1');
          await share(k, 'soR2');
        },
        call: (k) => store.renew([{ key: k.lock, owner: 'soR2', leaseMs: 90_000 }]),
      });
      expect(p.twice).toEqual([true]);
      expect(Number(p.after.hash.get('soR2')) - p.after.at).toBeGreaterThan(90_000 - SLACK_MS);
      expect(Number(p.after.hash.get('soR1')) - p.after.at).toBeLessThanOrEqual(LEASE.soR1);
    });

    it('an exact lease, shorter (an exclusive hold ending before lockAtLeastFor): set once, not shortened again', async () => {
      const p = await judge<Renewed>({
        script: RENEW_SCRIPT,
        scene: async (k) => void (await hold(k, 'oA')),
        call: (k) => store.renew([{ key: k.lock, owner: 'oA', leaseMs: 20_000, exact: true }]),
      });
      expect(p.twice).toEqual([true]);
      expect(p.after.pttl).toBeGreaterThan(20_000 - SLACK_MS);
      expect(p.after.pttl).toBeLessThanOrEqual(20_000);
    });

    it("an exact lease on a shared hold: that hold's lease, the key's lease the other reader's", async () => {
      const p = await judge<Renewed>({
        script: RENEW_SCRIPT,
        scene: async (k) => {
          await share(k, 'soR1');
          await share(k, 'soR2');
        },
        call: (k) => store.renew([{ key: k.lock, owner: 'soR1', leaseMs: 10_000, exact: true }]),
      });
      expect(p.twice).toEqual([true]);
      expect(Number(p.after.hash.get('soR1')) - p.after.at).toBeLessThanOrEqual(10_000);
      expect(p.after.pttl).toBeGreaterThan(LEASE.soR2 - 2 * SLACK_MS);
    });

    // One owner per call: a renewal call never names one key twice (see `distinctBatches`).
    it.each(['oA', 'oW1'])(
      'takes up nothing: %s (the old holder, the next owner) of a lock granted to the head is refused, the grant untouched',
      async (owner) => {
        const p = await judge<Renewed>({
          script: RENEW_SCRIPT,
          scene: async (k) => {
            await hold(k, 'oA');
            await queue(k, 'w1');
            await queue(k, 'w2');
            await keepPlaces(k);
            await release(k, 'oA');
          },
          call: (k) => store.renew([{ key: k.lock, owner, leaseMs: 90_000 }]),
        });
        expect(p.once).toEqual([false]);
        expect(p.twice).toEqual([false]);
        expect(fields(p.after)).toEqual({ [`w1:${grantOf(p.before, 'w1')}`]: '0' });
        expect(p.after.line).toEqual(['w2']);
      },
    );
  });

  // ---- leave -----------------------------------------------------------------------------------------

  describe('leave', () => {
    const grantedScene = async (k: LockKeys): Promise<void> => {
      await hold(k, 'oA');
      await queue(k, 'w1');
      await queue(k, 'w2');
      await queue(k, 'w3');
      await keepPlaces(k);
      await release(k, 'oA'); // w1 is granted the lock
    };

    it('the head with a grant: its grant goes to the next in line once; the re-sent copy grants nobody else', async () => {
      const p = await judge<void>({
        script: LEAVE_SCRIPT,
        scene: grantedScene,
        call: (k) => store.leave(k.lock, 'w1'),
      });
      expect(fields(p.after)).toEqual({ [`w2:${grantOf(p.first, 'w2')}`]: '0' });
      expect(p.after.line).toEqual(['w3']);
      expect(p.first.fence).toBeGreaterThan(grantOf(p.before, 'w1')); // one new grant
    });

    it('the head with a grant, the next taking its grant up before the copy comes: it still holds', async () => {
      const p = await judge<void>({
        script: LEAVE_SCRIPT,
        scene: grantedScene,
        call: (k) => store.leave(k.lock, 'w1'),
        between: async (k) => void (await takeUp(k, 'w2', 'oW2')),
      });
      expect(fields(p.after)).toEqual({ oW2: '1' });
      expect(p.after.line).toEqual(['w3']);
    });

    it('not the head: its place gone, nothing else moves', async () => {
      const p = await judge<void>({
        script: LEAVE_SCRIPT,
        scene: async (k) => {
          await hold(k, 'oA');
          await queue(k, 'w1');
          await queue(k, 'w2');
          await queue(k, 'w3');
          await keepPlaces(k);
        },
        call: (k) => store.leave(k.lock, 'w2'),
      });
      expect(fields(p.after)).toEqual({ oA: '1' });
      expect(p.after.line).toEqual(['w1', 'w3']);
      // oA's description, and its waiting mark (the waiters that joined behind it set it; one leaving leaves it)
      expect([...p.after.info.keys()].sort()).toEqual(['oA', '~oA']);
    });

    it('the head of a held lock: the next is named to look once', async () => {
      const p = await judge<void>({
        script: LEAVE_SCRIPT,
        scene: async (k) => {
          await hold(k, 'oA');
          await queue(k, 'w1');
          await queue(k, 'w2');
          await keepPlaces(k);
        },
        call: (k) => store.leave(k.lock, 'w1'),
      });
      expect(fields(p.after)).toEqual({ oA: '1' });
      expect(p.after.line).toEqual(['w2']);
      expect((p.after.deadlines.get('w2') ?? NaN) - p.first.at).toBeLessThanOrEqual(GRANT_MS);
    });
  });

  // ---- force-unlock ----------------------------------------------------------------------------------

  describe('force-unlock (RedisLockStore.forceUnlock: the holds read by inspect, then exactly those dropped)', () => {
    type Removed = StoredHold[];
    const owners = (removed: Removed): string[] => removed.map((hold) => hold.owner).sort();

    const heldScene = async (k: LockKeys): Promise<void> => {
      await hold(k, 'oA');
      await queue(k, 'w1');
      await queue(k, 'w2');
      await keepPlaces(k);
    };

    /** Readers hold, a writer waits, a reader waits behind it. */
    const sharedScene = async (k: LockKeys): Promise<void> => {
      await share(k, 'soR1');
      await share(k, 'soR2');
      await queue(k, 'w3');
      await queue(k, 'sR4', 0);
      await keepPlaces(k);
    };

    /** A writer holds; a reader heads the line, a writer behind it. */
    const readerHeadScene = async (k: LockKeys): Promise<void> => {
      await hold(k, 'oA');
      await queue(k, 'sR3', 0);
      await queue(k, 'w4');
      await keepPlaces(k);
    };

    const heldByW1: Case<Removed> = {
      script: FORCE_UNLOCK_SCRIPT,
      scene: heldScene,
      call: (k) => store.forceUnlock(k.lock),
      between: async (k) => void (await takeUp(k, 'w1', 'oW1')),
    };

    const heldByW3: Case<Removed> = {
      script: FORCE_UNLOCK_SCRIPT,
      scene: sharedScene,
      call: (k) => store.forceUnlock(k.lock),
      between: async (k) => void (await takeUp(k, 'w3', 'oW3')),
    };

    const heldByR3: Case<Removed> = {
      script: FORCE_UNLOCK_SCRIPT,
      scene: readerHeadScene,
      call: (k) => store.forceUnlock(k.lock),
      between: async (k) => void (await takeUp(k, 'sR3', 'soR3', 0)),
    };

    /** The same case, the old script run through another client behind the proxy (no inspect first). */
    const withOldScript = (c: Case<Removed>): Case<unknown> => ({
      ...c,
      script: OLD_FORCE_UNLOCK_SCRIPT,
      call: (k) => {
        const client = viaProxy();
        rawClients.push(client);
        return OLD_FORCE_UNLOCK_SCRIPT.run(client, listOf(k), ['old:1', 0, GRANT_MS]);
      },
    });

    it('held, with a line: the result names the holder; the grant to the next waiter survives the re-sent copy', async () => {
      const p = await judge<Removed>({
        script: FORCE_UNLOCK_SCRIPT,
        scene: heldScene,
        call: (k) => store.forceUnlock(k.lock),
      });
      expect(owners(p.once)).toEqual(['oA']);
      expect(owners(p.twice)).toEqual(['oA']);
      expect(p.twice[0]).toMatchObject({ exclusive: true, granted: false });
      expect(fields(p.after)).toEqual({ [`w1:${grantOf(p.first, 'w1')}`]: '0' });
      expect(p.after.line).toEqual(['w2']);
      expect(p.first.fence).toBeGreaterThan(p.before.fence);
    });

    it('held, with a line, the next waiter taking its grant up before the copy comes: it still holds, nobody else is granted', async () => {
      const p = await judge(heldByW1);
      expect(owners(p.twice)).toEqual(['oA']);
      expect(fields(p.after)).toEqual({ oW1: '1' });
      expect(p.after.line).toEqual(['w2']);
    });

    it('control: the old script (drops whatever it finds), re-sent the same way, drops that holder and grants the lock to a third', async () => {
      const old = withOldScript(heldByW1);
      const p = await play(old);
      // Run once, the old script ends as the new one does: the same control...
      expect(fields(p.control)).toEqual({ oW1: '1' });
      // ...but its re-sent copy drops the hold its first run handed over, and grants the lock to w2
      // while w1 (which heard nothing) is inside: the checks above fail on it.
      expect(p.after.hash.has('oW1')).toBe(false);
      expect(fields(p.after)).toEqual({ [`w2:${grantOf(p.after, 'w2')}`]: '0' });
      expect(
        differences(p.after, p.control, { tokens: 'hidden', since: [p.before.at, p.controlBefore.at] }),
      ).not.toEqual([]);
    });

    it('shared holds: the result names both readers; the writer granted next, and its hold once taken up, survive the re-sent copy', async () => {
      const pending = await judge<Removed>({
        script: FORCE_UNLOCK_SCRIPT,
        scene: sharedScene,
        call: (k) => store.forceUnlock(k.lock),
      });
      expect(owners(pending.twice)).toEqual(['soR1', 'soR2']);
      expect(pending.twice.every((hold) => !hold.exclusive)).toBe(true);
      expect(fields(pending.after)).toEqual({ [`w3:${grantOf(pending.first, 'w3')}`]: '0' });
      expect(pending.after.line).toEqual(['sR4']);

      const takenUp = await judge(heldByW3);
      expect(owners(takenUp.twice)).toEqual(['soR1', 'soR2']);
      expect(fields(takenUp.after)).toEqual({ oW3: '1' });
      expect(takenUp.after.line).toEqual(['sR4']);
    });

    it('control: the old script, re-sent, drops the writer that took its grant up (and names the reader behind it to look)', async () => {
      const p = await play(withOldScript(heldByW3));
      expect(fields(p.control)).toEqual({ oW3: '1' });
      expect(p.after.type).toBe('none');
      expect(
        differences(p.after, p.control, { tokens: 'hidden', since: [p.before.at, p.controlBefore.at] }),
      ).not.toEqual([]);
    });

    it('a reader heading the line takes its turn before the copy comes: its shared hold survives, the writer behind it still waits', async () => {
      const p = await judge(heldByR3);
      expect(owners(p.twice)).toEqual(['oA']);
      expect([...p.after.hash.keys()]).toEqual(['soR3']);
      expect(p.after.line).toEqual(['w4']);
    });

    it('control: the old script, re-sent, drops that reader: the lock goes to the writer, or is free, while the reader is inside', async () => {
      const p = await play(withOldScript(heldByR3));
      expect([...p.control.hash.keys()]).toEqual(['soR3']);
      // Its re-sent copy drops soR3 and hands the lock on: granted to w4, or free if w4's place lapsed
      // while the copy was held back (nobody here refreshes it after the reader named it to look).
      expect(p.after.hash.has('soR3')).toBe(false);
      expect([...p.after.hash.values()].every((value) => value === '0')).toBe(true);
      expect(
        differences(p.after, p.control, { tokens: 'hidden', since: [p.before.at, p.controlBefore.at] }),
      ).not.toEqual([]);
    });

    it('the replies of both inspect and force-unlock lost: each re-sent, the result the same, Redis as after one run', async () => {
      const p = await judge<Removed>({
        script: FORCE_UNLOCK_SCRIPT,
        scene: heldScene,
        call: (k) => store.forceUnlock(k.lock),
        alsoDropped: [INSPECT_SCRIPT],
      });
      expect(owners(p.twice)).toEqual(['oA']);
      expect(fields(p.after)).toEqual({ [`w1:${grantOf(p.first, 'w1')}`]: '0' });
    });
  });

  // ---- check and inspect: read only ------------------------------------------------------------------

  describe('check and inspect (read only)', () => {
    type Checked = CheckResult;

    const expectSameCheck = (twice: Checked, once: Checked): void => {
      expect(twice.held).toBe(once.held);
      expect(Math.abs(twice.ttl - once.ttl)).toBeLessThanOrEqual(SLACK_MS);
    };

    it('check, the exclusive holder: held, with its lease; nothing changes', async () => {
      const p = await judge<Checked>({
        script: CHECK_SCRIPT,
        scene: async (k) => {
          await hold(k, 'oA');
          await queue(k, 'w1');
          await keepPlaces(k);
        },
        call: (k) => store.check(k.lock, 'oA'),
      });
      expect(p.twice.held).toBe(true);
      expect(p.twice.ttl).toBeGreaterThan(LEASE.oA - 2 * SLACK_MS);
      expectSameCheck(p.twice, p.once);
    });

    it('check, a reader: held, with its own lease; and an owner whose lock went to the next in line: not held', async () => {
      const reader = await judge<Checked>({
        script: CHECK_SCRIPT,
        scene: async (k) => {
          await share(k, 'soR1');
          await share(k, 'soR2');
        },
        call: (k) => store.check(k.lock, 'soR2'),
      });
      expect(reader.twice.held).toBe(true);
      expect(reader.twice.ttl).toBeLessThanOrEqual(LEASE.soR2);
      expectSameCheck(reader.twice, reader.once);

      const gone = await judge<Checked>({
        script: CHECK_SCRIPT,
        scene: async (k) => {
          await hold(k, 'oA');
          await queue(k, 'w1');
          await keepPlaces(k);
          await release(k, 'oA');
        },
        call: (k) => store.check(k.lock, 'oA'),
      });
      expect(gone.once.held).toBe(false);
      expect(gone.twice.held).toBe(false);
      expect(gone.twice.ttl).toBeLessThanOrEqual(GRANT_MS);
    });

    /** An inspection as two runs are compared: grant tokens left out, times within the slack. */
    const expectSameInspection = (twice: StoredLock, once: StoredLock): void => {
      const shown = (lock: StoredLock): unknown => ({
        held: lock.held,
        waiting: lock.waiting,
        holds: lock.holds
          .map((hold) => ({
            owner: hold.owner.replace(GRANT_FIELD, '$1:<token>'),
            exclusive: hold.exclusive,
            granted: hold.granted,
            description: hold.recorded?.description,
            token: hold.recorded?.fencingToken !== undefined,
          }))
          .sort((a, b) => (a.owner < b.owner ? -1 : 1)),
      });
      expect(shown(twice)).toEqual(shown(once));
      const ttls = (lock: StoredLock): number[] =>
        [...lock.holds].sort((a, b) => (a.owner < b.owner ? -1 : 1)).map((hold) => hold.ttl);
      ttls(twice).forEach((ttl, i) => expect(Math.abs(ttl - ttls(once)[i])).toBeLessThanOrEqual(SLACK_MS));
    };

    it('inspect, readers with a writer waiting: the same holders and line; nothing changes', async () => {
      const p = await judge<StoredLock>({
        script: INSPECT_SCRIPT,
        scene: async (k) => {
          await share(k, 'soR1');
          await share(k, 'soR2');
          await queue(k, 'w3');
          await keepPlaces(k);
        },
        call: (k) => store.inspect(k.lock),
      });
      expect(p.twice).toMatchObject({ held: true, waiting: 1 });
      expect(p.twice.holds.map((hold) => hold.owner).sort()).toEqual(['soR1', 'soR2']);
      expectSameInspection(p.twice, p.once);
    });

    it('inspect, a grant to the head not taken up: shown as granted; nothing changes', async () => {
      const p = await judge<StoredLock>({
        script: INSPECT_SCRIPT,
        scene: async (k) => {
          await hold(k, 'oA');
          await queue(k, 'w1');
          await queue(k, 'w2');
          await keepPlaces(k);
          await release(k, 'oA');
        },
        call: (k) => store.inspect(k.lock),
      });
      expect(p.twice.holds).toHaveLength(1);
      expect(p.twice.holds[0]).toMatchObject({ owner: `w1:${grantOf(p.before, 'w1')}`, granted: true });
      // Waiters write nothing but their place: a grant is described once its waiter takes it up.
      expect(p.twice.holds[0].recorded).toBeUndefined();
      expectSameInspection(p.twice, p.once);
    });
  });

  // ---- forceUnlock through LockService, with the holder and the waiters in applications of their own --

  describe('LockService.forceUnlock: an operator application behind the proxy, the holder and two waiters in applications of their own', () => {
    type Unlock = 'library' | 'old script';

    interface Outcome {
      /** Whom the operator's result names. */
      readonly removed: readonly string[];
      /** Who holds in Redis, by role ("grant to Z": a grant not taken up). */
      readonly holds: Readonly<Record<string, string>>;
      readonly line: readonly string[];
      /** Y was told it lost the lock. */
      readonly yLost: boolean;
      /** Z's code is running. */
      readonly zInside: boolean;
    }

    async function app(options: Partial<DisLockModuleOptions>): Promise<TestApp> {
      const made = await createTestApp([], { keyPrefix: prefix, operationTimeout: OPERATION_TIMEOUT, ...options });
      apps.push(made);
      return made;
    }

    /**
     * X holds; Y, then Z, wait (their applications on Redis directly). The operator (behind the proxy)
     * force-unlocks: Y is granted the lock and takes it up. With `fault`, the reply is lost and the
     * copy re-sent once Y is inside.
     */
    async function forceUnlockScene(unlock: Unlock, fault: boolean): Promise<Outcome> {
      const name = `report-${++cases}`;
      const k = keysOf(prefix, prefix + name);
      const [x, y, z, operator] = await Promise.all([
        app({ redis: server.url }),
        app({ redis: server.url }),
        app({ redis: server.url }),
        app({ redis: { host: '127.0.0.1', port: proxy.port } }),
      ]);
      const options = { waitTime: 30_000, lockWatchdogTimeout: 60_000 };
      const held = await x.locks.lock(name, { ...options, label: 'X' });
      const yIn = deferred<LockHandle>();
      const zIn = deferred<LockHandle>();
      const exit = gate();
      let yInside = false;
      let zInside = false;
      const yDone = settle(
        y.locks.withLock(
          name,
          async (lock) => {
            yInside = true;
            yIn.resolve(lock);
            await exit.promise;
          },
          { ...options, label: 'Y' },
        ),
      );
      await waitFor(async () => (await snapshot(k)).line.length === 1, 5_000, 'Y in the line');
      const roleOfWaiter = new Map([[(await snapshot(k)).line[0], 'Y']]);
      const zDone = settle(
        z.locks.withLock(
          name,
          async (lock) => {
            zInside = true;
            zIn.resolve(lock);
            await exit.promise;
          },
          { ...options, label: 'Z' },
        ),
      );
      await waitFor(async () => (await snapshot(k)).line.length === 2, 5_000, 'Z in the line');
      roleOfWaiter.set((await snapshot(k)).line[1], 'Z');

      const yTakesItUp = async (): Promise<void> => void (await waitFor(async () => yInside, 5_000, 'Y inside'));
      const script = unlock === 'library' ? FORCE_UNLOCK_SCRIPT : OLD_FORCE_UNLOCK_SCRIPT;
      const call = async (): Promise<string[]> => {
        if (unlock === 'library') return (await operator.locks.forceUnlock(name)).map((holder) => holder.owner);
        const client = viaProxy();
        rawClients.push(client);
        await OLD_FORCE_UNLOCK_SCRIPT.run(client, listOf(k), ['old:1', 0, GRANT_MS]);
        return [];
      };
      let removed: string[];
      if (fault) {
        ({ result: removed } = await runTwice(script, k, call, { between: yTakesItUp, holdMs: APP_HOLD_MS }));
      } else {
        removed = await runOnce(script, call);
        await yTakesItUp();
      }
      const yLock = await yIn.promise;
      // What the re-sent copy of the old script set off: Z hears its grant and takes it up.
      if (unlock === 'old script' && fault) await waitFor(async () => zInside, 5_000, 'Z inside');
      const s = await snapshot(k);
      const roleOfOwner = new Map([
        [held.owner, 'X'],
        [yLock.owner, 'Y'],
      ]);
      if (zInside) roleOfOwner.set((await zIn.promise).owner, 'Z');
      // A waiter (in the line, or granted the lock as `<waiter>:<token>`) by the place it took.
      const labelOf = (field: string): string => roleOfWaiter.get(field.replace(GRANT_FIELD, '$1')) ?? `? ${field}`;
      const outcome: Outcome = {
        removed: removed.map((owner) => roleOfOwner.get(owner) ?? `? ${owner}`),
        holds: Object.fromEntries(
          [...s.hash].map(([field, value]) =>
            value === '0'
              ? [`grant to ${labelOf(field)}`, kindOf(value)]
              : [roleOfOwner.get(field) ?? `? ${field}`, kindOf(value)],
          ),
        ),
        line: s.line.map(labelOf),
        yLost: yLock.signal.aborted,
        zInside,
      };
      exit.open();
      await held.release();
      await yDone;
      await zDone;
      return outcome;
    }

    const oneHolderNext: Outcome = {
      removed: ['X'],
      holds: { Y: 'exclusive' },
      line: ['Z'],
      yLost: false,
      zInside: false,
    };

    it('re-sent once Y has taken the lock up: the result names X; Y still holds, Z still waits, as after one run', async () => {
      const control = await forceUnlockScene('library', false);
      expect(control).toEqual(oneHolderNext);
      const twice = await forceUnlockScene('library', true);
      expect(twice).toEqual(control);
    });

    it('control: the old script, re-sent the same way, drops Y (who is inside and not told) and lets Z in too', async () => {
      const once = await forceUnlockScene('old script', false);
      expect(once).toMatchObject({ holds: { Y: 'exclusive' }, line: ['Z'], zInside: false });
      const twice = await forceUnlockScene('old script', true);
      expect(twice).toMatchObject({ yLost: false, zInside: true });
      expect(twice.holds).not.toHaveProperty('Y');
    });
  });
});
