/**
 * Mutual exclusion when the network between the library and Redis misbehaves one command at a
 * time: a reply lost after Redis ran the command (and the client re-sending it), a reply later than
 * the lease, a subscriber connection dropped, a release whose answer comes after its timeout.
 *
 * Every app under test talks to a private `redis-server` through a FaultProxy
 * (test/support/fault-proxy.ts); the "other owner" app and the assertions talk to it directly.
 * Each test reproduces one finding of a review that broke the library this way, and failed on the
 * code before its fix.
 */
import type { MockInstance } from 'vitest';
import { Injectable, Logger } from '@nestjs/common';
import type { Redis } from 'ioredis';
import {
  DisLock,
  type DisLockModuleOptions,
  type LockHandle,
  type LockLostEvent,
  LockNotAcquiredError,
  LockService,
  RedisUnavailableError,
} from 'nestjs-dislock';
import { ACQUIRE_SCRIPT } from '../lib/store/redis/scripts/acquire.script';
import { RELEASE_SCRIPT } from '../lib/store/redis/scripts/release.script';
import { createTestApp, type TestApp } from './support/app';
import { settle } from './support/async';
import { type CommandMatcher, FaultProxy, isCommand, isScript } from './support/fault-proxy';
import { RedisServer } from './support/redis-server';
import { eventually, sleep, uniquePrefix } from './support/shared-redis';
import { holdsOf } from './support/lock-hash';

/** Any script call on `key`: the re-entry's command, whatever the script is called. */
const scriptOn =
  (key: string): CommandMatcher =>
  (argv) =>
    (argv[0]?.toLowerCase() === 'evalsha' || argv[0]?.toLowerCase() === 'eval') && argv.includes(key);

/**
 * Polls `tryLock(name)` from another owner every few ms while `during` runs, and records every
 * time it got the lock while `holder`'s signal had not aborted: each is a second holder.
 */
async function watchForSecondHolder(
  other: TestApp,
  name: string,
  holder: () => LockHandle | undefined,
  during: Promise<unknown>,
): Promise<string[]> {
  const overlaps: string[] = [];
  let done = false;
  void during.finally(() => (done = true));
  while (!done) {
    const got = await other.locks.tryLock(name).catch(() => null);
    if (got) {
      const held = holder();
      if (held && !held.signal.aborted && !done) {
        overlaps.push(`another owner took "${name}" while its holder had not been told it lost it`);
      }
      await got.release();
    }
    await sleep(10);
  }
  return overlaps;
}

/** Polls `tryLock(name)` from another owner every few ms for `ms`: whether it ever got the lock. */
async function everTaken(other: TestApp, name: string, ms: number): Promise<boolean> {
  const until = performance.now() + ms;
  let taken = false;
  while (performance.now() < until) {
    const got = await other.locks.tryLock(name).catch(() => null);
    if (got) {
      taken = true;
      await got.release();
    }
    await sleep(10);
  }
  return taken;
}

/** Resolves once some connection through the proxy has sent SUBSCRIBE: a waiter is listening. */
async function someoneSubscribed(proxy: FaultProxy): Promise<void> {
  expect(await eventually(() => proxy.log.some((c) => isCommand('subscribe')(c.argv)), 2_000)).toBe(true);
  await sleep(50); // its "one more try" after subscribing has been answered: it is asleep on the channel
}

@Injectable()
class Detached {
  nested: Promise<boolean> | undefined;
  inner: LockHandle | undefined;

  constructor(private readonly locks: LockService) {}

  /** Ends at once, leaving the key to expire, while a reentrant hold it started still runs. */
  @DisLock({ key: 'detached:{0}', lockWatchdogTimeout: 300, ifExpireWhenFinish: false })
  async start(_id: string, workMs: number): Promise<void> {
    this.nested = this.locks.withLock(`detached:${_id}`, async (inner) => {
      this.inner = inner;
      await sleep(workMs);
      this.inner = undefined;
      return inner.signal.aborted;
    });
  }
}

describe('network faults between the library and Redis', () => {
  vi.spyOn(Logger.prototype, 'warn').mockImplementation(() => undefined);
  vi.spyOn(Logger.prototype, 'error').mockImplementation(() => undefined);

  let server: RedisServer;
  let redis: Redis;
  let proxy: FaultProxy;
  const apps: TestApp[] = [];

  beforeAll(async () => {
    server = await RedisServer.start();
    redis = server.client();
  });

  afterAll(async () => {
    redis.disconnect();
    await server.dispose();
  });

  beforeEach(async () => {
    proxy = await FaultProxy.start(server.port);
  });

  afterEach(async () => {
    await proxy.close(); // first: an app closing behind a stalled connection would wait for it
    await Promise.all(apps.splice(0).map((app) => app.close()));
  });

  /** The app under test, behind the proxy, and the other owner, straight to Redis; one key prefix. */
  async function apps2(options: Partial<DisLockModuleOptions> = {}): Promise<{ t: TestApp; other: TestApp }> {
    const keyPrefix = uniquePrefix('net');
    const t = await createTestApp([Detached], {
      redis: { host: '127.0.0.1', port: proxy.port },
      operationTimeout: 1_000,
      ...options,
      keyPrefix,
    });
    apps.push(t);
    const other = await createTestApp([], { redis: server.url, keyPrefix });
    apps.push(other);
    // Load every script first: a dropped EVALSHA that Redis answered NOSCRIPT had no effect to repeat.
    await t.locks.withLock('warm-up', async () => {
      const inner = await t.locks.lock('warm-up');
      await inner.release();
    });
    proxy.clearLog();
    return { t, other };
  }

  describe('1. a command whose reply is lost and that the client re-sends has its effect once', () => {
    it('a nested release never frees the lock under the outer holder, and the final release reports released', async () => {
      const { t, other } = await apps2();
      const lost = vi.fn();
      const dropped = proxy.dropReply(isScript(RELEASE_SCRIPT)); // the first release script sent, if any
      let outerHandle: LockHandle | undefined;
      let finalRelease: MockInstance<() => Promise<boolean>> | undefined;
      await t.locks.withLock(
        'nested-release',
        async (outer) => {
          outerHandle = outer;
          finalRelease = vi.spyOn(outer, 'release'); // withLock ends with this handle's release()
          const inner = await t.locks.lock('nested-release');
          expect(await inner.release()).toBe(false);
          // The rest of the critical section: a re-sent copy of the nested release, if one was
          // sent, has long run by now; the other owner must not get in at any point.
          expect(await everTaken(other, 'nested-release', 150)).toBe(false);
          expect(await holdsOf(redis, outer.key)).toEqual({ [outer.owner]: '1' });
          expect(outer.signal.aborted).toBe(false);
        },
        { onLockLost: lost },
      );
      await dropped; // the outer's release: Redis ran it, the client heard nothing and sent it again
      expect(finalRelease?.mock.calls).toHaveLength(1);
      await expect(finalRelease?.mock.results[0]?.value).resolves.toBe(true);
      expect(outerHandle?.signal.aborted).toBe(false);
      expect(lost).not.toHaveBeenCalled();
      expect(await redis.exists(`${t.prefix}nested-release`)).toBe(0);
    });

    it('a release whose reply is lost resolves true, with no loss reported', async () => {
      const { t } = await apps2();
      const lost = vi.fn();
      const h = await t.locks.lock('lost-release-reply', { onLockLost: lost });
      const dropped = proxy.dropReply(isScript(RELEASE_SCRIPT));
      expect(await h.release()).toBe(true);
      await dropped;
      expect(h.signal.aborted).toBe(false);
      expect(lost).not.toHaveBeenCalled();
      expect(await redis.exists(h.key)).toBe(0);
    });

    it('a re-sent fresh acquire answers acquired, not busy, and leaves one hold', async () => {
      const { t } = await apps2();
      const fenceBefore = await t.locks.lock('fresh-acquire-before');
      await fenceBefore.release();
      const dropped = proxy.dropReply(isScript(ACQUIRE_SCRIPT));
      const h = await t.locks.tryLock('fresh-acquire');
      await dropped;
      expect(h).not.toBeNull();
      const handle = h as LockHandle;
      expect(await holdsOf(redis, handle.key)).toEqual({ [handle.owner]: '1' });
      expect(handle.fencingToken).toBeGreaterThan(fenceBefore.fencingToken);
      expect(await handle.release()).toBe(true);
      expect(await redis.exists(handle.key)).toBe(0);
    });

    it('without re-sending (autoResendUnfulfilledCommands: false) an acquire of unknown outcome leaves no orphan hold', async () => {
      const { t } = await apps2({
        redis: { host: '127.0.0.1', port: proxy.port, autoResendUnfulfilledCommands: false },
        operationTimeout: 300,
      });
      const key = `${t.prefix}no-resend`;
      const dropped = proxy.dropReply(isScript(ACQUIRE_SCRIPT));
      const result = await settle(t.locks.tryLock('no-resend'));
      await dropped;
      expect(result.ok).toBe(false);
      expect((result as { error: unknown }).error).toBeInstanceOf(RedisUnavailableError);
      // Redis ran it, so the key was there; the give-back removes it within a round trip or two
      // of the reconnect, not at the end of the 30 s lease.
      expect(await eventually(async () => (await redis.exists(key)) === 0, 2_000)).toBe(true);
      const again = await t.locks.tryLock('no-resend');
      expect(again).not.toBeNull();
      await again?.release();
    });

    it('an acquire whose reply is stalled past its timeout is given back at once, not when (if ever) the reply comes', async () => {
      const { t } = await apps2({ operationTimeout: 300 });
      const key = `${t.prefix}stalled-acquire`;
      const dropped = proxy.dropReply(isScript(ACQUIRE_SCRIPT), { then: 'stall' });
      const result = await settle(t.locks.tryLock('stalled-acquire'));
      await dropped;
      expect((result as { error: unknown }).error).toBeInstanceOf(RedisUnavailableError);
      expect(await redis.exists(key)).toBeGreaterThanOrEqual(0);
      expect(await eventually(async () => (await redis.exists(key)) === 0, 500)).toBe(true);
    });

    it('a re-entry whose reply is lost does not count the hold twice: the key goes with the last release', async () => {
      const { t } = await apps2();
      const key = `${t.prefix}reentry`;
      await t.locks.withLock('reentry', async (outer) => {
        const dropped = proxy.dropReply(scriptOn(key));
        const inner = await t.locks.lock('reentry');
        await dropped;
        expect(inner.owner).toBe(outer.owner);
        expect(await holdsOf(redis, key)).toEqual({ [outer.owner]: '1' });
        expect(await inner.release()).toBe(false);
      });
      expect(await redis.exists(key)).toBe(0);
    });
  });

  describe('2. a lease is timed from the moment the acquire was sent', () => {
    it('an acquire answered after its lease is never handed out (tryLock null, lock LockNotAcquiredError)', async () => {
      const { t } = await apps2({ operationTimeout: 2_000 });
      const slow = proxy.delayReply(isScript(ACQUIRE_SCRIPT), 300);
      expect(await t.locks.tryLock('late-reply', { expire: 150 })).toBeNull();
      await slow;
      const slowAgain = proxy.delayReply(isScript(ACQUIRE_SCRIPT), 300);
      const locked = await settle(t.locks.lock('late-reply-2', { expire: 150 }));
      await slowAgain;
      expect((locked as { error: unknown }).error).toBeInstanceOf(LockNotAcquiredError);
      expect(await redis.exists(`${t.prefix}late-reply`)).toBe(0);
      expect(await redis.exists(`${t.prefix}late-reply-2`)).toBe(0);
    });

    it('a renewed lock whose acquire reply was slow is renewed before its first lease ends', async () => {
      const { t, other } = await apps2({ operationTimeout: 2_000 });
      const slow = proxy.delayReply(isScript(ACQUIRE_SCRIPT), 220);
      const h = await t.locks.lock('slow-renewed', { lockWatchdogTimeout: 300 });
      await slow;
      const overlaps = await watchForSecondHolder(other, 'slow-renewed', () => h, sleep(500));
      expect(overlaps).toEqual([]);
      expect(h.signal.aborted).toBe(false);
      expect(await holdsOf(redis, h.key)).toEqual({ [h.owner]: '1' });
      expect(await h.release()).toBe(true);
    });

    it('a fixed lease with a slow acquire reply is declared lost before another owner can take it (a guard: this held before too)', async () => {
      const { t, other } = await apps2({ operationTimeout: 2_000 });
      const slow = proxy.delayReply(isScript(ACQUIRE_SCRIPT), 175); // 70 % of the lease
      const h = await t.locks.lock('slow-fixed', { expire: 250 });
      await slow;
      const overlaps = await watchForSecondHolder(other, 'slow-fixed', () => h, sleep(350));
      expect(overlaps).toEqual([]);
      expect(h.signal.aborted).toBe(true);
    });
  });

  describe('3. and 5. a nested hold always runs under a lease Redis has', () => {
    it('a fire-and-forget re-entry in flight while the outer releases keeps the lock renewed for itself', async () => {
      const { t, other } = await apps2({ operationTimeout: 2_000 });
      const key = `${t.prefix}in-flight`;
      let inner: LockHandle | undefined;
      let nested: Promise<boolean> | undefined;
      await t.locks.withLock(
        'in-flight',
        async () => {
          void proxy.delayReply(scriptOn(key), 50); // the re-entry's answer comes after the outer's release
          nested = t.locks.withLock(
            'in-flight',
            async (handle) => {
              inner = handle;
              await sleep(800);
              inner = undefined; // done: its release may let the other owner in from here on
              return handle.signal.aborted;
            },
            { lockWatchdogTimeout: 30_000 },
          );
        },
        { lockWatchdogTimeout: 300 },
      );
      const work = nested as Promise<boolean>;
      const overlaps = await watchForSecondHolder(other, 'in-flight', () => inner, work);
      expect(overlaps).toEqual([]);
      expect(await work).toBe(false);
      expect(await redis.exists(key)).toBe(0);
    });

    it('ifExpireWhenFinish: false leaves renewal on while a nested hold runs, then leaves the key to expire', async () => {
      const { t, other } = await apps2();
      const detached = t.get(Detached);
      await detached.start('1', 700);
      const work = detached.nested as Promise<boolean>;
      const overlaps = await watchForSecondHolder(other, 'detached:1', () => detached.inner, work);
      expect(overlaps).toEqual([]);
      expect(await work).toBe(false);
      const key = `${t.prefix}detached:1`;
      expect(await redis.exists(key)).toBe(1); // not released: left to its lease
      const pttl = await redis.pttl(key);
      expect(pttl).toBeGreaterThan(0);
      expect(pttl).toBeLessThanOrEqual(300);
      expect(await eventually(async () => (await redis.exists(key)) === 0, 600)).toBe(true);
    });

    it('stopRenewal() on the outer waits for the nested hold to end', async () => {
      const { t, other } = await apps2();
      let nested: Promise<boolean> | undefined;
      let inner: LockHandle | undefined;
      await t.locks.withLock(
        'stop-outer',
        async (held) => {
          nested = t.locks.withLock('stop-outer', async (handle) => {
            inner = handle;
            await sleep(700);
            inner = undefined;
            return handle.signal.aborted;
          });
          held.stopRenewal();
        },
        { lockWatchdogTimeout: 300 },
      );
      const work = nested as Promise<boolean>;
      const overlaps = await watchForSecondHolder(other, 'stop-outer', () => inner, work);
      expect(overlaps).toEqual([]);
      expect(await work).toBe(false);
    });
  });

  describe('4. timers, hooks and abort listeners run outside every caller’s lock scope', () => {
    it('an onLockLost hook and an abort listener see no current lock and cannot re-enter an unrelated hold', async () => {
      const { t } = await apps2();
      const seen: {
        hook?: unknown;
        listener?: unknown;
        triedB?: LockHandle | null;
        listenerTriedB?: Promise<LockHandle | null>;
      } = {};
      const hook = async (_event: LockLostEvent): Promise<void> => {
        seen.hook = t.locks.current() ?? null;
        seen.triedB = await t.locks.tryLock('scope-b');
        await seen.triedB?.release();
      };
      await t.locks.withLock('scope-b', async () => {
        // Taken inside B's flow (so the watchdog's timer is armed there), never released: it is lost.
        const a = await t.locks.lock('scope-a', { expire: 150, onLockLost: hook });
        a.signal.addEventListener('abort', () => {
          seen.listener = t.locks.current() ?? null;
          seen.listenerTriedB = t.locks.tryLock('scope-b');
        });
        await sleep(450);
      });
      const listenerTriedB = await seen.listenerTriedB;
      await listenerTriedB?.release();
      expect(seen.hook).toBeNull();
      expect(seen.listener).toBeNull();
      expect(seen.triedB).toBeNull();
      expect(seen.listenerTriedB).toBeDefined();
      expect(listenerTriedB).toBeNull();
    });
  });

  describe('6. and 7. no lost wake-ups', () => {
    it('a waiter re-checks at once when its subscriber connection comes back', async () => {
      const { t, other } = await apps2();
      const holder = await other.locks.lock('resubscribe'); // a 30 s lease: only a release frees it
      const waiting = settle(t.locks.tryLock('resubscribe', { waitTime: 5_000 }));
      await someoneSubscribed(proxy);
      expect(proxy.resetConnections('subscriber')).toBe(1);
      const releasedAt = performance.now();
      expect(await holder.release()).toBe(true); // announced while the subscriber is away
      const result = await waiting;
      expect(result.ok && result.value !== null).toBe(true);
      // A reconnect (ioredis waits 50 ms before the first) and one round trip, not the 5 s waitTime.
      expect(performance.now() - releasedAt).toBeLessThan(250);
      if (result.ok) await result.value?.release();
    });

    it('a release whose reply comes after its timeout still wakes the local waiter', async () => {
      const { t } = await apps2({ operationTimeout: 300 });
      const h = await t.locks.lock('late-release'); // a 30 s lease
      const waiting = settle(t.locks.tryLock('late-release', { waitTime: 5_000 }));
      await someoneSubscribed(proxy);
      // Later than operationTimeout, but not by so much that the waiter's own attempt, whose reply
      // queues behind this one on the connection, times out as well.
      const late = proxy.delayReply(isScript(RELEASE_SCRIPT), 450);
      const released = await settle(h.release());
      expect((released as { error: unknown }).error).toBeInstanceOf(RedisUnavailableError);
      await late;
      const result = await waiting;
      expect(result.ok && result.value !== null).toBe(true);
      expect(result.ms).toBeLessThan(2_000); // not the holder's 30 s lease, nor the 5 s waitTime
      if (result.ok) await result.value?.release();
    });

    it.each([
      ['the default client, which re-sends it', {}],
      ['autoResendUnfulfilledCommands: false', { autoResendUnfulfilledCommands: false }],
    ])(
      'a release whose reply is lost frees the lock, reports no loss and wakes the local waiter (%s)',
      async (_client, resend) => {
        const { t } = await apps2({
          redis: { host: '127.0.0.1', port: proxy.port, ...resend },
          operationTimeout: 300,
        });
        const lost = vi.fn();
        const h = await t.locks.lock('lost-release-wakes', { onLockLost: lost }); // a 30 s lease
        const waiting = settle(t.locks.tryLock('lost-release-wakes', { waitTime: 3_000 }));
        await someoneSubscribed(proxy);
        const dropped = proxy.dropReply(isScript(RELEASE_SCRIPT));
        const released = await settle(h.release());
        await dropped;
        if (released.ok) expect(released.value).toBe(true);
        else expect(released.error).toBeInstanceOf(RedisUnavailableError); // not re-sent: outcome unknown
        if (!('autoResendUnfulfilledCommands' in resend)) expect(released.ok).toBe(true);
        expect(h.signal.aborted).toBe(false);
        expect(lost).not.toHaveBeenCalled();
        const result = await waiting;
        expect(result.ok && result.value !== null).toBe(true);
        expect(result.ms).toBeLessThan(1_500); // not the 3 s waitTime, nor the 30 s lease
        const next = result.ok ? result.value : null;
        expect(await holdsOf(redis, h.key)).toEqual(next ? { [next.owner]: '1' } : {});
        await next?.release();
      },
    );

    it('the give-back of an acquire answered after its timeout wakes the next local waiter', async () => {
      const { t, other } = await apps2({ operationTimeout: 300 });
      // Never released: it expires, and nothing announces that (a release would grant the lock to
      // the head with no attempt at all).
      const holder = await other.locks.lock('give-back', { expire: 700 });
      // The head of the line: it asks Redis, subscribes, and sleeps on the channel.
      const head = settle(t.locks.lock('give-back', { waitTime: 3_000 }));
      await someoneSubscribed(proxy);
      // Joins the line behind the head and sends nothing until the head leaves it.
      const next = settle(t.locks.tryLock('give-back', { waitTime: 3_000 }));
      await sleep(50);
      proxy.clearLog();
      // The head's attempt at the end of the lease: Redis grants it, the answer comes after the
      // timeout. (Not so late that the next waiter's attempt, queued behind it on the connection,
      // times out.)
      const late = proxy.delayReply(isScript(ACQUIRE_SCRIPT), 450);
      const headResult = await head;
      expect((headResult as { error: unknown }).error).toBeInstanceOf(RedisUnavailableError);
      const failedAt = performance.now();
      await late;
      const nextResult = await next;
      expect(nextResult.ok && nextResult.value !== null).toBe(true);
      expect(performance.now() - failedAt).toBeLessThan(1_500); // not the rest of the 3 s waitTime
      const handle = nextResult.ok ? nextResult.value : null;
      expect(handle?.fencingToken).toBeGreaterThan(holder.fencingToken);
      expect(await holdsOf(redis, `${t.prefix}give-back`)).toEqual(handle ? { [handle.owner]: '1' } : {});
      await handle?.release();
    });
  });
});
