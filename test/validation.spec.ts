import { Injectable, type Type } from '@nestjs/common';
import { Test } from '@nestjs/testing';
import {
  DisLock,
  DisLockError,
  DisLockModule,
  type DisLockModuleOptions,
  type DisLockOptions,
  InvalidLockOptionsError,
  KeyResolutionError,
  type LockOptions,
  LockService,
  MAX_LOCK_NAME_LENGTH,
  MIN_LEASE_MS,
} from 'nestjs-dislock';
import type { Redis } from 'ioredis';
import { createTestApp, type TestApp } from './support/app';
import { sharedClient, sharedRedisUrl } from './support/shared-redis';
import { thrown } from './support/async';

/** Defines a class whose method carries `@DisLock(options)`; the decorator runs right here. */
function defineLocked(options: unknown): Type<unknown> {
  class Locked {
    @DisLock(options as DisLockOptions)
    async method(): Promise<void> {}
  }
  return Locked;
}

function expectInvalid(error: unknown, option: string): InvalidLockOptionsError {
  expect(error).toBeInstanceOf(InvalidLockOptionsError);
  expect(error).toBeInstanceOf(DisLockError);
  const invalid = error as InvalidLockOptionsError;
  expect(invalid.option).toBe(option);
  expect(invalid.message).toContain(option);
  expect(invalid.name).toBe('InvalidLockOptionsError');
  return invalid;
}

describe('@DisLock options are validated when the class is defined', () => {
  const invalid: [string, Record<string, unknown>, string][] = [
    ['expire: 0', { expire: 0 }, 'expire'],
    ['expire: -5', { expire: -5 }, 'expire'],
    ['expire: NaN', { expire: NaN }, 'expire'],
    ['expire: 1.5', { expire: 1.5 }, 'expire'],
    ['expire: Infinity', { expire: Infinity }, 'expire'],
    ["expire: '100'", { expire: '100' }, 'expire'],
    ['expire: 2**31', { expire: 2 ** 31 }, 'expire'],
    ['expire: null', { expire: null }, 'expire'],
    ['lockWatchdogTimeout: 0', { lockWatchdogTimeout: 0 }, 'lockWatchdogTimeout'],
    ['lockWatchdogTimeout: -1', { lockWatchdogTimeout: -1 }, 'lockWatchdogTimeout'],
    ['lockWatchdogTimeout: 1.5', { lockWatchdogTimeout: 1.5 }, 'lockWatchdogTimeout'],
    ['lockWatchdogTimeout: 2**31', { lockWatchdogTimeout: 2 ** 31 }, 'lockWatchdogTimeout'],
    ['expire: 1 (shorter than its margin)', { expire: 1 }, 'expire'],
    ['expire: MIN_LEASE_MS - 1', { expire: MIN_LEASE_MS - 1 }, 'expire'],
    ['lockWatchdogTimeout: 2 (shorter than its margin)', { lockWatchdogTimeout: 2 }, 'lockWatchdogTimeout'],
    ['lockWatchdogTimeout: MIN_LEASE_MS - 1', { lockWatchdogTimeout: MIN_LEASE_MS - 1 }, 'lockWatchdogTimeout'],
    ['maxRenewTimes: NaN', { maxRenewTimes: NaN }, 'maxRenewTimes'],
    ['maxRenewTimes: 1.5', { maxRenewTimes: 1.5 }, 'maxRenewTimes'],
    ["maxRenewTimes: '3'", { maxRenewTimes: '3' }, 'maxRenewTimes'],
    ['waitTime: -1', { waitTime: -1 }, 'waitTime'],
    ['waitTime: 1.5', { waitTime: 1.5 }, 'waitTime'],
    ['waitTime: 2**31', { waitTime: 2 ** 31 }, 'waitTime'],
    ["ifExpireWhenFinish: 'yes'", { ifExpireWhenFinish: 'yes' }, 'ifExpireWhenFinish'],
    ['ifExpireWhenFinish: 0', { ifExpireWhenFinish: 0 }, 'ifExpireWhenFinish'],
    ['an unknown field', { timeout: 100 }, 'timeout'],
    ['a misspelt field', { expires: 100 }, 'expires'],
    ['expire with lockWatchdogTimeout', { expire: 1000, lockWatchdogTimeout: 300 }, 'lockWatchdogTimeout'],
    ['expire with maxRenewTimes', { expire: 1000, maxRenewTimes: 3 }, 'maxRenewTimes'],
    ['expire with maxRenewTimes: 0', { expire: 1000, maxRenewTimes: 0 }, 'maxRenewTimes'],
  ];

  it.each(invalid)('rejects %s', (_label, fields, option) => {
    const error = thrown(() => defineLocked({ key: 'k:{0}', ...fields }));
    const invalidError = expectInvalid(error, option);
    expect(invalidError.message).toContain('@DisLock on Locked.method');
  });

  it('throws from the class body itself, before any instance exists', () => {
    expect(() => {
      class Orders {
        @DisLock({ key: 'order:{0}', expire: 0 })
        async pay(_id: number): Promise<void> {}
      }
      return Orders;
    }).toThrow(InvalidLockOptionsError);
    expect(() => {
      class Orders {
        @DisLock({ key: 'order:{0}', waitTime: -1 })
        async pay(_id: number): Promise<void> {}
      }
      return Orders;
    }).toThrow(/@DisLock on Orders\.pay: option "waitTime"/);
  });

  const keyCases: [string, unknown][] = [
    ['missing key', {}],
    ['key undefined', { key: undefined }],
    ["key ''", { key: '' }],
    ['key 42', { key: 42 }],
    ['key null', { key: null }],
    ['key an object', { key: { template: 'x' } }],
    ["shorthand ''", ''],
    ["template '{'", { key: 'order:{' }],
    ["template '}'", { key: 'order:}' }],
    ["template '{}'", { key: 'order:{}' }],
    ["template '{a}'", { key: 'order:{a}' }],
    ["template '{0.}'", { key: 'order:{0.}' }],
    ["template '{01}'", { key: 'order:{01}' }],
    ["template '{0.constructor}'", { key: 'order:{0.constructor}' }],
    ["shorthand template '{0..x}'", 'order:{0..x}'],
    ['a static key over the length limit', { key: 'k'.repeat(MAX_LOCK_NAME_LENGTH + 1) }],
  ];

  it.each(keyCases)('rejects %s (option "key")', (_label, options) => {
    const error = thrown(() => defineLocked(options));
    const invalidError = expectInvalid(error, 'key');
    expect(invalidError.message).toContain('Locked.method');
  });

  it('rejects options that are not an object', () => {
    expectInvalid(
      thrown(() => defineLocked(null)),
      'options',
    );
    expectInvalid(
      thrown(() => defineLocked(42)),
      'options',
    );
    expectInvalid(
      thrown(() => defineLocked([{ key: 'k' }])),
      'options',
    );
  });

  it('rejects a decorator on something that is not a method', () => {
    const error = thrown(() => {
      class WithAccessor {
        // @ts-expect-error refused by the compiler too; this test is about the run-time check (plain JS, casts)
        @DisLock('k')
        get value(): number {
          return 1;
        }
      }
      return WithAccessor;
    });
    expect(error).toBeInstanceOf(InvalidLockOptionsError);
    expect((error as InvalidLockOptionsError).option).toBe('target');
    expect((error as InvalidLockOptionsError).message).toContain('WithAccessor.value');
  });

  it('rejects a static method when the class is defined: it can never get the lock service', () => {
    // Today the decorator accepts it, names it "Function.run" and fails only when called.
    const error = thrown(() => {
      class Jobs {
        @DisLock('job:{0}')
        static async run(_id: number): Promise<void> {}
      }
      return Jobs;
    });
    expect(error).toBeInstanceOf(InvalidLockOptionsError);
    expect((error as InvalidLockOptionsError).option).toBe('target');
    expect((error as InvalidLockOptionsError).message).toContain('Jobs.run');
  });

  const legal: [string, Record<string, unknown>][] = [
    ['expire: -1', { expire: -1 }],
    [
      'expire: -1 with lockWatchdogTimeout and maxRenewTimes',
      { expire: -1, lockWatchdogTimeout: 300, maxRenewTimes: 2 },
    ],
    ['expire: 50', { expire: 50 }],
    ['expire: MIN_LEASE_MS', { expire: MIN_LEASE_MS }],
    ['lockWatchdogTimeout: MIN_LEASE_MS', { lockWatchdogTimeout: MIN_LEASE_MS }],
    ['expire: 2**31 - 1', { expire: 2 ** 31 - 1 }],
    ['lockWatchdogTimeout: 300', { lockWatchdogTimeout: 300 }],
    ['maxRenewTimes: 0', { maxRenewTimes: 0 }],
    ['maxRenewTimes: -1', { maxRenewTimes: -1 }],
    ['maxRenewTimes: 5', { maxRenewTimes: 5 }],
    ['waitTime: 0', { waitTime: 0 }],
    ['waitTime: 2000', { waitTime: 2000 }],
    ['ifExpireWhenFinish: false', { ifExpireWhenFinish: false }],
    ['explicitly undefined optional fields', { expire: undefined, waitTime: undefined }],
    ['a key function', { key: (id: number) => `k:${id}` }],
    ['a static key', { key: 'nightly' }],
    ['an escaped brace key', { key: '{{literal}}' }],
  ];

  it.each(legal)('accepts %s', (_label, fields) => {
    expect(() => defineLocked({ key: 'k:{0}', ...fields })).not.toThrow();
  });

  it('a lease too short to outlast its margin names the option and the shortest lease that works', () => {
    const error = expectInvalid(
      thrown(() => defineLocked({ key: 'k', expire: 2 })),
      'expire',
    );
    expect(error.message).toBe(
      '@DisLock on Locked.method: option "expire" (2 ms) is too short to be honoured: a holder counts its lease as ' +
        "ended 2.02 ms early (2 ms + 1 %, for Redis's whole milliseconds and late timers), so every acquisition " +
        `would find it over and the lock would always look taken; the shortest lease that works is ${MIN_LEASE_MS} ms`,
    );
    // The shortest lease outlasts its margin (2 ms + 1 %) by a millisecond; one less does not.
    expect(MIN_LEASE_MS - (2 + MIN_LEASE_MS / 100)).toBeGreaterThanOrEqual(1);
    expect(MIN_LEASE_MS - 1 - (2 + (MIN_LEASE_MS - 1) / 100)).toBeLessThan(1);
  });

  it('accepts the string shorthand', () => {
    expect(() => defineLocked('order:{0}')).not.toThrow();
  });
});

describe('LockService validates its arguments at call time', () => {
  let t: TestApp;
  let redis: Redis;
  beforeAll(async () => {
    t = await createTestApp();
    redis = sharedClient();
  });
  afterAll(async () => {
    await t.close();
    redis.disconnect();
  });

  const badOptions: [string, unknown, string][] = [
    ['expire: 0', { expire: 0 }, 'expire'],
    ['expire: 1.5', { expire: 1.5 }, 'expire'],
    ["expire: '100'", { expire: '100' }, 'expire'],
    ['lockWatchdogTimeout: 0', { lockWatchdogTimeout: 0 }, 'lockWatchdogTimeout'],
    ['expire: 2 (shorter than its margin)', { expire: 2 }, 'expire'],
    ['expire: MIN_LEASE_MS - 1', { expire: MIN_LEASE_MS - 1, waitTime: 500 }, 'expire'],
    ['lockWatchdogTimeout: MIN_LEASE_MS - 1', { lockWatchdogTimeout: MIN_LEASE_MS - 1 }, 'lockWatchdogTimeout'],
    ['maxRenewTimes: NaN', { maxRenewTimes: NaN }, 'maxRenewTimes'],
    ['waitTime: -1', { waitTime: -1 }, 'waitTime'],
    ['expire with lockWatchdogTimeout', { expire: 500, lockWatchdogTimeout: 300 }, 'lockWatchdogTimeout'],
    ['the decorator-only field key', { key: 'x' }, 'key'],
    ['the decorator-only field ifExpireWhenFinish', { ifExpireWhenFinish: false }, 'ifExpireWhenFinish'],
    ['an unknown field', { ttl: 5 }, 'ttl'],
    ['options that are not an object', 'fast', 'options'],
    ['null options', null, 'options'],
  ];

  it.each(badOptions)('rejects %s on tryLock, lock and withLock', async (_label, options, option) => {
    const fn = vi.fn();
    const calls: [string, () => Promise<unknown>][] = [
      ['tryLock', () => t.locks.tryLock('valid-name', options as LockOptions)],
      ['lock', () => t.locks.lock('valid-name', options as LockOptions)],
      ['withLock', () => t.locks.withLock('valid-name', fn, options as LockOptions)],
    ];
    for (const [method, call] of calls) {
      const error = await call().then(
        () => undefined,
        (reason: unknown) => reason,
      );
      const invalidError = expectInvalid(error, option);
      expect(invalidError.message).toContain(method === 'withLock' ? 'LockService.lock' : `LockService.${method}`);
    }
    expect(fn).not.toHaveBeenCalled();
    expect(await redis.exists(`${t.prefix}valid-name`)).toBe(0);
  });

  const badNames: [string, unknown][] = [
    ['an empty name', ''],
    ['a number', 42],
    ['undefined', undefined],
    ['null', null],
    ['an object', { name: 'x' }],
    ['a name over the length limit', 'n'.repeat(MAX_LOCK_NAME_LENGTH + 1)],
  ];

  it.each(badNames)('rejects %s as lock name (option "name")', async (_label, name) => {
    const fn = vi.fn();
    for (const call of [
      () => t.locks.tryLock(name as string),
      () => t.locks.lock(name as string),
      () => t.locks.withLock(name as string, fn),
    ]) {
      const error = await call().then(
        () => undefined,
        (reason: unknown) => reason,
      );
      expect(error).toBeInstanceOf(InvalidLockOptionsError);
      expect((error as InvalidLockOptionsError).option).toBe('name');
      expect((error as InvalidLockOptionsError).message).toMatch(/^LockService: /);
    }
    expect(fn).not.toHaveBeenCalled();
    expect(await redis.keys(`${t.prefix}*`)).toEqual([]);
  });

  it('accepts a name of exactly the length limit', async () => {
    const name = 'n'.repeat(MAX_LOCK_NAME_LENGTH);
    const handle = await t.locks.lock(name, { expire: 1000 });
    expect(await redis.exists(`${t.prefix}${name}`)).toBe(1);
    expect(await handle.release()).toBe(true);
  });

  it('takes a template-looking name literally', async () => {
    await t.locks.withLock('order:{0}', async (handle) => {
      expect(handle.name).toBe('order:{0}');
      expect(await redis.exists(`${t.prefix}order:{0}`)).toBe(1);
    });
  });

  it('rejects a withLock callback that is not a function (option "fn")', async () => {
    const error = await t.locks.withLock('valid-name', 'not a function' as unknown as () => void).then(
      () => undefined,
      (reason: unknown) => reason,
    );
    expect(error).toBeInstanceOf(InvalidLockOptionsError);
    expect((error as InvalidLockOptionsError).option).toBe('fn');
    expect(await redis.exists(`${t.prefix}valid-name`)).toBe(0);
  });

  it('the shortest lease that can be honoured takes a free lock', async () => {
    // Some room to wait: an answer that comes after the lease's margin (a slow round trip on a busy
    // machine) is given back and tried again, as with any lease.
    const handle = await t.locks.tryLock('shortest-lease', { expire: MIN_LEASE_MS, waitTime: 2_000 });
    expect(handle).not.toBeNull();
    await handle?.release();
  });

  it('accepts the legal edge values', async () => {
    for (const options of [
      { expire: -1 },
      { expire: 50 },
      { lockWatchdogTimeout: 300, maxRenewTimes: 0 },
      { maxRenewTimes: -1 },
      { waitTime: 0 },
      undefined,
      {},
    ] satisfies (LockOptions | undefined)[]) {
      const handle = await t.locks.lock('edge', options);
      expect(await handle.release()).toBe(true);
    }
  });
});

describe('names that are not well-formed Unicode are refused before Redis is touched', () => {
  // UTF-8, which Redis keys are sent in, has no lone surrogate: Node writes U+FFFD instead, so
  // 's\uD800', 's\uDBFF' and 's\uFFFD' would be one key, one lock shared by three names.
  const lone = ['s\uD800', 's\uDBFF', '\uDC00s'];

  @Injectable()
  class Jobs {
    readonly ran: string[] = [];

    @DisLock('job:{0}')
    async byTemplate(id: string): Promise<void> {
      this.ran.push(id);
    }

    @DisLock((id: string) => `job:${id}`)
    async byFunction(id: string): Promise<void> {
      this.ran.push(id);
    }

    @DisLock({ key: ['job:a', 'job:{0}'] })
    async both(id: string): Promise<void> {
      this.ran.push(id);
    }
  }

  let t: TestApp;
  let redis: Redis;
  beforeAll(async () => {
    t = await createTestApp([Jobs]);
    redis = sharedClient();
  });
  afterAll(async () => {
    await t.close();
    redis.disconnect();
  });

  it.each(lone)('LockService refuses %j on every call that takes a name, naming "name"', async (name) => {
    const fn = vi.fn();
    const calls: (() => Promise<unknown>)[] = [
      () => t.locks.tryLock(name),
      () => t.locks.lock(name),
      () => t.locks.withLock(name, fn),
      () => t.locks.lock(['fine', name]),
      async () => t.locks.inspect(name),
      async () => t.locks.forceUnlock(name),
      async () => t.locks.assertLocked(name),
    ];
    for (const call of calls) {
      const error = await call().then(
        () => undefined,
        (reason: unknown) => reason,
      );
      const invalid = expectInvalid(error, 'name');
      expect(invalid.message).toContain('must be well-formed Unicode');
      expect(invalid.message).toContain('lone surrogate');
    }
    expect(fn).not.toHaveBeenCalled();
    expect(await redis.keys(`${t.prefix}*`)).toEqual([]);
  });

  it.each(lone)('@DisLock refuses a key resolving to %j with KeyResolutionError, running nothing', async (name) => {
    const jobs = t.get(Jobs);
    for (const call of [() => jobs.byTemplate(name), () => jobs.byFunction(name), () => jobs.both(name)]) {
      const error = await call().then(
        () => undefined,
        (reason: unknown) => reason,
      );
      expect(error).toBeInstanceOf(KeyResolutionError);
      expect((error as KeyResolutionError).message).toContain('must resolve to well-formed Unicode');
    }
    expect(jobs.ran).toEqual([]);
    expect(await redis.keys(`${t.prefix}*`)).toEqual([]);
  });

  it('U+FFFD itself and surrogate pairs are names like any other, each its own key', async () => {
    const replacement = await t.locks.lock('s\uFFFD');
    const emoji = await t.locks.lock('s\uD83D\uDE00');
    expect(await redis.exists(`${t.prefix}s\uFFFD`, `${t.prefix}s\uD83D\uDE00`)).toBe(2);
    expect(await replacement.release()).toBe(true);
    expect(await emoji.release()).toBe(true);
    await t.get(Jobs).byTemplate('\uD83D\uDE00');
    expect(t.get(Jobs).ran).toEqual(['\uD83D\uDE00']);
  });
});

describe('DisLockModule.forRoot validates synchronously', () => {
  function forRoot(options: unknown): unknown {
    return thrown(() => DisLockModule.forRoot(options as DisLockModuleOptions));
  }

  const cases: [string, unknown, string][] = [
    ['options missing', undefined, 'options'],
    ['redis missing', {}, 'redis'],
    ['redis null', { redis: null }, 'redis'],
    ['redis a number', { redis: 6379 }, 'redis'],
    ['redis a host:port string', { redis: 'localhost:6379' }, 'redis'],
    ['redis an http URL', { redis: 'http://localhost:6379' }, 'redis'],
    ['redis a bare scheme', { redis: 'redis://' }, 'redis'],
    ['redis an array', { redis: [] }, 'redis'],
    ['redis a Date', { redis: new Date() }, 'redis'],
    ['redis a Map', { redis: new Map([['host', 'localhost']]) }, 'redis'],
    ['keyPrefix a number', { redis: 'redis://localhost:6379', keyPrefix: 1 }, 'keyPrefix'],
    ['keyPrefix null', { redis: 'redis://localhost:6379', keyPrefix: null }, 'keyPrefix'],
    ['keyPrefix with a lone surrogate', { redis: 'redis://localhost:6379', keyPrefix: 'app\uD800:' }, 'keyPrefix'],
    ['an unknown option', { redis: 'redis://localhost:6379', prefix: 'x:' }, 'prefix'],
    ['expire module-wide', { redis: 'redis://localhost:6379', expire: 1000 }, 'expire'],
    ['expire -1 module-wide', { redis: 'redis://localhost:6379', expire: -1 }, 'expire'],
    ['operationTimeout: 0', { redis: 'redis://localhost:6379', operationTimeout: 0 }, 'operationTimeout'],
    ['operationTimeout: 1.5', { redis: 'redis://localhost:6379', operationTimeout: 1.5 }, 'operationTimeout'],
    ['lockWatchdogTimeout: 0', { redis: 'redis://localhost:6379', lockWatchdogTimeout: 0 }, 'lockWatchdogTimeout'],
    [
      'lockWatchdogTimeout: MIN_LEASE_MS - 1',
      { redis: 'redis://localhost:6379', lockWatchdogTimeout: MIN_LEASE_MS - 1 },
      'lockWatchdogTimeout',
    ],
    ['maxRenewTimes: 1.5', { redis: 'redis://localhost:6379', maxRenewTimes: 1.5 }, 'maxRenewTimes'],
    ['waitTime: -1', { redis: 'redis://localhost:6379', waitTime: -1 }, 'waitTime'],
    ['whenDisconnected: "queue"', { redis: 'redis://localhost:6379', whenDisconnected: 'queue' }, 'whenDisconnected'],
    ['whenDisconnected: true', { redis: 'redis://localhost:6379', whenDisconnected: true }, 'whenDisconnected'],
  ];

  it.each(cases)('throws on %s', (_label, options, option) => {
    const error = expectInvalid(forRoot(options), option);
    expect(error.message).toContain('DisLockModule');
  });

  it('accepts legal options without connecting', () => {
    expect(forRoot({ redis: 'redis://127.0.0.1:1' })).toBeUndefined();
    expect(forRoot({ redis: 'rediss://127.0.0.1:1', keyPrefix: '' })).toBeUndefined();
    expect(forRoot({ redis: { host: '127.0.0.1', port: 1, lazyConnect: true } })).toBeUndefined();
    expect(
      forRoot({
        redis: 'redis://127.0.0.1:1',
        lockWatchdogTimeout: 300,
        maxRenewTimes: 0,
        waitTime: 0,
        operationTimeout: 1,
        isGlobal: false,
      }),
    ).toBeUndefined();
    for (const whenDisconnected of ['fail', 'wait']) {
      expect(forRoot({ redis: 'redis://127.0.0.1:1', whenDisconnected })).toBeUndefined();
    }
  });

  it('says what whenDisconnected takes', () => {
    const error = expectInvalid(
      forRoot({ redis: 'redis://127.0.0.1:1', whenDisconnected: 'queue' }),
      'whenDisconnected',
    );
    expect(error.message).toBe(
      'DisLockModule: option "whenDisconnected" must be "fail" (fail at once while Redis is known unreachable, the default) or "wait" (wait up to operationTimeout for a reconnection), got "queue"',
    );
  });

  it('forRootAsync validates the factory result when the app starts', async () => {
    const error = await Test.createTestingModule({
      imports: [
        DisLockModule.forRootAsync({
          useFactory: () => ({ redis: sharedRedisUrl(), operationTimeout: 0 }),
        }),
      ],
    })
      .compile()
      .then(
        () => undefined,
        (reason: unknown) => reason,
      );
    expectInvalid(error, 'operationTimeout');
  });
});

describe('a decorated class still boots once its options are valid', () => {
  @Injectable()
  class Valid {
    // A lease the first call can always outlive: a fresh client loads its scripts on that call, and
    // an acquire answered after its lease is given back (LockNotAcquiredError) by design.
    @DisLock({ key: 'v:{0}', expire: 5_000 })
    async run(id: number): Promise<number> {
      return id;
    }
  }

  it('runs', async () => {
    const t = await createTestApp([Valid]);
    try {
      expect(t.get(Valid)).toBeInstanceOf(Valid);
      expect(await t.get(Valid).run(3)).toBe(3);
      expect(t.get(LockService)).toBe(t.locks);
    } finally {
      await t.close();
    }
  });
});
