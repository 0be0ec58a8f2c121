/**
 * Churn worker for the Cluster suite: an application of its own, on a Cluster client of its own,
 * that takes each of the given lock names in a tight loop (lock with a wait, 1 ms of work, release,
 * again) until the parent says 'stop' or goes away. Sends `{ type: 'running' }` once every name has
 * gone round 5 times, and `{ type: 'stopped', cycles, acquiredAt }` before it exits (`acquiredAt[i]`:
 * when each acquisition of `names[i]` was answered, in ms since the epoch).
 *
 *   node -r ./test/support/ts-register.js test/support/workers/cluster-churn.ts '<json config>'
 */
import 'reflect-metadata';
import { Logger } from '@nestjs/common';
import { NestFactory } from '@nestjs/core';
import { Cluster, type ClusterNode } from 'ioredis';
import { DisLockModule, LockService } from 'nestjs-dislock';

interface ChurnConfig {
  seeds: ClusterNode[];
  keyPrefix: string;
  names: string[];
  /** Loops per name (default 1): with more, a release always has a local waiter to wake. */
  loopsPerName?: number;
}

const config = JSON.parse(process.argv[2] ?? '{}') as ChurnConfig;
const send = (message: object): Promise<void> =>
  new Promise((resolve) => (process.send ? process.send(message, () => resolve()) : resolve()));
const pause = (ms: number): Promise<void> => new Promise((resolve) => setTimeout(resolve, ms));

async function main(): Promise<void> {
  // Bounded, in case the parent dies without a word.
  setTimeout(() => process.exit(3), 60_000).unref();
  const client = new Cluster(config.seeds);
  client.on('error', () => undefined);
  const app = await NestFactory.createApplicationContext(
    DisLockModule.forRoot({ redis: client, keyPrefix: config.keyPrefix }),
    { logger: ['error'] },
  );
  const locks = app.get(LockService);
  let stop = false;
  const stopped = new Promise<void>((resolve) => {
    process.on('message', (message: { type?: string }) => {
      if (message.type === 'stop') resolve();
    });
    process.on('disconnect', () => resolve());
  }).then(() => (stop = true));
  const cycles = config.names.map(() => 0);
  /** When each acquisition of each name was answered (ms since the epoch, sub-ms precision). */
  const acquiredAt: number[][] = config.names.map(() => []);
  let announced = false;
  const perName = config.loopsPerName ?? 1;
  const loops = config.names.flatMap((name, i) => Array.from({ length: perName }, () => loop(name, i)));
  async function loop(name: string, i: number): Promise<void> {
    while (!stop) {
      const handle = await locks.tryLock(name, { waitTime: 5_000, expire: 2_000 }).catch(() => null);
      if (!handle) continue;
      cycles[i] += 1;
      acquiredAt[i].push(performance.timeOrigin + performance.now());
      await pause(1);
      await handle.release().catch(() => false);
      if (!announced && cycles.every((n) => n >= 5)) {
        announced = true;
        void send({ type: 'running' });
      }
    }
  }
  await stopped;
  await Promise.all(loops);
  await app.close();
  client.disconnect();
  await send({ type: 'stopped', cycles, acquiredAt });
  process.exit(0);
}

main().catch((error: unknown) => {
  new Logger('cluster-churn').error(error);
  process.exit(1);
});
