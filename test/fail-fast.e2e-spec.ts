/**
 * Fast answers while Redis is known to be down (`whenDisconnected: 'fail'`, the default): once the
 * client has seen a connection attempt fail, lock operations, a locked HTTP route, the startup
 * check and shutdown do not wait `operationTimeout` (5 s by default) in ioredis's offline queue;
 * `whenDisconnected: 'wait'` keeps waiting for the reconnection. Each test talks to a redis-server
 * of its own (stopped to take Redis down), and waits for the client's own events, not for time.
 */
import { Controller, type INestApplication, Injectable, Logger, Param, Post } from '@nestjs/common';
import { Test } from '@nestjs/testing';
import { Cluster, Redis } from 'ioredis';
import request from 'supertest';
import {
  DisLock,
  DisLockHealthIndicator,
  DisLockModule,
  type DisLockModuleOptions,
  RedisUnavailableError,
} from 'nestjs-dislock';
import { DISLOCK_STORE } from '../lib/options/dislock.internal-constants';
import { createTestApp, type TestApp } from './support/app';
import { settle } from './support/async';
import { RedisCluster } from './support/cluster';
import { RedisServer } from './support/redis-server';

/**
 * The bound every "fast" answer must keep: generous for a busy 2-core machine (they take a few ms),
 * far below the 5 s of `operationTimeout` that each of them waited before.
 */
const FAST_MS = 1_000;

@Injectable()
class Jobs {
  @DisLock({ key: 'job:{0}' })
  async run(id: string): Promise<string> {
    return `ran ${id}`;
  }
}

@Controller('jobs')
class JobsController {
  constructor(private readonly jobs: Jobs) {}

  @Post(':id')
  run(@Param('id') id: string): Promise<string> {
    return this.jobs.run(id);
  }
}

/** The client a module created (the store's), to wait for its events. */
function clientOf(app: { get: (token: symbol) => unknown }): Redis {
  return (app.get(DISLOCK_STORE) as { client: Redis }).client;
}

/** Resolves at the client's next `event` (register before causing it). */
function next(client: Redis | Cluster, event: 'close' | 'ready'): Promise<void> {
  return new Promise((resolve) => client.once(event, () => resolve()));
}

/**
 * Resolves once the client has seen its connection fail (an 'error': refused, or reset) and has
 * gone on to reconnect ('reconnecting'): from then on it is known to be down.
 */
function seenDown(client: Redis | Cluster): Promise<void> {
  return new Promise((resolve) => client.once('error', () => client.once('reconnecting', () => resolve())));
}

/** Stops the server and returns once the client has seen it go (see `seenDown`). */
async function takeDown(server: RedisServer, client: Redis, options: { asPaused?: boolean } = {}): Promise<void> {
  const down = seenDown(client);
  await server.stop(options);
  await down;
}

/** Every error in `error`'s `cause` chain, as text. */
function causes(error: unknown): string {
  const parts: string[] = [];
  for (let current = error; current instanceof Error; current = current.cause) parts.push(current.message);
  return parts.join(' <- ');
}

function expectUnreachable(error: unknown, operation: string, port: number): void {
  expect(error).toBeInstanceOf(RedisUnavailableError);
  const unavailable = error as RedisUnavailableError;
  expect(unavailable.operation).toBe(operation);
  expect(unavailable.message).toMatch(/Redis is unreachable/);
  for (const secret of ['127.0.0.1', String(port), 'ECONNREFUSED']) expect(unavailable.message).not.toContain(secret);
  expect(causes(unavailable)).toMatch(/ECONN(REFUSED|RESET)/); // the detail stays in the cause, for logs
}

describe('whenDisconnected: fail fast while Redis is known to be down', () => {
  const warn = vi.spyOn(Logger.prototype, 'warn').mockImplementation(() => undefined);
  vi.spyOn(Logger.prototype, 'error').mockImplementation(() => undefined);
  let server: RedisServer | undefined;
  let app: TestApp | undefined;
  let http: INestApplication | undefined;
  const closers: (() => unknown)[] = [];

  async function start(options: Partial<DisLockModuleOptions> = {}): Promise<{ server: RedisServer; app: TestApp }> {
    server = await RedisServer.start();
    app = await createTestApp([Jobs], { redis: server.url, ...options });
    return { server, app };
  }

  afterEach(async () => {
    await http?.close();
    await app?.close();
    for (const close of closers.splice(0)) await close();
    await server?.dispose();
    http = undefined;
    app = undefined;
    server = undefined;
    warn.mockClear();
  });

  it('tryLock, lock, withLock and a @DisLock method reject at once with RedisUnavailableError, every time', async () => {
    const { server: redis, app: t } = await start();
    await takeDown(redis, clientOf(t.app));

    const fn = vi.fn();
    const calls: [string, () => Promise<unknown>][] = [
      ['tryLock', () => t.locks.tryLock('a')],
      ['tryLock with waitTime', () => t.locks.tryLock('a', { waitTime: 3_000 })],
      ['lock', () => t.locks.lock('b')],
      ['withLock', () => t.locks.withLock('c', fn)],
      ['@DisLock', () => t.get(Jobs).run('d')],
    ];
    for (let round = 0; round < 3; round += 1) {
      for (const [what, call] of calls) {
        const result = await settle(call());
        expect(result.ok, what).toBe(false);
        expect(result.ms, what).toBeLessThan(FAST_MS);
        expectUnreachable((result as { error: unknown }).error, 'acquire', redis.port);
      }
    }
    expect(fn).not.toHaveBeenCalled();

    // Back up: locks work again, without anything left behind by the calls that failed.
    const ready = next(clientOf(t.app), 'ready');
    await redis.startProcess();
    await ready;
    const handle = await t.locks.lock('a');
    expect(await handle.release()).toBe(true);
  });

  it('an acquisition already sent when the connection drops keeps its operationTimeout; one sent after fails at once', async () => {
    const { server: redis, app: t } = await start({ operationTimeout: 1_500 });
    const client = clientOf(t.app);
    redis.pause(); // the acquire goes out on an open connection, and nothing answers
    const inFlight = settle(t.locks.lock('sent'));
    await new Promise((resolve) => setImmediate(resolve));
    await takeDown(redis, client, { asPaused: true }); // and the connection drops with it unanswered
    const after = await settle(t.locks.lock('after'));
    expect(after.ok).toBe(false);
    expect(after.ms).toBeLessThan(FAST_MS);
    expectUnreachable((after as { error: unknown }).error, 'acquire', redis.port);
    // The one sent before may have run: it waits for its answer (and is given back if it comes late).
    const sent = await inFlight;
    expect(sent.ok).toBe(false);
    expect((sent as { error: unknown }).error).toBeInstanceOf(RedisUnavailableError);
    expect((sent as { error: RedisUnavailableError }).error.message).toMatch(/did not answer within 1500 ms/);
    expect(sent.ms).toBeGreaterThanOrEqual(1_400);
  });

  it('a locked HTTP route answers 503 at once, naming no address', async () => {
    server = await RedisServer.start();
    const moduleRef = await Test.createTestingModule({
      imports: [DisLockModule.forRoot({ redis: server.url, keyPrefix: 'ff-http:' })],
      controllers: [JobsController],
      providers: [Jobs],
    }).compile();
    http = moduleRef.createNestApplication({ logger: false });
    await http.init();
    expect((await request(http.getHttpServer()).post('/jobs/1')).status).toBe(201);
    await takeDown(server, clientOf(http));
    for (let i = 0; i < 12; i += 1) {
      const started = performance.now();
      const response = await request(http.getHttpServer()).post(`/jobs/${i}`);
      expect(performance.now() - started).toBeLessThan(FAST_MS);
      expect(response.status).toBe(503);
      for (const secret of ['127.0.0.1', String(server.port), 'ECONNREFUSED']) {
        expect(response.text).not.toContain(secret);
      }
    }
  });

  it('startup with Redis down is not held up: the access check is skipped with a warning at once', async () => {
    server = await RedisServer.start();
    await server.stop(); // nothing listens on its port now
    const started = performance.now();
    app = await createTestApp([Jobs], { redis: server.url });
    const took = performance.now() - started;
    expect(took).toBeLessThan(FAST_MS);
    const warnings = warn.mock.calls.map((call) => String(call[0]));
    expect(warnings.some((w) => w.startsWith('Skipped the Redis access check: Redis is unreachable'))).toBe(true);
    // It did start, and says what it says at run time too.
    const result = await settle(app.locks.lock('x'));
    expect(result.ms).toBeLessThan(FAST_MS);
    expectUnreachable((result as { error: unknown }).error, 'acquire', server.port);
  });

  it('shutdown with locks held does not wait for Redis', async () => {
    const { server: redis, app: t } = await start();
    await t.locks.lock('held-1');
    await t.locks.lock('held-2', { expire: 60_000, lockAtLeastFor: 30_000 });
    await takeDown(redis, clientOf(t.app));
    const started = performance.now();
    await t.close();
    app = undefined;
    expect(performance.now() - started).toBeLessThan(FAST_MS);
    const warnings = warn.mock.calls.map((call) => String(call[0]));
    expect(warnings.filter((w) => w.includes('at shutdown')).length).toBe(2);
  });

  it('the health indicator says Redis is unreachable, and why, at once, without its address', async () => {
    const { server: redis, app: t } = await start({ keyPrefix: 'ff-health:' });
    await takeDown(redis, clientOf(t.app));
    const started = performance.now();
    const health = (await t.get(DisLockHealthIndicator).isHealthy('locks')).locks;
    expect(performance.now() - started).toBeLessThan(FAST_MS);
    expect(health.status).toBe('down');
    expect(health.message).toBe('Redis is unreachable (connection refused)');
  });

  it("the application's own client without an error listener: fails fast once a reconnection attempt has failed", async () => {
    server = await RedisServer.start();
    const silenced = vi.spyOn(console, 'error').mockImplementation(() => undefined); // ioredis's "Unhandled error event"
    closers.push(() => silenced.mockRestore());
    const own = new Redis({ port: server.port, host: '127.0.0.1', retryStrategy: () => 50 });
    closers.push(() => own.disconnect());
    app = await createTestApp([], { redis: own });
    expect(own.listenerCount('error')).toBe(0); // the module added none
    const dropped = next(own, 'close');
    await server.stop();
    await dropped; // the drop itself: the reconnection may yet succeed
    await next(own, 'close'); // a reconnection attempt failed
    const result = await settle(app.locks.tryLock('mine'));
    expect(result.ms).toBeLessThan(FAST_MS);
    expect((result as { error: unknown }).error).toBeInstanceOf(RedisUnavailableError);
    expect((result as { error: Error }).error.message).toMatch(/Redis is unreachable/);
  });
});

describe("whenDisconnected: 'wait'", () => {
  vi.spyOn(Logger.prototype, 'warn').mockImplementation(() => undefined);
  let server: RedisServer | undefined;
  let app: TestApp | undefined;

  afterEach(async () => {
    await app?.close();
    await server?.dispose();
  });

  it('an acquisition issued while Redis is down waits for it, and succeeds once it is back within operationTimeout', async () => {
    server = await RedisServer.start();
    app = await createTestApp([], { redis: server.url, whenDisconnected: 'wait', operationTimeout: 10_000 });
    await takeDown(server, clientOf(app.app));
    const pending = settle(app.locks.lock('patient'));
    const ready = next(clientOf(app.app), 'ready');
    await server.startProcess();
    await ready;
    const result = await pending;
    expect(result.ok).toBe(true);
    const handle = (result as { value: Awaited<ReturnType<TestApp['locks']['lock']>> }).value;
    expect(await handle.release()).toBe(true);
  });
});

describe('whenDisconnected on a Redis Cluster', () => {
  vi.spyOn(Logger.prototype, 'warn').mockImplementation(() => undefined);
  let cluster: RedisCluster;
  let app: TestApp | undefined;

  beforeAll(async () => {
    cluster = await RedisCluster.start();
  }, 60_000);

  afterAll(async () => {
    await app?.close();
    await cluster?.dispose();
  });

  it('fails fast only when the Cluster as a whole is down, not while one master is', async () => {
    const client = await cluster.readyClient();
    app = await createTestApp([], { redis: client, keyPrefix: '{ff}:' });
    // One master down (not the one of the lock's slot): the Cluster stays ready, and a lock on a
    // live master's slot is taken as ever.
    const lockMaster = await cluster.masterOf('{ff}:a');
    const victim = (await cluster.masters()).find((master) => master.port !== lockMaster) as { port: number };
    await cluster.killNode(victim.port);
    expect(client.status).toBe('ready');
    const handle = await app.locks.lock('a');
    expect(await handle.release()).toBe(true);

    // Every node down: once the Cluster client has failed to reach any of them, at once.
    const down = seenDown(client);
    for (const seed of cluster.seeds) await cluster.killNode((seed as { port: number }).port);
    await down;
    const result = await settle(app.locks.tryLock('a'));
    expect(result.ms).toBeLessThan(FAST_MS);
    expect((result as { error: unknown }).error).toBeInstanceOf(RedisUnavailableError);
    expect((result as { error: Error }).error.message).toMatch(/Redis is unreachable/);
  }, 60_000);
});
