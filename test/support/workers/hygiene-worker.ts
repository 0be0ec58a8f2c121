/**
 * Child process of test/hygiene.e2e-spec.ts: a process of its own, so that nothing of other tests
 * (the test runner's own handles, other suites' clients) blurs what the library leaves behind.
 *
 *   node [--expose-gc] -r ./test/support/ts-register.js test/support/workers/hygiene-worker.ts '<json>'
 *
 * - `handles`: watchdog locks (renewals firing), fixed leases, a waiter that gets a busy lock, a
 *   waiter still waiting at close, a decorated method, locks still held at close; then
 *   `app.close()`, and a report of what is still alive: `process.getActiveResourcesInfo()` (what
 *   keeps the process alive) and, through async_hooks, every timer or socket created and not yet
 *   destroyed (unref'd timers included, which getActiveResourcesInfo does not list).
 * - `memory`: acquire and release `total` distinct names, `concurrency` at a time; heapUsed after
 *   gc() at each sample point.
 *
 * Reports on stdout, one JSON object per line prefixed with `@@`; never calls process.exit.
 */
import 'reflect-metadata';
import { report, reportExit } from './child-report';
import { createHook } from 'node:async_hooks';
import { Injectable, type LoggerService, Module } from '@nestjs/common';
import { NestFactory } from '@nestjs/core';
import { DisLock, DisLockModule, LockService } from 'nestjs-dislock';

export type HygieneWorkerConfig =
  | { mode: 'handles'; redis: string; keyPrefix: string }
  | { mode: 'memory'; redis: string; keyPrefix: string; total: number; concurrency: number; samples: number[] };

/** A timer or socket created and not yet destroyed. */
export interface LiveResource {
  type: string;
  stack: string;
}

const config = JSON.parse(process.argv[2] ?? '{}') as HygieneWorkerConfig;

reportExit();

// ---- what is alive ----------------------------------------------------------------------------

const TRACKED = new Set(['Timeout', 'Immediate', 'TCPWRAP', 'TCPCONNECTWRAP', 'TLSWRAP', 'PIPEWRAP', 'PROCESSWRAP']);
/** Where each was created: an Error whose stack is formatted only if the resource outlives the close (formatting through source maps is slow). */
const live = new Map<number, { type: string; origin: Error }>();
const hook = createHook({
  init(asyncId, type) {
    if (TRACKED.has(type)) live.set(asyncId, { type, origin: new Error() });
  },
  destroy(asyncId) {
    live.delete(asyncId);
  },
});

/** Live tracked resources, with where they were created. */
const liveResources = (): LiveResource[] =>
  [...live.values()].map(({ type, origin }) => ({
    type,
    stack: (origin.stack ?? '').split('\n').slice(4, 14).join('\n'),
  }));
const liveTypes = (): string[] => [...live.values()].map(({ type }) => type);

const tick = (): Promise<void> => new Promise((resolve) => setImmediate(resolve));
const sleep = (ms: number): Promise<void> => new Promise((resolve) => setTimeout(resolve, ms));

const logs: string[] = [];
const logger: LoggerService = {
  log: () => undefined,
  warn: (message: unknown) => void logs.push(`warn ${String(message)}`),
  error: (message: unknown) => void logs.push(`error ${String(message)}`),
};

@Injectable()
class Jobs {
  @DisLock({ key: 'job:{0}', lockWatchdogTimeout: 300 })
  async run(id: string, ms: number): Promise<string> {
    await sleep(ms);
    return `done ${id}`;
  }

  @DisLock({ key: 'fixed:{0}', expire: 2_000 })
  async fixed(id: string): Promise<string> {
    return `fixed ${id}`;
  }
}

async function handles(locks: LockService, jobs: Jobs): Promise<{ outcomes: Record<string, unknown> }> {
  const outcomes: Record<string, unknown> = {};
  // Watchdog locks with a short lease: renewals fire every 100 ms while they are held.
  const w1 = await locks.lock('w1', { lockWatchdogTimeout: 300 });
  const w2 = await locks.lock('w2', { lockWatchdogTimeout: 300 });
  await sleep(250); // two renewals
  outcomes.w1 = await w1.release();
  outcomes.withLock = await locks.withLock('w3', async () => sleep(150).then(() => 'inside'), {
    lockWatchdogTimeout: 300,
  });
  outcomes.w2 = await w2.release();
  // Fixed leases: a timer for the end of each lease.
  const f1 = await locks.lock('f1', { expire: 3_000 });
  outcomes.f1 = await f1.release();
  outcomes.fixed = await jobs.fixed('a');
  outcomes.job = await jobs.run('a', 150);
  // A waiter that gets the lock once its holder lets go.
  const busy = await locks.lock('busy', { lockWatchdogTimeout: 300 });
  const waiter = locks.tryLock('busy', { waitTime: 3_000, lockWatchdogTimeout: 300 });
  await sleep(150);
  outcomes.busy = await busy.release();
  const got = await waiter;
  outcomes.waiterGotIt = got !== null;
  outcomes.waiterReleased = await got?.release();
  return { outcomes };
}

async function main(): Promise<void> {
  // The process's own stdio (pipes when spawned by the test) is there before and after: open it
  // now, so that it is part of the baseline whoever writes to it first.
  void process.stdout;
  void process.stderr;
  const baseline = process.getActiveResourcesInfo();
  if (config.mode === 'handles') hook.enable();

  @Module({
    imports: [DisLockModule.forRoot({ redis: config.redis, keyPrefix: config.keyPrefix, operationTimeout: 2_000 })],
    providers: [Jobs],
  })
  class WorkerModule {}

  const app = await NestFactory.createApplicationContext(WorkerModule, { logger });
  const locks = app.get(LockService);

  if (config.mode === 'handles') {
    const { outcomes } = await handles(locks, app.get(Jobs));
    // Still held or waiting when the application closes.
    const heldWatchdog = await locks.lock('held-at-close', { lockWatchdogTimeout: 300 });
    const heldFixed = await locks.lock('fixed-at-close', { expire: 5_000 });
    const blocker = await locks.lock('blocked', { lockWatchdogTimeout: 5_000 });
    const pendingWaiter = locks.tryLock('blocked', { waitTime: 10_000 }).then(
      (handle) => (handle ? 'acquired' : 'null'),
      (error: unknown) => `rejected: ${error instanceof Error ? error.constructor.name : String(error)}`,
    );
    const decoratedAtClose = app
      .get(Jobs)
      .run('at-close', 300)
      .then(
        (value) => value,
        (error: unknown) => `rejected: ${String(error)}`,
      );
    await sleep(150); // renewals and waits are under way
    const before = { active: process.getActiveResourcesInfo(), live: liveTypes() };

    await app.close();
    const closedAt = performance.now();
    outcomes.pendingWaiter = await pendingWaiter;
    outcomes.decoratedAtClose = await decoratedAtClose;
    outcomes.signals = [heldWatchdog, heldFixed, blocker].map((h) => h.signal.aborted);
    const atClose = process.getActiveResourcesInfo();
    // Let closing sockets finish closing (a destroyed socket's handle closes on a later tick).
    for (let i = 0; i < 3; i += 1) await tick();
    hook.disable();
    report('closed', {
      outcomes,
      baseline,
      before,
      atClose,
      after: process.getActiveResourcesInfo(),
      live: liveResources().filter((r) => !r.stack.includes('at tick (')), // not the tick above
      msSinceClose: performance.now() - closedAt,
      logs,
    });
    return;
  }

  // ---- memory ----
  const gc = (globalThis as { gc?: () => void }).gc;
  if (!gc) throw new Error('run with --expose-gc');
  const heap = (): number => {
    gc();
    gc();
    return process.memoryUsage().heapUsed;
  };
  const samples: { names: number; heapUsed: number; ms: number }[] = [];
  const started = performance.now();
  let next = 0;
  let done = 0;
  const sampleAt = [...config.samples].sort((a, b) => a - b);
  const lane = async (): Promise<void> => {
    for (;;) {
      // Stop handing out names at a sample point until every lane is idle.
      if (next >= config.total || (sampleAt.length > 0 && next >= sampleAt[0])) return;
      const name = `m:${next}`;
      next += 1;
      const handle = await locks.lock(name);
      await handle.release();
      done += 1;
    }
  };
  while (done < config.total) {
    await Promise.all(Array.from({ length: config.concurrency }, lane));
    if (sampleAt.length > 0 && done >= sampleAt[0]) {
      sampleAt.shift();
      samples.push({ names: done, heapUsed: heap(), ms: performance.now() - started });
    }
  }
  const elapsedMs = performance.now() - started;
  await app.close();
  report('closed', { samples, elapsedMs, logs });
}

main().catch((error: unknown) => {
  report('failed', { error: error instanceof Error ? (error.stack ?? error.message) : String(error) });
  process.exitCode = 1;
});
