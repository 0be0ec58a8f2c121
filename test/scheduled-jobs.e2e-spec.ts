import { type DynamicModule, Inject, Injectable, Logger, SetMetadata, type Type } from '@nestjs/common';
import { Reflector } from '@nestjs/core';
import type { Redis } from 'ioredis';
import {
  DISLOCK_METADATA,
  DisLock,
  DisLockError,
  type DisLockOptions,
  InvalidLockOptionsError,
  LockNotAcquiredError,
  LockNotHeldError,
  LockService,
  RedisUnavailableError,
} from 'nestjs-dislock';
import { type Observable, lastValueFrom, of, toArray } from 'rxjs';
import { createTestApp, type TestApp } from './support/app';
import { Cron, Interval, ScheduleModule, Timeout } from '@nestjs/schedule';
import { FakeInterval, INTERVAL_TYPE, startIntervals } from './support/mini-scheduler';
import { RedisServer } from './support/redis-server';
import { eventually, sharedClient, sleep, uniquePrefix } from './support/shared-redis';
import { gate, thrown } from './support/async';
import { holdsOf } from './support/lock-hash';

let redis: Redis;
/** Nest's debug lines (a skipped call logs one), kept off the console. */
const debug = vi.spyOn(Logger.prototype, 'debug').mockImplementation(() => undefined);

beforeAll(() => {
  redis = sharedClient();
});

afterAll(() => {
  redis.disconnect();
  debug.mockRestore();
});

/** The rejection reason of `promise` (fails the test if it resolves). */
async function rejection(promise: Promise<unknown>): Promise<unknown> {
  return promise.then(
    (value) => {
      throw new Error(`expected a rejection, got ${JSON.stringify(value)}`);
    },
    (reason: unknown) => reason,
  );
}

function defineLocked(options: unknown): Type<unknown> {
  class Locked {
    @DisLock(options as DisLockOptions)
    async method(): Promise<void> {}
  }
  return Locked;
}

// ---- providers -------------------------------------------------------------------------------

@Injectable()
class Jobs {
  runs = 0;

  constructor(readonly locks: LockService) {}

  @DisLock({ key: 'job:{0}', onBusy: 'skip' })
  async skip(_id: string): Promise<string> {
    this.runs += 1;
    return 'ran';
  }

  @DisLock({ key: 'job:{0}', onBusy: 'skip', waitTime: 300 })
  async skipAfterWait(_id: string): Promise<string> {
    this.runs += 1;
    return 'ran';
  }

  @DisLock({ key: 'job:{0}' })
  async throwing(_id: string): Promise<string> {
    this.runs += 1;
    return 'ran';
  }

  @DisLock({ key: 'job:{0}', onBusy: 'skip' })
  observe(_id: string): Observable<string> {
    this.runs += 1;
    return of('a', 'b');
  }

  /** No written return type: nothing is recorded, the call returns a Promise that is also an Observable. */
  @DisLock({ key: 'job:{0}', onBusy: 'skip' })
  inferred(_id: string) {
    this.runs += 1;
    return of('a', 'b');
  }

  @DisLock({ key: 'least:{0}', onBusy: 'skip', lockAtLeastFor: 400, expire: 2_000 })
  async atLeast(_id: string, ms: number): Promise<string> {
    this.runs += 1;
    await sleep(ms);
    return 'ran';
  }

  @DisLock({ key: 'least:{0}', onBusy: 'skip', lockAtLeastFor: 50, expire: 2_000 })
  async atLeastShort(_id: string, ms: number): Promise<string> {
    this.runs += 1;
    await sleep(ms);
    return 'ran';
  }

  /** A watchdog lock: its lease is lockWatchdogTimeout (30 s by default), renewed. */
  @DisLock({ key: 'least:{0}', onBusy: 'skip', lockAtLeastFor: 400 })
  async atLeastWatchdog(_id: string, ms: number): Promise<string> {
    this.runs += 1;
    await sleep(ms);
    return 'ran';
  }

  /** A watchdog lease (300 ms) shorter than the minimum hold: lengthened to it. */
  @DisLock({ key: 'least:{0}', lockAtLeastFor: 1_000, lockWatchdogTimeout: 300 })
  async atLeastPastLease(_id: string, ms: number): Promise<string> {
    await sleep(ms);
    return 'ran';
  }

  @DisLock({ key: 'least:{0}', lockAtLeastFor: 300, expire: 1_000, ifExpireWhenFinish: false })
  async atLeastKept(_id: string): Promise<string> {
    return 'ran';
  }

  @DisLock({ key: 'guarded:{0}' })
  async guarded(id: string): Promise<string> {
    this.locks.assertLocked(`guarded:${id}`);
    this.locks.assertLocked();
    await sleep(5);
    this.locks.assertLocked(`guarded:${id}`);
    return 'ran';
  }
}

// ---- onBusy --------------------------------------------------------------------------------

describe("onBusy: 'skip'", () => {
  let t: TestApp;
  let jobs: Jobs;
  let seq = 0;
  const fresh = (label = 'x'): string => `${label}-${(seq += 1)}`;

  beforeAll(async () => {
    t = await createTestApp([Jobs]);
    jobs = t.get(Jobs);
  });

  afterAll(async () => {
    await t.close();
  });

  beforeEach(() => {
    jobs.runs = 0;
    debug.mockClear();
  });

  it('a free lock runs the method as usual and releases it', async () => {
    const id = fresh();
    expect(await jobs.skip(id)).toBe('ran');
    expect(jobs.runs).toBe(1);
    expect(await redis.exists(`${t.prefix}job:${id}`)).toBe(0);
    expect(debug).not.toHaveBeenCalled();
  });

  it('a busy lock resolves undefined, logs at debug naming the lock, never runs the method', async () => {
    const id = fresh();
    const holder = await t.locks.lock(`job:${id}`);
    const started = performance.now();
    expect(await jobs.skip(id)).toBeUndefined();
    expect(performance.now() - started).toBeLessThan(200);
    expect(jobs.runs).toBe(0);
    expect(debug).toHaveBeenCalledTimes(1);
    expect(String(debug.mock.calls[0]?.[0])).toContain(`job:${id}`);
    // The holder's lock is untouched.
    expect(await holdsOf(redis, `${t.prefix}job:${id}`)).toEqual({ [holder.owner]: '1' });
    // 'throw' stays the default.
    expect(await rejection(jobs.throwing(id))).toBeInstanceOf(LockNotAcquiredError);
    expect(jobs.runs).toBe(0);
    await holder.release();
    expect(await jobs.skip(id)).toBe('ran');
  });

  it('a method with an inferred Observable return type resolves undefined and replays nothing when busy', async () => {
    const id = fresh();
    const holder = await t.locks.lock(`job:${id}`);
    // Typed Observable<string> by inference; at run time also a Promise of the last value.
    const asPromise = (value: unknown): PromiseLike<unknown> => value as PromiseLike<unknown>;
    const result = jobs.inferred(id);
    expect(await asPromise(result)).toBeUndefined();
    expect(await lastValueFrom(result.pipe(toArray()))).toEqual([]);
    expect(jobs.runs).toBe(0);
    await holder.release();
    expect(await asPromise(jobs.inferred(id))).toBe('b');
  });

  it('an Observable method completes without a value when busy', async () => {
    const id = fresh();
    const holder = await t.locks.lock(`job:${id}`);
    expect(await lastValueFrom(jobs.observe(id).pipe(toArray()))).toEqual([]);
    expect(jobs.runs).toBe(0);
    expect(debug).toHaveBeenCalledTimes(1);
    await holder.release();
    expect(await lastValueFrom(jobs.observe(id).pipe(toArray()))).toEqual(['a', 'b']);
  });

  it('skips only after waitTime', async () => {
    const id = fresh();
    const holder = await t.locks.lock(`job:${id}`, { expire: 2_000 });
    const started = performance.now();
    expect(await jobs.skipAfterWait(id)).toBeUndefined();
    const waited = performance.now() - started;
    expect(waited).toBeGreaterThanOrEqual(290);
    expect(waited).toBeLessThan(1_000);
    expect(jobs.runs).toBe(0);
    expect(String(debug.mock.calls[0]?.[0])).toContain('300 ms');
    // Freed during the wait: it runs.
    const running = jobs.skipAfterWait(id);
    await sleep(100);
    await holder.release();
    expect(await running).toBe('ran');
    expect(jobs.runs).toBe(1);
  });

  it('an invalid onBusy fails when the class is defined, naming the option', () => {
    for (const onBusy of ['ignore', true, null, 0]) {
      const error = thrown(() => defineLocked({ key: 'k', onBusy }));
      expect(error).toBeInstanceOf(InvalidLockOptionsError);
      expect((error as InvalidLockOptionsError).option).toBe('onBusy');
      expect((error as Error).message).toContain('"onBusy"');
      expect((error as Error).message).toContain('@DisLock on Locked.method');
    }
    expect(thrown(() => defineLocked({ key: 'k', onBusy: 'throw' }))).toBeUndefined();
    expect(thrown(() => defineLocked({ key: 'k', onBusy: 'skip' }))).toBeUndefined();
  });
});

describe("onBusy: 'skip' with Redis down", () => {
  let server: RedisServer;
  let t: TestApp;

  beforeAll(async () => {
    server = await RedisServer.start();
    t = await createTestApp([Jobs], { redis: server.url, operationTimeout: 500 });
  });

  afterAll(async () => {
    await t.close();
    await server.dispose();
  });

  it('still rejects with RedisUnavailableError: skip is only for a busy lock', async () => {
    const jobs = t.get(Jobs);
    expect(await jobs.skip('up')).toBe('ran');
    await server.stop();
    jobs.runs = 0;
    expect(await rejection(jobs.skip('down'))).toBeInstanceOf(RedisUnavailableError);
    expect(await rejection(lastValueFrom(jobs.observe('down'), { defaultValue: 'none' }))).toBeInstanceOf(
      RedisUnavailableError,
    );
    expect(jobs.runs).toBe(0);
  });
});

// ---- decorator order ---------------------------------------------------------------------------

const MARK = 'test:mark';

@Injectable()
class Ordered {
  runs: string[] = [];

  constructor(readonly locks: LockService) {}

  // @DisLock applied first (it is nearest the method), the interval metadata after it.
  @Interval(200)
  @SetMetadata(MARK, 'above')
  @DisLock({ key: 'order-above', onBusy: 'skip' })
  async above(): Promise<string> {
    this.runs.push(`above:${this.locks.current()?.name ?? 'none'}`);
    return 'above';
  }

  // The interval metadata first, @DisLock wrapping a method that already carries it.
  @DisLock({ key: 'order-below', onBusy: 'skip' })
  @SetMetadata(MARK, 'below')
  @Interval(300)
  async below(): Promise<string> {
    this.runs.push(`below:${this.locks.current()?.name ?? 'none'}`);
    return 'below';
  }
}

describe('decorator order with @nestjs/schedule', () => {
  let t: TestApp;

  beforeAll(async () => {
    // ScheduleModule starts the intervals it finds when the application starts.
    t = await createTestApp([Ordered], {}, [ScheduleModule.forRoot()]);
  });

  afterAll(async () => {
    await t.close();
  });

  it('keeps every metadata key on the method Nest sees, in both orders', () => {
    const instance = t.get(Ordered);
    const reflector = new Reflector();
    for (const [method, mark, timeout] of [
      [instance.above, 'above', 200],
      [instance.below, 'below', 300],
    ] as const) {
      expect(reflector.get(MARK, method)).toBe(mark);
      expect(reflector.get('SCHEDULER_TYPE', method)).toBe(INTERVAL_TYPE); // SchedulerType.INTERVAL, not exported
      expect(reflector.get('SCHEDULE_INTERVAL_OPTIONS', method)).toEqual({ timeout });
      expect(Reflect.getMetadata(DISLOCK_METADATA, method)).toHaveLength(1);
      expect(method.name).toBe(mark);
    }
  });

  it('ScheduleModule runs the locked method, under its lock, in both orders', async () => {
    const instance = t.get(Ordered);
    expect(await eventually(() => instance.runs.includes('above:order-above'), 2_000)).toBe(true);
    expect(await eventually(() => instance.runs.includes('below:order-below'), 2_000)).toBe(true);
    expect(instance.runs.every((run) => !run.endsWith(':none'))).toBe(true);
  });
});

// ---- lockAtLeastFor ----------------------------------------------------------------------------

describe('lockAtLeastFor', () => {
  const prefix = uniquePrefix('least');
  let a: TestApp;
  let b: TestApp;
  let seq = 0;
  const fresh = (label = 'x'): string => `${label}-${(seq += 1)}`;
  const key = (name: string): string => prefix + name;

  beforeAll(async () => {
    a = await createTestApp([Jobs], { keyPrefix: prefix });
    b = await createTestApp([Jobs], { keyPrefix: prefix });
  });

  afterAll(async () => {
    await a.close();
    await b.close();
  });

  it('a job done in 20 ms leaves the key to expire 400 ms after acquisition; another instance skips until then', async () => {
    const id = fresh();
    const jobsA = a.get(Jobs);
    const jobsB = b.get(Jobs);
    jobsB.runs = 0;
    const started = performance.now();
    expect(await jobsA.atLeast(id, 20)).toBe('ran');
    const pttl = await redis.pttl(key(`least:${id}`));
    expect(pttl).toBeGreaterThan(250);
    expect(pttl).toBeLessThanOrEqual(381);
    const hash = await holdsOf(redis, key(`least:${id}`));
    expect(Object.values(hash)).toEqual(['1']);
    // Another instance, same tick: skipped.
    expect(await jobsB.atLeast(id, 0)).toBeUndefined();
    expect(jobsB.runs).toBe(0);
    // It expires about 400 ms after acquisition (not at the 2 s expire), and the next run goes ahead.
    expect(await eventually(async () => (await redis.exists(key(`least:${id}`))) === 0, 1_500, 5)).toBe(true);
    const gone = performance.now() - started;
    expect(gone).toBeGreaterThanOrEqual(380);
    expect(gone).toBeLessThan(700);
    expect(await jobsB.atLeast(id, 0)).toBe('ran');
    expect(jobsB.runs).toBe(1);
  });

  it('a job longer than lockAtLeastFor is released as usual', async () => {
    const id = fresh();
    expect(await a.get(Jobs).atLeastShort(id, 120)).toBe('ran');
    expect(await redis.exists(key(`least:${id}`))).toBe(0);
  });

  it('a watchdog lock (30 s lease) is cut to the time left, and renewal stops', async () => {
    const id = fresh();
    expect(await a.get(Jobs).atLeastWatchdog(id, 20)).toBe('ran');
    const pttl = await redis.pttl(key(`least:${id}`));
    expect(pttl).toBeGreaterThan(250);
    expect(pttl).toBeLessThanOrEqual(381);
    expect(await b.get(Jobs).atLeastWatchdog(id, 0)).toBeUndefined();
    expect(await eventually(async () => (await redis.exists(key(`least:${id}`))) === 0, 1_500, 5)).toBe(true);
  });

  it('a watchdog lease shorter than lockAtLeastFor is lengthened to it, no further', async () => {
    const id = fresh();
    expect(await a.get(Jobs).atLeastPastLease(id, 20)).toBe('ran');
    const pttl = await redis.pttl(key(`least:${id}`));
    expect(pttl).toBeGreaterThan(800);
    expect(pttl).toBeLessThanOrEqual(981);
  });

  it('ifExpireWhenFinish: false keeps its meaning: the fixed lease is left as it is', async () => {
    const id = fresh();
    expect(await a.get(Jobs).atLeastKept(id)).toBe('ran');
    const pttl = await redis.pttl(key(`least:${id}`));
    expect(pttl).toBeGreaterThan(900);
    expect(pttl).toBeLessThanOrEqual(1_000);
  });

  it('LockService: release() leaves the key to expire and answers false; withLock likewise', async () => {
    const name = fresh('svc');
    const handle = await a.locks.lock(name, { lockAtLeastFor: 300 });
    expect(await handle.release()).toBe(false);
    expect(await holdsOf(redis, key(name))).toEqual({ [handle.owner]: '1' });
    expect(await redis.pttl(key(name))).toBeLessThanOrEqual(300);
    expect(await b.locks.tryLock(name)).toBeNull();
    expect(handle.signal.aborted).toBe(false);

    const other = fresh('svc');
    await a.locks.withLock(other, async () => sleep(10), { lockAtLeastFor: 300 });
    const pttl = await redis.pttl(key(other));
    expect(pttl).toBeGreaterThan(150);
    expect(pttl).toBeLessThanOrEqual(291);
    expect(await rejection(b.locks.lock(other))).toBeInstanceOf(LockNotAcquiredError);
    // A waiter gets it once the minimum hold ends.
    const waited = await b.locks.lock(other, { waitTime: 1_000 });
    await waited.release();
    expect(await redis.exists(key(other))).toBe(0);
  });

  it('counts from when a waiter was handed the lock, not from when it began waiting', async () => {
    const name = fresh('grant');
    const holder = await a.locks.lock(name);
    let ranAt = 0;
    const job = async (): Promise<string> => {
      ranAt = performance.now();
      return 'ran';
    };
    const waiting = b.locks.withLock(name, job, { waitTime: 2_000, lockAtLeastFor: 300 });
    // The waiter's refused attempt is ~60 ms old when the release hands it the lock: counted from
    // that attempt, the key would expire ~60 ms early. Not ~100 ms old: a grant heard more than
    // GRANT_MS / 2 (~120 ms) after the attempt is checked by a renewal first, a round trip before
    // the job runs, and a busy machine can turn 100 into 120 (the slow path instead of the one
    // under test, and a round trip past the 10 ms allowed).
    await sleep(60);
    await holder.release();
    expect(await waiting).toBe('ran');
    const pttl = await redis.pttl(key(name));
    expect(pttl).toBeGreaterThanOrEqual(300 - (performance.now() - ranAt) - 20);
    expect(pttl).toBeLessThanOrEqual(300);
  });

  it('stopRenewal() then release() within the minimum hold still leaves the key to expire', async () => {
    const name = fresh('stopped');
    const handle = await a.locks.lock(name, { lockAtLeastFor: 300 });
    handle.stopRenewal();
    expect(await handle.release()).toBe(false);
    expect(await holdsOf(redis, key(name))).toEqual({ [handle.owner]: '1' });
    expect(await redis.pttl(key(name))).toBeLessThanOrEqual(300);
  });

  it('reentrant holds count down as before: only the end of the outermost hold sets the lease', async () => {
    const name = fresh('re');
    await a.locks.withLock(
      name,
      async (outer) => {
        await a.locks.withLock(name, async (inner) => {
          expect(inner.owner).toBe(outer.owner);
        });
        // The inner hold ended: the lock is still held and renewed, with its watchdog lease.
        expect(await redis.pttl(key(name))).toBeGreaterThan(1_000);
      },
      { lockAtLeastFor: 300, lockWatchdogTimeout: 3_000 },
    );
    const pttl = await redis.pttl(key(name));
    expect(pttl).toBeGreaterThan(150);
    expect(pttl).toBeLessThanOrEqual(300);
  });

  it('is validated: a positive whole number of ms, at most a fixed expire (naming both)', async () => {
    for (const lockAtLeastFor of [0, -1, 1.5, '100', NaN]) {
      const error = thrown(() => defineLocked({ key: 'k', lockAtLeastFor }));
      expect(error).toBeInstanceOf(InvalidLockOptionsError);
      expect((error as InvalidLockOptionsError).option).toBe('lockAtLeastFor');
    }
    const tooLong = thrown(() => defineLocked({ key: 'k', expire: 300, lockAtLeastFor: 400 }));
    expect(tooLong).toBeInstanceOf(InvalidLockOptionsError);
    expect((tooLong as Error).message).toContain('"lockAtLeastFor"');
    expect((tooLong as Error).message).toContain('"expire"');
    expect(thrown(() => defineLocked({ key: 'k', expire: 400, lockAtLeastFor: 400 }))).toBeUndefined();
    expect(thrown(() => defineLocked({ key: 'k', lockAtLeastFor: 60_000 }))).toBeUndefined();
    const viaService = await rejection(a.locks.lock(fresh(), { expire: 100, lockAtLeastFor: 200 }));
    expect(viaService).toBeInstanceOf(InvalidLockOptionsError);
    expect(await rejection(a.locks.tryLock(fresh(), { lockAtLeastFor: 0 }))).toBeInstanceOf(InvalidLockOptionsError);
  });
});

describe('lockAtLeastFor at shutdown', () => {
  it('a lock still within its minimum hold is left to expire, not deleted', async () => {
    const t = await createTestApp();
    const name = 'shutdown-least';
    const handle = await t.locks.lock(name, { lockAtLeastFor: 1_000 });
    await t.close();
    expect(await holdsOf(redis, t.prefix + name)).toEqual({ [handle.owner]: '1' });
    const pttl = await redis.pttl(t.prefix + name);
    expect(pttl).toBeGreaterThan(700);
    expect(pttl).toBeLessThanOrEqual(1_000);
  });
});

// ---- assertLocked ------------------------------------------------------------------------------

describe('LockService.assertLocked', () => {
  let t: TestApp;
  let locks: LockService;

  beforeAll(async () => {
    t = await createTestApp([Jobs]);
    locks = t.locks;
  });

  afterAll(async () => {
    await t.close();
  });

  it('throws LockNotHeldError outside any lock, naming the lock', () => {
    const named = thrown(() => locks.assertLocked('report'));
    expect(named).toBeInstanceOf(LockNotHeldError);
    expect(named).toBeInstanceOf(DisLockError);
    expect((named as LockNotHeldError).name).toBe('LockNotHeldError');
    expect((named as LockNotHeldError).lockName).toBe('report');
    expect((named as Error).message).toContain('"report"');
    expect((named as Error).message).toContain('current call chain');
    const any = thrown(() => locks.assertLocked());
    expect(any).toBeInstanceOf(LockNotHeldError);
    expect((any as LockNotHeldError).lockName).toBeUndefined();
  });

  it('passes inside a @DisLock method, across an await', async () => {
    expect(await t.get(Jobs).guarded('g1')).toBe('ran');
  });

  it('inside withLock: the lock held passes, another name throws; nested locks both pass', async () => {
    await locks.withLock('outer', async () => {
      locks.assertLocked('outer');
      locks.assertLocked();
      expect(thrown(() => locks.assertLocked('inner'))).toBeInstanceOf(LockNotHeldError);
      await locks.withLock('inner', async () => {
        locks.assertLocked('inner');
        locks.assertLocked('outer');
      });
      expect(thrown(() => locks.assertLocked('inner'))).toBeInstanceOf(LockNotHeldError);
      locks.assertLocked('outer');
    });
    expect(thrown(() => locks.assertLocked('outer'))).toBeInstanceOf(LockNotHeldError);
  });

  it('follows the call chain into a setTimeout, and not past the release', async () => {
    const inTimer = gate();
    const afterRelease = gate();
    const seen: unknown[] = [];
    await locks.withLock('timer', async () => {
      setTimeout(() => {
        seen.push(thrown(() => locks.assertLocked('timer')));
        inTimer.open();
      }, 10);
      await inTimer.promise;
      setTimeout(() => {
        seen.push(thrown(() => locks.assertLocked('timer')));
        afterRelease.open();
      }, 50);
    });
    await afterRelease.promise;
    expect(seen[0]).toBeUndefined();
    expect(seen[1]).toBeInstanceOf(LockNotHeldError);
  });

  it('does not see a handle from lock()/tryLock, which runs no code inside the lock', async () => {
    const handle = await locks.lock('manual');
    expect(thrown(() => locks.assertLocked('manual'))).toBeInstanceOf(LockNotHeldError);
    await handle.release();
  });

  it('one call chain does not see another one', async () => {
    const holding = gate();
    const done = locks.withLock('elsewhere', () => holding.promise);
    await sleep(20);
    expect(thrown(() => locks.assertLocked('elsewhere'))).toBeInstanceOf(LockNotHeldError);
    holding.open();
    await done;
  });
});

// ---- three instances, one run per tick ---------------------------------------------------------

const RUNS = Symbol('runs');

/** Where the instances of one test record their runs: `<Date.now()>:<instance>` entries of `list`. */
class RunLog {
  constructor(
    readonly list: string,
    readonly instance: string,
  ) {}

  async record(): Promise<void> {
    await redis.rpush(this.list, `${Date.now()}:${this.instance}`);
  }
}

/** Instance `i` of an application running `job` under `prefix`, recording its runs in `list`. */
function startInstance(
  job: Type<object>,
  prefix: string,
  list: string,
  i: number,
  imports: DynamicModule[] = [],
): Promise<TestApp> {
  return createTestApp([job, { provide: RUNS, useValue: new RunLog(list, `app${i}`) }], { keyPrefix: prefix }, imports);
}

@Injectable()
class TickAbove {
  constructor(@Inject(RUNS) private readonly log: RunLog) {}

  @FakeInterval(200)
  @DisLock({ key: 'tick', onBusy: 'skip', lockAtLeastFor: 150 })
  async tick(): Promise<void> {
    await this.log.record();
    await sleep(20);
  }
}

@Injectable()
class TickBelow {
  constructor(@Inject(RUNS) private readonly log: RunLog) {}

  @DisLock({ key: 'tick', onBusy: 'skip', lockAtLeastFor: 150 })
  @FakeInterval(200)
  async tick(): Promise<void> {
    await this.log.record();
    await sleep(20);
  }
}

describe('three instances share an interval job', () => {
  const prefix = uniquePrefix('tick');
  const list = `${prefix}runs`;
  const apps: TestApp[] = [];

  afterAll(async () => {
    await Promise.all(apps.map((app) => app.close()));
  });

  it('each tick runs exactly once across the three', async () => {
    debug.mockClear();
    for (const [i, type] of [TickAbove, TickBelow, TickAbove].entries()) {
      apps.push(await startInstance(type, prefix, list, i));
    }
    // The instances' schedulers start 0, 30 and 60 ms apart, as on three machines.
    const start = Date.now();
    const stops: (() => void)[] = [];
    for (const [i, app] of apps.entries()) {
      if (i > 0) await sleep(start + i * 30 - Date.now());
      stops.push(startIntervals(app.app, [i === 1 ? TickBelow : TickAbove]));
    }
    await sleep(200 * 10 + 100);
    stops.forEach((stop) => stop());
    await sleep(100); // runs under way finish

    const runs = (await redis.lrange(list, 0, -1)).map((entry) => {
      const [at, instance] = entry.split(':');
      return { tick: Math.floor((Number(at) - start) / 200), instance };
    });
    const perTick = new Map<number, number>();
    for (const run of runs) perTick.set(run.tick, (perTick.get(run.tick) ?? 0) + 1);
    expect([...perTick.values()].every((count) => count === 1)).toBe(true);
    expect(perTick.size).toBeGreaterThanOrEqual(9);
    expect([...perTick.keys()].sort((x, y) => x - y)).toEqual(Array.from({ length: perTick.size }, (_, i) => i + 1));
    // The other instances were skipped, not failed: a debug line each.
    expect(debug.mock.calls.filter(([message]) => String(message).includes('"tick"')).length).toBeGreaterThanOrEqual(
      perTick.size,
    );
  });
});

@Injectable()
class CronJob {
  constructor(@Inject(RUNS) private readonly log: RunLog) {}

  // Every second, on the wall clock: all instances fire together, as @Cron does on several machines.
  @Cron('* * * * * *')
  @DisLock({ key: 'cron-tick', onBusy: 'skip', lockAtLeastFor: 500 })
  async tick(): Promise<void> {
    await this.log.record();
    await sleep(20);
  }
}

describe('three instances share a @Cron job (@nestjs/schedule)', () => {
  const prefix = uniquePrefix('cron');
  const list = `${prefix}runs`;

  it('each second runs the job exactly once, on one of them', async () => {
    const apps: TestApp[] = [];
    try {
      for (let i = 0; i < 3; i += 1) {
        apps.push(await startInstance(CronJob, prefix, list, i, [ScheduleModule.forRoot()]));
      }
      const from = Math.ceil(Date.now() / 1000) + 1; // the first whole second all three see
      await sleep(from * 1000 + 4_000 - Date.now());
    } finally {
      await Promise.all(apps.map((app) => app.close())); // stops the cron jobs
    }
    const runs = (await redis.lrange(list, 0, -1)).map((entry) => Number(entry.split(':')[0]));
    const seconds = new Map<number, number>();
    for (const at of runs) seconds.set(Math.floor(at / 1000), (seconds.get(Math.floor(at / 1000)) ?? 0) + 1);
    const counted = [...seconds.entries()].filter(([second]) => second >= Math.ceil(runs[0] / 1000));
    expect(counted.length).toBeGreaterThanOrEqual(3);
    expect(counted.every(([, count]) => count === 1)).toBe(true);
  }, 15_000);
});

@Injectable()
class StartupJob {
  constructor(@Inject(RUNS) private readonly log: RunLog) {}

  // Once, 100 ms after each instance starts: a start-up task that must run on one instance only.
  @Timeout(100)
  @DisLock({ key: 'startup', onBusy: 'skip', lockAtLeastFor: 5_000 })
  async warmUp(): Promise<void> {
    await this.log.record();
  }
}

describe('three instances share a @Timeout job (@nestjs/schedule)', () => {
  const prefix = uniquePrefix('timeout');
  const list = `${prefix}runs`;

  it('runs on one instance; the others, starting within lockAtLeastFor, skip it', async () => {
    const apps: TestApp[] = [];
    try {
      for (let i = 0; i < 3; i += 1) {
        apps.push(await startInstance(StartupJob, prefix, list, i, [ScheduleModule.forRoot()]));
      }
      await sleep(400); // every instance's timeout has fired
      const runs = await redis.lrange(list, 0, -1);
      expect(runs).toHaveLength(1);
      expect(await redis.pttl(`${prefix}startup`)).toBeGreaterThan(0); // still kept for lockAtLeastFor
    } finally {
      await Promise.all(apps.map((app) => app.close()));
    }
  });
});
