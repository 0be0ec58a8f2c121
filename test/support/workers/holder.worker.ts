/**
 * Holder worker: takes the lock `name` through a `@DisLock` method, sends 'locked' (with the key
 * and its owner id) and keeps holding it, the watchdog renewing it if the lease is one, until the
 * parent sends 'release' or kills the process. Used to crash a lock holder on purpose.
 */
import 'reflect-metadata';
import { Injectable, Module } from '@nestjs/common';
import { NestFactory } from '@nestjs/core';
import { DisLock, DisLockModule, LockService } from 'nestjs-dislock';
import { boundLifetime, fromParent, type HolderWorkerConfig, runWorker, toParent, workerConfig } from './protocol';

const config = workerConfig<HolderWorkerConfig>();
const lifetime = boundLifetime(config.deadlineMs);

@Injectable()
class Holder {
  constructor(private readonly locks: LockService) {}

  @DisLock({ key: '{0}', ...config.lease })
  async hold(name: string): Promise<void> {
    const handle = this.locks.current(name);
    if (!handle) throw new Error('no current lock inside the @DisLock method');
    await toParent({ type: 'locked', key: handle.key, owner: handle.owner });
    await fromParent('release');
  }
}

@Module({
  imports: [DisLockModule.forRoot({ redis: config.redis, keyPrefix: config.keyPrefix })],
  providers: [Holder],
})
class HolderModule {}

runWorker(async () => {
  const app = await NestFactory.createApplicationContext(HolderModule, { logger: ['error', 'warn'] });
  await app.get(Holder).hold(config.name);
  await app.close();
  lifetime.finish();
});
