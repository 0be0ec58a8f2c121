import {
  Controller,
  type DynamicModule,
  Get,
  type INestApplication,
  Injectable,
  Logger,
  Module,
  Param,
  ParseIntPipe,
} from '@nestjs/common';
import { Test } from '@nestjs/testing';
import { Redis } from 'ioredis';
import { trackTimers } from './support/timers';
import {
  DisLock,
  DisLockError,
  DisLockModule,
  type DisLockModuleOptions,
  InvalidLockOptionsError,
  type LockHandle,
  LockNotAcquiredError,
  LockService,
} from 'nestjs-dislock';
import request from 'supertest';
import { createTestApp, type TestApp } from './support/app';
import { RedisServer } from './support/redis-server';
import { eventually, sharedClient, sharedRedisUrl, sleep, uniquePrefix } from './support/shared-redis';
import { lostReason, gate, settle } from './support/async';
import { holdsOf } from './support/lock-hash';

function sharedPort(): number {
  return Number(new URL(sharedRedisUrl()).port);
}

async function connectedClients(redis: Redis): Promise<number> {
  const list = (await redis.call('CLIENT', 'LIST')) as string;
  return list.split('\n').filter((line) => line.trim().length > 0).length;
}

/**
 * The timers created from now on by the library or ioredis that are still pending and keep the
 * process alive (ref'd), with where they were created.
 */
function trackAliveTimers(): { alive(): string[]; stop(): void } {
  const timers = trackTimers();
  return {
    alive: () =>
      timers
        .pending()
        .filter(({ timer }) => timer.hasRef())
        // Only the library's and its Redis client's timers (the test runner has timers of its own).
        .filter(({ stack }) => stack.includes('ioredis') || /[\\/]lib[\\/][\w./-]+\.ts/.test(stack))
        .map(({ stack }) => stack.split('\n').slice(2, 14).join('\n')),
    stop: timers.stop,
  };
}

// ---- providers used by the tests -------------------------------------------------------------

@Injectable()
class NeedsLocks {
  constructor(readonly locks: LockService) {}
}

@Injectable()
class LockedWork {
  @DisLock('work:{0}')
  async run(id: string): Promise<string> {
    return `ran ${id}`;
  }
}

@Module({ providers: [NeedsLocks] })
class FeatureWithoutImport {}

@Module({ providers: [LockedWork] })
class DecoratedFeatureWithoutImport {}

@Controller('locked')
class LockedController {
  @Get(':id')
  @DisLock('locked:{0}')
  async get(@Param('id') id: string): Promise<string> {
    return id;
  }
}

@Module({})
class FeatureWithImport {
  static with(dislock: DynamicModule): DynamicModule {
    return { module: FeatureWithImport, imports: [dislock], providers: [NeedsLocks], exports: [NeedsLocks] };
  }
}

const LOCK_CONFIG = 'LOCK_CONFIG';
interface LockConfig {
  readonly url: string;
  readonly prefix: string;
  readonly lease: number;
}

@Module({})
class LockConfigModule {
  static with(config: LockConfig): DynamicModule {
    return {
      module: LockConfigModule,
      providers: [{ provide: LOCK_CONFIG, useValue: config }],
      exports: [LOCK_CONFIG],
    };
  }
}

const useClassPrefix = uniquePrefix('use-class');

@Injectable()
class DisLockOptionsFactory {
  create(): DisLockModuleOptions {
    return { redis: sharedRedisUrl(), keyPrefix: useClassPrefix, lockWatchdogTimeout: 800 };
  }
}

@Injectable()
class DefaultsUser {
  @DisLock('defaults:{0}')
  async inside<T>(_id: string, fn: () => Promise<T>): Promise<T> {
    return fn();
  }
}

/** Held open by the test until it calls `release.open()`. */
const shutdownGate = { release: gate(), seen: [] as LockHandle[] };

@Injectable()
class LongJobs {
  constructor(private readonly locks: LockService) {}

  @DisLock({ key: 'long:{0}', lockWatchdogTimeout: 5_000 })
  async long(id: string): Promise<string> {
    const handle = this.locks.current();
    if (handle) shutdownGate.seen.push(handle);
    await shutdownGate.release.promise;
    return `long ${id}`;
  }

  @DisLock({ key: 'keep:{0}', lockWatchdogTimeout: 1_500, ifExpireWhenFinish: false })
  async keep(id: string): Promise<string> {
    const handle = this.locks.current();
    if (handle) shutdownGate.seen.push(handle);
    await shutdownGate.release.promise;
    return `keep ${id}`;
  }
}

/** What the HTTP handler is waiting for; replaced per test. */
const http = { release: Promise.resolve(), entered: [] as number[] };

@Controller('items')
class ItemsController {
  constructor(private readonly locks: LockService) {}

  @Get(':id')
  @DisLock('item:{0}')
  async get(@Param('id', ParseIntPipe) id: number): Promise<{ id: number; lock: string | undefined }> {
    http.entered.push(id);
    await http.release;
    return { id, lock: this.locks.current()?.name };
  }
}

// ---- tests ---------------------------------------------------------------------------------------

describe('DisLockModule', () => {
  const redis = sharedClient();
  const warn = vi.spyOn(Logger.prototype, 'warn').mockImplementation(() => undefined);

  afterAll(() => {
    redis.disconnect();
    warn.mockRestore();
  });

  describe('forRoot connections', () => {
    it('connects with a redis:// URL', async () => {
      const t = await createTestApp([], { redis: sharedRedisUrl() });
      try {
        const h = await t.locks.lock('url');
        expect(await holdsOf(redis, `${t.prefix}url`)).toEqual({ [h.owner]: '1' });
        expect(await h.release()).toBe(true);
      } finally {
        await t.close();
      }
    });

    it('connects with RedisOptions { host, port }', async () => {
      const t = await createTestApp([], { redis: { host: '127.0.0.1', port: sharedPort() } });
      try {
        const h = await t.locks.lock('opts');
        expect(await holdsOf(redis, `${t.prefix}opts`)).toEqual({ [h.owner]: '1' });
        expect(await h.release()).toBe(true);
      } finally {
        await t.close();
      }
    });

    it('uses an ioredis instance as it is and leaves it open after app.close()', async () => {
      const client = new Redis(sharedRedisUrl());
      try {
        const t = await createTestApp([], { redis: client });
        const h = await t.locks.lock('instance');
        expect(await holdsOf(redis, `${t.prefix}instance`)).toEqual({ [h.owner]: '1' });
        const held = await t.locks.lock('held-at-close');
        await t.close();
        // Held locks were still released through the user's client, and it stays open and usable.
        expect(await redis.exists(`${t.prefix}instance`)).toBe(0);
        expect(await redis.exists(`${t.prefix}held-at-close`)).toBe(0);
        expect(lostReason(held.signal.reason)).toBe('shutdown');
        expect(client.status).toBe('ready');
        expect(await client.ping()).toBe('PONG');
        await client.set(`${t.prefix}still-usable`, '1', 'PX', 1_000);
        expect(await client.get(`${t.prefix}still-usable`)).toBe('1');
      } finally {
        await client.quit();
      }
    });

    it("defaults keyPrefix to 'dislock:'", async () => {
      const server = await RedisServer.start();
      const assertions = server.client();
      try {
        const moduleRef = await Test.createTestingModule({
          imports: [DisLockModule.forRoot({ redis: server.url })],
        }).compile();
        const app = await moduleRef.init();
        try {
          const h = await app.get(LockService).lock('default-prefix');
          expect(h.key).toBe('dislock:default-prefix');
          expect(await holdsOf(assertions, 'dislock:default-prefix')).toEqual({ [h.owner]: '1' });
          expect(await h.release()).toBe(true);
          expect(await assertions.exists('dislock:default-prefix')).toBe(0);
        } finally {
          await app.close();
        }
      } finally {
        assertions.disconnect();
        await server.dispose();
      }
    });

    it('uses a custom keyPrefix', async () => {
      const prefix = `${uniquePrefix('custom')}app:`;
      const t = await createTestApp([], { keyPrefix: prefix });
      try {
        const h = await t.locks.lock('named');
        expect(h.key).toBe(`${prefix}named`);
        expect(await holdsOf(redis, `${prefix}named`)).toEqual({ [h.owner]: '1' });
        expect(await redis.exists(`dislock:named`)).toBe(0);
        await h.release();
      } finally {
        await t.close();
      }
    });
  });

  describe('forRootAsync', () => {
    it('useFactory + inject from an imported module', async () => {
      const config: LockConfig = { url: sharedRedisUrl(), prefix: uniquePrefix('factory'), lease: 700 };
      const moduleRef = await Test.createTestingModule({
        imports: [
          DisLockModule.forRootAsync({
            imports: [LockConfigModule.with(config)],
            inject: [LOCK_CONFIG],
            useFactory: async (c: LockConfig) => {
              await sleep(1);
              return { redis: c.url, keyPrefix: c.prefix, lockWatchdogTimeout: c.lease };
            },
          }),
        ],
        providers: [NeedsLocks],
      }).compile();
      const app = await moduleRef.init();
      try {
        const h = await app.get(NeedsLocks).locks.lock('async');
        expect(h.key).toBe(`${config.prefix}async`);
        const pttl = await redis.pttl(h.key);
        expect(pttl).toBeGreaterThan(400);
        expect(pttl).toBeLessThanOrEqual(700);
        expect(await h.release()).toBe(true);
      } finally {
        await app.close();
      }
    });

    it('useClass', async () => {
      const moduleRef = await Test.createTestingModule({
        imports: [DisLockModule.forRootAsync({ useClass: DisLockOptionsFactory })],
      }).compile();
      const app = await moduleRef.init();
      try {
        const h = await app.get(LockService).lock('class');
        expect(h.key).toBe(`${useClassPrefix}class`);
        const pttl = await redis.pttl(h.key);
        expect(pttl).toBeGreaterThan(500);
        expect(pttl).toBeLessThanOrEqual(800);
        expect(await h.release()).toBe(true);
      } finally {
        await app.close();
      }
    });

    it('validates the options the factory returns at startup', async () => {
      const built = settle(
        Test.createTestingModule({
          imports: [
            DisLockModule.forRootAsync({
              useFactory: () => ({ redis: sharedRedisUrl(), lockWatchdogTimeout: -5 }),
            }),
          ],
        }).compile(),
      );
      const result = await built;
      expect(result.ok).toBe(false);
      const error = (result as { error: unknown }).error;
      expect(error).toBeInstanceOf(InvalidLockOptionsError);
      expect((error as InvalidLockOptionsError).option).toBe('lockWatchdogTimeout');
    });
  });

  describe('forgotten', () => {
    it.each([
      ['a provider', { providers: [LockedWork] }, 'LockedWork'],
      ['a controller', { controllers: [LockedController] }, 'LockedController'],
    ])(
      '@DisLock on %s of an app without DisLockModule: startup fails naming DisLockModule.forRoot()',
      async (_label, metadata, className) => {
        @Module(metadata)
        class AppWithoutDisLock {}
        const built = await settle(Test.createTestingModule({ imports: [AppWithoutDisLock] }).compile());
        expect(built.ok).toBe(false);
        const message = String((built as { error: unknown }).error);
        expect(message).toContain(`Nest can't resolve dependencies of the ${className}`);
        expect(message).toContain('add DisLockModule.forRoot() or forRootAsync() to the imports of the root module');
      },
    );
  });

  describe('isGlobal: false', () => {
    it('a feature module that does not import it cannot resolve LockService or @DisLock', async () => {
      const client = new Redis(sharedRedisUrl()); // the app's own client: nothing leaks if compile fails
      try {
        const dislock = DisLockModule.forRoot({ redis: client, keyPrefix: uniquePrefix(), isGlobal: false });
        const plain = await settle(Test.createTestingModule({ imports: [dislock, FeatureWithoutImport] }).compile());
        expect(plain.ok).toBe(false);
        expect(String((plain as { error: unknown }).error)).toContain('LockService');

        const decorated = await settle(
          Test.createTestingModule({ imports: [dislock, DecoratedFeatureWithoutImport] }).compile(),
        );
        expect(decorated.ok).toBe(false);
        expect(String((decorated as { error: unknown }).error)).toContain('DisLockInterceptor');
      } finally {
        await client.quit();
      }
    });

    it('works where it is imported', async () => {
      const prefix = uniquePrefix();
      const dislock = DisLockModule.forRoot({ redis: sharedRedisUrl(), keyPrefix: prefix, isGlobal: false });
      const moduleRef = await Test.createTestingModule({
        imports: [dislock, FeatureWithImport.with(dislock)],
      }).compile();
      const app = await moduleRef.init();
      try {
        const { locks } = app.get(NeedsLocks);
        expect(locks).toBe(app.get(LockService));
        const h = await locks.lock('feature');
        expect(await holdsOf(redis, `${prefix}feature`)).toEqual({ [h.owner]: '1' });
        expect(await h.release()).toBe(true);
      } finally {
        await app.close();
      }
    });
  });

  describe('module-wide defaults', () => {
    let t: TestApp;
    beforeAll(async () => {
      t = await createTestApp([DefaultsUser], { lockWatchdogTimeout: 600, waitTime: 400, maxRenewTimes: 2 });
    });
    afterAll(async () => {
      await t.close();
    });

    it('lockWatchdogTimeout applies to LockService and @DisLock locks that do not set it', async () => {
      const h = await t.locks.lock('lease');
      const pttl = await redis.pttl(h.key);
      expect(pttl).toBeGreaterThan(400);
      expect(pttl).toBeLessThanOrEqual(600);
      await h.release();

      const own = await t.locks.lock('own-lease', { lockWatchdogTimeout: 2_000 });
      expect(await redis.pttl(own.key)).toBeGreaterThan(1_500);
      await own.release();

      const decorated = await t.get(DefaultsUser).inside('d', () => redis.pttl(`${t.prefix}defaults:d`));
      expect(decorated).toBeGreaterThan(400);
      expect(decorated).toBeLessThanOrEqual(600);
    });

    it('waitTime applies when a lock does not set it', async () => {
      const holder = await t.locks.lock('wait');
      setTimeout(() => void holder.release(), 150);
      const started = performance.now();
      const waiter = await t.locks.tryLock('wait');
      expect(waiter).not.toBeNull();
      expect(performance.now() - started).toBeGreaterThanOrEqual(100);
      await waiter?.release();

      const stuck = await t.locks.lock('wait-stuck');
      const error: unknown = await t.locks.lock('wait-stuck').catch((e: unknown) => e);
      expect(error).toBeInstanceOf(LockNotAcquiredError);
      expect((error as LockNotAcquiredError).waitedMs).toBe(400);
      expect(await t.locks.tryLock('wait-stuck', { waitTime: 0 })).toBeNull();
      await stuck.release();
    });

    it('maxRenewTimes applies when a lock does not set it', async () => {
      const started = performance.now();
      const h = await t.locks.lock('cap');
      const aborted = await eventually(() => h.signal.aborted, 2_500);
      expect(aborted).toBe(true);
      expect(lostReason(h.signal.reason)).toBe('max-renewals');
      expect(performance.now() - started).toBeGreaterThanOrEqual(800); // 2 renewals (~200 ms apart) + 600 ms
    });
  });

  describe('shutdown', () => {
    it('releases held locks, aborts their signals with shutdown, keeps ifExpireWhenFinish:false keys, closes its client', async () => {
      const server = await RedisServer.start();
      const assertions = server.client();
      shutdownGate.release = gate();
      shutdownGate.seen = [];
      const t = await createTestApp([LongJobs], { redis: server.url });
      let closed = false;
      try {
        const jobs = t.get(LongJobs);
        const service = await t.locks.lock('svc', { lockWatchdogTimeout: 5_000 });
        const long = settle(jobs.long('a'));
        const keep = settle(jobs.keep('b'));
        const keys = [`${t.prefix}svc`, `${t.prefix}long:a`, `${t.prefix}keep:b`];
        expect(await eventually(async () => (await assertions.exists(...keys)) === 3)).toBe(true);
        expect(await eventually(() => shutdownGate.seen.length === 2)).toBe(true); // both methods are running
        expect(await connectedClients(assertions)).toBe(2); // the module's client and ours

        await t.close();
        closed = true;

        expect(await assertions.exists(`${t.prefix}svc`)).toBe(0);
        expect(await assertions.exists(`${t.prefix}long:a`)).toBe(0);
        const keptPttl = await assertions.pttl(`${t.prefix}keep:b`);
        expect(keptPttl).toBeGreaterThan(0);
        expect(keptPttl).toBeLessThanOrEqual(1_500);
        expect(lostReason(service.signal.reason)).toBe('shutdown');
        for (const handle of shutdownGate.seen) expect(lostReason(handle.signal.reason)).toBe('shutdown');

        // The methods still finish normally, and their late finish does not touch Redis.
        shutdownGate.release.open();
        expect(await long).toMatchObject({ ok: true, value: 'long a' });
        expect(await keep).toMatchObject({ ok: true, value: 'keep b' });
        expect(await service.release()).toBe(false);
        expect(await assertions.exists(`${t.prefix}keep:b`)).toBe(1);

        // The module's client is gone.
        expect(await eventually(async () => (await connectedClients(assertions)) === 1, 2_000)).toBe(true);

        // Nothing renews the kept key any more: it expires within its lease.
        expect(await eventually(async () => (await assertions.exists(`${t.prefix}keep:b`)) === 0, 2_500)).toBe(true);
      } finally {
        shutdownGate.release.open();
        if (!closed) await t.close();
        assertions.disconnect();
        await server.dispose();
      }
    });

    it('app.close() leaves no timer that keeps the process alive', async () => {
      const t = await createTestApp();
      const held = await t.locks.lock('timers', { lockWatchdogTimeout: 900 });
      const released = await t.locks.lock('timers-released', { expire: 900 });
      await released.release();
      const timers = trackAliveTimers();
      try {
        await t.close();
        await sleep(50);
        expect(timers.alive()).toEqual([]);
        expect(lostReason(held.signal.reason)).toBe('shutdown');
      } finally {
        timers.stop();
      }
    });

    it('app.close() with its Redis down leaves no timer that keeps the process alive either', async () => {
      const server = await RedisServer.start();
      const t = await createTestApp([], { redis: server.url, operationTimeout: 300 });
      const timers = trackAliveTimers();
      try {
        const h = await t.locks.lock('down-at-close', { lockWatchdogTimeout: 900 });
        await server.stop();
        const started = performance.now();
        await t.close();
        expect(performance.now() - started).toBeLessThan(2_000); // release and QUIT are bounded
        expect(lostReason(h.signal.reason)).toBe('shutdown');
        await sleep(50);
        expect(timers.alive()).toEqual([]);
      } finally {
        timers.stop();
        await server.dispose();
      }
    });

    it('refuses new acquisitions after close, without touching Redis', async () => {
      const t = await createTestApp();
      await t.close();
      const started = performance.now();
      const error: unknown = await t.locks.lock('after-close').catch((e: unknown) => e);
      expect(error).toBeInstanceOf(DisLockError);
      expect(performance.now() - started).toBeLessThan(500);
      expect(await redis.exists(`${t.prefix}after-close`)).toBe(0);
    });

    it('a caller still waiting (waitTime) at close does not end up holding the lock', async () => {
      const t = await createTestApp();
      const key = `${t.prefix}busy`;
      try {
        await t.locks.lock('busy', { lockWatchdogTimeout: 5_000 });
        const waiter = settle(t.locks.tryLock('busy', { waitTime: 3_000, lockWatchdogTimeout: 5_000 }));
        await sleep(50);
        await t.close();
        const result = await waiter;
        // Either null or an error is fine; a lock taken during shutdown is left behind in Redis.
        const outcome = !result.ok ? 'rejected' : result.value === null ? 'null' : `acquired by ${result.value.owner}`;
        expect(['rejected', 'null']).toContain(outcome);
        expect(await redis.exists(key)).toBe(0);
      } finally {
        await redis.del(key);
      }
    });
  });

  describe('two applications in one process', () => {
    it('never see each other’s locks (each its own Redis, same keyPrefix)', async () => {
      const server = await RedisServer.start();
      const privateClient = server.client();
      const prefix = uniquePrefix('two-apps');
      const a = await createTestApp([], { keyPrefix: prefix });
      const b = await createTestApp([], { redis: server.url, keyPrefix: prefix });
      try {
        const ha = await a.locks.lock('x');
        const hb = await b.locks.lock('x');
        expect(ha.owner).not.toBe(hb.owner);
        expect(await holdsOf(redis, `${prefix}x`)).toEqual({ [ha.owner]: '1' });
        expect(await holdsOf(privateClient, `${prefix}x`)).toEqual({ [hb.owner]: '1' });
        await ha.release();
        await hb.release();

        await a.locks.withLock('y', async (outer) => {
          expect(a.locks.current('y')).toBe(outer);
          expect(b.locks.current()).toBeUndefined();
          expect(b.locks.current('y')).toBeUndefined();
          await b.locks.withLock('y', async (inB) => {
            expect(inB.owner).not.toBe(outer.owner);
            expect(await holdsOf(privateClient, `${prefix}y`)).toEqual({ [inB.owner]: '1' });
            expect(await holdsOf(redis, `${prefix}y`)).toEqual({ [outer.owner]: '1' });
            expect(a.locks.current()).toBe(outer);
            expect(b.locks.current()).toBe(inB);
          });
        });
      } finally {
        await a.close();
        await b.close();
        privateClient.disconnect();
        await server.dispose();
      }
    });

    it('on the same Redis and prefix, one app’s lock does not re-enter in the other', async () => {
      const prefix = uniquePrefix('same-redis');
      const a = await createTestApp([], { keyPrefix: prefix });
      const b = await createTestApp([], { keyPrefix: prefix });
      try {
        await a.locks.withLock('z', async (outer) => {
          expect(b.locks.current('z')).toBeUndefined();
          expect(await b.locks.tryLock('z')).toBeNull();
          expect(await holdsOf(redis, `${prefix}z`)).toEqual({ [outer.owner]: '1' });
        });
      } finally {
        await a.close();
        await b.close();
      }
    });
  });

  describe('HTTP controller with @DisLock', () => {
    async function httpApp(options: Partial<DisLockModuleOptions>): Promise<INestApplication> {
      const moduleRef = await Test.createTestingModule({
        imports: [DisLockModule.forRoot({ redis: sharedRedisUrl(), ...options })],
        controllers: [ItemsController],
      }).compile();
      const app = moduleRef.createNestApplication({ logger: false });
      await app.listen(0, '127.0.0.1');
      return app;
    }

    it('concurrent requests on one id: 200 and 409 { statusCode, message }; the key uses the piped param', async () => {
      const prefix = uniquePrefix('http');
      const app = await httpApp({ keyPrefix: prefix });
      const release = gate();
      http.release = release.promise;
      http.entered = [];
      try {
        const first = request(app.getHttpServer())
          .get('/items/007')
          .then((res) => res);
        expect(await eventually(() => http.entered.length === 1)).toBe(true);
        // ParseIntPipe ran before the key was resolved: '007' -> 7.
        expect(await redis.exists(`${prefix}item:7`)).toBe(1);
        expect(await redis.exists(`${prefix}item:007`)).toBe(0);

        const second = await request(app.getHttpServer()).get('/items/7');
        expect(second.status).toBe(409);
        expect(second.body).toEqual({ statusCode: 409, message: expect.stringContaining('item:7') as unknown });

        const other = request(app.getHttpServer())
          .get('/items/8')
          .then((res) => res);
        expect(await eventually(() => http.entered.length === 2)).toBe(true);

        release.open();
        const [ok, okOther] = await Promise.all([first, other]);
        expect(ok.status).toBe(200);
        expect(ok.body).toEqual({ id: 7, lock: 'item:7' });
        expect(okOther.status).toBe(200);
        expect(okOther.body).toEqual({ id: 8, lock: 'item:8' });
        expect(http.entered).toEqual([7, 8]);
        expect(await redis.exists(`${prefix}item:7`, `${prefix}item:8`)).toBe(0);
      } finally {
        release.open();
        await app.close();
      }
    });

    it('answers 503 when its Redis is down, with a body that tells nothing about Redis', async () => {
      const server = await RedisServer.start();
      const app = await httpApp({ redis: server.url, operationTimeout: 500, keyPrefix: uniquePrefix('http-503') });
      http.release = Promise.resolve();
      http.entered = [];
      try {
        await server.stop();
        const res = await request(app.getHttpServer()).get('/items/1');
        expect(res.status).toBe(503);
        // The standard status text: the error is not exposed, its message and cause stay in the log.
        expect(res.body).toEqual({ statusCode: 503, message: 'Service Unavailable' });
        for (const secret of ['127.0.0.1', String(server.port), 'ECONNREFUSED', 'connect']) {
          expect(res.text).not.toContain(secret);
        }
        expect(http.entered).toEqual([]);
      } finally {
        await app.close();
        await server.dispose();
      }
    });
  });
});
