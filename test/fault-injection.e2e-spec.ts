/**
 * Fault injection: locks lost in every way the library knows (`onLockLost`, `release()` after a
 * loss), fencing tokens (order, restarts, hash slots), and the failure cases of the issue: Redis
 * stopped, Redis paused past the lease, a holder whose event loop stalls past the lease, and keys
 * deleted or overwritten under a holder. Anything disruptive runs on a redis-server of the test's
 * own; the shared one only sees ordinary commands.
 */
import type { Mock, MockInstance } from 'vitest';
import { type ChildProcess, spawn } from 'node:child_process';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join, resolve } from 'node:path';
import { runInThisContext } from 'node:vm';
import { Injectable, Logger, type Provider } from '@nestjs/common';
import type { Redis } from 'ioredis';
import {
  DisLock,
  DisLockModule,
  type DisLockModuleOptions,
  InvalidLockOptionsError,
  type LockHandle,
  type LockLostEvent,
  LockLostError,
  type LockLostReason,
  type LockOptions,
  LockService,
} from 'nestjs-dislock';
import { createTestApp, type TestApp } from './support/app';
import { abortReason, gate, lostReason } from './support/async';
import { countRenewals } from './support/renewals';
import { RedisServer } from './support/redis-server';
import { eventually, sharedClient, sharedRedisUrl, sleep, uniquePrefix } from './support/shared-redis';
import {
  fencedWrite,
  readResource,
  type StalledHolderConfig,
  type StalledHolderMessage,
  type StalledHolderReport,
} from './support/workers/fault-protocol';
import { holdsOf } from './support/lock-hash';
import { FENCE_MARKER, fenceKeyFor, HASH_SLOTS, keySlot, slotTag } from '../lib/store/redis/fence-key';
import { RENEW_SCRIPT } from '../lib/store/redis/scripts/renew.script';

/** The real `process`, whatever sandbox the test runner gives test files. */
const realProcess = runInThisContext('process') as NodeJS.Process;

const ROOT = resolve(__dirname, '..');
const TS_REGISTER = join(ROOT, 'test', 'support', 'ts-register.js');
const STALLED_HOLDER = join(ROOT, 'test', 'support', 'workers', 'fault-stalled-holder.ts');

const OTHER_OWNER = 'f'.repeat(32);

type Hook = Mock<(event: LockLostEvent) => void | Promise<void>>;
const hook = (): Hook => vi.fn<(event: LockLostEvent) => void | Promise<void>>();

/** The per-call hook of the decorated methods below (set when the class is defined). */
const decoratorHook = hook();

@Injectable()
class FaultJobs {
  constructor(readonly locks: LockService) {}

  @DisLock({ key: 'job:{0}', lockWatchdogTimeout: 600, onLockLost: (event) => decoratorHook(event) })
  async hold(_id: string, inside: (handle: LockHandle) => void, until: Promise<void>): Promise<string> {
    inside(this.locks.current() as LockHandle);
    await until;
    return 'finished';
  }

  @DisLock({ key: 'nest:{0}', lockWatchdogTimeout: 5_000 })
  async outer(id: string): Promise<number[]> {
    const mine = (this.locks.current(`nest:${id}`) as LockHandle).fencingToken;
    return [mine, ...(await this.inner(id))];
  }

  @DisLock({ key: 'nest:{0}', lockWatchdogTimeout: 5_000 })
  async inner(id: string): Promise<number[]> {
    return [(this.locks.current(`nest:${id}`) as LockHandle).fencingToken];
  }

  @DisLock('{0}')
  async anyName(_name: string, ran: () => void): Promise<void> {
    ran();
  }
}

/** Redis TIME in microseconds, the clock fencing tokens start from. */
async function redisMicros(redis: Redis): Promise<number> {
  const [seconds, micros] = await redis.time();
  return Number(seconds) * 1_000_000 + Number(micros);
}

function expectStrictlyIncreasing(tokens: number[]): void {
  for (const token of tokens) {
    expect(Number.isSafeInteger(token)).toBe(true);
    expect(token).toBeGreaterThan(0);
  }
  for (let i = 1; i < tokens.length; i += 1) expect(tokens[i]).toBeGreaterThan(tokens[i - 1]);
}

/** Samples `read` every 25 ms for `ms` and returns every distinct value seen (JSON). */
async function watch(read: () => Promise<unknown>, ms: number): Promise<string[]> {
  const seen = new Set<string>();
  const until = performance.now() + ms;
  while (performance.now() < until) {
    seen.add(JSON.stringify(await read()));
    await sleep(25);
  }
  return [...seen];
}

describe('fault injection', () => {
  const warn = vi.spyOn(Logger.prototype, 'warn').mockImplementation(() => undefined);
  const error = vi.spyOn(Logger.prototype, 'error').mockImplementation(() => undefined);
  const log = vi.spyOn(Logger.prototype, 'log').mockImplementation(() => undefined);
  /** Logger calls whose message mentions lock `name` (quoted, as the library writes it). */
  const about = (spy: MockInstance, name: string): string[] =>
    spy.mock.calls.map((call) => String(call[0])).filter((message) => message.includes(`"${name}"`));

  // ---- everything a test opens, closed in afterEach whatever happened ------------------------
  let servers: RedisServer[] = [];
  let apps: TestApp[] = [];
  let clients: Redis[] = [];
  let children: ChildProcess[] = [];
  let dirs: string[] = [];
  let unhandled: unknown[] = [];
  const onUnhandled = (reason: unknown): void => void unhandled.push(reason);

  beforeEach(() => {
    unhandled = [];
    realProcess.on('unhandledRejection', onUnhandled);
    warn.mockClear();
    error.mockClear();
    log.mockClear();
    decoratorHook.mockReset();
  });

  afterEach(async () => {
    realProcess.off('unhandledRejection', onUnhandled);
    for (const server of servers) server.resume();
    for (const child of children) if (child.exitCode === null && child.signalCode === null) child.kill('SIGKILL');
    await Promise.allSettled(apps.map((t) => t.close()));
    for (const client of clients) client.disconnect();
    await Promise.allSettled(servers.map((server) => server.dispose()));
    for (const dir of dirs) rmSync(dir, { recursive: true, force: true });
    servers = [];
    apps = [];
    clients = [];
    children = [];
    dirs = [];
  });

  afterAll(() => {
    warn.mockRestore();
    error.mockRestore();
    log.mockRestore();
  });

  async function ownServer(args: string[] = []): Promise<RedisServer> {
    const server = await RedisServer.start({ args });
    servers.push(server);
    return server;
  }

  function track(client: Redis): Redis {
    clients.push(client);
    return client;
  }

  /** An app on the shared Redis, or on `server` (operationTimeout 300 ms there). */
  async function app(
    options: Partial<DisLockModuleOptions> & { server?: RedisServer; providers?: Provider[] } = {},
  ): Promise<TestApp> {
    const { server, providers = [FaultJobs], ...moduleOptions } = options;
    const t = await createTestApp(providers, {
      ...(server && { redis: { host: '127.0.0.1', port: server.port }, operationTimeout: 300 }),
      ...moduleOptions,
    });
    apps.push(t);
    return t;
  }

  async function closeApp(t: TestApp): Promise<void> {
    apps = apps.filter((other) => other !== t);
    await t.close();
  }

  function tempDir(): string {
    const dir = mkdtempSync(join(tmpdir(), 'dislock-fault-'));
    dirs.push(dir);
    return dir;
  }

  /** Both hooks heard exactly one loss of `handle`, with every field right. */
  function expectOneEvent(hooks: Hook[], handle: LockHandle, reason: LockLostReason): void {
    for (const h of hooks) {
      expect(h).toHaveBeenCalledTimes(1);
      const [event] = h.mock.calls[0];
      expect(event).toMatchObject({
        name: handle.name,
        key: handle.key,
        owner: handle.owner,
        fencingToken: handle.fencingToken,
        reason,
      });
      expect(event.error).toBeInstanceOf(LockLostError);
      expect(event.error).toBe(handle.signal.reason); // the very error the signal aborted with
      expect(event.error.reason).toBe(reason);
      expect(event.error.lockName).toBe(handle.name);
    }
  }

  // ---- A. onLockLost ---------------------------------------------------------------------------

  describe('onLockLost', () => {
    interface Case {
      reason: LockLostReason;
      own?: boolean;
      options: LockOptions;
      /** Make the lock be lost (or just let time pass); its signal must then abort within `withinMs`. */
      lose(ctx: { t: TestApp; h: LockHandle; redis: Redis; server?: RedisServer }): Promise<void>;
      withinMs: number;
      /** What Redis holds afterwards (when it can be asked). */
      after?(ctx: { t: TestApp; h: LockHandle; redis: Redis }): Promise<void>;
      /** Whether Redis answers a release afterwards (not while it is stopped: see the it.failing below). */
      canRelease?: false;
      /** Exactly how many renewals Redis runs for the lock, first to last (counted by MONITOR). */
      renewals?: number;
    }

    const cases: [string, Case][] = [
      [
        'not-owner: the key is deleted',
        {
          reason: 'not-owner',
          options: { lockWatchdogTimeout: 600 },
          lose: async ({ h, redis }) => void (await redis.del(h.key)),
          withinMs: 1_000,
          after: async ({ h, redis }) => expect(await redis.exists(h.key)).toBe(0),
        },
      ],
      [
        'not-owner: the key is replaced by a hash of another owner',
        {
          reason: 'not-owner',
          options: { lockWatchdogTimeout: 600 },
          lose: async ({ h, redis }) => void (await redis.multi().del(h.key).hset(h.key, OTHER_OWNER, '1').exec()),
          withinMs: 1_000,
          after: async ({ h, redis }) => {
            expect(await holdsOf(redis, h.key)).toEqual({ [OTHER_OWNER]: '1' });
            expect(await redis.pttl(h.key)).toBe(-1); // never renewed by the old holder
          },
        },
      ],
      [
        'lease-expired: Redis is stopped',
        {
          reason: 'lease-expired',
          own: true,
          options: { lockWatchdogTimeout: 600 },
          lose: async ({ server }) => {
            await sleep(250);
            await server?.stop();
          },
          withinMs: 2_000,
          canRelease: false,
        },
      ],
      [
        'expired: a fixed expire shorter than the work',
        {
          reason: 'expired',
          options: { expire: 250 },
          lose: async () => undefined,
          withinMs: 1_500,
          after: async ({ h, redis }) =>
            expect(await eventually(async () => (await redis.exists(h.key)) === 0, 1_000)).toBe(true),
        },
      ],
      [
        'max-renewals: renewal stops at maxRenewTimes and the last lease runs out',
        {
          reason: 'max-renewals',
          options: { lockWatchdogTimeout: 450, maxRenewTimes: 2 },
          lose: async () => undefined,
          withinMs: 2_000,
          renewals: 2,
          after: async ({ h, redis }) => {
            expect(await eventually(async () => (await redis.exists(h.key)) === 0, 1_000)).toBe(true);
            expect(about(warn, h.name).some((m) => m.includes('maxRenewTimes'))).toBe(true);
          },
        },
      ],
      [
        'shutdown: app.close()',
        {
          reason: 'shutdown',
          options: { lockWatchdogTimeout: 5_000 },
          lose: async ({ t }) => closeApp(t),
          withinMs: 1_000,
          after: async ({ h, redis }) => expect(await redis.exists(h.key)).toBe(0), // released at shutdown
        },
      ],
    ];

    it.each(cases)('%s: module and per-call hooks each get one event with the right fields', async (_label, c) => {
      const server = c.own ? await ownServer() : undefined;
      const redis = track(server ? server.client() : sharedClient());
      const moduleHook = hook();
      const perCall = hook();
      const t = await app({ server, onLockLost: moduleHook });
      let renewals: ReturnType<typeof countRenewals> | undefined;
      if (c.renewals !== undefined) {
        await redis.script('LOAD', RENEW_SCRIPT.source);
        renewals = countRenewals(track(await redis.monitor()), redis, `${t.prefix}hooked`);
      }
      const h = await t.locks.lock('hooked', { ...c.options, onLockLost: perCall });
      expect(await holdsOf(redis, h.key)).toEqual({ [h.owner]: '1' });
      expect(moduleHook).not.toHaveBeenCalled();

      await c.lose({ t, h, redis, server });
      const reason = await abortReason(h.signal, c.withinMs);
      expect(lostReason(reason)).toBe(c.reason);
      expectOneEvent([perCall, moduleHook], h, c.reason);
      // The hooks replace the default message (shutdown's `log` and every other reason's `warn`).
      expect(about(warn, 'hooked').filter((m) => m.includes('lost:') || m.includes('given up'))).toEqual([]);
      expect(about(log, 'hooked')).toEqual([]);
      await c.after?.({ t, h, redis });

      // Reported once: not again by a later tick, nor by the release.
      await sleep(150);
      if (c.canRelease !== false) expect(await h.release()).toBe(false);
      expect(perCall).toHaveBeenCalledTimes(1);
      expect(moduleHook).toHaveBeenCalledTimes(1);
      expect(unhandled).toEqual([]);
      if (renewals) {
        // Counted, not timed: every command Redis ran up to now has been seen.
        await renewals.synced();
        expect(renewals.count()).toBe(c.renewals);
      }
    });

    it('release() of a lock lost to lease-expired resolves false at once while Redis is still down', async () => {
      const server = await ownServer();
      const t = await app({ server });
      const h = await t.locks.lock('down', { lockWatchdogTimeout: 600 });
      await server.stop();
      expect(lostReason(await abortReason(h.signal, 2_000))).toBe('lease-expired');
      await expect(h.release()).resolves.toBe(false);
    });

    it('without hooks, a loss is a Logger warning (and a shutdown a Logger log), one each', async () => {
      const redis = track(sharedClient());
      const t = await app();
      const quiet = hook();
      const lost = await t.locks.lock('no-hook', { lockWatchdogTimeout: 600 });
      const hooked = await t.locks.lock('per-call-only', { lockWatchdogTimeout: 600, onLockLost: quiet });
      await redis.del(lost.key, hooked.key);
      expect(lostReason(await abortReason(lost.signal, 1_000))).toBe('not-owner');
      expect(lostReason(await abortReason(hooked.signal, 1_000))).toBe('not-owner');
      await sleep(150);
      const warned = about(warn, 'no-hook');
      expect(warned).toHaveLength(1);
      expect(warned[0]).toContain('lost');
      expect(about(warn, 'per-call-only')).toEqual([]); // its own hook replaced the warning
      expect(quiet).toHaveBeenCalledTimes(1);

      const atShutdown = await t.locks.lock('at-shutdown', { lockWatchdogTimeout: 5_000 });
      await closeApp(t);
      expect(lostReason(atShutdown.signal.reason)).toBe('shutdown');
      expect(about(log, 'at-shutdown')).toHaveLength(1);
      expect(about(warn, 'at-shutdown')).toEqual([]);
      expect(error).not.toHaveBeenCalled();
    });

    it.each([
      ['the per-call hook throws, the module hook rejects', 'throw', 'reject'],
      ['the per-call hook rejects (with a string), the module hook throws', 'reject', 'throw'],
    ] as const)('%s: both are logged with Logger.error, nothing escapes', async (_label, perCallFails, moduleFails) => {
      const failing = (how: 'throw' | 'reject', who: string): Hook =>
        how === 'throw'
          ? vi.fn<(event: LockLostEvent) => void>(() => {
              throw new Error(`${who} threw`);
            })
          : // Not even an Error: whatever a hook rejects with is logged.
            // eslint-disable-next-line @typescript-eslint/prefer-promise-reject-errors
            vi.fn<(event: LockLostEvent) => Promise<void>>(() => Promise.reject(`${who} rejected`));
      const perCall = failing(perCallFails, 'per-call');
      const moduleHook = failing(moduleFails, 'module');
      const redis = track(sharedClient());
      const t = await app({ onLockLost: moduleHook });
      const h = await t.locks.lock('bad-hooks', { lockWatchdogTimeout: 600, onLockLost: perCall });
      await redis.del(h.key);
      expect(lostReason(await abortReason(h.signal, 1_000))).toBe('not-owner');
      await sleep(100); // let a rejection surface, if one were left unhandled

      expect(perCall).toHaveBeenCalledTimes(1);
      expect(moduleHook).toHaveBeenCalledTimes(1); // the first hook failing did not stop the second
      const errors = about(error, 'bad-hooks');
      expect(errors).toHaveLength(2);
      expect(errors.some((m) => m.includes('onLockLost') && m.includes('per-call'))).toBe(true);
      expect(errors.some((m) => m.includes('onLockLost') && m.includes('module'))).toBe(true);
      expect(unhandled).toEqual([]);
      // The service is unharmed: the watchdog and the next lock work.
      const next = await t.locks.lock('bad-hooks', { lockWatchdogTimeout: 600 });
      await sleep(250);
      expect(next.signal.aborted).toBe(false);
      expect(await next.release()).toBe(true);
    });

    it('@DisLock({ onLockLost }) gets the event of the decorated method’s lock (and the module hook too)', async () => {
      const redis = track(sharedClient());
      const moduleHook = hook();
      const t = await app({ onLockLost: moduleHook });
      const jobs = t.get(FaultJobs);
      let inside: LockHandle | undefined;
      const done = gate();
      const call = jobs.hold('7', (h) => (inside = h), done.promise);
      expect(await eventually(() => inside !== undefined)).toBe(true);
      const h = inside as LockHandle;
      expect(h.name).toBe('job:7');
      expect(await holdsOf(redis, h.key)).toEqual({ [h.owner]: '1' });

      await redis.del(h.key);
      expect(lostReason(await abortReason(h.signal, 1_000))).toBe('not-owner');
      expectOneEvent([decoratorHook, moduleHook], h, 'not-owner');
      done.open();
      expect(await call).toBe('finished'); // the method's own result still comes through
      expect(decoratorHook).toHaveBeenCalledTimes(1); // the decorator's release does not report it again
      expect(moduleHook).toHaveBeenCalledTimes(1);
      expect(await redis.exists(h.key)).toBe(0);
    });
  });

  // ---- B. release() after a loss -------------------------------------------------------------

  describe('release() of a lost lock', () => {
    it('deleted, then taken by another owner: false, the other owner’s key untouched, reported once', async () => {
      const redis = track(sharedClient());
      const moduleHook = hook();
      const perCall = hook();
      const t = await app({ onLockLost: moduleHook });
      // Renewal every 500 ms: the release below notices the loss long before the watchdog does.
      const h = await t.locks.lock('taken', { lockWatchdogTimeout: 1_500, onLockLost: perCall });
      await redis.del(h.key);
      const other = await t.locks.lock('taken', { lockWatchdogTimeout: 10_000 });
      expect(other.owner).not.toBe(h.owner);
      const othersKey = await holdsOf(redis, h.key);
      expect(othersKey).toEqual({ [other.owner]: '1' });
      expect(h.signal.aborted).toBe(false); // nobody has noticed yet

      expect(await h.release()).toBe(false);
      expect(await holdsOf(redis, h.key)).toEqual(othersKey);
      expect(await redis.pttl(h.key)).toBeGreaterThan(9_000);
      expect(lostReason(h.signal.reason)).toBe('not-owner');
      expectOneEvent([perCall, moduleHook], h, 'not-owner');

      // Past the old holder's next renewal: its watchdog is stopped and reports nothing more.
      await sleep(700);
      expect(perCall).toHaveBeenCalledTimes(1);
      expect(moduleHook).toHaveBeenCalledTimes(1);
      expect(await h.release()).toBe(false);
      expect(await holdsOf(redis, h.key)).toEqual(othersKey);
      expect(other.signal.aborted).toBe(false);
      expect(await other.release()).toBe(true);
      expect(await redis.exists(h.key)).toBe(0);
    });

    it('a lock the watchdog already reported lost: false, no second report, the new owner untouched', async () => {
      const redis = track(sharedClient());
      const perCall = hook();
      const t = await app();
      const h = await t.locks.lock('reported', { lockWatchdogTimeout: 600, onLockLost: perCall });
      await redis.del(h.key);
      expect(lostReason(await abortReason(h.signal, 1_000))).toBe('not-owner');
      expect(perCall).toHaveBeenCalledTimes(1);
      const other = await t.locks.lock('reported', { lockWatchdogTimeout: 10_000 });
      expect(await h.release()).toBe(false);
      expect(await holdsOf(redis, h.key)).toEqual({ [other.owner]: '1' });
      expect(perCall).toHaveBeenCalledTimes(1);
      expect(about(warn, 'reported')).toEqual([]);
      expect(await other.release()).toBe(true);
    });

    it('release racing the watchdog (renewal every 50 ms, release 0–60 ms after the DEL): exactly one report', async () => {
      const redis = track(sharedClient());
      const t = await app();
      for (let i = 0; i < 15; i += 1) {
        const perCall = hook();
        const h = await t.locks.lock(`race-${i}`, { lockWatchdogTimeout: 150, onLockLost: perCall });
        await sleep(Math.random() * 50);
        await redis.del(h.key);
        await sleep(Math.random() * 60);
        expect(await h.release()).toBe(false);
        await sleep(80);
        // Whoever noticed first (the release, a renewal, or on a loaded machine the lease's end) reported it, once.
        expect(['not-owner', 'lease-expired']).toContain(lostReason(h.signal.reason));
        expect(perCall).toHaveBeenCalledTimes(1);
        expect(perCall.mock.calls[0][0].error).toBe(h.signal.reason);
        expect(await redis.exists(h.key)).toBe(0);
      }
    });

    it('a lock deleted under a reentrant hold is reported once, by the release that reaches Redis', async () => {
      const redis = track(sharedClient());
      const outerHook = hook();
      const innerHook = hook();
      const t = await app();
      let outerHandle: LockHandle | undefined;
      await t.locks.withLock(
        'nested-lost',
        async (outer) => {
          outerHandle = outer;
          const inner = await t.locks.lock('nested-lost', { onLockLost: innerHook });
          expect(inner.fencingToken).toBe(outer.fencingToken);
          expect(await holdsOf(redis, outer.key)).toEqual({ [outer.owner]: '1' });
          await redis.del(outer.key);
          // The nested release only counts down in this process (reentrant holds are not counted
          // in Redis, so a re-sent command can never count one twice): it sees nothing yet.
          expect(await inner.release()).toBe(false);
          expect(outer.signal.aborted).toBe(false);
        },
        { lockWatchdogTimeout: 3_000, onLockLost: outerHook },
      );
      // The outermost acquisition's hook (its options rule the hold); the nested call's is not used.
      expectOneEvent([outerHook], outerHandle as LockHandle, 'not-owner');
      expect(innerHook).not.toHaveBeenCalled();
      expect(await redis.exists((outerHandle as LockHandle).key)).toBe(0);
    });
  });

  // ---- C. fencing tokens -----------------------------------------------------------------------

  describe('fencing tokens', () => {
    it('grow strictly across release → reacquire, expiry → reacquire, waits and two apps on one Redis', async () => {
      const redis = track(sharedClient());
      const keyPrefix = uniquePrefix('fence');
      const a = await app({ keyPrefix });
      const b = await app({ keyPrefix });
      const tokens: number[] = [];
      /** Acquire, and check the token against Redis TIME (µs) read just before and just after. */
      const take = async (acquire: () => Promise<LockHandle | null>): Promise<LockHandle> => {
        const before = await redisMicros(redis);
        const handle = await acquire();
        const after = await redisMicros(redis);
        expect(handle).not.toBeNull();
        const token = (handle as LockHandle).fencingToken;
        expect(token).toBeGreaterThanOrEqual(before);
        expect(token).toBeLessThanOrEqual(after);
        tokens.push(token);
        return handle as LockHandle;
      };

      for (const t of [a, b, a, a, b]) await (await take(() => t.locks.lock('f'))).release();
      // Expiry, no release: the next owner (the other app) takes it once the key is gone.
      const expiring = await take(() => a.locks.lock('f', { expire: 150 }));
      expect(await eventually(async () => (await redis.exists(expiring.key)) === 0, 2_000)).toBe(true);
      const afterExpiry = await take(() => b.locks.lock('f'));
      // Waiting for a busy lock: the wait ends when the holder releases, and gets a larger token.
      const waited = take(() => b.locks.tryLock('f', { waitTime: 2_000 }));
      await sleep(50);
      await afterExpiry.release();
      await (await waited).release();
      await take(() => a.locks.withLock('f', async (h) => h));
      expect(await expiring.release()).toBe(false);

      expect(tokens).toHaveLength(9);
      expectStrictlyIncreasing(tokens);
      // The slot's counter holds the last token issued.
      const fenceKey = fenceKeyFor(keyPrefix, `${keyPrefix}f`);
      expect(await redis.get(fenceKey)).toBe(String(tokens[tokens.length - 1]));
    });

    it('reentry returns the holder’s token and issues none (LockService and @DisLock)', async () => {
      const redis = track(sharedClient());
      const t = await app();
      const jobs = t.get(FaultJobs);
      await t.locks.withLock('re', async (outer) => {
        const fenceKey = fenceKeyFor(t.prefix, outer.key);
        expect(await redis.get(fenceKey)).toBe(String(outer.fencingToken));
        expect(t.locks.current()?.fencingToken).toBe(outer.fencingToken);
        const inner = await t.locks.lock('re');
        const tried = (await t.locks.tryLock('re')) as LockHandle;
        const nested = await t.locks.withLock('re', (h) => h.fencingToken);
        expect([inner.fencingToken, tried.fencingToken, nested]).toEqual([
          outer.fencingToken,
          outer.fencingToken,
          outer.fencingToken,
        ]);
        expect(await holdsOf(redis, outer.key)).toEqual({ [outer.owner]: '1' });
        expect(await redis.get(fenceKey)).toBe(String(outer.fencingToken)); // no token issued
        expect(await inner.release()).toBe(false);
        expect(await tried.release()).toBe(false);
      });

      const [outerToken, innerToken] = await jobs.outer('1');
      expect(innerToken).toBe(outerToken);
      expect(await redis.get(fenceKeyFor(t.prefix, `${t.prefix}nest:1`))).toBe(String(outerToken));
      const [again] = await jobs.outer('1');
      expect(again).toBeGreaterThan(outerToken);
    });

    it('after a Redis restart that lost the counter, the next token is still larger', async () => {
      const server = await ownServer();
      const t = await app({ server });
      let redis = track(server.client());
      const first = await t.locks.lock('restart');
      const fenceKey = fenceKeyFor(t.prefix, first.key);
      expect(await first.release()).toBe(true);
      expect(await redis.get(fenceKey)).toBe(String(first.fencingToken));

      await server.stop();
      await server.startProcess(); // nothing was persisted
      redis = track(server.client());
      expect(await redis.dbsize()).toBe(0);
      let second: LockHandle | null = null;
      expect(
        await eventually(async () => (second = await t.locks.tryLock('restart').catch(() => null)) !== null, 5_000, 50),
      ).toBe(true);
      const next = second as unknown as LockHandle;
      expect(next.fencingToken).toBeGreaterThan(first.fencingToken);
      expect(Number.isSafeInteger(next.fencingToken)).toBe(true);
      expect(await redis.get(fenceKey)).toBe(String(next.fencingToken));
      expect(await next.release()).toBe(true);
    });

    it('a counter ahead of the clock (e.g. after the clock stepped back) is counted on: last + 1', async () => {
      const redis = track(sharedClient());
      const t = await app();
      const fenceKey = fenceKeyFor(t.prefix, `${t.prefix}ahead`);
      const ahead = (await redisMicros(redis)) + 3_600_000_000; // one hour in the future
      await redis.set(fenceKey, String(ahead));
      const first = await t.locks.lock('ahead');
      expect(first.fencingToken).toBe(ahead + 1);
      await first.release();
      const second = await t.locks.lock('ahead');
      expect(second.fencingToken).toBe(ahead + 2);
      await second.release();
      expect(await redis.get(fenceKey)).toBe(String(ahead + 2));
      expect(Number.isSafeInteger(ahead + 2)).toBe(true);
    });

    it('names in one hash slot share one counter (one order); names in other slots have their own', async () => {
      const redis = track(sharedClient());
      const t = await app();
      const slotOf = (name: string): number => keySlot(t.prefix + name);
      // Same slot through a user hash tag, and two names without tags that happen to collide.
      const tagged = ['user:{42}:a', 'user:{42}:b', 'order:{42}'];
      const bySlot = new Map<number, string>();
      let collision: [string, string] | undefined;
      for (let i = 0; !collision; i += 1) {
        const name = `n${i}`;
        const seen = bySlot.get(slotOf(name));
        if (seen !== undefined) collision = [seen, name];
        else bySlot.set(slotOf(name), name);
      }
      for (const group of [tagged, collision]) {
        expect(new Set(group.map(slotOf)).size).toBe(1);
        const tokens: number[] = [];
        for (const name of [...group, ...group, ...group]) {
          const h = await t.locks.lock(name);
          tokens.push(h.fencingToken);
          await h.release();
        }
        expectStrictlyIncreasing(tokens);
        expect(await redis.get(fenceKeyFor(t.prefix, t.prefix + group[0]))).toBe(String(tokens[tokens.length - 1]));
      }
      // Different slots, different counters, each holding its own last token.
      const apart = ['x:1', 'x:2', 'x:3'].filter(
        (name, i, all) => all.findIndex((o) => slotOf(o) === slotOf(name)) === i,
      );
      expect(apart.length).toBeGreaterThan(1);
      const fenceKeys = apart.map((name) => fenceKeyFor(t.prefix, t.prefix + name));
      expect(new Set(fenceKeys).size).toBe(apart.length);
      for (const [i, name] of apart.entries()) {
        const h = await t.locks.lock(name);
        expect(await redis.get(fenceKeys[i])).toBe(String(h.fencingToken));
        await h.release();
      }
    });

    it('the counter key is in the lock key’s hash slot (CLUSTER KEYSLOT), for every slot and odd names', async () => {
      const dir = tempDir();
      const server = await ownServer(['--cluster-enabled', 'yes', '--cluster-config-file', join(dir, 'nodes.conf')]);
      const redis = track(server.client());
      const slots = async (keys: string[]): Promise<number[]> => {
        const pipeline = redis.pipeline();
        for (const key of keys) pipeline.call('CLUSTER', 'KEYSLOT', key);
        const replies = (await pipeline.exec()) ?? [];
        return replies.map(([err, slot]) => {
          if (err) throw err;
          return Number(slot);
        });
      };
      // slotTag(s) hashes to s, for all 16,384 slots: the counter can always be placed.
      const all = Array.from({ length: HASH_SLOTS }, (_, slot) => slot);
      expect(await slots(all.map((slot) => `{${slotTag(slot)}}`))).toEqual(all);

      const names = [
        'plain',
        'user:{42}:x',
        '{42}',
        'a{b}c{d}',
        '{}',
        '{}x',
        'x{}',
        '{}{a}',
        '{',
        '}',
        '}{a}',
        'a{',
        '{{a}}',
        'café',
        '锁:订单:{42}',
        '🔒{🔑}',
        'ключ:{тег}',
        '#fence', // not the reserved prefix '#fence:'
        'x#fence:{42}',
        'a'.repeat(512),
        ...Array.from({ length: 200 }, () => Math.random().toString(36).slice(2)),
      ];
      for (const prefix of ['dislock:', uniquePrefix(), '{app}:', 'ü:', '']) {
        const lockKeys = names.map((name) => prefix + name);
        const fenceKeys = lockKeys.map((key) => fenceKeyFor(prefix, key));
        const lockSlots = await slots(lockKeys);
        expect(lockKeys.map(keySlot)).toEqual(lockSlots);
        expect(await slots(fenceKeys)).toEqual(lockSlots);
        for (const fenceKey of fenceKeys) expect(fenceKey.startsWith(`${prefix}${FENCE_MARKER}{`)).toBe(true);
      }
    });

    // Redis Cluster reads a key's first '{...}'. A prefix whose '{' does not close a non-empty tag
    // ('app{}:', 'a{b:') would leave the counter's own '{tag}' unread, in another slot than the
    // lock: such prefixes are refused when the module is configured. Valid ones keep the slot.
    it('refuses a keyPrefix with an empty or unclosed brace; a prefix with a real hash tag keeps the counter in the lock’s slot', async () => {
      for (const keyPrefix of ['app{}:', 'a{b:', 'x{']) {
        expect(() => DisLockModule.forRoot({ redis: 'redis://127.0.0.1:1', keyPrefix })).toThrow(
          expect.objectContaining({ name: 'InvalidLockOptionsError', option: 'keyPrefix' }),
        );
      }
      const dir = tempDir();
      const server = await ownServer(['--cluster-enabled', 'yes', '--cluster-config-file', join(dir, 'nodes.conf')]);
      const redis = track(server.client());
      for (const prefix of ['{app}:', 'a}b:', 'p{q}{}:']) {
        expect(() => DisLockModule.forRoot({ redis: 'redis://127.0.0.1:1', keyPrefix: prefix })).not.toThrow();
        for (const name of ['order:1', 'x}y', 'user:{42}', '{']) {
          const key = prefix + name;
          const fenceKey = fenceKeyFor(prefix, key);
          expect(await redis.call('CLUSTER', 'KEYSLOT', fenceKey)).toBe(await redis.call('CLUSTER', 'KEYSLOT', key));
        }
      }
    });

    it('5,000 distinct names leave one counter per slot used and nothing else', async () => {
      const server = await ownServer();
      const t = await app({ server, operationTimeout: 5_000 });
      const redis = track(server.client());
      const names = Array.from({ length: 5_000 }, (_, i) => `item:${i}:${Math.random().toString(36).slice(2, 8)}`);
      for (let i = 0; i < names.length; i += 100) {
        await Promise.all(
          names.slice(i, i + 100).map(async (name) => {
            const h = await t.locks.lock(name);
            expect(await h.release()).toBe(true);
          }),
        );
      }
      const slotsUsed = new Set(names.map((name) => keySlot(t.prefix + name)));
      const keys = await redis.keys('*');
      expect(await redis.dbsize()).toBe(slotsUsed.size);
      expect(keys).toHaveLength(slotsUsed.size);
      expect(keys.length).toBeLessThanOrEqual(Math.min(5_000, HASH_SLOTS));
      expect(keys.every((key) => key.startsWith(`${t.prefix}${FENCE_MARKER}{`))).toBe(true);
      expect(new Set(keys)).toEqual(
        new Set([...slotsUsed].map((slot) => `${t.prefix}${FENCE_MARKER}{${slotTag(slot)}}`)),
      );
    });

    it('a name starting with "#fence:" is refused before Redis is touched', async () => {
      const server = await ownServer();
      const t = await app({ server });
      const monitor = track(await track(server.client()).monitor());
      const seen: string[][] = [];
      monitor.on('monitor', (_time: string, args: string[]) => {
        // Lock scripts, or anything naming a key of this app (not the clients' own handshakes).
        if (/^eval/i.test(args[0]) || args.some((arg) => arg.startsWith(t.prefix))) seen.push(args);
      });
      await sleep(50);
      const fn = vi.fn();
      const ran = vi.fn();
      const attempts = [
        t.locks.lock('#fence:x'),
        t.locks.tryLock(`${FENCE_MARKER}{abc}`),
        t.locks.withLock(FENCE_MARKER, fn),
        t.get(FaultJobs).anyName('#fence:{0}', ran),
      ];
      for (const attempt of attempts) {
        const failure: unknown = await attempt.then(
          () => 'resolved',
          (e: unknown) => e,
        );
        expect(failure).toBeInstanceOf(InvalidLockOptionsError);
        expect((failure as InvalidLockOptionsError).option).toBe('name');
      }
      expect(fn).not.toHaveBeenCalled();
      expect(ran).not.toHaveBeenCalled();
      await sleep(100);
      expect(seen).toEqual([]);

      // Control: MONITOR does see lock commands, and only the prefix is reserved.
      const h = await t.locks.lock('x#fence:');
      await h.release();
      expect(await eventually(() => seen.some((args) => args.includes(h.key)), 1_000)).toBe(true);
    });
  });

  // ---- D. the failure cases ----------------------------------------------------------

  describe('issue case 3: Redis stopped mid-hold, then started again on the same port', () => {
    it('lease-expired by the end of the lease, reported, nothing crashes; after restart no stale renewal', async () => {
      const server = await ownServer();
      const moduleHook = hook();
      const t = await app({ server, onLockLost: moduleHook });
      const redis = track(server.client());
      const h = await t.locks.lock('stopped', { lockWatchdogTimeout: 600 });
      await sleep(250); // at least one renewal went through
      const pttl = await redis.pttl(h.key);
      expect(pttl).toBeGreaterThan(0);
      await server.stop();
      const stoppedAt = performance.now();

      const reason = await abortReason(h.signal, 2_000);
      const elapsed = performance.now() - stoppedAt;
      expect(lostReason(reason)).toBe('lease-expired');
      expect(elapsed).toBeLessThan(600 + 400); // the lease in force at the stop, plus a margin
      expect(elapsed).toBeGreaterThan(pttl - 200); // not at the first failed renewal
      expectOneEvent([moduleHook], h, 'lease-expired');

      await server.startProcess();
      const fresh = track(server.client());
      // New locks work once the module's client has reconnected (and flushed what it had queued).
      expect(
        await eventually(
          async () => {
            const next = await t.locks.tryLock('after-restart').catch(() => null);
            return next !== null && (await next.release());
          },
          5_000,
          50,
        ),
      ).toBe(true);
      // From now on nothing touches the old key: MONITOR over several renewal intervals (200 ms).
      const monitor = track(await track(server.client()).monitor());
      const touched: string[][] = [];
      monitor.on('monitor', (_time: string, args: string[]) => {
        // (The EXISTS below are this test's own.)
        if (args[0].toLowerCase() === 'exists') return;
        if (args.includes(h.key) || args.includes(RENEW_SCRIPT.sha)) touched.push(args);
      });
      expect(await watch(() => fresh.exists(h.key), 700)).toEqual(['0']);
      expect(touched).toEqual([]);
      expect(await h.release()).toBe(false);
      expect(moduleHook).toHaveBeenCalledTimes(1);

      const again = await t.locks.lock('stopped', { lockWatchdogTimeout: 600 });
      expect(again.owner).not.toBe(h.owner);
      expect(again.fencingToken).toBeGreaterThan(h.fencingToken);
      expect(await holdsOf(fresh, h.key)).toEqual({ [again.owner]: '1' });
      expect(await again.release()).toBe(true);
      expect(unhandled).toEqual([]);
    });
  });

  describe('issue case 4a: Redis paused longer than the lease', () => {
    // Expiry during CLIENT PAUSE (Redis 7.0): a key whose TTL passes during the pause is not
    // deleted while paused (DBSIZE still counts it) but already reads as missing (PTTL -2) to
    // commands a WRITE pause lets through; with ALL nothing runs until the pause ends, and then the
    // key is gone. Under SIGSTOP the clock moves on the same way: expiry is an absolute time. The
    // test below assumes only that, and waits (waitTime) for the key rather than assuming when it
    // is deleted, so it holds whether the key goes at the end of the pause or at its first access.
    it.each([
      ['CLIENT PAUSE 1500 ALL (operationTimeout 300 ms)', 'client-pause', 300],
      // A renewal then waits for its answer longer than the lease: only the lease's end can tell.
      ['SIGSTOP for 1500 ms (operationTimeout 2 s, longer than the lease)', 'sigstop', 2_000],
    ] as const)(
      '%s: the holder reports lease-expired; its stale write is fenced off',
      async (_label, how, operationTimeout) => {
        const server = await ownServer();
        const keyPrefix = uniquePrefix('pause');
        const moduleHook = hook();
        const perCall = hook();
        const holderApp = await app({ server, keyPrefix, operationTimeout, onLockLost: moduleHook });
        const otherApp = await app({ server, keyPrefix, operationTimeout });
        const redis = track(server.client());
        const resource = `${keyPrefix}resource`;

        const holder = await holderApp.locks.lock('res', { lockWatchdogTimeout: 600, onLockLost: perCall });
        expect(await fencedWrite(redis, resource, holder.fencingToken, 'holder:1')).toBe(true);
        await sleep(250);
        const pausedAt = performance.now();
        if (how === 'client-pause') {
          const admin = track(server.client());
          expect(await admin.call('CLIENT', 'PAUSE', '1500', 'ALL')).toBe('OK');
        } else {
          server.pause();
          setTimeout(() => server.resume(), 1_500).unref();
        }

        const reason = await abortReason(holder.signal, 2_000);
        expect(lostReason(reason)).toBe('lease-expired');
        expect(performance.now() - pausedAt).toBeLessThan(600 + 400);
        expectOneEvent([perCall, moduleHook], holder, 'lease-expired');

        // After the pause: the holder's renewals that waited in Redis run against an expired key and
        // revive nothing (the key never shows the holder's owner id again)...
        await sleep(Math.max(0, pausedAt + 1_500 - performance.now()));
        const afterPause = await watch(() => redis.hgetall(holder.key), 300);
        expect(afterPause.filter((value) => value.includes(holder.owner))).toEqual([]);
        // ...and another owner takes the lock with a larger token and writes.
        const next = await otherApp.locks.tryLock('res', { waitTime: 3_000, lockWatchdogTimeout: 5_000 });
        expect(next).not.toBeNull();
        const other = next as LockHandle;
        expect(await holdsOf(redis, holder.key)).toEqual({ [other.owner]: '1' });
        expect(other.fencingToken).toBeGreaterThan(holder.fencingToken);
        expect(await fencedWrite(redis, resource, other.fencingToken, 'other:1')).toBe(true);

        // The stale holder writes with its old token (as one that did not look at its signal would).
        expect(await fencedWrite(redis, resource, holder.fencingToken, 'holder:2')).toBe(false);
        expect(await readResource(redis, resource)).toEqual({ value: 'other:1', token: String(other.fencingToken) });
        // Its release is owner-safe and reports nothing more.
        expect(await holder.release()).toBe(false);
        expect(await holdsOf(redis, holder.key)).toEqual({ [other.owner]: '1' });
        expect(perCall).toHaveBeenCalledTimes(1);
        expect(moduleHook).toHaveBeenCalledTimes(1);
        expect(other.signal.aborted).toBe(false);
        expect(await other.release()).toBe(true);
        expect(unhandled).toEqual([]);
      },
    );
  });

  describe('issue case 4b: the holder’s event loop blocked longer than the lease (child process)', () => {
    it('the next owner writes with a larger token; the stalled holder’s write is rejected; it reports the loss', async () => {
      const redis = track(sharedClient());
      const t = await app();
      const resumeFile = join(tempDir(), 'resume');
      const lease = 600;
      const config: StalledHolderConfig = {
        redis: sharedRedisUrl(),
        keyPrefix: t.prefix,
        name: 'stalled',
        lockWatchdogTimeout: lease,
        resource: `${t.prefix}resource`,
        minStallMs: lease + 100,
        resumeFile,
        maxStallMs: 8_000,
        noticeWithinMs: 2_000,
        deadlineMs: 20_000,
      };
      const child = spawn(process.execPath, ['-r', TS_REGISTER, STALLED_HOLDER, JSON.stringify(config)], {
        cwd: ROOT,
        stdio: ['ignore', 'pipe', 'pipe', 'ipc'],
      });
      children.push(child);
      let output = '';
      child.stdout?.on('data', (chunk: Buffer) => (output += chunk.toString()));
      child.stderr?.on('data', (chunk: Buffer) => (output += chunk.toString()));
      const inbox: StalledHolderMessage[] = [];
      child.on('message', (message: StalledHolderMessage) => inbox.push(message));
      const next = async <T extends StalledHolderMessage['type']>(
        type: T,
        ms: number,
      ): Promise<Extract<StalledHolderMessage, { type: T }>> => {
        const arrived = await eventually(() => inbox.some((m) => m.type === type || m.type === 'failed'), ms, 20);
        const message = inbox.find((m) => m.type === type);
        if (!arrived || !message) throw new Error(`the worker sent no '${type}' within ${ms} ms:\n${output}`);
        return message as Extract<StalledHolderMessage, { type: T }>;
      };

      const locked = await next('locked', 15_000);
      expect(locked.firstWriteAccepted).toBe(true);
      expect(await holdsOf(redis, locked.key)).toEqual({ [locked.owner]: '1' });
      expect(await readResource(redis, config.resource)).toEqual({
        value: 'stalled-holder:1',
        token: String(locked.token),
      });

      child.send({ type: 'stall' });
      // The stalled holder cannot renew: its key expires within one lease.
      expect(await eventually(async () => (await redis.exists(locked.key)) === 0, lease + 1_500, 20)).toBe(true);
      const mine = await t.locks.lock('stalled', { lockWatchdogTimeout: 5_000 });
      expect(mine.fencingToken).toBeGreaterThan(locked.token);
      expect(await fencedWrite(redis, config.resource, mine.fencingToken, 'parent')).toBe(true);
      writeFileSync(resumeFile, ''); // let the holder's loop run again

      const { report } = await next('report', 10_000);
      const expected: Partial<StalledHolderReport> = {
        abortedWhenWriting: false, // it could not have known before writing
        staleWriteAccepted: false, // fencing refused it
        released: false,
      };
      expect(report).toMatchObject(expected);
      expect(report.stalledMs).toBeGreaterThan(lease);
      // Noticed as soon as its loop ran: the overdue watchdog tick finds the lease past.
      expect(['lease-expired', 'not-owner']).toContain(report.lostReason);
      expect(report.noticedAfterMs).toBeLessThan(1_000);
      expect(report.events).toEqual([
        {
          name: 'stalled',
          key: locked.key,
          owner: locked.owner,
          fencingToken: locked.token,
          reason: report.lostReason,
          errorIsSignalReason: true,
        },
      ]);
      expect(await readResource(redis, config.resource)).toEqual({ value: 'parent', token: String(mine.fencingToken) });
      expect(await holdsOf(redis, mine.key)).toEqual({ [mine.owner]: '1' });
      expect(mine.signal.aborted).toBe(false);
      expect(await mine.release()).toBe(true);
      const exit = await new Promise<number | null>((done) => {
        if (child.exitCode !== null) done(child.exitCode);
        else child.once('exit', (code) => done(code));
      });
      expect(exit).toBe(0);
    }, 30_000);
  });

  describe('issue case 5: the key deleted or overwritten under a holder', () => {
    const cases: [
      string,
      (redis: Redis, key: string) => Promise<unknown>,
      (redis: Redis, key: string) => Promise<unknown>,
    ][] = [
      ['DEL', (redis, key) => redis.del(key), (redis, key) => redis.exists(key)],
      [
        'DEL then HSET by another owner',
        (redis, key) => redis.multi().del(key).hset(key, OTHER_OWNER, '1').exec(),
        async (redis, key) => [await redis.hgetall(key), await redis.pttl(key)],
      ],
      [
        'SET turning it into a string',
        (redis, key) => redis.set(key, 'not a lock'),
        async (redis, key) => [await redis.type(key), await redis.get(key), await redis.pttl(key)],
      ],
    ];

    it.each(cases)(
      '%s: not-owner within one renewal interval, and the key is left as it is',
      async (_label, change, read) => {
        const redis = track(sharedClient());
        const perCall = hook();
        const t = await app();
        const lease = 600; // renewal every 200 ms
        const h = await t.locks.lock('overwritten', { lockWatchdogTimeout: lease, onLockLost: perCall });
        await sleep(50);
        await change(redis, h.key);
        const changedAt = performance.now();
        const after = JSON.stringify(await read(redis, h.key));

        const reason = await abortReason(h.signal, 2_000);
        expect(lostReason(reason)).toBe('not-owner');
        expect(performance.now() - changedAt).toBeLessThan(lease / 3 + 400);
        expectOneEvent([perCall], h, 'not-owner');
        // Over three renewal intervals the old holder neither re-creates nor touches the key.
        expect(await watch(() => read(redis, h.key), lease)).toEqual([after]);
        expect(await h.release()).toBe(false);
        expect(JSON.stringify(await read(redis, h.key))).toBe(after);
        expect(perCall).toHaveBeenCalledTimes(1);
      },
    );
  });
});
