import { monitorEventLoopDelay } from 'node:perf_hooks';
import type { Redis } from 'ioredis';
import type { LockHandle } from 'nestjs-dislock';
import { cpuMicros, hr, sleep, sleepUntil } from '../support/clock';
import { countingClient, infoDelta, infoSnapshot, perCommand, plainClient, ready } from '../support/redis';
import type { CellSpec, Metrics } from '../support/protocol';
import type { CellRun } from './cell-run';

/** Lease kept alive by each contender's own renewal. */
export const RENEWAL_LEASE_MS = 3_000;
/**
 * dislock-fixed: a fixed lease that outlasts the window (acquisition and 10 s), checked every
 * third of it (5 s): two checks per lock in the full window, none in the quick one.
 */
export const FIXED_LEASE_MS = 15_000;
const ACQUIRE_CONCURRENCY = 256;
/** Sampling interval of the event-loop delay histogram. */
const ELD_RESOLUTION_MS = 1;

/** Lease of the warm-up lock: renewed after 100 ms (nestjs-dislock) or 240 ms (redis-semaphore). */
const WARM_LEASE_MS = 300;
const ACQUIRE_TIMEOUT_MS = 60_000;

/** The locks of one contender, held until `releaseAll`. */
interface Holder {
  /**
   * Take one lock with a short lease and hold it through a renewal or two, so that Redis has every
   * script of the contender cached before the window (the first call of a script on a server is a
   * NOSCRIPT error and a retry with EVAL).
   */
  warm(): Promise<void>;
  /** Take lock `i`; false if it was not taken. */
  acquire(i: number): Promise<boolean>;
  /** The Redis key of lock `i`. */
  key(i: number): string;
  /** Locks the contender itself noticed as lost so far. */
  lost(): number;
  releaseAll(): Promise<void>;
  sent(): number;
  warnings(): number;
  close(): Promise<void>;
}

async function dislockHolder(redisUrl: string, fixed: boolean): Promise<Holder> {
  const { startDislockApp } = await import('../contenders/nest-app.js');
  const { client, sent } = countingClient(redisUrl, `bench-dislock-${process.pid}`);
  await ready(client);
  const { app, locks, logger } = await startDislockApp({ redis: client, lockWatchdogTimeout: RENEWAL_LEASE_MS });
  const handles: LockHandle[] = [];
  return {
    async warm() {
      const handle = await locks.lock('warm-up', { lockWatchdogTimeout: WARM_LEASE_MS });
      await sleep(WARM_LEASE_MS);
      await handle.release();
    },
    async acquire(i) {
      // No expire: the watchdog renews every 1 s. Fixed: checked every 5 s, never extended.
      const handle = await locks.tryLock(`r:${i}`, fixed ? { expire: FIXED_LEASE_MS } : {});
      if (handle) handles[i] = handle;
      return handle !== null;
    },
    key: (i) => handles[i]?.key ?? `dislock:r:${i}`,
    lost: () => handles.filter((handle) => handle.signal.aborted).length,
    async releaseAll() {
      await inBatches(handles.length, (i) => handles[i]?.release());
    },
    sent,
    warnings: () => logger.warnings,
    async close() {
      await app.close();
      await client.quit();
    },
  };
}

async function semaphoreHolder(redisUrl: string): Promise<Holder> {
  const { Mutex } = await import('redis-semaphore');
  const { client, sent } = countingClient(redisUrl, `bench-semaphore-${process.pid}`);
  await ready(client);
  let lost = 0;
  const mutexes: InstanceType<typeof Mutex>[] = [];
  return {
    async warm() {
      const mutex = new Mutex(client, 'warm-up', { lockTimeout: WARM_LEASE_MS });
      await mutex.acquire();
      await sleep(WARM_LEASE_MS);
      await mutex.release();
    },
    async acquire(i) {
      // refreshInterval left at its default, 0.8 x lockTimeout = 2400 ms.
      const mutex = new Mutex(client, `r:${i}`, {
        lockTimeout: RENEWAL_LEASE_MS,
        acquireAttemptsLimit: 1,
        onLockLost: () => void (lost += 1),
      });
      if (!(await mutex.tryAcquire())) return false;
      mutexes[i] = mutex;
      return true;
    },
    key: (i) => `mutex:r:${i}`, // redis-semaphore's documented key format
    lost: () => lost,
    async releaseAll() {
      await inBatches(mutexes.length, (i) => mutexes[i]?.release());
    },
    sent,
    warnings: () => 0,
    async close() {
      await client.quit();
    },
  };
}

/** Runs `task(0 .. count-1)` with at most ACQUIRE_CONCURRENCY at once. */
async function inBatches(count: number, task: (i: number) => Promise<unknown> | undefined): Promise<void> {
  let next = 0;
  const deadline = hr() + ACQUIRE_TIMEOUT_MS;
  const lane = async (): Promise<void> => {
    while (next < count) {
      if (hr() > deadline) throw new Error(`not done within ${ACQUIRE_TIMEOUT_MS} ms`);
      await task(next++);
    }
  };
  await Promise.all(Array.from({ length: Math.min(ACQUIRE_CONCURRENCY, count) }, lane));
}

/** Keys among `keys` that still exist with a lease left (PTTL > 0), checked in pipelines of 1000. */
async function aliveCount(admin: Redis, keys: readonly string[]): Promise<number> {
  let alive = 0;
  for (let i = 0; i < keys.length; i += 1000) {
    const pipeline = admin.pipeline();
    for (const key of keys.slice(i, i + 1000)) pipeline.pttl(key);
    for (const [error, ttl] of (await pipeline.exec()) ?? []) if (!error && Number(ttl) > 0) alive += 1;
  }
  return alive;
}

export interface RenewalPart {
  readonly metrics: Metrics;
}

/**
 * `spec.locks` locks taken by one process, then held for `spec.measureMs` while the contender's
 * own renewal keeps them alive: what that costs Redis and the process.
 */
export async function setupRenewal(spec: CellSpec, _rank: number, redisUrl: string): Promise<CellRun> {
  const holder =
    spec.contender === 'redis-semaphore'
      ? await semaphoreHolder(redisUrl)
      : await dislockHolder(redisUrl, spec.contender === 'dislock-fixed');
  await holder.warm();
  const admin = plainClient(redisUrl, `bench-admin-${process.pid}`);
  await ready(admin);
  return {
    async go(t0: number): Promise<RenewalPart> {
      await sleepUntil(t0);
      const acquireStart = hr();
      let notTaken = 0;
      await inBatches(spec.locks, async (i) => {
        if (!(await holder.acquire(i))) notTaken += 1;
      });
      const acquireMs = hr() - acquireStart;

      // The histogram records each timer interval, the resolution included: lag = value - resolution.
      const delay = monitorEventLoopDelay({ resolution: ELD_RESOLUTION_MS });
      let rss = process.memoryUsage.rss();
      const rssTimer = setInterval(() => (rss = Math.max(rss, process.memoryUsage.rss())), 200);
      const cpu = cpuMicros();
      const sent = holder.sent();
      const info = await infoSnapshot(admin);
      const started = hr();
      delay.enable();
      await sleep(spec.measureMs);
      delay.disable();
      const cpuUs = cpuMicros() - cpu;
      const sentInWindow = holder.sent() - sent;
      const wallMs = hr() - started;
      const redis = infoDelta(info, await infoSnapshot(admin));
      clearInterval(rssTimer);
      rss = Math.max(rss, process.memoryUsage.rss());

      const keys = Array.from({ length: spec.locks }, (_, i) => holder.key(i));
      const alive = await aliveCount(admin, keys);
      const lost = holder.lost();
      const releaseStart = hr();
      await holder.releaseAll();
      const releaseMs = hr() - releaseStart;
      const seconds = redis.ms / 1000;
      return {
        metrics: {
          locks: spec.locks,
          redisCallsPerSec: redis.totalCalls / seconds,
          roundTripsPerSec: sentInWindow / (wallMs / 1000),
          redisCpuPct: (100 * redis.redisCpuMs) / redis.ms,
          nodeCpuPct: (100 * cpuUs) / 1000 / wallMs,
          rssMb: rss / 2 ** 20,
          eldP99Ms: Math.max(0, delay.percentile(99) / 1e6 - ELD_RESOLUTION_MS),
          eldMaxMs: Math.max(0, delay.max / 1e6 - ELD_RESOLUTION_MS),
          alive,
          lost,
          notTaken,
          acquireMs,
          releaseMs,
          warnings: holder.warnings(),
          ...perCommand(redis, seconds),
        },
      };
    },
    async close() {
      await holder.close();
      await admin.quit();
    },
  };
}

export function renewalMetrics(parts: readonly RenewalPart[]): Metrics {
  return parts[0].metrics;
}
