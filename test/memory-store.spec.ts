/**
 * The in-memory store and DisLockTesting, as an application's own unit tests use them: no Redis,
 * Vitest's fake timers moving every lease, renewal and wait.
 */
import { Injectable, type INestApplicationContext, Logger } from '@nestjs/common';
import { Test } from '@nestjs/testing';
import {
  DisLock,
  DisLockModule,
  DisLockSetupError,
  DisLockTesting,
  DisLockTestingModule,
  InvalidLockOptionsError,
  type AcquireResult,
  type LockHandle,
  type LockLostEvent,
  LockLostError,
  LockNotAcquiredError,
  LockService,
  MemoryLockStore,
  type TestHolder,
} from 'nestjs-dislock';
import { abortReason, lostReason, settle } from './support/async';

@Injectable()
class Payments {
  runs = 0;
  lastSignal: AbortSignal | undefined;

  constructor(private readonly locks: LockService) {}

  @DisLock({ key: 'order:{0}', expire: 5_000 })
  async pay(orderId: number): Promise<string> {
    this.runs += 1;
    this.lastSignal = this.locks.current()?.signal;
    await new Promise((resolve) => setTimeout(resolve, 1_000));
    return `paid ${orderId}`;
  }

  @DisLock({ key: 'digest', onBusy: 'skip' })
  async digest(): Promise<string> {
    this.runs += 1;
    return 'ran';
  }
}

describe('the in-memory store under fake timers (DisLockTestingModule)', () => {
  let app: INestApplicationContext;
  let locks: LockService;
  let testing: DisLockTesting;
  let payments: Payments;
  const lost: LockLostEvent[] = [];

  beforeEach(async () => {
    vi.useFakeTimers();
    lost.length = 0;
    const moduleRef = await Test.createTestingModule({
      imports: [DisLockTestingModule.forRoot({ onLockLost: (event) => void lost.push(event) })],
      providers: [Payments],
    }).compile();
    app = await moduleRef.init();
    locks = app.get(LockService);
    testing = app.get(DisLockTesting);
    payments = app.get(Payments);
  });

  afterEach(async () => {
    await app.close();
    vi.useRealTimers();
  });

  it('the watchdog keeps a lock for ten minutes of fake time; its lease ends only when renewal stops', async () => {
    const held = await locks.lock('report', { lockWatchdogTimeout: 30_000 });
    await vi.advanceTimersByTimeAsync(10 * 60_000);
    expect(held.signal.aborted).toBe(false);
    expect(testing.holders('report')).toEqual([{ owner: held.owner, exclusive: true, ttl: expect.any(Number) }]);
    expect(testing.holders('report')[0].ttl).toBeGreaterThan(15_000);
    held.stopRenewal();
    await vi.advanceTimersByTimeAsync(30_000);
    expect(testing.holders('report')).toEqual([]);
    expect(await locks.tryLock('report')).not.toBeNull();
  });

  it('a fixed expire ends the lock on fake time: the signal aborts, another caller gets in', async () => {
    const held = await locks.lock('order:1', { expire: 5_000 });
    await vi.advanceTimersByTimeAsync(4_900);
    expect(held.signal.aborted).toBe(false);
    await vi.advanceTimersByTimeAsync(200);
    expect(lostReason(held.signal.reason)).toBe('expired');
    expect(await locks.tryLock('order:1')).not.toBeNull();
  });

  // The lease safety margin (lib/core/lock-handle.ts, leaseValidUntil): a lease counts as ended
  // 2 ms + 1 % of it before its end, so that its loss is reported before another owner can take
  // the lock. On fake time the moments are exact; the windows below are those of the margin
  // (12 ms of a 1 s lease, 32 ms of a 3 s one): without it every loss comes at the lease's very end.

  it('the lease safety margin: a fixed 1000 ms lease is reported lost at 988 ms, while the store still holds it', async () => {
    const startedAt = performance.now();
    const held = await locks.lock('margin', { expire: 1_000 });
    let lostAfter = Infinity;
    let holdersAtLoss: TestHolder[] = [];
    held.signal.addEventListener('abort', () => {
      lostAfter = performance.now() - startedAt;
      holdersAtLoss = testing.holders('margin');
    });
    await vi.advanceTimersByTimeAsync(985);
    expect(held.signal.aborted).toBe(false);
    await vi.advanceTimersByTimeAsync(4); // 989 ms: 1000 - (2 + 10) = 988 is past
    expect(lostReason(held.signal.reason)).toBe('expired');
    expect(lostAfter).toBeGreaterThanOrEqual(985);
    expect(lostAfter).toBeLessThan(989);
    expect(lost.map((event) => [event.name, event.reason])).toEqual([['margin', 'expired']]);
    // Reported while the store still has the hold: nobody else could hold the lock yet.
    expect(holdersAtLoss).toEqual([{ owner: held.owner, exclusive: true, ttl: expect.any(Number) }]);
    expect(holdersAtLoss[0].ttl).toBeGreaterThan(10);
    expect(await locks.tryLock('margin')).toBeNull();
    await vi.advanceTimersByTimeAsync(11); // 1000 ms: the lease itself ends
    expect(testing.holders('margin')).toEqual([]);
    expect(await locks.tryLock('margin')).not.toBeNull();
  });

  it('maxRenewTimes on fake time: exactly that many renewals, then lost when the last lease less the margin ends', async () => {
    const startedAt = performance.now();
    const renewedAt: number[] = [];
    locks.on('renewed', (event) => {
      if (event.name === 'capped') renewedAt.push(performance.now() - startedAt);
    });
    const held = await locks.lock('capped', { lockWatchdogTimeout: 3_000, maxRenewTimes: 2 });
    // Renewed every 1000 ms: at 1000 and 2000, then no more. The last lease, sent at 2000 ms,
    // counts until 2000 + 3000 - (2 + 30) = 4968 ms.
    await vi.advanceTimersByTimeAsync(4_965);
    expect(renewedAt).toHaveLength(2);
    expect(renewedAt[0]).toBeGreaterThanOrEqual(999);
    expect(renewedAt[1]).toBeGreaterThanOrEqual(1_999);
    expect(renewedAt[1]).toBeLessThan(2_001);
    expect(held.signal.aborted).toBe(false);
    await vi.advanceTimersByTimeAsync(4); // 4969 ms
    expect(lostReason(held.signal.reason)).toBe('max-renewals');
    expect(testing.holders('capped')).toEqual([{ owner: held.owner, exclusive: true, ttl: expect.any(Number) }]);
    await vi.advanceTimersByTimeAsync(10_000);
    expect(renewedAt).toHaveLength(2);
    expect(testing.holders('capped')).toEqual([]);
  });

  it('a wait ends when the holder lease does, or at waitTime', async () => {
    testing.occupy('sku:1', 3_000);
    const waiting = settle(locks.lock('sku:1', { waitTime: 10_000 }));
    await vi.advanceTimersByTimeAsync(3_100);
    const got = await waiting;
    expect(got.ok).toBe(true);
    testing.occupy('sku:2');
    const refused = settle(locks.lock('sku:2', { waitTime: 2_000 }));
    await vi.advanceTimersByTimeAsync(2_100);
    expect((await refused).ok).toBe(false);
    expect(((await refused) as { error: unknown }).error).toBeInstanceOf(LockNotAcquiredError);
  });

  it('occupy makes a @DisLock method busy (the 409 path) until free', async () => {
    testing.occupy('order:7');
    await expect(payments.pay(7)).rejects.toBeInstanceOf(LockNotAcquiredError);
    expect(payments.runs).toBe(0);
    testing.free('order:7');
    const paying = payments.pay(7);
    await vi.advanceTimersByTimeAsync(1_000);
    expect(await paying).toBe('paid 7');
  });

  it('refuseNext refuses only the next attempts; onBusy skip resolves undefined meanwhile', async () => {
    const debug = vi.spyOn(Logger.prototype, 'debug').mockImplementation(() => undefined);
    testing.refuseNext('digest', 2);
    expect(await payments.digest()).toBeUndefined();
    expect(await payments.digest()).toBeUndefined();
    expect(await payments.digest()).toBe('ran');
    expect(payments.runs).toBe(1);
    debug.mockRestore();
  });

  it('loseLock aborts the running method signal at once and calls onLockLost', async () => {
    const paying = payments.pay(9);
    await vi.advanceTimersByTimeAsync(10);
    expect(testing.loseLock('order:9')).toBe(1);
    expect(payments.lastSignal?.aborted).toBe(true);
    expect(payments.lastSignal?.reason).toBeInstanceOf(LockLostError);
    expect(lost.map((event) => [event.name, event.reason])).toEqual([['order:9', 'not-owner']]);
    expect(testing.holders('order:9')).toEqual([]);
    await vi.advanceTimersByTimeAsync(1_000);
    expect(await paying).toBe('paid 9'); // the method decides what a lost lock means; its result passes
  });

  it('read-write locks, semaphores and multi-locks work on it too', async () => {
    const readers = [await locks.lock('prices', { mode: 'read' }), await locks.lock('prices', { mode: 'read' })];
    expect(await locks.tryLock('prices', { mode: 'write' })).toBeNull();
    for (const reader of readers) await reader.release();
    const permits = [await locks.lock('export', { permits: 2 }), await locks.lock('export', { permits: 2 })];
    expect(await locks.tryLock('export', { permits: 2 })).toBeNull();
    for (const permit of permits) await permit.release();
    const set = await locks.lock(['account:2', 'account:1']);
    expect(set.locks.map((part) => part.name)).toEqual(['account:1', 'account:2']);
    expect(await set.release()).toBe(true);
  });

  it('keeps nothing for names nobody holds, waits for or watches', async () => {
    const store = (testing as unknown as { store: { entries: Map<string, unknown> } }).store;
    for (let i = 0; i < 50; i += 1) await (await locks.lock(`n:${i}`)).release();
    testing.occupy('busy', 100);
    const waiting = settle(locks.lock('busy', { waitTime: 1_000 }));
    await vi.advanceTimersByTimeAsync(200);
    const got = await waiting;
    expect(got.ok).toBe(true);
    await (got as { value: LockHandle }).value.release();
    await vi.advanceTimersByTimeAsync(5_000);
    expect(store.entries.size).toBe(0);
  });
});

/** The in-memory store, its acquisitions answered `answerAfterMs` late on the fake clock (a slow network). */
class SlowAnswers extends MemoryLockStore {
  answerAfterMs = 0;

  override async acquire(...args: Parameters<MemoryLockStore['acquire']>): Promise<AcquireResult> {
    const result = await super.acquire(...args);
    await new Promise((resolve) => setTimeout(resolve, this.answerAfterMs));
    return result;
  }
}

describe('an acquisition answered late, under fake timers', () => {
  let app: INestApplicationContext;
  let locks: LockService;
  let testing: DisLockTesting;
  const store = new SlowAnswers();

  beforeEach(async () => {
    vi.useFakeTimers();
    const moduleRef = await Test.createTestingModule({ imports: [DisLockTestingModule.forRoot({ store })] }).compile();
    app = await moduleRef.init();
    locks = app.get(LockService);
    testing = app.get(DisLockTesting);
  });

  afterEach(async () => {
    await app.close();
    vi.useRealTimers();
  });

  // A lease of 1000 ms counts from the send, less the margin: until 988 ms. An answer that comes
  // later may come after another owner took the lock; it must be given back, never handed out.
  it.each([
    [985, true],
    [989, false],
  ])('a 1000 ms lease answered after %i ms: kept %s', async (answerAfterMs, kept) => {
    store.answerAfterMs = answerAfterMs;
    const name = `late-${answerAfterMs}`;
    const taking = locks.tryLock(name, { expire: 1_000 });
    await vi.advanceTimersByTimeAsync(answerAfterMs);
    const held = await taking;
    expect(held !== null, 'a handle was handed out').toBe(kept);
    if (!kept) {
      expect(testing.holders(name)).toEqual([]); // given back at once
      return;
    }
    expect(held?.signal.aborted).toBe(false);
    await vi.advanceTimersByTimeAsync(4); // 989 ms
    expect(lostReason(held?.signal.reason)).toBe('expired');
  });
});

describe('the memory store between applications, and its options', () => {
  it('one MemoryLockStore shared by two applications: they exclude each other like two instances on one Redis', async () => {
    const store = new MemoryLockStore();
    const start = async (): Promise<INestApplicationContext> =>
      (await Test.createTestingModule({ imports: [DisLockTestingModule.forRoot({ store })] }).compile()).init();
    const [one, two] = [await start(), await start()];
    const held = await one.get(LockService).lock('shared');
    expect(await two.get(LockService).tryLock('shared')).toBeNull();
    await one.close(); // releases what it holds; the store stays usable for the other
    expect(await two.get(LockService).tryLock('shared')).not.toBeNull();
    expect(held.signal.aborted).toBe(true);
    await two.close();
  });

  it("DisLockModule.forRoot({ store: 'memory' }) needs no Redis", async () => {
    const app = await (
      await Test.createTestingModule({ imports: [DisLockModule.forRoot({ store: 'memory' })] }).compile()
    ).init();
    const locks = app.get(LockService);
    expect(await abortReason((await locks.lock('x', { expire: 50 })).signal, 1_000)).toBeInstanceOf(LockLostError);
    await app.close();
  });

  it('refuses a store that is not one, or a store beside redis, naming the option', () => {
    const option = (options: object): string | undefined => {
      try {
        DisLockModule.forRoot(options);
      } catch (error) {
        return error instanceof InvalidLockOptionsError ? `${error.option}: ${error.message}` : String(error);
      }
      return undefined;
    };
    expect(option({ store: 'disk' })).toMatch(/^store: .*"memory" or a LockStore/);
    expect(option({ store: { acquire: () => undefined } })).toMatch(/^store: .*has no leave, check, renew, release/);
    expect(option({ store: 'memory', redis: 'redis://localhost:6379' })).toMatch(/^store: .*set one of/);
    expect(option({ store: 'memory', replicas: { min: 1, timeout: 10 } })).toMatch(/^replicas:/);
  });

  it('DisLockTesting on a Redis module says what to import instead', async () => {
    const moduleRef = Test.createTestingModule({
      imports: [DisLockModule.forRoot({ redis: { lazyConnect: true, host: '127.0.0.1', port: 1 } })],
      providers: [DisLockTesting],
    });
    const error = await moduleRef.compile().catch((e: unknown) => e);
    expect(error).toBeInstanceOf(DisLockSetupError);
    expect(String((error as Error).message)).toMatch(/DisLockTestingModule\.forRoot\(\)/);
  });
});
