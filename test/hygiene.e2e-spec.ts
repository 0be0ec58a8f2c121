/**
 * Hygiene: what the library leaves behind. After `app.close()` no timer, socket or pending work
 * (seen from a child process of its own); no memory that grows with the number of distinct lock
 * names; and, after thousands of acquire/release cycles racing with renewals, no key and no
 * renewal left in Redis.
 */
import { Logger } from '@nestjs/common';
import type { Redis } from 'ioredis';
import { DisLockError, LockNotAcquiredError } from 'nestjs-dislock';
import { createTestApp, type TestApp } from './support/app';
import { RedisServer } from './support/redis-server';
import { eventually, sleep, uniquePrefix } from './support/shared-redis';
import { WorkerChild } from './support/workers/hostile-child-process';
import { RENEW_SCRIPT } from '../lib/store/redis/scripts/renew.script';
import type { LiveResource } from './support/workers/hygiene-worker';

const WORKER = 'hygiene-worker.ts';

/** What may stay under a prefix once every lock is released: fencing counters, one per hash slot at most. */
/** A slot's fencing counter, or the data set's marker (see EPOCH_SCRIPT): the keys that stay. */
const FENCE_KEY = /#fence:(epoch)?(\{[^}]+\})?$/;
const HASH_SLOTS = 16_384;

/** Every key under `prefix` (SCAN, not KEYS). */
async function keysUnder(redis: Redis, prefix: string): Promise<string[]> {
  const keys: string[] = [];
  let cursor = '0';
  do {
    const [nextCursor, batch] = await redis.scan(cursor, 'MATCH', `${prefix}*`, 'COUNT', 1_000);
    cursor = nextCursor;
    keys.push(...batch);
  } while (cursor !== '0');
  return keys;
}

/** Only fencing counters are left under `prefix`, and no more of them than there are hash slots. */
async function expectOnlyFenceKeys(redis: Redis, prefix: string): Promise<number> {
  const keys = await keysUnder(redis, prefix);
  expect(keys.filter((key) => !FENCE_KEY.test(key))).toEqual([]);
  expect(keys.length).toBeLessThanOrEqual(HASH_SLOTS);
  return keys.length;
}

describe('hygiene', () => {
  let server: RedisServer | undefined;
  let worker: WorkerChild | undefined;
  let app: TestApp | undefined;
  const clients: Redis[] = [];
  const warn = vi.spyOn(Logger.prototype, 'warn').mockImplementation(() => undefined);

  afterEach(async () => {
    await app?.close();
    app = undefined;
    await worker?.kill();
    worker = undefined;
    for (const client of clients.splice(0)) client.disconnect();
    await server?.dispose();
    server = undefined;
  });

  afterAll(() => warn.mockRestore());

  it('after app.close() no timer, socket or pending work is left, and the process exits by itself', async () => {
    server = await RedisServer.start();
    const keyPrefix = uniquePrefix('hygiene');
    worker = new WorkerChild(WORKER, { mode: 'handles', redis: server.url, keyPrefix });
    const closed = await worker.next('closed', 20_000);
    const closedAt = performance.now();

    // The scenario ran as intended: renewals, fixed leases, a waiter served, locks held at close.
    expect(closed.outcomes).toEqual({
      w1: true, // held across renewals (lease 300 ms, held 250 ms)
      withLock: 'inside',
      w2: true,
      f1: true,
      fixed: 'fixed a',
      job: 'done a',
      busy: true,
      waiterGotIt: true,
      waiterReleased: true,
      // Waiting for a busy lock when the application closed: the wait ends without the lock.
      pendingWaiter: expect.not.stringMatching(/^acquired$/),
      decoratedAtClose: 'done at-close',
      signals: [true, true, true], // held at close: aborted (reason: shutdown)
    });
    // The instruments see what there is to see: before close, the Redis socket(s) keep the process
    // alive, and async_hooks also sees the watchdog's unref'd timer.
    const before = closed.before as { active: string[]; live: string[] };
    expect(before.active).toContain('TCPSocketWrap');
    expect(before.live).toEqual(expect.arrayContaining(['TCPWRAP', 'Timeout']));

    // After close: nothing keeps the process alive but its own stdio (as before the app started),
    // and no timer or socket created since (unref'd ones included) is still alive.
    expect((closed.baseline as string[]).every((type) => type === 'PipeWrap')).toBe(true);
    expect(closed.after).toEqual(closed.baseline);
    const live = closed.live as LiveResource[];
    expect(live.map((r) => `${r.type}\n${r.stack}`)).toEqual([]);
    expect(closed.logs).toEqual([]); // no failed release, no lost lock

    await worker.expectCleanExit(closedAt);

    const redis = server.client();
    clients.push(redis);
    await expectOnlyFenceKeys(redis, keyPrefix); // the locks held at close were released
  });

  // Guards a fixed bug (lib/service/wait-line.ts, WaitLine.wait() returned on `stop.signal.aborted` right
  // after `await queue.watch` without checking for shutdown): a waiter whose SUBSCRIBE is still on its way when app.close() begins
  // has its wait aborted by beforeApplicationShutdown and returns `null` without checking
  // `closing`. tryLock then resolves null ("busy") and lock() / @DisLock reject with
  // LockNotAcquiredError (409 "held by another owner") although the application is shutting
  // down; README: pending waits "fail with a DisLockError (not a 409 ...)". Closing 0-2 ms after
  // the wait starts hits it most of the time.
  it('a wait on a busy lock that app.close() interrupts fails with the shutdown DisLockError, never "busy"', async () => {
    const outcomes: string[] = [];
    for (let trial = 0; trial < 12; trial += 1) {
      const t = await createTestApp([], { lockWatchdogTimeout: 5_000 });
      await t.locks.lock('blocked');
      const waiting =
        trial % 2 === 0
          ? t.locks.tryLock('blocked', { waitTime: 10_000 })
          : t.locks.lock('blocked', { waitTime: 10_000 });
      const outcome = waiting.then(
        (handle) => (handle ? 'acquired' : 'resolved null'),
        (error: unknown) =>
          error instanceof LockNotAcquiredError
            ? 'LockNotAcquiredError'
            : error instanceof DisLockError
              ? 'DisLockError'
              : `other: ${String(error)}`,
      );
      await sleep(trial % 3);
      await t.close();
      outcomes.push(`${trial % 2 === 0 ? 'tryLock' : 'lock'} closed after ${trial % 3} ms: ${await outcome}`);
    }
    expect(outcomes.filter((o) => !o.endsWith(': DisLockError'))).toEqual([]);
  });

  it('memory stays flat across 30,000 distinct lock names; only fencing counters stay in Redis', async () => {
    server = await RedisServer.start();
    const keyPrefix = uniquePrefix('memory');
    // 30,000 names, not 100,000: the bound below still catches anything kept per name (the
    // 100,000 took 34 s of CI on a loaded machine; these take a third of it).
    const total = 30_000;
    worker = new WorkerChild(
      WORKER,
      { mode: 'memory', redis: server.url, keyPrefix, total, concurrency: 64, samples: [5_000, total] },
      { nodeArgs: ['--expose-gc'] },
    );
    const closed = await worker.next('closed', 50_000);
    const samples = closed.samples as { names: number; heapUsed: number; ms: number }[];
    expect(samples.map((s) => s.names)).toEqual([5_000, total]);
    const growth = samples[1].heapUsed - samples[0].heapUsed;
    // 25,000 more names went through between the samples (heapUsed after two gc() each). Keeping
    // anything per name costs more than 42 bytes: a Set of the lock keys alone measures ~80 bytes
    // per name here (2 MB for these); measured growth without a leak is 0.05-0.15 MB.
    expect(growth).toBeLessThan(1024 * 1024);
    // Runtime: ~11 s for 100,000 names on a busy 2-core machine, so ~3.5 s for these. Wide on
    // purpose: it catches a per-name cost that grows with the names seen, not a slow machine.
    expect(closed.elapsedMs).toBeLessThan(20_000);
    expect(await worker.exitWithin(2_000)).toMatchObject({ code: 0 });

    const redis = server.client();
    clients.push(redis);
    await expectOnlyFenceKeys(redis, keyPrefix);
  }, 60_000);

  it('3,000 acquire/release cycles racing with renewals: no key, no renewal, no script call left after release', async () => {
    server = await RedisServer.start();
    const LEASE = 45; // lockWatchdogTimeout: renewals every 15 ms
    const KEYS = 6;
    const CYCLES = 3_000;
    const LANES = 32;

    const base = server.client();
    const markers = server.client();
    const redis = server.client();
    clients.push(base, markers, redis);
    const monitor = await base.monitor();
    clients.push(monitor);
    const lines: string[][] = [];
    monitor.on('monitor', (_time: string, args: string[]) => void lines.push(args));
    const isScriptCall = (args: string[]): boolean =>
      /^(eval|evalsha|eval_ro|evalsha_ro|fcall|fcall_ro)$/i.test(args[0]);
    const markerAt = (text: string): number => lines.findIndex((args) => args[0] === 'echo' && args[1] === text);

    app = await createTestApp([], { redis: server.url, lockWatchdogTimeout: LEASE, operationTimeout: 2_000 });
    const t = app;
    const key = (k: number): string => `${t.prefix}race:${k}`;

    // Renewals really happen at this lease, and MONITOR sees them: a lock held alone is renewed
    // again and again (waited for, not slept on: a busy machine may run its timers late).
    const isRenewal = (args: string[]): boolean =>
      (/^evalsha$/i.test(args[0]) && args[1] === RENEW_SCRIPT.sha) ||
      (/^eval$/i.test(args[0]) && args[1] === RENEW_SCRIPT.source);
    const alone = await t.locks.lock('alone');
    const aloneFrom = lines.length;
    const renewalsOfAlone = (): number =>
      lines.slice(aloneFrom).filter((args) => isRenewal(args) && args.includes(`${t.prefix}alone`)).length;
    // (A stall past the 45 ms lease loses it, as in the race below: then the renewals seen so far count.)
    expect(await eventually(() => renewalsOfAlone() >= 3 || alone.signal.aborted, 10 * 1_000)).toBe(true);
    expect(renewalsOfAlone()).toBeGreaterThanOrEqual(1);
    await alone.release();

    // Key k is used only in the first (KEYS + k + 1) / (2 KEYS) of the run (key 0 in the first
    // 58 %, the last key to the end), so keys finish one after another while the others run on.
    const plan = Array.from({ length: CYCLES }, (_, i) => {
      const first = Math.max(0, Math.floor((i * 2 * KEYS) / CYCLES) - KEYS);
      return first + Math.floor(Math.random() * (KEYS - first));
    });
    const left = new Array<number>(KEYS).fill(0);
    for (const k of plan) left[k] += 1;
    const stats = { held: 0, busy: 0, lost: 0, reentered: 0 };
    const hold = (): number => (Math.random() < 0.1 ? 30 + Math.random() * 30 : Math.random() * 15);

    const cycle = async (k: number): Promise<void> => {
      const name = `race:${k}`;
      if (Math.random() < 0.25) {
        // withLock with a nested, reentrant acquisition inside.
        try {
          await t.locks.withLock(
            name,
            async () => {
              await sleep(hold());
              await t.locks.withLock(name, () => sleep(Math.random() * 5));
              stats.reentered += 1;
            },
            { waitTime: 100 },
          );
          stats.held += 1;
        } catch (error) {
          if (!(error instanceof LockNotAcquiredError)) throw error;
          stats.busy += 1;
        }
        return;
      }
      const handle = await t.locks.tryLock(name, { waitTime: Math.random() < 0.4 ? 0 : 100 });
      if (!handle) {
        stats.busy += 1;
        return;
      }
      stats.held += 1;
      await sleep(hold());
      if (!(await handle.release())) stats.lost += 1; // lease ran out under load: legal, counted
    };

    let next = 0;
    const started = performance.now();
    await Promise.all(
      Array.from({ length: LANES }, async () => {
        while (next < CYCLES) {
          const k = plan[next];
          next += 1;
          await cycle(k);
          left[k] -= 1;
          // The last cycle on key k is over: mark the spot in MONITOR's stream.
          if (left[k] === 0) await markers.echo(`done:${key(k)}`);
        }
      }),
    );
    const elapsed = performance.now() - started;

    await markers.echo('all-released');
    await sleep(3 * LEASE); // 9 renewal intervals: any renewal still scheduled would have gone out
    await markers.echo('end');
    expect(await eventually(() => markerAt('end') !== -1, 2_000)).toBe(true);

    // The race was real: many locks taken, many refused, reentrant holds, and the long holds renewed.
    expect(stats.held + stats.busy).toBe(CYCLES);
    // (How many are held against refused moves with the machine's load: a third on a quiet one, but
    // a busy CI run has seen 959 of 3,000. A tenth still shows a real race.)
    expect(stats.held).toBeGreaterThan(CYCLES / 10);
    expect(stats.busy).toBeGreaterThan(0);
    expect(stats.reentered).toBeGreaterThan(0);
    expect(lines.filter(isScriptCall).length).toBeGreaterThan(CYCLES);
    expect(stats.lost).toBeLessThan(stats.held / 10);

    // Nothing at all runs a script once everything was released: no renewal, no retry.
    const allReleased = markerAt('all-released');
    expect(allReleased).toBeGreaterThan(-1);
    expect(lines.slice(allReleased).filter(isScriptCall)).toEqual([]);
    // And per key: no script call names key k after its last cycle ended, while the others ran on.
    for (let k = 0; k < KEYS; k += 1) {
      const done = markerAt(`done:${key(k)}`);
      expect(done).toBeGreaterThan(-1);
      const after = lines.slice(done).filter((args) => isScriptCall(args) && args.includes(key(k)));
      expect({ key: key(k), after }).toEqual({ key: key(k), after: [] });
    }
    // The per-key checks had teeth: the first key finished well before the end.
    expect(markerAt(`done:${key(0)}`)).toBeLessThan(allReleased * 0.8);

    await expectOnlyFenceKeys(redis, t.prefix);
    expect(elapsed).toBeLessThan(30_000);
  }, 60_000);
});
