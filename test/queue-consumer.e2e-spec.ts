import { Controller, type DynamicModule, Inject, type INestMicroservice, Logger, Module } from '@nestjs/common';
import { NestFactory } from '@nestjs/core';
import {
  type ClientProxy,
  ClientProxyFactory,
  EventPattern,
  type MicroserviceOptions,
  Payload,
  Transport,
} from '@nestjs/microservices';
import type { Redis } from 'ioredis';
import { DisLock, DisLockModule } from 'nestjs-dislock';
import { eventually, sharedClient, sharedRedisUrl, sleep, uniquePrefix } from './support/shared-redis';

const INSTANCE = Symbol('instance');
const PREFIX = uniquePrefix('queue');
const RUNS = `${PREFIX}runs`;

/** A consumer of a fan-out event bus: every instance hears every event; one of them runs each. */
@Controller()
class DigestConsumer {
  private readonly redis = sharedClient();

  constructor(@Inject(INSTANCE) private readonly instance: string) {}

  @EventPattern('digest.requested')
  @DisLock({ key: 'digest:{0.id}', onBusy: 'skip', lockAtLeastFor: 2_000 })
  async digest(@Payload() event: { id: string }): Promise<void> {
    await this.redis.rpush(RUNS, `digest:${event.id}:${this.instance}`);
    await sleep(20);
  }

  // The other decorator order.
  @DisLock({ key: 'invoice:{0.id}', onBusy: 'skip', lockAtLeastFor: 2_000 })
  @EventPattern('invoice.requested')
  async invoice(@Payload() event: { id: string }): Promise<void> {
    await this.redis.rpush(RUNS, `invoice:${event.id}:${this.instance}`);
  }

  onModuleDestroy(): void {
    this.redis.disconnect();
  }
}

@Module({})
class ConsumerModule {
  static for(instance: string): DynamicModule {
    return {
      module: ConsumerModule,
      imports: [DisLockModule.forRoot({ redis: sharedRedisUrl(), keyPrefix: PREFIX })],
      controllers: [DigestConsumer],
      providers: [{ provide: INSTANCE, useValue: instance }],
    };
  }
}

describe('onBusy: skip in queue consumers (@EventPattern over the Redis transport, three instances)', () => {
  const url = new URL(sharedRedisUrl());
  const transport = { host: url.hostname, port: Number(url.port) };
  let consumers: INestMicroservice[] = [];
  let producer: ClientProxy;
  let redis: Redis;
  const debug = vi.spyOn(Logger.prototype, 'debug').mockImplementation(() => undefined);
  const error = vi.spyOn(Logger.prototype, 'error').mockImplementation(() => undefined);

  beforeAll(async () => {
    redis = sharedClient();
    consumers = await Promise.all(
      ['a', 'b', 'c'].map(async (instance) => {
        const app = await NestFactory.createMicroservice<MicroserviceOptions>(ConsumerModule.for(instance), {
          transport: Transport.REDIS,
          options: transport,
          logger: false,
        });
        await app.listen();
        return app;
      }),
    );
    producer = ClientProxyFactory.create({ transport: Transport.REDIS, options: transport });
    await producer.connect();
  });

  afterAll(async () => {
    await producer?.close();
    await Promise.all(consumers.map((app) => app.close()));
    redis.disconnect();
    debug.mockRestore();
    error.mockRestore();
  });

  it('every event is heard by all three and run by exactly one; the others skip it without an error', async () => {
    // All three subscribed: an event published now reaches each of them.
    expect(
      await eventually(async () => {
        const [, count] = (await redis.pubsub('NUMSUB', 'digest.requested')) as [string, number];
        return count === 3;
      }, 5_000),
    ).toBe(true);
    const ids = Array.from({ length: 12 }, (_, i) => `${i}`);
    for (const id of ids) {
      producer.emit('digest.requested', { id });
      producer.emit('invoice.requested', { id });
    }
    const expected = ids.length * 2;
    expect(await eventually(async () => (await redis.llen(RUNS)) >= expected, 5_000)).toBe(true);
    await sleep(300); // a second run of any event would have landed by now
    const runs = await redis.lrange(RUNS, 0, -1);
    expect(runs).toHaveLength(expected);
    const perEvent = new Map<string, number>();
    for (const run of runs) {
      const event = run.split(':').slice(0, 2).join(':');
      perEvent.set(event, (perEvent.get(event) ?? 0) + 1);
    }
    expect(perEvent.size).toBe(expected);
    expect([...perEvent.values()].every((count) => count === 1)).toBe(true);
    // Each of the other two instances skipped each event, quietly.
    const skips = debug.mock.calls.filter(([message]) => String(message).includes("onBusy: 'skip'"));
    expect(skips).toHaveLength(expected * 2);
    expect(error).not.toHaveBeenCalled();
  });
});
