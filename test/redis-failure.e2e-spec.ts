import { Injectable, Logger } from '@nestjs/common';
import type { Redis } from 'ioredis';
import {
  DisLock,
  type DisLockModuleOptions,
  type LockHandle,
  LockLostError,
  RedisUnavailableError,
} from 'nestjs-dislock';
import { createTestApp, type TestApp } from './support/app';
import { RedisServer } from './support/redis-server';
import { eventually, sleep } from './support/shared-redis';
import { abortReason, lostReason, gate, settle } from './support/async';
import { holdsOf } from './support/lock-hash';
import { ACQUIRE_SCRIPT } from '../lib/store/redis/scripts/acquire.script';
import { CHECK_SCRIPT } from '../lib/store/redis/scripts/check.script';

/** A MONITOR line of the acquire script asking for a lease of `leaseMs`. */
const isAcquire = (args: string[], leaseMs: string): boolean =>
  args[1] === ACQUIRE_SCRIPT.sha && args.includes(leaseMs);

@Injectable()
class Jobs {
  readonly ran: string[] = [];

  @DisLock({ key: 'job:{0}', lockWatchdogTimeout: 5_000 })
  async run(id: string, until?: Promise<void>): Promise<string> {
    this.ran.push(id);
    await until;
    return `done ${id}`;
  }

  @DisLock({ key: 'fail:{0}', lockWatchdogTimeout: 5_000 })
  async fail(_id: string, until: Promise<void>, error: Error): Promise<string> {
    await until;
    throw error;
  }
}

describe('Redis failures (private Redis per test)', () => {
  const warn = vi.spyOn(Logger.prototype, 'warn').mockImplementation(() => undefined);
  const error = vi.spyOn(Logger.prototype, 'error').mockImplementation(() => undefined);

  /** Everything a test opened; closed in afterEach whatever happened. */
  let server: RedisServer | undefined;
  let app: TestApp | undefined;
  const clients: Redis[] = [];

  async function start(
    moduleOptions: Partial<DisLockModuleOptions> = {},
    serverOptions: { password?: string } = {},
  ): Promise<{ server: RedisServer; app: TestApp; redis: Redis }> {
    server = await RedisServer.start(serverOptions);
    app = await createTestApp([Jobs], {
      redis: { host: '127.0.0.1', port: server.port, password: serverOptions.password },
      operationTimeout: 500,
      ...moduleOptions,
    });
    const redis = server.client();
    clients.push(redis);
    return { server, app, redis };
  }

  afterEach(async () => {
    server?.resume();
    await app?.close();
    for (const client of clients.splice(0)) client.disconnect();
    await server?.dispose();
    app = undefined;
    server = undefined;
  });

  afterAll(async () => {
    warn.mockRestore();
    error.mockRestore();
  });

  describe('Redis stopped before acquiring', () => {
    it('lock, tryLock and withLock reject with RedisUnavailableError (503) within a bounded time', async () => {
      const { server: redisServer, app: t } = await start();
      await redisServer.stop();

      const locked = await settle(t.locks.lock('a'));
      expect(locked.ok).toBe(false);
      const e = (locked as { error: unknown }).error;
      expect(e).toBeInstanceOf(RedisUnavailableError);
      expect((e as RedisUnavailableError).statusCode).toBe(503);
      expect((e as RedisUnavailableError).operation).toBe('acquire');
      expect((e as RedisUnavailableError).lockName).toBe('a');
      expect(locked.ms).toBeLessThan(3_000);

      const tried = await settle(t.locks.tryLock('b', { waitTime: 200 }));
      expect(tried.ok).toBe(false);
      expect((tried as { error: unknown }).error).toBeInstanceOf(RedisUnavailableError);
      expect(tried.ms).toBeLessThan(3_000);

      const fn = vi.fn();
      const withLock = await settle(t.locks.withLock('c', fn));
      expect((withLock as { error: unknown }).error).toBeInstanceOf(RedisUnavailableError);
      expect(fn).not.toHaveBeenCalled();
      expect(withLock.ms).toBeLessThan(3_000);
    });

    it('a decorated method rejects with RedisUnavailableError and does not run', async () => {
      const { server: redisServer, app: t } = await start();
      await redisServer.stop();
      const jobs = t.get(Jobs);
      const result = await settle(jobs.run('x'));
      expect(result.ok).toBe(false);
      expect((result as { error: unknown }).error).toBeInstanceOf(RedisUnavailableError);
      expect(result.ms).toBeLessThan(3_000);
      expect(jobs.ran).toEqual([]);
    });
  });

  describe('Redis stopped while a watchdog lock is held', () => {
    it('aborts the signal with lease-expired by the end of the lease; works again after a restart', async () => {
      const { server: redisServer, app: t, redis } = await start();
      const h = await t.locks.lock('w', { lockWatchdogTimeout: 600 });
      await sleep(250); // at least one renewal went through
      await redisServer.stop();
      const stoppedAt = performance.now();
      const reason = await abortReason(h.signal, 3_000);
      const elapsed = performance.now() - stoppedAt;
      expect(reason).toBeInstanceOf(LockLostError);
      expect(lostReason(reason)).toBe('lease-expired');
      expect(elapsed).toBeLessThan(600 + 600); // the last lease ends at most 600 ms after the stop

      await redisServer.startProcess();
      const fresh = await eventually(
        async () => {
          const handle = await t.locks.tryLock('w2').catch(() => null);
          if (handle) await handle.release();
          return handle !== null;
        },
        3_000,
        50,
      );
      expect(fresh).toBe(true);
      // No stale renewal re-creates the old key.
      expect(await redis.exists(`${t.prefix}w`)).toBe(0);
      await sleep(450);
      expect(await redis.exists(`${t.prefix}w`)).toBe(0);
      expect(await h.release()).toBe(false);

      const again = await t.locks.lock('w', { lockWatchdogTimeout: 600 });
      expect(again.owner).not.toBe(h.owner);
      expect(await holdsOf(redis, `${t.prefix}w`)).toEqual({ [again.owner]: '1' });
      expect(await again.release()).toBe(true);
    });

    it('aborts by the end of the lease even when a renewal is still waiting for Redis (operationTimeout > lease)', async () => {
      // Same as above, but each Redis round trip may take up to 2 s: the lease (600 ms) ends while
      // the renewal is still pending, and the signal must not wait for that renewal to time out.
      const { server: redisServer, app: t } = await start({ operationTimeout: 2_000 });
      const h = await t.locks.lock('slow', { lockWatchdogTimeout: 600 });
      await sleep(250);
      await redisServer.stop();
      const stoppedAt = performance.now();
      const reason = await abortReason(h.signal, 1_500);
      const elapsed = performance.now() - stoppedAt;
      await redisServer.startProcess(); // so that shutdown does not wait on a dead server
      expect(lostReason(reason)).toBe('lease-expired');
      expect(elapsed).toBeLessThan(600 + 600);
    });
  });

  describe('Redis paused (SIGSTOP) longer than the lease', () => {
    it('aborts the signal; after resume a new owner can take the lock', async () => {
      const { server: redisServer, app: t, redis } = await start();
      const h = await t.locks.lock('p', { lockWatchdogTimeout: 600 });
      await sleep(250);
      redisServer.pause();
      const reason = await abortReason(h.signal, 2_000);
      expect(reason).toBeInstanceOf(LockLostError);
      expect(lostReason(reason)).toBe('lease-expired');
      redisServer.resume();

      let next: LockHandle | null = null;
      const got = await eventually(
        async () => {
          next = await t.locks.tryLock('p').catch(() => null);
          return next !== null;
        },
        3_000,
        50,
      );
      expect(got).toBe(true);
      const n = next as unknown as LockHandle;
      expect(n.owner).not.toBe(h.owner);
      expect(await holdsOf(redis, `${t.prefix}p`)).toEqual({ [n.owner]: '1' });
      expect(await h.release()).toBe(false);
      expect(await holdsOf(redis, `${t.prefix}p`)).toEqual({ [n.owner]: '1' });
      expect(await n.release()).toBe(true);
    });
  });

  describe('release fails because Redis stopped during the method', () => {
    it('the method’s result still reaches the caller', async () => {
      const { server: redisServer, app: t, redis } = await start();
      const jobs = t.get(Jobs);
      const inside = gate();
      const call = settle(jobs.run('r', inside.promise));
      expect(await eventually(async () => (await redis.exists(`${t.prefix}job:r`)) === 1)).toBe(true);
      await redisServer.stop();
      warn.mockClear();
      inside.open();
      const result = await call;
      expect(result).toMatchObject({ ok: true, value: 'done r' });
      expect(result.ms).toBeLessThan(3_000);
      const messages = warn.mock.calls.map((c) => String(c[0]));
      expect(messages.some((m) => m.includes('job:r'))).toBe(true);
    });

    it('the method’s own error still reaches the caller (not a Redis error)', async () => {
      const { server: redisServer, app: t, redis } = await start();
      const jobs = t.get(Jobs);
      const inside = gate();
      const boom = new Error('method failed');
      const call = settle(jobs.fail('f', inside.promise, boom));
      expect(await eventually(async () => (await redis.exists(`${t.prefix}fail:f`)) === 1)).toBe(true);
      await redisServer.stop();
      inside.open();
      const result = await call;
      expect(result.ok).toBe(false);
      expect((result as { error: unknown }).error).toBe(boom);
      expect(result.ms).toBeLessThan(3_000);
    });
  });

  describe('password-protected Redis', () => {
    it('works with RedisOptions { port, password }', async () => {
      const { app: t, redis } = await start({}, { password: 'pw' });
      const h = await t.locks.lock('pw-opts');
      expect(await holdsOf(redis, `${t.prefix}pw-opts`)).toEqual({ [h.owner]: '1' });
      expect(await h.release()).toBe(true);
    });

    it('works with a redis://:pw@host:port URL', async () => {
      server = await RedisServer.start({ password: 'pw' });
      app = await createTestApp([], { redis: `redis://:pw@127.0.0.1:${server.port}`, operationTimeout: 500 });
      const redis = server.client();
      clients.push(redis);
      const h = await app.locks.lock('pw-url');
      expect(await holdsOf(redis, `${app.prefix}pw-url`)).toEqual({ [h.owner]: '1' });
      expect(await h.release()).toBe(true);
    });

    it.each([
      ['a wrong password', 'nope'],
      ['no password', undefined],
    ])('with %s, acquiring fails with RedisUnavailableError, bounded', async (_label, password) => {
      server = await RedisServer.start({ password: 'pw' });
      app = await createTestApp([], {
        redis: { host: '127.0.0.1', port: server.port, password },
        operationTimeout: 500,
      });
      const result = await settle(app.locks.lock('pw-bad'));
      expect(result.ok).toBe(false);
      expect((result as { error: unknown }).error).toBeInstanceOf(RedisUnavailableError);
      expect(result.ms).toBeLessThan(3_000);
      const redis = server.client();
      clients.push(redis);
      expect(await redis.exists(`${app.prefix}pw-bad`)).toBe(0);
    });
  });

  describe('a timed-out acquire whose command lands later', () => {
    it('does not leave an orphan lock', async () => {
      const { server: redisServer, app: t, redis } = await start({ operationTimeout: 300 });
      const k = `${t.prefix}orphan`;
      const base = redisServer.client();
      clients.push(base);
      const monitor = await base.monitor();
      clients.push(monitor);
      const seen: string[][] = [];
      monitor.on('monitor', (_time: string, args: string[]) => {
        if (args.includes(k)) seen.push(args);
      });

      redisServer.pause();
      const result = await settle(t.locks.tryLock('orphan', { lockWatchdogTimeout: 10_000 }));
      expect(result.ok).toBe(false);
      expect((result as { error: unknown }).error).toBeInstanceOf(RedisUnavailableError);
      expect(result.ms).toBeLessThan(2_000);
      redisServer.resume();

      // The queued acquire reaches Redis now (MONITOR proves it), and is given back at once.
      expect(await eventually(() => seen.some((args) => isAcquire(args, '10000')), 2_000)).toBe(true);
      expect(await eventually(async () => (await redis.exists(k)) === 0, 2_000)).toBe(true);
      await sleep(300);
      expect(await redis.exists(k)).toBe(0);
      // And the name is free for anyone.
      const h = await t.locks.lock('orphan');
      expect(await h.release()).toBe(true);
    });

    it('a timed-out reentrant acquire that lands later changes nothing in Redis, and the outer lock stays', async () => {
      const { server: redisServer, app: t, redis } = await start({ operationTimeout: 300 });
      const k = `${t.prefix}reenter`;
      const base = redisServer.client();
      clients.push(base);
      const monitor = await base.monitor();
      clients.push(monitor);
      const lateChecks: string[][] = [];
      monitor.on('monitor', (_time: string, args: string[]) => {
        if (args.includes(k) && args[0].toLowerCase() === 'evalsha' && args[1] === CHECK_SCRIPT.sha) {
          lateChecks.push(args);
        }
      });
      await t.locks.withLock(
        'reenter',
        async (outer) => {
          redisServer.pause();
          const inner = await settle(t.locks.lock('reenter', { lockWatchdogTimeout: 7_000 }));
          redisServer.resume();
          expect(inner.ok).toBe(false);
          expect((inner as { error: unknown }).error).toBeInstanceOf(RedisUnavailableError);
          // A re-entry only asks whether the hold is still there (the count is kept in this
          // process): landing late, it must leave the outer's hold exactly as it was.
          expect(await eventually(() => lateChecks.length > 0, 2_000)).toBe(true);
          await sleep(300);
          expect(await holdsOf(redis, k)).toEqual({ [outer.owner]: '1' });
          expect(outer.signal.aborted).toBe(false);
        },
        { lockWatchdogTimeout: 10_000 },
      );
      expect(await redis.exists(k)).toBe(0);
    });
  });
});
