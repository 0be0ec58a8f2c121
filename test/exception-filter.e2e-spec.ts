import { createServer } from 'node:net';
import { inspect } from 'node:util';
import { Controller, Injectable, Logger, Param, ParseIntPipe, Post } from '@nestjs/common';
import type { ArgumentsHost, INestApplication } from '@nestjs/common';
import { APP_FILTER } from '@nestjs/core';
import { FastifyAdapter, type NestFastifyApplication } from '@nestjs/platform-fastify';
import { Test } from '@nestjs/testing';
import { lastValueFrom } from 'rxjs';
import request from 'supertest';
import {
  DisLock,
  DisLockExceptionFilter,
  DisLockModule,
  type DisLockModuleOptions,
  LockNotAcquiredError,
  LockService,
  RedisUnavailableError,
} from 'nestjs-dislock';
import { sharedRedisUrl, sleep, uniquePrefix } from './support/shared-redis';

@Injectable()
class Jobs {
  @DisLock({ key: 'job:{0}', expire: 2_000 })
  async run(id: number): Promise<{ id: number }> {
    await sleep(300);
    return { id };
  }
}

@Controller('jobs')
class JobsController {
  constructor(private readonly jobs: Jobs) {}

  @Post(':id')
  run(@Param('id', ParseIntPipe) id: number): Promise<{ id: number }> {
    return this.jobs.run(id);
  }

  /** A semaphore: at most two exports at once. */
  @Post('exports/:id')
  @DisLock({ key: 'exports', permits: 2, expire: 2_000 })
  async export(@Param('id', ParseIntPipe) id: number): Promise<{ id: number }> {
    await sleep(300);
    return { id };
  }
}

type Platform = 'express' | 'fastify';

/** A port on 127.0.0.1 where nothing listens (taken from the OS, then let go). */
async function closedPort(): Promise<number> {
  const server = createServer();
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  const { port } = server.address() as { port: number };
  await new Promise<void>((resolve) => server.close(() => resolve()));
  return port;
}

async function startApp(
  platform: Platform,
  withFilter: boolean,
  options: Partial<DisLockModuleOptions> = {},
): Promise<INestApplication> {
  const moduleRef = await Test.createTestingModule({
    imports: [DisLockModule.forRoot({ redis: sharedRedisUrl(), keyPrefix: uniquePrefix('filter'), ...options })],
    controllers: [JobsController],
    providers: [Jobs, ...(withFilter ? [{ provide: APP_FILTER, useClass: DisLockExceptionFilter }] : [])],
  }).compile();
  if (platform === 'express') {
    const app = moduleRef.createNestApplication({ logger: false });
    await app.init();
    return app;
  }
  const app = moduleRef.createNestApplication<NestFastifyApplication>(new FastifyAdapter(), { logger: false });
  await app.init();
  await app.getHttpAdapter().getInstance().ready();
  return app;
}

/** Runs `fn` while catching every error-level log (Nest's and the library's); returns them as text. */
async function errorLogsOf<T>(fn: () => Promise<T>): Promise<{ result: T; errorLogs: string[] }> {
  const spy = vi.spyOn(Logger.prototype, 'error').mockImplementation(() => undefined);
  const staticSpy = vi.spyOn(Logger, 'error').mockImplementation(() => undefined);
  try {
    const result = await fn();
    const calls = [...spy.mock.calls, ...staticSpy.mock.calls];
    const errorLogs = calls.map((args) =>
      args.map((arg) => (typeof arg === 'string' ? arg : inspect(arg, { depth: 10 }))).join(' '),
    );
    return { result, errorLogs };
  } finally {
    spy.mockRestore();
    staticSpy.mockRestore();
  }
}

/** Fires two requests for the same job at once; returns the statuses and the 409 body. */
async function race(app: INestApplication): Promise<{ statuses: number[]; conflict: unknown; errorLogs: string[] }> {
  const { result: answers, errorLogs } = await errorLogsOf(() =>
    Promise.all([1, 2].map(() => request(app.getHttpServer()).post('/jobs/7'))),
  );
  return {
    statuses: answers.map((answer) => answer.status).sort(),
    conflict: answers.find((answer) => answer.status === 409)?.body as unknown,
    errorLogs,
  };
}

/** What must never reach an HTTP client when Redis is down: where Redis is, and what the connection said. */
function expectNothingAboutRedis(text: string, port: number): void {
  for (const secret of ['127.0.0.1', 'localhost', String(port), 'ECONNREFUSED', 'connect']) {
    expect(text).not.toContain(secret);
  }
}

const busyBody = { statusCode: 409, message: 'Lock "job:7" is held by another owner' };
/** A busy semaphore says what is true: its permits are taken (not "held by another owner"). */
const fullBody = { statusCode: 409, message: 'All 2 permits of "exports" are taken' };

describe.each<Platform>(['express', 'fastify'])('HTTP answers on %s (Nest 12)', (platform) => {
  describe.each([false, true])('with DisLockExceptionFilter: %s', (withFilter) => {
    it(`busy: 201 for one, 409 { statusCode, message } for the other${withFilter ? ', not logged as an error' : ', logged by Nest'}`, async () => {
      const app = await startApp(platform, withFilter);
      try {
        const { statuses, conflict, errorLogs } = await race(app);
        expect(statuses).toEqual([201, 409]);
        expect(conflict).toEqual(busyBody);
        if (withFilter) expect(errorLogs).toEqual([]);
        else expect(errorLogs.length).toBeGreaterThan(0);
      } finally {
        await app.close();
      }
    });

    it('a busy semaphore: 201 for two, 409 for the third, saying all its permits are taken', async () => {
      const app = await startApp(platform, withFilter);
      try {
        const { result: answers } = await errorLogsOf(() =>
          Promise.all([1, 2, 3].map((id) => request(app.getHttpServer()).post(`/jobs/exports/${id}`))),
        );
        expect(answers.map((answer) => answer.status).sort()).toEqual([201, 201, 409]);
        expect(answers.find((answer) => answer.status === 409)?.body).toEqual(fullBody);
      } finally {
        await app.close();
      }
    });

    it('Redis unreachable: 503 whose body tells nothing about Redis; the log has the cause, once', async () => {
      const port = await closedPort();
      const app = await startApp(platform, withFilter, {
        redis: { host: '127.0.0.1', port },
        operationTimeout: 300,
      });
      try {
        const { result: answer, errorLogs } = await errorLogsOf(() => request(app.getHttpServer()).post('/jobs/7'));
        expect(answer.status).toBe(503);
        expect(answer.body).toEqual({ statusCode: 503, message: 'Service Unavailable' });
        expectNothingAboutRedis(answer.text, port);
        expect(errorLogs).toHaveLength(1);
        // The client has seen its first connection refused (at startup): the request fails at once.
        expect(errorLogs[0]).toContain('Could not acquire lock "job:7": Redis is unreachable; nothing was sent');
        expect(errorLogs[0]).toContain(`ECONNREFUSED 127.0.0.1:${port}`);
      } finally {
        await app.close();
      }
    });
  });
});

describe('RedisUnavailableError and LockNotAcquiredError, as any Nest filter sees them', () => {
  it('busy: http-errors shape with status 409, exposed', () => {
    const error = new LockNotAcquiredError('job:7', 0);
    expect(error).toBeInstanceOf(Error);
    expect(error).toMatchObject({ status: 409, statusCode: 409, expose: true, message: busyBody.message });
  });

  // Nest 11's default filter sends `message` as it is (it does not read `expose`): the message must
  // reveal nothing, and the detail must survive in the cause.
  it('Redis unreachable: status 503, not exposed, a message without connection detail, the detail in the cause', async () => {
    const port = await closedPort();
    const app = await startApp('express', false, { redis: { host: '127.0.0.1', port }, operationTimeout: 300 });
    try {
      const error = await app
        .get(LockService)
        .lock('x')
        .then(
          () => undefined,
          (e: unknown) => e,
        );
      expect(error).toBeInstanceOf(RedisUnavailableError);
      expect(error).toMatchObject({
        status: 503,
        statusCode: 503,
        expose: false,
        operation: 'acquire',
        lockName: 'x',
        message: 'Could not acquire lock "x": Redis is unreachable; nothing was sent',
      });
      expectNothingAboutRedis((error as Error).message, port);
      expect(inspect(error)).toContain(`connect ECONNREFUSED 127.0.0.1:${port}`);
    } finally {
      await app.close();
    }
  });
});

describe('DisLockExceptionFilter outside HTTP', () => {
  /** An ArgumentsHost of `type` over `args`, laid out as Nest lays out each context's arguments. */
  function hostOf(type: string, args: unknown[]): ArgumentsHost {
    return {
      getType: () => type,
      getArgs: () => args,
      getArgByIndex: (index: number) => args[index],
      switchToRpc: () => ({ getData: () => args[0], getContext: () => args[1] }),
      switchToHttp: () => ({ getRequest: () => args[0], getResponse: () => args[1], getNext: () => args[2] }),
      switchToWs: () => ({ getClient: () => args[0], getData: () => args[1], getPattern: () => args[2] }),
    } as unknown as ArgumentsHost;
  }

  const busy = new LockNotAcquiredError('job:7', 0);
  const down = new RedisUnavailableError('acquire', 'job:7', 'Could not acquire lock "job:7": Redis is unavailable', {
    cause: new Error('connect ECONNREFUSED 127.0.0.1:16391'),
  });

  it('rpc: an error Observable of { status, message }: the lock message when busy, nothing about Redis when down', async () => {
    const filter = new DisLockExceptionFilter();
    const { errorLogs } = await errorLogsOf(async () => {
      await expect(lastValueFrom(filter.catch(busy, hostOf('rpc', [{}, {}]))!)).rejects.toEqual({
        status: 'error',
        message: busyBody.message,
      });
      await expect(lastValueFrom(filter.catch(down, hostOf('rpc', [{}, {}]))!)).rejects.toEqual({
        status: 'error',
        message: 'Service Unavailable',
      });
    });
    expect(errorLogs).toHaveLength(1);
    expect(errorLogs[0]).toContain('ECONNREFUSED 127.0.0.1:16391');
  });

  it("ws: emits 'exception' to the client itself (Nest counts a matched filter as the answer)", async () => {
    const filter = new DisLockExceptionFilter();
    const emit = vi.fn();
    const { errorLogs } = await errorLogsOf(async () => {
      expect(filter.catch(busy, hostOf('ws', [{ emit }, { id: 7 }, 'jobs']))).toBeUndefined();
      expect(filter.catch(down, hostOf('ws', [{ emit }, { id: 7 }, 'jobs']))).toBeUndefined();
      // A client that cannot be emitted to (Nest skips its own answer then too): nothing thrown.
      expect(filter.catch(busy, hostOf('ws', [{}, { id: 7 }, 'jobs']))).toBeUndefined();
    });
    expect(emit.mock.calls).toEqual([
      ['exception', { status: 'error', message: busyBody.message }],
      ['exception', { status: 'error', message: 'Service Unavailable' }],
    ]);
    expect(errorLogs).toHaveLength(1);
    expect(errorLogs[0]).toContain('ECONNREFUSED 127.0.0.1:16391');
  });

  it("another context (e.g. 'graphql'): returns nothing, logs nothing, so Nest's own handling applies", async () => {
    const filter = new DisLockExceptionFilter();
    const { errorLogs } = await errorLogsOf(async () => {
      expect(filter.catch(busy, hostOf('graphql', [{}, {}, {}, {}]))).toBeUndefined();
      expect(filter.catch(down, hostOf('graphql', [{}, {}, {}, {}]))).toBeUndefined();
    });
    expect(errorLogs).toEqual([]);
  });
});
