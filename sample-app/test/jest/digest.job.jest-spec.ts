/**
 * DigestJob under Jest's fake timers: `@DisLock({ key: 'digest', onBusy: 'skip', lockAtLeastFor:
 * 500, expire: 5_000 })`. The same kind of test as test/unit/digest.job.spec.ts.
 */
import { jest } from '@jest/globals'; // in Jest's ESM mode, `jest` comes from here
import { type INestApplicationContext, Logger } from '@nestjs/common';
import { Test } from '@nestjs/testing';
import {
  DisLockTesting,
  DisLockTestingModule,
  type LockLostEvent,
  LockLostError,
  LockService,
  MemoryLockStore,
} from 'nestjs-dislock';
import { DigestJob } from '../../src/digest/digest.job';
import { APP_LOCK_OPTIONS, appConfig } from '../support/app-config';
import { FakeRedisClient, fakeRedisService } from '../support/fake-redis';

const DIGESTS = 'sample:digests';

describe('DigestJob.publish under jest.useFakeTimers()', () => {
  let store: MemoryLockStore;
  let redis: FakeRedisClient;
  let lost: LockLostEvent[];
  const apps: INestApplicationContext[] = [];

  async function startInstance(instance: string): Promise<INestApplicationContext> {
    const moduleRef = await Test.createTestingModule({
      imports: [
        DisLockTestingModule.forRoot({ ...APP_LOCK_OPTIONS, store, onLockLost: (event) => void lost.push(event) }),
      ],
      providers: [appConfig({ instance }), fakeRedisService(redis), DigestJob],
    }).compile();
    const app = await moduleRef.init();
    apps.push(app);
    return app;
  }

  beforeEach(() => {
    jest.useFakeTimers(); // before the apps, so that every lease runs on the fake clock
    store = new MemoryLockStore();
    redis = new FakeRedisClient();
    lost = [];
  });

  afterEach(async () => {
    for (const app of apps.splice(0)) await app.close();
    jest.useRealTimers();
    jest.restoreAllMocks();
  });

  it('skips the ticks refused by refuseNext, and keeps a tick taken for lockAtLeastFor', async () => {
    jest.spyOn(Logger.prototype, 'debug').mockImplementation(() => undefined);
    const one = await startInstance('one');
    const two = await startInstance('two');

    one.get(DisLockTesting).refuseNext('digest');
    await expect(one.get(DigestJob).publish()).resolves.toBeUndefined(); // skipped
    await one.get(DigestJob).publish();
    await two.get(DigestJob).publish(); // within 500 ms of the last tick: skipped
    await jest.advanceTimersByTimeAsync(500);
    await two.get(DigestJob).publish();

    expect(await redis.lrange(DIGESTS, 0, -1)).toEqual([
      expect.stringMatching(/^\d+:one$/),
      expect.stringMatching(/^\d+:two$/),
    ]);
  });

  it('a tick stuck past its 5 s expire loses the lock: the signal aborts and the next tick runs elsewhere', async () => {
    const one = await startInstance('one');
    const two = await startInstance('two');
    let signal: AbortSignal | undefined;
    redis.onExec = () => (signal ??= one.get(LockService).current('digest')?.signal);
    redis.execDelayMs = 60_000; // Redis hangs on instance one's write

    const stuck = one.get(DigestJob).publish();
    await jest.advanceTimersByTimeAsync(4_900);
    expect(signal?.aborted).toBe(false);
    expect(two.get(DisLockTesting).holders('digest')).toHaveLength(1);

    await jest.advanceTimersByTimeAsync(100); // past the fixed 5 s lease
    expect(signal?.aborted).toBe(true);
    expect(signal?.reason).toBeInstanceOf(LockLostError);
    expect((signal?.reason as LockLostError).reason).toBe('expired');
    expect(lost.map((event) => [event.name, event.reason])).toEqual([['digest', 'expired']]);
    expect(two.get(DisLockTesting).holders('digest')).toEqual([]);

    redis.execDelayMs = 0;
    await two.get(DigestJob).publish();
    await jest.advanceTimersByTimeAsync(60_000);
    await stuck;
    expect(await redis.lrange(DIGESTS, 0, -1)).toEqual([
      expect.stringMatching(/^\d+:two$/),
      expect.stringMatching(/^\d+:one$/),
    ]);
  });
});
