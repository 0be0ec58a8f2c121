/**
 * Counter worker: `iterations` non-atomic increments (GET, sleep 1-3 ms, SET) of a Redis counter
 * inside a `@DisLock` method, racing other processes doing the same. Around the critical section
 * it keeps two gauges in Redis: `holders` (inside the method) and `callers` (calling it, waiting
 * included), each with its high-water mark. See protocol.ts for the configuration and report.
 *
 * Messages: 'ready' once the app is up, then waits for 'go', then 'done' with its report.
 */
import 'reflect-metadata';
import { Injectable, Module } from '@nestjs/common';
import { NestFactory } from '@nestjs/core';
import { Redis } from 'ioredis';
import { DisLock, DisLockModule, LockNotAcquiredError, LockService } from 'nestjs-dislock';
import {
  boundLifetime,
  counterKeys,
  type CounterReport,
  type CounterWorkerConfig,
  ENTER_GAUGE_SCRIPT,
  fromParent,
  runWorker,
  toParent,
  workerConfig,
} from './protocol';
import { holdsOf } from '../lock-hash';

const config = workerConfig<CounterWorkerConfig>();
const keys = counterKeys(config.keyPrefix);
const lifetime = boundLifetime(config.deadlineMs);
const sleep = (ms: number): Promise<void> => new Promise((resolve) => setTimeout(resolve, ms));

const data = new Redis(config.redis, { maxRetriesPerRequest: 1 });
const enter = async (gauge: string, mark: string): Promise<number> =>
  Number(await data.eval(ENTER_GAUGE_SCRIPT, 2, gauge, mark));

const report: CounterReport = { increments: 0, conflicts: 0, lost: 0, foreign: 0, maxHolders: 0, maxCallMs: 0, ms: 0 };

@Injectable()
class Counter {
  constructor(private readonly locks: LockService) {}

  @DisLock({ key: 'counter', waitTime: config.waitTime, ...config.lease })
  async lockedIncrement(): Promise<void> {
    const handle = this.locks.current('counter');
    if (!handle) throw new Error('no current lock inside the @DisLock method');
    await this.increment(async () => {
      // What Redis holds while we are inside: our owner, once, and nobody else.
      const hash = await holdsOf(data, handle.key);
      if (Object.keys(hash).length !== 1 || hash[handle.owner] !== '1') report.foreign++;
    });
    if (handle.signal.aborted) report.lost++;
  }

  async unlockedIncrement(): Promise<void> {
    await this.increment(async () => undefined);
  }

  private async increment(check: () => Promise<void>): Promise<void> {
    const holders = await enter(keys.holders, keys.maxHolders);
    report.maxHolders = Math.max(report.maxHolders, holders);
    try {
      await check();
      const value = Number((await data.get(keys.counter)) ?? '0');
      await sleep(1 + Math.random() * 2);
      await data.set(keys.counter, String(value + 1));
    } finally {
      await data.decr(keys.holders);
    }
  }
}

@Module({
  imports: [DisLockModule.forRoot({ redis: config.redis, keyPrefix: config.keyPrefix })],
  providers: [Counter],
})
class CounterModule {}

runWorker(async () => {
  const app = await NestFactory.createApplicationContext(CounterModule, { logger: ['error', 'warn'] });
  const counter = app.get(Counter);
  await data.ping();
  await toParent({ type: 'ready' });
  await fromParent('go');

  const started = performance.now();
  while (report.increments < config.iterations) {
    await enter(keys.callers, keys.maxCallers);
    const called = performance.now();
    try {
      await (config.locked ? counter.lockedIncrement() : counter.unlockedIncrement());
      report.increments++;
      report.maxCallMs = Math.max(report.maxCallMs, performance.now() - called);
    } catch (error) {
      // Busy (waitTime 0), or busy for all of waitTime: counted, and tried again.
      if (!(error instanceof LockNotAcquiredError)) throw error;
      report.conflicts++;
    } finally {
      await data.decr(keys.callers);
    }
    await sleep(Math.random() * 2); // other work between calls, so that others get a turn
  }
  report.ms = performance.now() - started;

  await toParent({ type: 'done', report });
  await app.close();
  await data.quit();
  lifetime.finish();
});
