/**
 * DigestJob: a @Cron job every instance schedules and one instance runs per tick. Its lock is
 * `@DisLock({ key: 'digest', onBusy: 'skip', lockAtLeastFor: 500, expire: 5_000 })`; the tests
 * call `publish()` as the scheduler would, under Vitest's fake timers.
 */
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

describe('DigestJob.publish', () => {
  let store: MemoryLockStore;
  let redis: FakeRedisClient;
  let lost: LockLostEvent[];
  const apps: INestApplicationContext[] = [];

  /** One instance of the app; every instance shares the lock store and the app's (fake) Redis. */
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
    // Fake timers first, then the apps: every lease is then measured on the fake clock.
    vi.useFakeTimers();
    store = new MemoryLockStore();
    redis = new FakeRedisClient();
    lost = [];
  });

  afterEach(async () => {
    for (const app of apps.splice(0)) await app.close();
    vi.useRealTimers();
    vi.restoreAllMocks();
  });

  it('skips the ticks whose lock is busy (refuseNext), quietly at debug level, and runs the next one', async () => {
    const debug = vi.spyOn(Logger.prototype, 'debug').mockImplementation(() => undefined);
    const error = vi.spyOn(Logger.prototype, 'error');
    const app = await startInstance('one');
    app.get(DisLockTesting).refuseNext('digest', 2); // another instance takes the next two ticks

    await expect(app.get(DigestJob).publish()).resolves.toBeUndefined();
    await expect(app.get(DigestJob).publish()).resolves.toBeUndefined();
    expect(await redis.lrange(DIGESTS, 0, -1)).toEqual([]);
    expect(debug).toHaveBeenCalled();
    expect(error).not.toHaveBeenCalled();

    await app.get(DigestJob).publish();
    expect(await redis.lrange(DIGESTS, 0, -1)).toEqual([expect.stringMatching(/^\d+:one$/)]);
  });

  it('runs each tick on one instance only: lockAtLeastFor keeps the tick taken for 500 ms', async () => {
    vi.spyOn(Logger.prototype, 'debug').mockImplementation(() => undefined);
    const one = await startInstance('one');
    const two = await startInstance('two');

    await one.get(DigestJob).publish(); // done in no time, but the lock stays taken
    await two.get(DigestJob).publish(); // the same tick, a little late: skipped
    expect(two.get(DisLockTesting).holders('digest')).toHaveLength(1);

    await vi.advanceTimersByTimeAsync(500); // the next tick
    expect(two.get(DisLockTesting).holders('digest')).toEqual([]);
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
    await vi.advanceTimersByTimeAsync(4_900);
    expect(signal?.aborted).toBe(false);
    expect(two.get(DisLockTesting).holders('digest')).toHaveLength(1);

    // Past the fixed 5 s lease. (The holder counts its lock lost a little before the lease ends,
    // 2 ms + 1 % of it early, so that it knows before another instance can take it.)
    await vi.advanceTimersByTimeAsync(100);
    expect(signal?.aborted).toBe(true);
    expect(signal?.reason).toBeInstanceOf(LockLostError);
    expect((signal?.reason as LockLostError).reason).toBe('expired');
    expect(lost.map((event) => [event.name, event.reason])).toEqual([['digest', 'expired']]);
    expect(two.get(DisLockTesting).holders('digest')).toEqual([]);

    redis.execDelayMs = 0;
    await two.get(DigestJob).publish(); // no longer excluded by the stuck one
    await vi.advanceTimersByTimeAsync(60_000);
    await stuck; // the method itself decides what a lost lock means: this one still writes
    expect(await redis.lrange(DIGESTS, 0, -1)).toEqual([
      expect.stringMatching(/^\d+:two$/),
      expect.stringMatching(/^\d+:one$/),
    ]);
  });
});
