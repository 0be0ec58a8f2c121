/**
 * Hand-overs inside one process (issue 22, contended path): a holder that finishes while a waiter
 * of its own process is next hands the lock over in one step (one acquire script call that
 * replaces its hold with the waiter's: see the acquire script's ARGV[10]) instead of a release and
 * a second acquisition. The lock is never free in between, the new holder gets its own lease and
 * a larger fencing token, and one process keeps the lock for one turn of its line at most (the
 * waiters that were behind it when it came to the process) while other processes wait.
 *
 * Every test runs on this file's own redis-server, watched with MONITOR; nothing is timed: each
 * step waits for the event it is about (a `waiting` event, a lock handed to a caller).
 */
import type { Redis } from 'ioredis';
import type { LockHandle, LockService } from 'nestjs-dislock';
import { ACQUIRE_SHARED_SCRIPT } from '../lib/store/redis/scripts/acquire-shared.script';
import { ACQUIRE_SCRIPT } from '../lib/store/redis/scripts/acquire.script';
import { RELEASE_SCRIPT } from '../lib/store/redis/scripts/release.script';
import { createTestApp, type TestApp } from './support/app';
import { argvOf, handOversIn, startWaiting as waitingCall } from './support/hand-overs';
import { calls, type Line, Monitor } from './support/monitor';
import { RedisServer } from './support/redis-server';
import { uniquePrefix } from './support/shared-redis';

/** Waiters wait long enough that waitTime never decides a test that is not about it. */
const WAIT = 10_000;

/** The acquisitions among `lines` that were hand-overs (they send the holder's owner id as ARGV[10]). */
const handOvers = (lines: readonly Line[], key: string, script = ACQUIRE_SCRIPT): string[][] =>
  handOversIn(lines, key, script);

/** Starts a waiting `lock` call and resolves once it waits (its first attempt found the lock busy). */
const startWaiting = (
  service: LockService,
  name: string,
  options: { expire: number; signal?: AbortSignal; permits?: number; mode?: 'read' | 'write' },
): Promise<{ got: Promise<LockHandle> }> => waitingCall(service, name, options, WAIT);

describe('hand-overs inside one process', () => {
  let server: RedisServer;
  let redis: Redis;
  let mon: Monitor;
  const apps: TestApp[] = [];

  beforeAll(async () => {
    server = await RedisServer.start();
    redis = server.client();
    mon = await Monitor.start(server, redis);
  });

  afterAll(async () => {
    await Promise.allSettled(apps.map((app) => app.close()));
    mon?.stop();
    redis?.disconnect();
    await server?.stop();
  });

  async function app(prefix: string): Promise<TestApp> {
    const made = await createTestApp([], { redis: server.url, keyPrefix: prefix, telemetry: false });
    apps.push(made);
    return made;
  }

  it('waiters of one process take the lock from one another in one step each: own lease, larger token, never free between', async () => {
    const prefix = uniquePrefix('hand-over');
    const t = await app(prefix);
    const name = 'chain';
    const key = prefix + name;
    const first = await t.locks.lock(name, { expire: 20_000 });
    // Five waiters, one after another; each its own fixed lease, so that the lease in Redis says whose it is.
    const expires = [9_000, 8_000, 7_000, 6_000, 5_000];
    const waiters = [];
    for (const expire of expires) waiters.push(await startWaiting(t.locks, name, { expire }));
    const from = mon.lines.length;
    expect(await first.release()).toBe(true);

    const handles: LockHandle[] = [];
    for (const [i, waiter] of waiters.entries()) {
      const handle = await waiter.got;
      handles.push(handle);
      // Its hold alone in the hash (no other owner, no grant) with its description, and its own
      // lease. (A waiting mark may be there too: a waiter's look while another held the lock.)
      const fields = Object.keys(await redis.hgetall(key)).filter((field) => !field.startsWith('=~'));
      expect(fields.sort()).toEqual([handle.owner, `=${handle.owner}`].sort());
      const ttl = await redis.pttl(key);
      expect(ttl).toBeLessThanOrEqual(expires[i]);
      expect(ttl).toBeGreaterThan(expires[i] - 1_000);
      expect(await handle.release()).toBe(true);
    }
    expect(await redis.exists(key)).toBe(0);

    const lines = await mon.window(from);
    // The first waiter takes the lock from the line (the first holder released it, a grant); each
    // later one takes it over from the one before, naming it; only the first holder and the last
    // waiter release.
    expect(handOvers(lines, key).map((argv) => argv[9])).toEqual(handles.slice(0, -1).map((handle) => handle.owner));
    expect(calls(lines, RELEASE_SCRIPT, key).map((args) => argvOf(args)[0])).toEqual([
      first.owner,
      handles[handles.length - 1].owner,
    ]);
    const tokens = [first, ...handles].map((handle) => handle.fencingToken);
    expect(tokens).toEqual([...tokens].sort((a, b) => a - b));
    expect(new Set(tokens).size).toBe(tokens.length);
  });

  it('another process waiting gets the lock after one turn of this process’s line, before a caller here that came after it', async () => {
    const prefix = uniquePrefix('hand-over-turn');
    const [a, b] = [await app(prefix), await app(prefix)];
    const name = 'turn';
    const key = prefix + name;
    const order: string[] = [];
    const hold = async (label: string, got: Promise<LockHandle>, during?: () => Promise<void>): Promise<void> => {
      const handle = await got;
      order.push(label);
      await during?.();
      await handle.release();
    };

    const a0 = await a.locks.lock(name, { expire: 20_000 });
    const [a1, a2, a3] = [
      await startWaiting(a.locks, name, { expire: 20_000 }),
      await startWaiting(a.locks, name, { expire: 20_000 }),
      await startWaiting(a.locks, name, { expire: 20_000 }),
    ];
    const b1 = await startWaiting(b.locks, name, { expire: 20_000 });
    const from = mon.lines.length;
    let again: Promise<void> | undefined;
    const done = Promise.all([
      // A caller of A that comes once a1 holds the lock: after b1, which waited before it.
      hold('a1', a1.got, async () => {
        const late = await startWaiting(a.locks, name, { expire: 20_000 });
        again = hold('a0-again', late.got);
      }),
      hold('a2', a2.got),
      hold('a3', a3.got),
      hold('b1', b1.got),
    ]);
    await a0.release();
    await done;
    await again;
    expect(order).toEqual(['a1', 'a2', 'a3', 'b1', 'a0-again']);
    // a2 and a3 were handed over; b1's and the late caller's came through the line.
    expect(handOvers(await mon.window(from), key)).toHaveLength(2);
    expect(await redis.exists(key)).toBe(0);
  });

  it('a waiter that gives up as the holder finishes: the holder releases as usual, the next waiter gets the lock, nothing is left', async () => {
    const prefix = uniquePrefix('hand-over-give-up');
    const t = await app(prefix);
    const name = 'give-up';
    const key = prefix + name;
    for (let round = 0; round < 5; round += 1) {
      const blocker = await t.locks.lock(name, { expire: 20_000 });
      const holderWait = await startWaiting(t.locks, name, { expire: 20_000 });
      const quitter = new AbortController();
      const leaving = await startWaiting(t.locks, name, { expire: 20_000, signal: quitter.signal });
      const next = await startWaiting(t.locks, name, { expire: 20_000 });
      await blocker.release();
      const holder = await holderWait.got;
      // The next in line here gives up just as the holder finishes (its offer may be pending).
      quitter.abort();
      expect(await holder.release()).toBe(true);
      await expect(leaving.got).rejects.toThrow();
      const last = await next.got;
      const fields = Object.keys(await redis.hgetall(key)).filter((field) => !field.startsWith('=~'));
      expect(fields.sort()).toEqual([last.owner, `=${last.owner}`].sort());
      expect(last.fencingToken).toBeGreaterThan(holder.fencingToken);
      expect(await last.release()).toBe(true);
      expect(await redis.exists(key)).toBe(0);
    }
  });
  it('a semaphore’s permit passes between waiters of one process in one step each; never more holders than permits', async () => {
    const prefix = uniquePrefix('hand-over-permit');
    const t = await app(prefix);
    const name = 'permits';
    const key = prefix + name;
    const permits = 2;
    const first = await t.locks.lock(name, { permits, expire: 20_000 });
    const other = await t.locks.lock(name, { permits, expire: 20_000 });
    const expires = [9_000, 8_000, 7_000, 6_000];
    const waiters = [];
    for (const expire of expires) waiters.push(await startWaiting(t.locks, name, { permits, expire }));
    const from = mon.lines.length;
    expect(await first.release()).toBe(true);

    const handles: LockHandle[] = [];
    for (const [i, waiter] of waiters.entries()) {
      const handle = await waiter.got;
      handles.push(handle);
      // Two holds: the other holder's, and this one's with its own lease in place of the one before.
      const holds = Object.keys(await redis.hgetall(key)).filter((field) => !field.startsWith('='));
      expect(holds.sort()).toEqual([other.owner, handle.owner].sort());
      const lease = Number(await redis.hget(key, handle.owner)) - Number((await redis.time())[0]) * 1000;
      expect(lease).toBeLessThanOrEqual(expires[i] + 1_000);
      expect(lease).toBeGreaterThan(expires[i] - 1_000);
      expect(await handle.release()).toBe(true);
    }
    expect(await other.release()).toBe(true);
    expect(await redis.exists(key)).toBe(0);

    const lines = await mon.window(from);
    // The first waiter takes a permit from the line (the first holder released it); each later one
    // takes the permit over from the one before, naming it; no other acquisition takes one.
    expect(handOvers(lines, key, ACQUIRE_SHARED_SCRIPT).map((argv) => argv[9])).toEqual(
      handles.slice(0, -1).map((handle) => handle.owner),
    );
    expect(calls(lines, RELEASE_SCRIPT, key).map((args) => argvOf(args)[0])).toEqual([
      first.owner,
      handles[handles.length - 1].owner,
      other.owner,
    ]);
    const tokens = [first, ...handles].map((handle) => handle.fencingToken);
    expect(tokens).toEqual([...tokens].sort((a, b) => a - b));
  });

  it('a reader’s hold is never handed over: a writer waiting in another process goes before a reader here that came after it', async () => {
    const prefix = uniquePrefix('hand-over-reader');
    const [a, b] = [await app(prefix), await app(prefix)];
    const name = 'rw';
    const key = prefix + name;
    const order: string[] = [];
    // The reader comes through the line, with another reader here behind it: it would have a
    // hand-over to make, if readers made them.
    const first = await a.locks.lock(name, { mode: 'write', expire: 20_000 });
    const waiting = await startWaiting(a.locks, name, { mode: 'read', expire: 20_000 });
    const writer = await startWaiting(b.locks, name, { mode: 'write', expire: 20_000 });
    // A second reader here comes after the writer: it waits behind it.
    const late = await startWaiting(a.locks, name, { mode: 'read', expire: 20_000 });
    const from = mon.lines.length;
    expect(await first.release()).toBe(true);
    const reader = await waiting.got;
    const done = Promise.all(
      [
        ['writer', writer.got],
        ['late reader', late.got],
      ].map(async ([label, got]) => {
        const handle = await (got as Promise<LockHandle>);
        order.push(label as string);
        await handle.release();
      }),
    );
    expect(await reader.release()).toBe(true);
    await done;
    expect(order).toEqual(['writer', 'late reader']);
    expect(handOvers(await mon.window(from), key, ACQUIRE_SHARED_SCRIPT)).toEqual([]);
    expect(await redis.exists(key)).toBe(0);
  });
});
