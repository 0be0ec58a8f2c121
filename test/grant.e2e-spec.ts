import { randomBytes } from 'node:crypto';
import { Logger } from '@nestjs/common';
import type { Redis } from 'ioredis';
import type { LockHandle } from 'nestjs-dislock';
import { fenceKeyFor, lineKeysFor } from '../lib/store/redis/fence-key';
import { GRANT_MS, PLACE_MS, RedisLockStore } from '../lib/store/redis/redis-lock.store';
import type { AcquireOptions, AcquireResult, RenewOutcome, RenewRequest } from '../lib/store/lock-store.interface';
import { ACQUIRE_SCRIPT } from '../lib/store/redis/scripts/acquire.script';
import { ACQUIRE_SHARED_SCRIPT } from '../lib/store/redis/scripts/acquire-shared.script';
import { LEAVE_SCRIPT } from '../lib/store/redis/scripts/leave.script';
import { RELEASE_SCRIPT } from '../lib/store/redis/scripts/release.script';
import { RENEW_SCRIPT } from '../lib/store/redis/scripts/renew.script';
import { createTestApp, type TestApp } from './support/app';
import { settle, waitFor } from './support/async';
import { RedisServer } from './support/redis-server';
import { eventually, sleep, uniquePrefix } from './support/shared-redis';
import { holdsOf } from './support/lock-hash';

/**
 * Grants: a release (or a leave, or an acquire that finds the lock free with a line) hands the
 * lock straight to the head of the lock's Redis line. First the scripts on their own (what Redis
 * holds after each step), then through LockService: the head's process wakes, and its next
 * attempt takes the grant up: the hold starts on that attempt's answer. Everything runs on this file's own
 * redis-server.
 */

/** Release -> the waiter holds the lock. A round trip is a few ms; the margin is for a busy 2-core machine. */
const WAKE_MS = 150;
/** A holder that only a release lets go of within a test. */
const LONG = { lockWatchdogTimeout: 20_000 } as const;

const waiterId = (): string => randomBytes(12).toString('hex');

/** A lock's four script keys: the lock, its slot's fencing counter, its line and the line's deadlines. */
interface LockKeys {
  readonly key: string;
  readonly fence: string;
  readonly line: string;
  readonly deadlines: string;
  readonly all: string[];
}

function lockKeys(prefix: string, name: string): LockKeys {
  const key = prefix + name;
  const fence = fenceKeyFor(prefix, key);
  const [line, deadlines] = lineKeysFor(prefix, key, key);
  return { key, fence, line, deadlines, all: [key, fence, line, deadlines] };
}

/** Busy until `until` (performance.now()): the event loop stands still, as in a long GC pause or a CPU-bound request. */
function stallUntil(until: number): void {
  while (performance.now() < until) {
    // spinning
  }
}

describe('grants: a release hands the lock to the head of its line', () => {
  const quiet = (['log', 'warn', 'error'] as const).map((level) =>
    vi.spyOn(Logger.prototype, level).mockImplementation(() => undefined),
  );
  let server: RedisServer;
  let redis: Redis;

  beforeAll(async () => {
    server = await RedisServer.start();
    redis = server.client();
  });

  afterAll(async () => {
    redis?.disconnect();
    await server?.dispose();
    for (const spy of quiet) spy.mockRestore();
  });

  describe('the scripts', () => {
    /** What the scripts announce with: a store id and a sequence number. */
    const NOTICE = 'teststore:7';
    let k: LockKeys;

    beforeEach(() => {
      k = lockKeys(uniquePrefix('grant'), 'job');
    });

    /** {1, token}, {0, pttl}, or {0, -3, ms the head has to take it}. */
    const acquire = (owner: string, leaseMs: number, waiter: string): Promise<number[]> =>
      ACQUIRE_SCRIPT.run(redis, k.all, [owner, leaseMs, waiter, PLACE_MS, 0, NOTICE, GRANT_MS]) as Promise<number[]>;
    const release = (owner: string): Promise<0 | [number, string, string, string]> =>
      RELEASE_SCRIPT.run(redis, k.all, [owner, NOTICE, 0, GRANT_MS]) as Promise<0 | [number, string, string, string]>;
    const leave = (waiter: string): Promise<number> =>
      LEAVE_SCRIPT.run(redis, k.all, [waiter, NOTICE, 0, GRANT_MS]) as Promise<number>;
    const renew = (owner: string, leaseMs: number): Promise<number[]> =>
      RENEW_SCRIPT.run(redis, [k.key], [owner, leaseMs]) as Promise<number[]>;
    const line = async (): Promise<{ order: string[]; deadlines: string[] }> => ({
      order: await redis.zrange(k.line, '0', '-1'),
      deadlines: await redis.zrange(k.deadlines, '0', '-1'),
    });

    /** Every message published on the lock's channel from now on. */
    async function listen(): Promise<{ messages: string[]; stop: () => void }> {
      const sub = redis.duplicate();
      const messages: string[] = [];
      sub.on('message', (channel: string, message: string) => {
        if (channel === k.key) messages.push(message);
      });
      await sub.subscribe(k.key);
      return { messages, stop: () => sub.disconnect() };
    }

    /** `holder` holds the lock (no line), then each of `waiters` in turn takes a place in its line. */
    async function heldWithLine(holder: string, ...waiters: string[]): Promise<number> {
      const [taken, token] = await acquire(holder, 10_000, '');
      expect(taken).toBe(1);
      for (const waiter of waiters) {
        const refused = await acquire(`attempt-of-${waiter}`, 10_000, waiter);
        expect(refused).toEqual([0, expect.any(Number)]);
        expect(refused[1]).toBeGreaterThan(9_000);
      }
      // The deadlines are ordered by lapse time (whole ms), not by arrival.
      const { order, deadlines } = await line();
      expect({ order, deadlines: [...deadlines].sort() }).toEqual({ order: waiters, deadlines: [...waiters].sort() });
      return token;
    }

    it('a release grants the lock to the head; an acquire by the head takes the grant up with its token, once', async () => {
      const W = waiterId();
      const holderToken = await heldWithLine('holder', W);

      const reply = await release('holder');
      expect(reply).toEqual([1, W, '', expect.stringMatching(/^\d+$/)]);
      const token = (reply as [number, string, string, string])[3];
      expect(Number(token)).toBeGreaterThan(holderToken);
      expect(await holdsOf(redis, k.key)).toEqual({ [`${W}:${token}`]: '0' });
      const pttl = await redis.pttl(k.key);
      expect(pttl).toBeGreaterThan(0);
      expect(pttl).toBeLessThanOrEqual(GRANT_MS);
      expect(await line()).toEqual({ order: [], deadlines: [] }); // the head left the line
      expect(await redis.exists(k.line, k.deadlines)).toBe(0);
      expect(await redis.get(k.fence)).toBe(token);

      // W's next attempt finds the grant not yet taken up: it takes it up under its own owner id.
      expect(await acquire('owner2', 5_000, W)).toEqual([1, Number(token)]);
      expect(await holdsOf(redis, k.key)).toEqual({ owner2: '1' });
      expect(await redis.pttl(k.key)).toBeGreaterThan(4_500);
      expect(await redis.get(k.fence)).toBe(token); // no new token was issued

      // The grant's own owner id has gone: its renewal is refused, and a leave by W changes nothing.
      expect(await renew(`${W}:${token}`, 5_000)).toEqual([0]);
      expect(await leave(W)).toBe(0);
      expect(await holdsOf(redis, k.key)).toEqual({ owner2: '1' });
      expect(await redis.pttl(k.key)).toBeGreaterThan(4_000);
      expect(await line()).toEqual({ order: [], deadlines: [] });
    });

    it('a renewal by the grant owner takes the grant up (value 1, its own lease); a later attempt of the head does not take it again', async () => {
      const W = waiterId();
      await heldWithLine('holder', W);
      const [, , , token] = (await release('holder')) as [number, string, string, string];
      const grantOwner = `${W}:${token}`;
      expect(await holdsOf(redis, k.key)).toEqual({ [grantOwner]: '0' });

      expect(await renew(grantOwner, 5_000)).toEqual([1]);
      expect(await holdsOf(redis, k.key)).toEqual({ [grantOwner]: '1' });
      expect(await redis.pttl(k.key)).toBeGreaterThan(4_000);

      const [taken, pttl] = await acquire('ownerX', 5_000, W);
      expect(taken).toBe(0);
      expect(pttl).toBeGreaterThan(4_000);
      expect(await holdsOf(redis, k.key)).toEqual({ [grantOwner]: '1' });
      expect(await redis.get(k.fence)).toBe(token);
    });

    it('a leave by the head drops its unclaimed grant and grants the lock to the next in line, announcing it', async () => {
      const W = waiterId();
      const V = waiterId();
      await heldWithLine('holder', W, V);
      const channel = await listen();
      try {
        const granted = (await release('holder')) as [number, string, string, string];
        expect(granted).toEqual([1, W, V, expect.stringMatching(/^\d+$/)]);
        const token = granted[3];
        expect(await line()).toEqual({ order: [V], deadlines: [V] });

        expect(await leave(W)).toBe(1);
        const fields = await holdsOf(redis, k.key);
        const [field] = Object.keys(fields);
        expect(Object.keys(fields)).toHaveLength(1);
        expect(field).toMatch(new RegExp(`^${V}:\\d+$`));
        const token2 = field.slice(V.length + 1);
        expect(fields[field]).toBe('0');
        expect(Number(token2)).toBeGreaterThan(Number(token));
        expect(await redis.pttl(k.key)).toBeLessThanOrEqual(GRANT_MS);
        expect(await redis.get(k.fence)).toBe(token2);
        expect(await line()).toEqual({ order: [], deadlines: [] });

        expect(await eventually(() => channel.messages.length === 2, 1_000)).toBe(true);
        expect(channel.messages).toEqual([`${NOTICE}:${W}:${V}:${token}`, `${NOTICE}:${V}::${token2}`]);
      } finally {
        channel.stop();
      }
    });

    it('a grant to a dead head lapses after GRANT_MS; a non-waiting acquire then grants the lock to the new head and answers -3', async () => {
      const D = waiterId(); // dies without ever taking up its grant
      const V = waiterId();
      await heldWithLine('holder', D, V);
      const [, , , token] = (await release('holder')) as [number, string, string, string];
      const grantedAt = performance.now();
      expect(await holdsOf(redis, k.key)).toEqual({ [`${D}:${token}`]: '0' });

      const lapsed = await waitFor(
        async () => (await redis.exists(k.key)) === 0 && performance.now(),
        2_000,
        'the grant to lapse',
        5,
      );
      expect(lapsed - grantedAt).toBeGreaterThan(GRANT_MS - 60);
      expect(lapsed - grantedAt).toBeLessThan(GRANT_MS + 300);
      expect(await line()).toEqual({ order: [V], deadlines: [V] });

      const channel = await listen();
      try {
        // A caller that does not wait (waiter '') may not jump the line: the lock goes to V.
        const refused = await acquire('newcomer', 5_000, '');
        const token2 = await redis.get(k.fence);
        expect(refused).toEqual([0, -3, GRANT_MS]); // the new head has the grant's 250 ms to take it up
        expect(Number(token2)).toBeGreaterThan(Number(token));
        expect(await holdsOf(redis, k.key)).toEqual({ [`${V}:${token2}`]: '0' });
        const pttl = await redis.pttl(k.key);
        expect(pttl).toBeGreaterThan(0);
        expect(pttl).toBeLessThanOrEqual(GRANT_MS);
        expect(await line()).toEqual({ order: [], deadlines: [] }); // the newcomer took no place
        expect(await eventually(() => channel.messages.length === 1, 1_000)).toBe(true);
        expect(channel.messages).toEqual([`${NOTICE}:${V}::${token2}`]);
      } finally {
        channel.stop();
      }
    });

    describe('shared holds: the head of the line is named, never granted', () => {
      /** {1, token}, {0, ms}, or {0, -3, ms until the head's place lapses}; `permits` 0: a reader. */
      const acquireShared = (owner: string, waiter: string, permits: number): Promise<number[]> =>
        ACQUIRE_SHARED_SCRIPT.run(redis, k.all, [owner, 10_000, waiter, PLACE_MS, 0, NOTICE, permits]) as Promise<
          number[]
        >;
      /** A waiting line whose process began with a shared waiter (see WaitLine.newSeat). */
      const sharedWaiterId = (): string => `s${waiterId()}`;

      it('a permit freed while others hold names the head and the second; the head leaving names the next; nobody else is told', async () => {
        const [A, B, C] = [sharedWaiterId(), sharedWaiterId(), sharedWaiterId()];
        expect((await acquireShared('sp1', '', 2))[0]).toBe(1);
        expect((await acquireShared('sp2', '', 2))[0]).toBe(1);
        for (const waiter of [A, B, C]) expect((await acquireShared(`s-attempt-of-${waiter}`, waiter, 2))[0]).toBe(0);
        expect((await line()).order).toEqual([A, B, C]);
        const channel = await listen();
        try {
          expect(await release('sp1')).toEqual([1, A, B, '']);
          expect(Object.keys(await holdsOf(redis, k.key))).toEqual(['sp2']); // nothing granted
          expect((await line()).order).toEqual([A, B, C]); // the head takes its permit itself
          // C gives up: it headed nothing, nobody needs to hear of it.
          expect(await leave(C)).toBe(0);
          // A gives up before it took the permit it was told of: B heads the line now, and is told.
          expect(await leave(A)).toBe(0);
          expect(await eventually(() => channel.messages.length === 2, 1_000)).toBe(true);
          expect(channel.messages).toEqual([`${NOTICE}:${A}:${B}:`, `${NOTICE}:${B}::`]);
          // B takes the free permit; the semaphore is full again: nothing more is announced.
          expect((await acquireShared(`s-attempt-of-${B}`, B, 2))[0]).toBe(1);
          expect(await line()).toEqual({ order: [], deadlines: [] });
          await sleep(50);
          expect(channel.messages).toHaveLength(2);
        } finally {
          channel.stop();
        }
      });

      it('a permit handed over to the head of the line while another is free names the next in line', async () => {
        const [A, B] = [sharedWaiterId(), sharedWaiterId()];
        expect((await acquireShared('sp1', '', 3))[0]).toBe(1);
        expect((await acquireShared('sp2', '', 3))[0]).toBe(1);
        expect((await acquireShared('sp3', '', 3))[0]).toBe(1);
        for (const waiter of [A, B]) expect((await acquireShared(`s-attempt-of-${waiter}`, waiter, 3))[0]).toBe(0);
        // sp3 is released: A, at the head, is named to look.
        expect(await release('sp3')).toEqual([1, A, B, '']);
        const channel = await listen();
        try {
          // Before A looks, sp1 (of A's process) finishes and hands its permit to A: A's place leaves
          // the line, and with sp3's permit still free, B is named at once.
          const handed = (await ACQUIRE_SHARED_SCRIPT.run(redis, k.all, [
            's-taken-by-A',
            10_000,
            A,
            PLACE_MS,
            0,
            NOTICE,
            3,
            '',
            GRANT_MS,
            'sp1',
          ])) as number[];
          expect([handed[0], handed[2]]).toEqual([1, 1]);
          expect(Object.keys(await holdsOf(redis, k.key)).sort()).toEqual(['s-taken-by-A', 'sp2'].sort());
          expect((await line()).order).toEqual([B]);
          expect(await eventually(() => channel.messages.length === 1, 1_000)).toBe(true);
          expect(channel.messages).toEqual([`${NOTICE}:${B}::`]);
          expect((await acquireShared(`s-attempt-of-${B}`, B, 3))[0]).toBe(1);
        } finally {
          channel.stop();
        }
      });

      it('a writer’s release with a reader at the head deletes the key and names the reader: no grant, no token', async () => {
        const [R1, R2] = [sharedWaiterId(), sharedWaiterId()];
        expect((await acquire('writer', 10_000, ''))[0]).toBe(1);
        for (const waiter of [R1, R2]) expect((await acquireShared(`s-attempt-of-${waiter}`, waiter, 0))[0]).toBe(0);
        const channel = await listen();
        try {
          expect(await release('writer')).toEqual([1, R1, R2, '']);
          expect(await redis.exists(k.key)).toBe(0);
          expect(await eventually(() => channel.messages.length === 1, 1_000)).toBe(true);
          expect(channel.messages).toEqual([`${NOTICE}:${R1}:${R2}:`]);
          // The head takes its read turn, and names the next reader, who may join it.
          expect((await acquireShared(`s-attempt-of-${R1}`, R1, 0))[0]).toBe(1);
          expect(await eventually(() => channel.messages.length === 2, 1_000)).toBe(true);
          expect(channel.messages[1]).toBe(`${NOTICE}:${R2}::`);
          expect((await acquireShared(`s-attempt-of-${R2}`, R2, 0))[0]).toBe(1);
          expect(Object.keys(await holdsOf(redis, k.key)).sort()).toEqual(
            [`s-attempt-of-${R1}`, `s-attempt-of-${R2}`].sort(),
          );
        } finally {
          channel.stop();
        }
      });
    });
  });

  describe('through LockService', () => {
    /** Every acquire attempt of every store in this process, as it went. */
    interface Attempt {
      readonly key: string;
      readonly waiter: string | undefined;
      settledAt: number;
      result: AcquireResult | undefined;
    }
    /** Every renewal call of every store in this process, as it went. */
    interface Renewal {
      readonly requests: readonly RenewRequest[];
      settledAt: number;
      outcomes: RenewOutcome[] | undefined;
    }
    const attempts: Attempt[] = [];
    const renewals: Renewal[] = [];
    const originalAcquire = RedisLockStore.prototype.acquire;
    const originalRenew = RedisLockStore.prototype.renew;
    /** Extra ms a renewal call takes before it is sent (a slow link), by its requests; none unless a test says so. */
    let renewDelay: (requests: readonly RenewRequest[]) => number = () => 0;

    const PREFIX = 'grant:';
    let a: TestApp;
    let b: TestApp;
    let seq = 0;
    const fresh = (label: string): string => `${label}-${(seq += 1)}`;

    /** The attempts on `key` that found the lock busy, after the first `from` attempts recorded. */
    const misses = (from: number, key: string): Attempt[] =>
      attempts.slice(from).filter((attempt) => attempt.key === key && attempt.result?.acquired === false);

    /**
     * The first waiter on `key` since `from` has failed twice (tried, subscribed, tried again) and
     * sleeps now: when its second miss came back.
     */
    const asleep = async (from: number, key: string): Promise<number> =>
      waitFor(
        async () => {
          const [first, ...later] = misses(from, key);
          return later.find((miss) => miss.waiter === first?.waiter)?.settledAt;
        },
        3_000,
        `two misses on ${key}`,
        2,
      );

    /** Redis holds `key` for `owner` alone, taken up. */
    const takenUp = (key: string, owner: string): Promise<boolean> =>
      eventually(async () => JSON.stringify(await holdsOf(redis, key)) === JSON.stringify({ [owner]: '1' }), 1_000, 5);

    beforeAll(async () => {
      vi.spyOn(RedisLockStore.prototype, 'acquire').mockImplementation(async function (
        this: RedisLockStore,
        key: string,
        owner: string,
        leaseMs: number,
        options?: AcquireOptions,
      ) {
        const attempt: Attempt = { key, waiter: options?.waiter, settledAt: Infinity, result: undefined };
        attempts.push(attempt);
        try {
          attempt.result = await originalAcquire.call(this, key, owner, leaseMs, options);
          return attempt.result;
        } finally {
          attempt.settledAt = performance.now();
        }
      });
      vi.spyOn(RedisLockStore.prototype, 'renew').mockImplementation(async function (
        this: RedisLockStore,
        requests: readonly RenewRequest[],
      ) {
        const renewal: Renewal = { requests, settledAt: Infinity, outcomes: undefined };
        renewals.push(renewal);
        try {
          const delay = renewDelay(requests);
          if (delay > 0) await sleep(delay);
          renewal.outcomes = await originalRenew.call(this, requests);
          return renewal.outcomes;
        } finally {
          renewal.settledAt = performance.now();
        }
      });
      a = await createTestApp([], { redis: server.url, keyPrefix: PREFIX });
      b = await createTestApp([], { redis: server.url, keyPrefix: PREFIX });
    });

    afterEach(() => {
      renewDelay = () => 0;
    });

    afterAll(async () => {
      await a?.close();
      await b?.close();
      vi.mocked(RedisLockStore.prototype.acquire).mockRestore();
      vi.mocked(RedisLockStore.prototype.renew).mockRestore();
    });

    /** The attempts on `key` since the first `from` recorded that took the lock. */
    const takes = (from: number, key: string): Attempt[] =>
      attempts.slice(from).filter((attempt) => attempt.key === key && attempt.result?.acquired === true);

    it('a waiter with a fixed expire is handed the lock by the release: its one attempt takes the grant up with its token and its own lease', async () => {
      const name = fresh('fixed');
      const key = PREFIX + name;
      const holder = await b.locks.lock(name, LONG);
      const from = attempts.length;
      const waiting = a.locks.lock(name, { waitTime: 5_000, expire: 800 });
      await asleep(from, key);

      const renewalsBefore = renewals.length;
      await holder.release();
      const granted = Number(await redis.get(fenceKeyFor(PREFIX, key))); // the grant's token, issued by the release
      const handle = await waiting;
      const handedAt = performance.now();
      expect(handle.fencingToken).toBeGreaterThan(holder.fencingToken);
      expect(handle.fencingToken).toBe(granted);
      // The hold started on the answer of one attempt (the line's, after the release), not on the
      // announcement alone: no renewal was needed, and nobody was handed the lock before that answer.
      const taken = takes(from, key);
      expect(taken).toHaveLength(1);
      expect(taken[0].waiter).toBe(misses(from, key)[0].waiter);
      expect(taken[0].settledAt).toBeLessThanOrEqual(handedAt);
      expect(misses(from, key)).toHaveLength(2); // tried, subscribed, tried again: then the grant
      expect(renewals.slice(renewalsBefore).some((call) => call.requests.some((r) => r.owner === handle.owner))).toBe(
        false,
      );
      expect(await takenUp(key, handle.owner)).toBe(true);
      const pttl = await redis.pttl(key);
      expect(pttl).toBeGreaterThan(600);
      expect(pttl).toBeLessThanOrEqual(800);

      expect(await handle.release()).toBe(true);
      expect(await redis.exists(key)).toBe(0);
    });

    it('a watchdog waiter is handed the lock by the release: taken up with lockWatchdogTimeout, then renewed', async () => {
      const name = fresh('watchdog');
      const key = PREFIX + name;
      const holder = await b.locks.lock(name, LONG);
      const from = attempts.length;
      const waiting = a.locks.lock(name, { waitTime: 5_000, lockWatchdogTimeout: 3_000 });
      await asleep(from, key);

      await holder.release();
      const handle = await waiting;
      expect(handle.fencingToken).toBeGreaterThan(holder.fencingToken);
      expect(takes(from, key)).toHaveLength(1);
      expect(await takenUp(key, handle.owner)).toBe(true);
      expect(await redis.pttl(key)).toBeGreaterThan(2_500);

      // Renewed every second: 1.5 s later (midway between the renewals at 1 s and 2 s, not just
      // after the first) the lease is back near 2.5 s; left alone, it would be < 1.5 s.
      await sleep(1_500);
      expect(await holdsOf(redis, key)).toEqual({ [handle.owner]: '1' });
      expect(await redis.pttl(key)).toBeGreaterThan(2_000);
      expect(handle.signal.aborted).toBe(false);
      const renewed = renewals.filter((call) => call.requests.some((request) => request.owner === handle.owner));
      expect(renewed.length).toBeGreaterThanOrEqual(1);
      expect(renewed.every((call) => call.outcomes?.every((outcome) => outcome === true))).toBe(true);

      expect(await handle.release()).toBe(true);
      expect(await redis.exists(key)).toBe(0);
    });

    it('a grant made long after the waiter’s last miss is taken up as promptly as any other', async () => {
      const name = fresh('late');
      const key = PREFIX + name;
      const holder = await b.locks.lock(name, LONG);
      const from = attempts.length;
      const waiting = a.locks.lock(name, { waitTime: 5_000, lockWatchdogTimeout: 5_000 });
      const lastMiss = await asleep(from, key);
      await sleep(Math.max(0, lastMiss + 400 - performance.now())); // held 400 ms past the waiter's last miss

      const releasedAt = performance.now();
      await holder.release();
      const handle = await waiting;
      const handedAt = performance.now();
      expect(handedAt - releasedAt).toBeLessThan(WAKE_MS);
      expect(handle.fencingToken).toBeGreaterThan(holder.fencingToken);
      expect(misses(from, key)).toHaveLength(2);
      expect(takes(from, key)).toHaveLength(1);
      expect(await holdsOf(redis, key)).toEqual({ [handle.owner]: '1' });
      expect(await redis.pttl(key)).toBeGreaterThan(4_500);

      expect(await handle.release()).toBe(true);
      expect(await redis.exists(key)).toBe(0);
    });

    it('mutual exclusion under churn: 3 applications x 3 loops, 1-3 ms holds, tokens in order, nothing left behind', async () => {
      const c = await createTestApp([], { redis: server.url, keyPrefix: PREFIX });
      try {
        const name = fresh('churn');
        const { key, line, deadlines } = lockKeys(PREFIX, name);
        const stopAt = performance.now() + 1_500;
        let inside = 0;
        let overlaps = 0;
        const tokens: number[] = [];
        const problems: string[] = [];
        const loop = async (app: TestApp): Promise<number> => {
          let rounds = 0;
          while (performance.now() < stopAt) {
            const handle = await app.locks.lock(name, { waitTime: 10_000, lockWatchdogTimeout: 2_000 });
            inside += 1;
            if (inside > 1) overlaps += 1;
            tokens.push(handle.fencingToken);
            await sleep(1 + Math.floor(Math.random() * 3));
            if (handle.signal.aborted) problems.push(`lost while held: ${String(handle.signal.reason)}`);
            inside -= 1;
            if (!(await handle.release())) problems.push(`release of ${handle.owner} did not free the lock`);
            rounds += 1;
          }
          return rounds;
        };
        const rounds = await Promise.all([a, b, c].flatMap((app) => [loop(app), loop(app), loop(app)]));

        expect(overlaps).toBe(0);
        expect(problems).toEqual([]);
        for (let i = 1; i < tokens.length; i += 1) {
          if (tokens[i] <= tokens[i - 1])
            throw new Error(`token ${i} (${tokens[i]}) <= token ${i - 1} (${tokens[i - 1]})`);
        }
        const total = rounds.reduce((sum, n) => sum + n, 0);
        expect(total).toBeGreaterThanOrEqual(50); // ~460 on an idle 2-core machine
        expect(rounds.every((n) => n >= 1)).toBe(true);
        expect(await eventually(async () => (await redis.exists(key, line, deadlines)) === 0, 1_000)).toBe(true);
      } finally {
        await c.close();
      }
    });

    it('a grant that the line’s own attempt took up is not handed out again to the next local waiter', async () => {
      // W's line in a has two waiters. The holder's lease is short, so W's first waiter sleeps only
      // until it ends. a's event loop stalls right after the holder's release was sent: Redis grants
      // the lock to W meanwhile; when the loop runs again, W's timer fires before the announcement
      // is read, and W's attempt takes the grant up itself (same token, its own owner id). The
      // announcement of that grant, read next, is stale: the second waiter must not hold the lock
      // with it while the first one does.
      const name = fresh('taken-up');
      const keys = lockKeys(PREFIX, name);
      const run = (script: typeof ACQUIRE_SCRIPT, args: (string | number)[]): Promise<unknown> =>
        script.run(redis, keys.all, args);
      expect(await run(ACQUIRE_SCRIPT, ['bare-holder', 150, '', PLACE_MS, 0, 'bare:1', GRANT_MS])).toEqual([
        1,
        expect.any(Number),
      ]);
      const from = attempts.length;
      const options = { waitTime: 5_000, lockWatchdogTimeout: 5_000 } as const;
      const first = a.locks.lock(name, options);
      const lastMiss = await asleep(from, keys.key);
      const ttl = (misses(from, keys.key)[1].result as { ttl: number }).ttl;
      const second = settle(a.locks.lock(name, options)); // behind the first in a's local line: no attempt
      expect(ttl).toBeGreaterThan(30); // time enough to release before the lease ends

      await redis.ping(); // from here on this runs in the poll phase: timers come before the next poll
      const releasing = run(RELEASE_SCRIPT, ['bare-holder', 'bare:2', 0, GRANT_MS]);
      stallUntil(lastMiss + ttl + 10); // past the first waiter's timer; the grant lives on
      const [released, W, , granted] = (await releasing) as [number, string, string, string];
      expect(released).toBe(1);
      const h1 = await first;
      // The race did happen: the first waiter's attempt (its timer) took the grant up, with its token.
      expect(h1.fencingToken).toBe(Number(granted));
      expect(W).toMatch(/^[0-9a-f]{24}$/);

      const early = await Promise.race([second, sleep(150).then(() => 'still waiting' as const)]);
      expect(early).toBe('still waiting');
      expect(await holdsOf(redis, keys.key)).toEqual({ [h1.owner]: '1' });
      expect(h1.signal.aborted).toBe(false);

      expect(await h1.release()).toBe(true);
      const outcome = await second;
      expect(outcome.ok).toBe(true);
      const h2 = (outcome as { value: LockHandle }).value;
      expect(h2.fencingToken).toBeGreaterThan(h1.fencingToken);
      expect(await takenUp(keys.key, h2.owner)).toBe(true);
      expect(await h2.release()).toBe(true);
    });

    it('a grant heard only after a miss that its own lapse caused wakes an attempt, which finds the lock granted to the next in line', async () => {
      // W (in a) heads the line, V (a bare waiter id) is second. a's event loop stalls (a GC pause,
      // a CPU-bound request) right after b's release was sent: during the stall Redis grants the
      // lock to W and the grant lapses. When the loop runs again, W's wait timer (due during the
      // stall) fires before the announcement is read: W's attempt finds the lock free with V in
      // line, grants it to V and misses. Then the announcement of the old grant to W is read: it
      // only wakes W to look (nothing is held on an announcement), and W gets the lock once V's
      // grant has lapsed, on an answer of its own.
      const name = fresh('stall');
      const keys = lockKeys(PREFIX, name);
      const holder = await b.locks.lock(name, LONG);
      const from = attempts.length;
      const waiting = settle(a.locks.lock(name, { waitTime: 5_000, lockWatchdogTimeout: 5_000 }));
      const lastMiss = await asleep(from, keys.key); // W sleeps now until lastMiss + lineRefreshMs (1 s)
      const V = waiterId();
      const [busy] = (await ACQUIRE_SCRIPT.run(redis, keys.all, [
        'v-attempt',
        60_000,
        V,
        PLACE_MS,
        0,
        'bare:1',
        GRANT_MS,
      ])) as number[];
      expect(busy).toBe(0);
      const [W] = await redis.zrange(keys.line, '0', '0');
      expect(await redis.zrange(keys.line, '0', '-1')).toEqual([W, V]);

      await sleep(Math.max(0, lastMiss + 650 - performance.now()));
      await redis.ping(); // from here on this runs in the poll phase: timers come before the next poll
      const releasedAt = performance.now();
      const releasing = holder.release(); // sent now; its grant to W lives GRANT_MS
      stallUntil(Math.max(performance.now() + GRANT_MS + 100, lastMiss + 1_040));
      expect(await releasing).toBe(true);

      const outcome = await waiting;
      const handedAt = performance.now();
      expect(outcome.ok).toBe(true);
      const handle = (outcome as { value: LockHandle }).value;
      const inRedis = await holdsOf(redis, keys.key);
      const lastToken = Number(await redis.get(keys.fence));
      await sleep(100);
      const lostSoon = handle.signal.aborted;
      const released = await handle.release();

      // What a holder must see: Redis holds the lock for it, its token is the latest issued, and
      // it keeps the lock until it releases it.
      expect({ inRedis, lastToken, lostSoon, released }).toEqual({
        inRedis: { [handle.owner]: '1' },
        lastToken: handle.fencingToken,
        lostSoon: false,
        released: true,
      });
      // And the race did happen: W missed after the release (the lock free, V in line: -3), and the
      // hold came from a later attempt of W's, answered before the handle was given out.
      const after = misses(from, keys.key).filter((attempt) => attempt.settledAt > releasedAt);
      expect(after.length).toBeGreaterThanOrEqual(1);
      expect(after[0].result).toMatchObject({ acquired: false, ttl: -3 });
      const taken = takes(from, keys.key);
      expect(taken).toHaveLength(1);
      expect(taken[0].waiter).toBe(W);
      expect(taken[0].settledAt).toBeLessThanOrEqual(handedAt);
    });
  });
});
