/**
 * Cron-job worker: one instance of an application that runs a scheduled job on every tick of its
 * own clock, which runs `skewMs` off the real one, under `@DisLock` with `onBusy: 'skip'`. Each
 * run is recorded in Redis (`<keyPrefix>runs`: `<tick>:<instance>`) before the job's work, so a
 * run whose instance is SIGKILLed mid-job is still counted. Starts scheduling on 'go'.
 */
import 'reflect-metadata';
import { Injectable, Module } from '@nestjs/common';
import { NestFactory } from '@nestjs/core';
import { Redis } from 'ioredis';
import { DisLock, DisLockModule } from 'nestjs-dislock';
import { boundLifetime, type CronWorkerConfig, fromParent, runWorker, toParent, workerConfig } from './protocol';

const config = workerConfig<CronWorkerConfig>();
boundLifetime(config.deadlineMs);
const data = new Redis(config.redis);
const sleep = (ms: number): Promise<void> => new Promise((resolve) => setTimeout(resolve, Math.max(0, ms)));

@Injectable()
class Job {
  @DisLock({ key: 'job', onBusy: 'skip', lockAtLeastFor: config.lockAtLeastFor, expire: config.expire })
  async run(tick: number): Promise<void> {
    await data.rpush(`${config.keyPrefix}runs`, `${tick}:${config.instance}`);
    await sleep(config.jobMs);
  }
}

@Module({
  imports: [DisLockModule.forRoot({ redis: config.redis, keyPrefix: config.keyPrefix })],
  providers: [Job],
})
class CronModule {}

runWorker(async () => {
  const app = await NestFactory.createApplicationContext(CronModule, { logger: ['error', 'warn'] });
  const job = app.get(Job);
  await toParent({ type: 'ready' });
  await fromParent('go');
  // Tick k fires at k * periodMs on this instance's clock, that is k * periodMs + skewMs on the real one.
  for (;;) {
    const tick = Math.floor((Date.now() - config.skewMs) / config.periodMs) + 1;
    await sleep(tick * config.periodMs + config.skewMs - Date.now());
    void job.run(tick).catch((error: unknown) => console.error(error));
  }
});
