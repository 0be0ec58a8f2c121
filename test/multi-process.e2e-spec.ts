/**
 * Several operating-system processes, each its own Nest application with DisLockModule, on the
 * run's shared Redis (a unique key prefix per test): mutual exclusion between them, and what
 * happens to a lock whose holder is killed with SIGKILL (no release, no shutdown hook: only the
 * lease can end it). The workers are test/support/workers/*.worker.ts, run by plain `node` through
 * test/support/ts-register.js; every one still running is killed in afterEach.
 */
import type { Redis } from 'ioredis';
import type { LockHandle } from 'nestjs-dislock';
import { createTestApp, type TestApp } from './support/app';
import { sharedClient, sharedRedisUrl, sleep, uniquePrefix } from './support/shared-redis';
import { type MutualExclusionRun, runMutualExclusion } from './support/workers/mutual-exclusion';
import type { Lease } from './support/workers/protocol';
import { type Exit, type WorkerProcess, WorkerSet } from './support/workers/worker-process';
import { holdsOf } from './support/lock-hash';

const now = (): number => performance.now();

/** Starting a worker (node + Nest + ioredis) takes ~0.5-1 s of CPU; 4 at once on 2 busy cores, more. */
const START_TIMEOUT = 15_000;

describe('multiple processes on one Redis', () => {
  const workers = new WorkerSet();
  let redis: Redis;
  let app: TestApp | undefined;

  beforeAll(() => {
    redis = sharedClient();
  });

  afterEach(async () => {
    await workers.killAll();
    await app?.close();
    app = undefined;
  });

  afterAll(() => {
    redis.disconnect();
  });

  describe('mutual exclusion: 4 processes x 100 non-atomic increments (GET, sleep 1-3 ms, SET)', () => {
    const WORKERS = 4;
    const ITERATIONS = 100;

    const run = (variant: Pick<MutualExclusionRun, 'waitTime' | 'lease' | 'locked'>, iterations = ITERATIONS) =>
      runMutualExclusion(
        {
          redis: sharedRedisUrl(),
          keyPrefix: uniquePrefix('multi-process'),
          workers: WORKERS,
          iterations,
          startTimeoutMs: START_TIMEOUT,
          // ~400 critical sections of ~2-5 ms one after the other take ~2-3 s; 20 s is room for a busy machine.
          runTimeoutMs: 20_000,
          ...variant,
        },
        workers,
      );

    it('control: without @DisLock the same workers lose updates and overlap (the harness can see a race)', async () => {
      const result = await run({ waitTime: 0, lease: { expire: 3_000 }, locked: false }, 30);
      expect(result.reports.map((r) => r.increments)).toEqual([30, 30, 30, 30]);
      expect(result.maxHolders).toBeGreaterThan(1);
      expect(result.counter).toBeLessThan(result.expected);
    }, 40_000);

    it.each<[string, number, Lease]>([
      ['waitTime 10 s, watchdog lease', 10_000, { lockWatchdogTimeout: 3_000 }],
      ['waitTime 10 s, fixed expire', 10_000, { expire: 3_000 }],
      ['no waitTime (retry after LockNotAcquiredError), watchdog lease', 0, { lockWatchdogTimeout: 3_000 }],
    ])(
      '%s: the counter ends at exactly N x M and nobody shares the lock',
      async (_, waitTime, lease) => {
        const result = await run({ waitTime, lease });

        expect(result.reports.map((r) => r.increments)).toEqual(Array(WORKERS).fill(ITERATIONS));
        expect(result.counter).toBe(WORKERS * ITERATIONS);
        expect(result.maxHolders).toBe(1);
        // They did contend: several processes were calling the method at once...
        expect(result.maxCallers).toBeGreaterThan(1);
        // ... and without waitTime some calls found the lock busy and were refused.
        if (waitTime === 0) expect(result.conflicts).toBeGreaterThan(0);
        else expect(result.conflicts).toBe(0);
        // Inside the method Redis held the caller's own hold and nothing else, every time, and no
        // lock was lost on the way (a lease of 3 s against critical sections of a few ms).
        expect(result.foreign).toBe(0);
        expect(result.lost).toBe(0);
        // Afterwards: the lock is released, the gauges are back to 0, and every worker closed its
        // app and ended on its own (exit code 0; 4 would mean an open handle kept it alive).
        expect(result.lockKeyAfter).toBe(0);
        expect([result.holdersAfter, result.callersAfter]).toEqual([0, 0]);
        expect(result.exits).toEqual(Array(WORKERS).fill({ code: 0, signal: null }));
      },
      40_000,
    );
  });

  describe('a holder killed with SIGKILL: the lock stays taken until its lease ends, then is free', () => {
    const NAME = 'job';

    /** A holder worker that has taken `NAME` with `lease`, and a parent app on the same prefix. */
    async function startHolder(lease: Lease) {
      const prefix = uniquePrefix('crash');
      app = await createTestApp([], { keyPrefix: prefix });
      const holder = workers.start('holder', {
        redis: sharedRedisUrl(),
        keyPrefix: prefix,
        name: NAME,
        lease,
        deadlineMs: 30_000,
      });
      const { key, owner } = await holder.next('locked', START_TIMEOUT);
      const lockedAt = now();
      expect(key).toBe(`${prefix}${NAME}`);
      expect(await holdsOf(redis, key)).toEqual({ [owner]: '1' });
      return { holder, key, owner, lockedAt, locks: app.locks };
    }

    /**
     * SIGKILL the holder and read what is left of its lease. The key expires at some `end` with
     * `t0 + pttl <= end <= t1 + pttl + 1` (PTTL is read between t0 and t1, in whole ms).
     */
    async function kill(holder: WorkerProcess, key: string) {
      const killAt = now();
      const exit: Exit = await holder.kill();
      const exitAt = now();
      // Bytes the holder wrote just before dying (a renewal) still reach Redis; let them land
      // before reading the lease, so that the reading is the final one.
      await sleep(20);
      const t0 = now();
      const pttl = await redis.pttl(key);
      const t1 = now();
      expect(exit).toEqual({ code: null, signal: 'SIGKILL' });
      expect(pttl).toBeGreaterThan(0);
      return { killAt, exitAt, earliestEnd: t0 + pttl, latestEnd: t1 + pttl + 1 };
    }

    /** Polls with tryLock every 10 ms until it gets the lock (for 10 s at most). */
    async function poll(locks: TestApp['locks']) {
      let refusals = 0;
      for (const deadline = now() + 10_000; now() < deadline;) {
        const handle = await locks.tryLock(NAME, { expire: 5_000 });
        const at = now();
        if (handle) return { handle, at, refusals };
        refusals++;
        await sleep(10);
      }
      throw new Error(`tryLock refused for 10 s (${refusals} times)`);
    }

    /** Waits in `lock()` (waitTime 10 s) and reports when it got the lock. */
    async function wait(locks: TestApp['locks']) {
      const handle = await locks.lock(NAME, { expire: 5_000, waitTime: 10_000 });
      return { handle, at: now(), refusals: undefined };
    }

    /**
     * The observer got the lock only once the dead holder's lease had ended, and soon after, and
     * Redis now holds the observer's hold alone.
     */
    async function expectTakenAtLeaseEnd(
      got: { handle: LockHandle; at: number },
      lease: { earliestEnd: number; latestEnd: number },
      deadOwner: string,
      key: string,
    ) {
      // Never before the lease ended. 10 ms: PTTL is in whole ms, and Redis's clock and ours may
      // drift apart by a ms or two over the test; nothing else can make it earlier.
      expect(got.at).toBeGreaterThanOrEqual(lease.earliestEnd - 10);
      // Soon after it. 250 ms: the poll period (10 ms) or the waiter's back-off (it should never
      // sleep past the remaining lease), a round trip, and scheduling delays on a busy 2-core machine.
      expect(got.at).toBeLessThanOrEqual(lease.latestEnd + 250);
      expect(got.handle.owner).not.toBe(deadOwner);
      expect(await holdsOf(redis, key)).toEqual({ [got.handle.owner]: '1' });
      expect(await got.handle.release()).toBe(true);
      expect(await redis.exists(key)).toBe(0);
    }

    describe.each([
      ['polling with tryLock', poll],
      ['waiting in lock({ waitTime })', wait],
    ])('observer %s', (_, observe) => {
      it('fixed expire 800 ms: free at the end of the original lease, not before', async () => {
        const LEASE = 800;
        const { holder, key, owner, lockedAt, locks } = await startHolder({ expire: LEASE });
        const observed = observe(locks);
        observed.catch(() => undefined); // awaited below; handled here if an assertion fails first
        await sleep(300);
        const lease = await kill(holder, key);

        // A fixed lease is never extended: it ends no later than LEASE after the 'locked' message
        // (the lock was taken before the message was sent; 10 ms for PTTL rounding)...
        expect(lease.earliestEnd).toBeLessThanOrEqual(lockedAt + LEASE + 10);
        // ... and it is the configured lease: it started at most 300 ms before the message
        // reached us (one IPC hop from a child on a busy machine).
        expect(lease.latestEnd).toBeGreaterThanOrEqual(lockedAt + LEASE - 300);

        const got = await observed;
        await expectTakenAtLeaseEnd(got, lease, owner, key);
        expect(got.at).toBeLessThanOrEqual(lockedAt + LEASE + 250);
        if (got.refusals !== undefined) expect(got.refusals).toBeGreaterThan(0);
      }, 30_000);

      it('watchdog 600 ms (renewed every 200 ms): kept alive past its lease while the holder lives, free one lease after the kill', async () => {
        const LEASE = 600;
        const INTERVAL = LEASE / 3;
        const { holder, key, owner, lockedAt, locks } = await startHolder({ lockWatchdogTimeout: LEASE });
        const observed = observe(locks);
        observed.catch(() => undefined); // awaited below; handled here if an assertion fails first

        // Watch the lease: each renewal sets PTTL back up to 600. Wait for 3 renewals and until the
        // lock has outlived its first lease (plus 100 ms), so its existence proves the renewals.
        let renewals = 0;
        let last = await redis.pttl(key);
        const deadline = now() + 5_000;
        while ((renewals < 3 || now() - lockedAt < LEASE + 100) && now() < deadline) {
          await sleep(20);
          const pttl = await redis.pttl(key);
          if (pttl > last) renewals++;
          last = pttl;
        }
        expect(renewals).toBeGreaterThanOrEqual(3);
        expect(now() - lockedAt).toBeGreaterThan(LEASE);
        expect(await holdsOf(redis, key)).toEqual({ [owner]: '1' });

        const lease = await kill(holder, key);
        // The last renewal left a lease of LEASE, at most one interval before the kill. 100 ms: a
        // renewal tick that fired late on a busy machine.
        expect(lease.earliestEnd).toBeGreaterThanOrEqual(lease.killAt + LEASE - INTERVAL - 100);
        // No renewal sets more than LEASE, and none happens after the process is gone.
        expect(lease.earliestEnd).toBeLessThanOrEqual(lease.exitAt + LEASE + 10);

        const got = await observed;
        await expectTakenAtLeaseEnd(got, lease, owner, key);
        expect(got.at).toBeLessThanOrEqual(lease.exitAt + LEASE + 250);
        if (got.refusals !== undefined) expect(got.refusals).toBeGreaterThan(0);
      }, 30_000);
    });
  });
});
