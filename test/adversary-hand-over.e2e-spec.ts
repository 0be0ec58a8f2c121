/**
 * Adversary tests for hand-overs inside one process (9fd60d4): a holder that finishes with a waiter
 * of its own process at the head of the local line offers its hold, and the head's next attempt
 * takes it over in one acquire call (ARGV[10] = the holder's owner id).
 *
 * What is looked for: two holders at once (overlapping critical sections, a fencing token not
 * larger than the previous holder's), a lock left held by nobody, a waiter never woken, a holder
 * told "released" when it lost the lock (or told "lost" when it did not), unfairness beyond one
 * turn of the local line, unhandled rejections, and a hand-over that ignores the holder's options.
 *
 * Every test runs on redis-server processes of its own (never the shared one), some behind a
 * FaultProxy; nothing mocks Redis. Steps wait for what they are about (an event, a MONITOR line, a
 * reply), not for time to pass.
 */
import { Logger } from '@nestjs/common';
import { Test } from '@nestjs/testing';
import type { Redis } from 'ioredis';
import {
  DisLockTestingModule,
  type DisLockModuleOptions,
  type LockHandle,
  LockService,
  MemoryLockStore,
} from 'nestjs-dislock';
import { fenceKeyFor, lineKeysFor } from '../lib/store/redis/fence-key';
import { ACQUIRE_SCRIPT } from '../lib/store/redis/scripts/acquire.script';
import { RELEASE_SCRIPT } from '../lib/store/redis/scripts/release.script';
import { createTestApp, type TestApp } from './support/app';
import { settle } from './support/async';
import { FaultProxy, isScript } from './support/fault-proxy';
import { holdsOf } from './support/lock-hash';
import { calls, type Line, Monitor } from './support/monitor';
import { argvOf, handOversIn, isHandOverBy, startWaiting as waitingCall } from './support/hand-overs';
import { RedisServer } from './support/redis-server';
import { ReplicatedPair } from './support/sentinel';
import { eventually } from './support/shared-redis';

const PREFIX = 'adv-hand-over:';
/** Waiters wait long enough that waitTime never decides a test that is not about it. */
const WAIT = 10_000;

/** A proxied command that is a hand-over: the acquire script with the holder's owner id as ARGV[10]. */
const isHandOver = isHandOverBy(ACQUIRE_SCRIPT);

/** The hand-overs of `key` among MONITOR `lines`: their ARGV. */
const handOversOf = (lines: readonly Line[], key: string): string[][] => handOversIn(lines, key, ACQUIRE_SCRIPT);

/** Starts a waiting `lock` call and resolves once it waits (its first attempt found the lock busy). */
const startWaiting = (
  locks: LockService,
  name: string,
  options: Record<string, unknown> = {},
): Promise<{ got: Promise<LockHandle> }> => waitingCall(locks, name, options, WAIT);

/**
 * A holder that can hand over: the lock only gets a budget of hand-overs when it comes to this
 * process through its line, so a blocker holds it first while `waiters` callers line up behind it
 * (`options` for each), then lets go. Resolves with the first waiter's handle (its hand-over budget
 * is the others) and the others' pending acquisitions.
 */
async function lineUp(
  locks: LockService,
  name: string,
  waiters: number,
  options: (i: number) => Record<string, unknown> = () => ({}),
): Promise<{ holder: LockHandle; rest: Promise<LockHandle>[] }> {
  const blocker = await locks.lock(name);
  const lined: Promise<LockHandle>[] = [];
  for (let i = 0; i < waiters; i += 1) lined.push((await startWaiting(locks, name, options(i))).got);
  await blocker.release();
  return { holder: await lined[0], rest: lined.slice(1) };
}

/** Who is inside a critical section of one lock, and every time that broke the lock's rules. */
class Sections {
  readonly overlaps: string[] = [];
  /** Every entry in order: who, shared or not, its fencing token. */
  readonly entries: { who: string; shared: boolean; token: number }[] = [];
  private readonly inside = new Map<string, boolean>();

  enter(who: string, shared: boolean, token: number): void {
    const others = [...this.inside];
    if (others.some(([, otherShared]) => !shared || !otherShared)) {
      this.overlaps.push(`${who} entered while ${others.map(([name]) => name).join(', ')} inside`);
    }
    this.inside.set(who, shared);
    this.entries.push({ who, shared, token });
  }

  exit(who: string): void {
    this.inside.delete(who);
  }

  /** Exclusive entries whose token is not larger than every token issued before them (and after them: smaller). */
  tokenViolations(): string[] {
    const bad: string[] = [];
    this.entries.forEach((entry, i) => {
      if (entry.shared) return;
      for (const [j, other] of this.entries.entries()) {
        if (j < i && other.token >= entry.token)
          bad.push(`${entry.who} (${entry.token}) after ${other.who} (${other.token})`);
        if (j > i && other.token <= entry.token)
          bad.push(`${other.who} (${other.token}) after ${entry.who} (${entry.token})`);
      }
    });
    return bad;
  }
}

/** A few turns of the event loop (a critical section that does some async work). */
async function work(turns: number): Promise<void> {
  for (let i = 0; i < turns; i += 1) await new Promise((resolve) => setImmediate(resolve));
}

describe('adversary: hand-overs inside one process', () => {
  const quiet = (['log', 'warn', 'error'] as const).map((level) =>
    vi.spyOn(Logger.prototype, level).mockImplementation(() => undefined),
  );
  const unhandled: unknown[] = [];
  const onUnhandled = (reason: unknown): void => void unhandled.push(reason);

  let servers: RedisServer[] = [];
  let proxies: FaultProxy[] = [];
  let apps: TestApp[] = [];
  let clients: Redis[] = [];
  let monitors: Monitor[] = [];

  beforeAll(() => {
    process.on('unhandledRejection', onUnhandled);
  });

  afterEach(async () => {
    for (const server of servers) server.resume();
    await Promise.allSettled(proxies.map((proxy) => proxy.close()));
    await Promise.allSettled(apps.map((t) => t.close()));
    for (const monitor of monitors) monitor.stop();
    for (const client of clients) client.disconnect();
    await Promise.allSettled(servers.map((server) => server.dispose()));
    servers = [];
    proxies = [];
    apps = [];
    clients = [];
    monitors = [];
    expect(unhandled).toEqual([]);
  });

  afterAll(() => {
    process.off('unhandledRejection', onUnhandled);
    for (const spy of quiet) spy.mockRestore();
  });

  async function ownServer(): Promise<{ server: RedisServer; redis: Redis }> {
    const server = await RedisServer.start();
    servers.push(server);
    const redis = server.client();
    clients.push(redis);
    return { server, redis };
  }

  async function monitorOf(server: RedisServer, redis: Redis): Promise<Monitor> {
    const monitor = await Monitor.start(server, redis);
    monitors.push(monitor);
    return monitor;
  }

  async function proxyTo(server: RedisServer): Promise<FaultProxy> {
    const proxy = await FaultProxy.start(server.port);
    proxies.push(proxy);
    return proxy;
  }

  async function app(
    redis: DisLockModuleOptions['redis'],
    options: Partial<DisLockModuleOptions> = {},
  ): Promise<TestApp> {
    const t = await createTestApp([], { redis, keyPrefix: PREFIX, telemetry: false, ...options });
    apps.push(t);
    return t;
  }

  /** The lock key and its line's two keys. */
  function keysFor(name: string): { key: string; line: string; deadlines: string; fence: string } {
    const key = PREFIX + name;
    const [line, deadlines] = lineKeysFor(PREFIX, key, key);
    return { key, line, deadlines, fence: fenceKeyFor(PREFIX, key) };
  }

  /** Nothing of `name` is left in Redis: no hold, and (once places lapse or are left) no line. */
  async function nothingLeft(redis: Redis, name: string): Promise<void> {
    const { key, line, deadlines } = keysFor(name);
    expect(await holdsOf(redis, key)).toEqual({});
    expect(await eventually(async () => (await redis.exists(line, deadlines)) === 0, 4_000)).toBe(true);
  }

  it('stress: plain, writer, reader, tryLock and giving-up callers in two processes; no overlap, tokens grow, nothing left', async () => {
    const { server, redis } = await ownServer();
    const monitor = await monitorOf(server, redis);
    const [a, b] = [await app(server.url), await app(server.url)];
    const name = 'stress';
    const { key } = keysFor(name);
    const sections = new Sections();
    const lost: string[] = [];
    for (const t of [a, b]) t.locks.on('lost', (event) => void lost.push(`${event.name} ${event.reason}`));
    const from = monitor.lines.length;
    let seq = 0;
    let bWaiting = 0;
    let run = 0;
    let longestRun = 0;
    const kinds = ['plain', 'plain', 'fixed', 'write', 'read', 'try', 'quit'] as const;

    async function worker(t: TestApp, label: string, rounds: number): Promise<void> {
      for (let round = 0; round < rounds; round += 1) {
        const kind = kinds[(round * 5 + label.length * 3 + round * round) % kinds.length];
        const who = `${label}#${(seq += 1)}:${kind}`;
        const quit = new AbortController();
        const waits = label.startsWith('b') && kind !== 'try' && kind !== 'quit';
        if (waits) bWaiting += 1;
        let handle: LockHandle | null;
        try {
          if (kind === 'try') handle = await t.locks.tryLock(name);
          else if (kind === 'quit') {
            // Gives up after a few turns of the event loop: mostly while waiting, sometimes as the lock comes.
            void work(1 + (round % 4)).then(() => quit.abort());
            handle = await t.locks.lock(name, { waitTime: WAIT, signal: quit.signal }).catch(() => null);
          } else {
            handle = await t.locks.lock(name, {
              waitTime: WAIT,
              ...(kind === 'fixed' ? { expire: 2_000 } : {}),
              ...(kind === 'write' ? { mode: 'write' as const } : {}),
              ...(kind === 'read' ? { mode: 'read' as const } : {}),
            });
          }
        } catch (error) {
          throw new Error(`${who}: ${String(error)}`);
        }
        if (waits) bWaiting -= 1;
        if (!handle) continue;
        // The longest run of entries by A while a caller of B was waiting all along.
        if (label.startsWith('a') && bWaiting > 0) longestRun = Math.max(longestRun, (run += 1));
        else run = 0;
        sections.enter(who, kind === 'read', handle.fencingToken);
        await work(round % 3);
        sections.exit(who);
        await handle.release();
      }
    }

    await Promise.all([
      ...['a1', 'a2', 'a3', 'a4', 'a5', 'a6'].map((label) => worker(a, label, 60)),
      ...['b1', 'b2', 'b3'].map((label) => worker(b, label, 60)),
    ]);

    expect(sections.overlaps).toEqual([]);
    expect(sections.tokenViolations()).toEqual([]);
    expect(lost).toEqual([]);
    // A turn of A's line is six entries at most (its six callers). A caller of B counts as waiting
    // here from its call on, before its first attempt has a place in the Redis line: on a loaded
    // machine it can see two turns of A back to back (7 seen beside a CPU hog). Hand-overs without
    // a budget give runs of dozens; the exact one-turn order is pinned in hand-over.e2e-spec.ts.
    expect(longestRun).toBeLessThanOrEqual(12);
    expect(sections.entries.length).toBeGreaterThan(50);
    console.log(
      `[stress] ${sections.entries.length} entries, ${handOversOf(await monitor.window(from), key).length} hand-overs, longest run of A while B waits ${longestRun}`,
    );
    // The test exercised what it is about.
    expect(handOversOf(await monitor.window(from), key).length).toBeGreaterThan(5);
    await nothingLeft(redis, name);
    for (const t of [a, b]) expect((await t.locks.health()).heldLocks).toBe(0);
  }, 60_000);

  it('multi-locks and single locks of the same names in two processes: no overlap on either name, nothing left', async () => {
    const { server, redis } = await ownServer();
    const monitor = await monitorOf(server, redis);
    const [a, b] = [await app(server.url), await app(server.url)];
    const names = ['left', 'right'];
    const sections = new Map(names.map((name) => [name, new Sections()]));
    const from = monitor.lines.length;
    let seq = 0;

    async function worker(t: TestApp, label: string, rounds: number): Promise<void> {
      for (let round = 0; round < rounds; round += 1) {
        const pick = (round + label.length) % 3;
        const wanted = pick === 0 ? names : [names[(round + Number(label.slice(1))) % 2]];
        const who = `${label}#${(seq += 1)}:${wanted.join('+')}`;
        const handle =
          wanted.length > 1
            ? await t.locks.lock(wanted, { waitTime: WAIT })
            : await t.locks.lock(wanted[0], { waitTime: WAIT });
        for (const name of wanted) sections.get(name)?.enter(who, false, 0);
        await work(round % 3);
        for (const name of wanted) sections.get(name)?.exit(who);
        await handle.release();
      }
    }

    await Promise.all([
      ...['a1', 'a2', 'a3', 'a4'].map((label) => worker(a, label, 30)),
      ...['b1', 'b2'].map((label) => worker(b, label, 30)),
    ]);
    for (const name of names) expect(sections.get(name)?.overlaps).toEqual([]);
    const lines = await monitor.window(from);
    expect(names.reduce((sum, name) => sum + handOversOf(lines, PREFIX + name).length, 0)).toBeGreaterThan(5);
    for (const name of names) await nothingLeft(redis, name);
    for (const t of [a, b]) expect((await t.locks.health()).heldLocks).toBe(0);
  }, 60_000);

  describe('Redis faults on the hand-over attempt', () => {
    it('its reply is lost and the connection reset (ioredis re-sends it): one holder, the holder released, nothing left', async () => {
      const { server, redis } = await ownServer();
      const proxy = await proxyTo(server);
      const t = await app(proxy.url);
      const name = 'resent';
      const { key } = keysFor(name);
      const lost: string[] = [];
      t.locks.on('lost', (event) => void lost.push(event.owner));
      const { holder, rest } = await lineUp(t.locks, name, 2);
      const dropped = proxy.dropReply(isHandOver);
      expect(await holder.release()).toBe(true);
      const seen = await dropped;
      expect(argvOf(seen.argv)[9]).toBe(holder.owner);
      const next = await rest[0];
      expect(next.fencingToken).toBeGreaterThan(holder.fencingToken);
      expect(await holdsOf(redis, key)).toEqual({ [next.owner]: '1' });
      expect(lost).toEqual([]);
      expect(await next.release()).toBe(true);
      await nothingLeft(redis, name);
    });

    it('its reply never comes (operationTimeout): both holds are given back, the next waiter gets the lock, nothing left', async () => {
      const { server, redis } = await ownServer();
      const proxy = await proxyTo(server);
      const t = await app(proxy.url, { operationTimeout: 400 });
      const name = 'stalled';
      const { key } = keysFor(name);
      const { holder, rest } = await lineUp(t.locks, name, 3);
      const [first, second] = rest.map((got) => ({ got }));
      const stalled = proxy.dropReply(isHandOver, { then: 'stall' });
      const released = await settle(holder.release());
      await stalled;
      // Unknown outcome: the holder is told its release failed (its hold is given back behind it).
      expect(released.ok).toBe(false);
      expect((await settle(first.got)).ok).toBe(false);
      // The connection comes back: what ioredis still held is re-sent, then the give-backs run.
      proxy.resetConnections('command');
      const next = await second.got;
      expect(await holdsOf(redis, key)).toEqual({ [next.owner]: '1' });
      expect(next.fencingToken).toBeGreaterThan(holder.fencingToken);
      expect(await next.release()).toBe(true);
      await nothingLeft(redis, name);
    });
  });

  describe("the holder's options", () => {
    it('lockAtLeastFor: no hand-over before the minimum; the waiter gets the lock after it', async () => {
      const { server, redis } = await ownServer();
      const monitor = await monitorOf(server, redis);
      const t = await app(server.url);
      const name = 'at-least';
      const { key } = keysFor(name);
      const from = monitor.lines.length;
      const { holder, rest } = await lineUp(t.locks, name, 2, (i) => (i === 0 ? { lockAtLeastFor: 400 } : {}));
      const lockedAt = performance.now();
      await holder.release();
      const next = await rest[0];
      expect(performance.now() - lockedAt).toBeGreaterThanOrEqual(380);
      expect(handOversOf(await monitor.window(from), key)).toEqual([]);
      await next.release();
      await nothingLeft(redis, name);
    });

    it('ifExpireWhenFinish: false (finish without release): no hand-over; the waiter gets the lock once it expires', async () => {
      const { server, redis } = await ownServer();
      const monitor = await monitorOf(server, redis);
      const t = await app(server.url);
      const name = 'keep';
      const { key } = keysFor(name);
      const from = monitor.lines.length;
      const { holder, rest } = await lineUp(t.locks, name, 2, (i) => (i === 0 ? { expire: 400 } : {}));
      const lockedAt = performance.now();
      await t.locks.finish(holder as never, false);
      const next = await rest[0];
      expect(performance.now() - lockedAt).toBeGreaterThanOrEqual(380);
      const lines = await monitor.window(from);
      expect(handOversOf(lines, key)).toEqual([]);
      expect(calls(lines, RELEASE_SCRIPT, key).map((args) => argvOf(args)[0])).not.toContain(holder.owner);
      await next.release();
      await nothingLeft(redis, name);
    });

    it('stopRenewal(): released as usual, never handed over', async () => {
      const { server, redis } = await ownServer();
      const monitor = await monitorOf(server, redis);
      const t = await app(server.url);
      const name = 'stopped';
      const { key } = keysFor(name);
      const from = monitor.lines.length;
      const { holder, rest } = await lineUp(t.locks, name, 2);
      holder.stopRenewal();
      await holder.release();
      const next = await rest[0];
      expect(handOversOf(await monitor.window(from), key)).toEqual([]);
      await next.release();
      await nothingLeft(redis, name);
    });
  });

  describe('the waiter, the application and other callers while the hand-over is on its way', () => {
    /** A holder with a budget, a waiter next, a third behind; the hand-over's reply held `ms` by the proxy. */
    async function handOverInFlight(ms: number, options: Partial<DisLockModuleOptions> = {}) {
      const { server, redis } = await ownServer();
      const monitor = await monitorOf(server, redis);
      const proxy = await proxyTo(server);
      const t = await app(proxy.url, options);
      const name = 'in-flight';
      const quit = new AbortController();
      const { holder, rest } = await lineUp(t.locks, name, 3, (i) => (i === 1 ? { signal: quit.signal } : {}));
      const [next, third] = rest;
      const delayed = proxy.delayReply(isHandOver, ms);
      // Redis runs it (MONITOR): its reply is now held by the proxy.
      const ran = monitor.next((args) => isScript(ACQUIRE_SCRIPT)(args) && argvOf(args).length === 10);
      const released = settle(holder.release());
      await ran;
      return { t, redis, name, holder, next, third, quit, delayed, released };
    }

    it('the waiter gives up while its hand-over is on its way: the holder released, the lock goes on to the next, nothing left', async () => {
      const { t, redis, name, holder, next, third, quit, delayed, released } = await handOverInFlight(200);
      quit.abort();
      await delayed;
      const holderOutcome = await released;
      expect(holderOutcome.ok && holderOutcome.value).toBe(true);
      expect((await settle(next)).ok).toBe(false);
      const last = await third;
      expect(last.fencingToken).toBeGreaterThan(holder.fencingToken);
      expect(await holdsOf(redis, PREFIX + name)).toEqual({ [last.owner]: '1' });
      await last.release();
      await nothingLeft(redis, name);
      expect((await t.locks.health()).heldLocks).toBe(0);
    });

    it('the application shuts down while the hand-over is on its way: everything settles, nothing left', async () => {
      const { t, redis, name, next, third, released } = await handOverInFlight(200);
      await t.close();
      expect((await released).ok).toBe(true);
      await Promise.allSettled([next, third]);
      await nothingLeft(redis, name);
    });

    it('forceUnlock while the hand-over is on its way: one holder at most, nothing left', async () => {
      const { t, redis, name, holder, next, third, delayed, released } = await handOverInFlight(200);
      const forced = await t.locks.forceUnlock(name);
      await delayed;
      await released;
      const got = await settle(next);
      // Whoever holds it now (the handed-over owner was force-unlocked), it is one owner.
      const holds = Object.keys(await holdsOf(redis, PREFIX + name));
      expect(holds.length).toBeLessThanOrEqual(1);
      expect(forced.map((hold) => hold.owner)).not.toContain(holder.owner);
      if (got.ok) await got.value.release();
      const last = await third;
      expect(last.fencingToken).toBeGreaterThan(holder.fencingToken);
      await last.release();
      await nothingLeft(redis, name);
    });
  });

  describe("the holder's outcome", () => {
    // Found by review (9fd60d4): a re-sent copy of the hand-over answered {1, token, 2} whether the
    // first copy handed the hold over or found it gone and took the lock as an ordinary acquisition,
    // so a holder whose hold was dropped while its code ran was told "released". A hold that came by
    // hand-over now says so in its description, and the re-sent copy answers 3 for the other case.
    it('a lock lost mid-work (force-unlocked by another process), then a hand-over whose reply is lost: the holder is told, not "released"', async () => {
      const { server, redis } = await ownServer();
      const proxy = await proxyTo(server);
      const t = await app(proxy.url);
      const other = await app(server.url);
      const name = 'masked';
      const lost: string[] = [];
      t.locks.on('lost', (event) => void lost.push(event.owner));
      // The next waiter here sleeps until the holder's release (no place in Redis's line), so the
      // force-unlock below wakes nobody and grants nothing.
      const { holder, rest } = await lineUp(t.locks, name, 3);
      // Another process drops the hold while the holder works: its process does not know yet (the
      // watchdog renews every 10 s).
      expect((await other.locks.forceUnlock(name)).map((hold) => hold.owner)).toEqual([holder.owner]);
      const dropped = proxy.dropReply(isHandOver);
      const released = await holder.release();
      await dropped;
      const next = await rest[0];
      expect(await holdsOf(redis, PREFIX + name)).toEqual({ [next.owner]: '1' });
      // The holder's critical section ran without the lock: it must learn so.
      expect({ released, lost }).toEqual({ released: false, lost: [holder.owner] });
      await next.release();
    });

    // Found by review (9fd60d4): with `replicas`, the hand-over's script runs (the holder's hold is
    // replaced), then the new owner's WAIT falls short; the holder's release() used to reject with
    // ReplicationNotConfirmedError although its hold was certainly gone. The store now marks the
    // error (`markHandedOver`), and the holder is told it released.
    it('a hand-over whose new owner replicas do not confirm: the holder, whose hold did go over, is not told its release failed', async () => {
      const pair = await ReplicatedPair.start();
      try {
        const t = await app(pair.nodes[0].url, { replicas: { min: 1, timeout: 300 } });
        const name = 'replicas';
        const { holder, rest } = await lineUp(t.locks, name, 2);
        pair.cutReplication();
        const released = await settle(holder.release());
        const next = await settle(rest[0]);
        expect(next.ok).toBe(false);
        expect(released.ok ? released.value : String(released.error)).toBe(true);
      } finally {
        await Promise.allSettled(apps.splice(0).map((t) => t.close()));
        await pair.dispose();
      }
    }, 30_000);
  });

  describe('the memory store under fake timers', () => {
    afterEach(() => {
      vi.useRealTimers();
    });

    it('a chain of hand-overs needs no timer to move; another application waiting gets the lock after one turn; nothing left', async () => {
      vi.useFakeTimers();
      const store = new MemoryLockStore();
      const handOvers: string[] = [];
      const acquire = store.acquire.bind(store);
      vi.spyOn(store, 'acquire').mockImplementation((key, owner, leaseMs, options) => {
        if (options?.from !== undefined) handOvers.push(options.from);
        return acquire(key, owner, leaseMs, options);
      });
      const contexts = await Promise.all(
        [0, 1].map(async () => {
          const moduleRef = await Test.createTestingModule({
            imports: [DisLockTestingModule.forRoot({ store, keyPrefix: PREFIX })],
          }).compile();
          return moduleRef.init();
        }),
      );
      try {
        const [a, b] = contexts.map((context) => context.get(LockService));
        const name = 'memory-chain';
        const order: string[] = [];
        const { holder, rest } = await lineUp(a, name, 4);
        const other = await startWaiting(b, name);
        const late = await startWaiting(a, name);
        const tokens = [holder.fencingToken];
        expect(store.holders(PREFIX + name).map((hold) => hold.owner)).toEqual([holder.owner]);
        order.push('a1');
        await holder.release();
        for (const [i, got] of rest.entries()) {
          const handle = await got;
          order.push(`a${i + 2}`);
          tokens.push(handle.fencingToken);
          await handle.release();
        }
        const fromB = await other.got;
        order.push('b');
        tokens.push(fromB.fencingToken);
        await fromB.release();
        const last = await late.got;
        order.push('a-late');
        tokens.push(last.fencingToken);
        await last.release();
        expect(order).toEqual(['a1', 'a2', 'a3', 'a4', 'b', 'a-late']);
        expect(handOvers).toHaveLength(3);
        expect(tokens).toEqual([...tokens].sort((x, y) => x - y));
        expect(store.holders(PREFIX + name)).toEqual([]);
      } finally {
        for (const context of contexts) await context.close();
      }
    });
  });
});
