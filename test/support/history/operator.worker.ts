/**
 * The operator of a history run: a Nest app of its own that now and then calls
 * `LockService.forceUnlock(name)` on one of the run's lock names (one that `inspect` found held,
 * with waiters if it could), as an operator facing a stuck lock would, while the parent injects
 * faults into its connection (a dropped reply with a reset, so that ioredis sends the force-unlock
 * script again; a reply held past a short operationTimeout).
 *
 * Each call is recorded with what the checker needs to tell the holds it may remove from those it
 * must not (see ./history.ts): Redis's clock read by a script sent just before the force-unlock
 * script, on the same connection and in the same write (the client auto-pipelines what is sent in
 * one tick, and the script reads the lock's key, so that a Cluster routes it to the lock's master),
 * the owners it returned, and for a call that failed, Redis's clock read on that connection after it.
 *
 * Its client is its own (an application's `Redis` or `Cluster`, which the module takes as it is),
 * without auto-pipelining whatever the run drew for the workers: an auto-pipelined command is
 * aborted when its connection closes, never sent again, and the re-sent force-unlock script is what
 * the operator's faults are for. The read and the script go out in one write because the socket
 * is corked for the tick that sends them.
 *
 * Messages are those of the history workers: 'ready', then 'go' and 'stop'; events go up in
 * 'history' batches, and 'history-done' comes last, after the app has closed.
 */
import 'reflect-metadata';
import { Injectable, Module } from '@nestjs/common';
import type { Socket } from 'node:net';
import { Cluster, Redis } from 'ioredis';
import { keySlot } from '../../../lib/store/redis/fence-key';
import { DisLockModule, type LockService } from 'nestjs-dislock';
import { boundLifetime, workerConfig } from '../workers/protocol';
import type { HistoryClientConfig } from './history-client';
import { redisClock } from './history-client';
import { runHistoryLoop } from './history-loop';
import { clock, type HistoryEvent, prng } from './history';

export interface OperatorWorkerConfig {
  /** This process's number among the run's processes (after the workers). */
  worker: number;
  /** The lock Redis (or Cluster), through the operator's own fault proxies (`autoPipelining` is ignored: always off). */
  client: HistoryClientConfig;
  keyPrefix: string;
  names: string[];
  seed: number;
  operationTimeout: number;
  /** How long the operator waits between calls: from `[0]` to `[1]` ms. */
  everyMs: [number, number];
  deadlineMs: number;
}

const config = workerConfig<OperatorWorkerConfig>();
const lifetime = boundLifetime(config.deadlineMs);
const random = prng(config.seed);
const sleep = (ms: number): Promise<void> => new Promise((resolve) => setTimeout(resolve, ms));
const pending: HistoryEvent[] = [];
const record = (event: HistoryEvent): void => void pending.push(event);

const timeout = config.client.commandTimeout === undefined ? {} : { commandTimeout: config.client.commandTimeout };
const client: Redis | Cluster = config.client.cluster
  ? new Cluster([...config.client.cluster.seeds], { natMap: config.client.cluster.natMap, redisOptions: timeout })
  : new Redis(config.client.url ?? '', timeout);
client.on('error', () => undefined);

/** The socket the commands on `key` go out on (on a Cluster, its master's), if connected. */
function socketOf(key: string): Socket | undefined {
  if (client instanceof Cluster) {
    const nodeKey = client.slots[keySlot(key)]?.[0];
    return client.nodes('master').find((node) => `${node.options.host}:${node.options.port}` === nodeKey)?.stream;
  }
  return client.stream;
}

@Injectable()
class Operator {}

/** Redis's clock on the key's connection, once it answers (bounded: undefined if it never does). */
async function clockOnceAnswered(key: string): Promise<number | undefined> {
  const until = clock() + 15_000;
  while (clock() < until) {
    try {
      return await redisClock(client, key);
    } catch {
      await sleep(50);
    }
  }
  return undefined;
}

async function oneCall(_operator: Operator, locks: LockService): Promise<void> {
  const [least, most] = config.everyMs;
  await sleep(least + random() * (most - least));
  // As an operator facing a stuck lock would: look first, and force one that is held, with others
  // waiting for it if one is (the next holder comes in as soon as the holder is removed).
  let name = config.names[Math.floor(random() * config.names.length)];
  let fallback: string | undefined;
  for (let look = 0; look < 5; look += 1) {
    const seen = await locks.inspect(name).catch(() => undefined);
    if (seen?.held && seen.waiting > 0) break;
    if (seen?.held) fallback ??= name;
    name = look === 4 && fallback !== undefined ? fallback : config.names[Math.floor(random() * config.names.length)];
  }
  const key = config.keyPrefix + name;
  const calledAt = clock();
  // In one tick on one connection, corked: one write carries the read, the script and the read.
  const socket = socketOf(key);
  socket?.cork();
  const before = redisClock(client, key);
  const forced = locks.forceUnlock(name);
  const after = redisClock(client, key);
  process.nextTick(() => socket?.uncork());
  const [read, removed, readAfter] = await Promise.allSettled([before, forced, after]);
  const at = clock();
  const base = {
    kind: 'force-unlock' as const,
    worker: config.worker,
    name,
    calledAt,
    at,
    before: read.status === 'fulfilled' ? read.value : undefined,
  };
  if (removed.status === 'fulfilled') {
    record({ ...base, removed: removed.value.map((holder) => holder.owner) });
    return;
  }
  const until = readAfter.status === 'fulfilled' ? readAfter.value : await clockOnceAnswered(key);
  record({ ...base, until });
}

@Module({
  imports: [
    DisLockModule.forRoot({
      redis: client,
      keyPrefix: config.keyPrefix,
      operationTimeout: config.operationTimeout,
    }),
  ],
  providers: [Operator],
})
class OperatorModule {}

runHistoryLoop({
  module: OperatorModule,
  actor: Operator,
  worker: config.worker,
  loops: 1,
  random,
  pending,
  lifetime,
  oneCall,
  afterClose: () => client.disconnect(),
});
