import { Controller, Injectable, Logger, Param, ParseIntPipe, Post } from '@nestjs/common';
import { APP_FILTER } from '@nestjs/core';
import type { INestApplication } from '@nestjs/common';
import { Test } from '@nestjs/testing';
import request from 'supertest';
import { DisLock, DisLockExceptionFilter, DisLockModule } from 'nestjs-dislock';
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
}

async function startApp(withFilter: boolean): Promise<INestApplication> {
  const moduleRef = await Test.createTestingModule({
    imports: [DisLockModule.forRoot({ redis: sharedRedisUrl(), keyPrefix: uniquePrefix('filter') })],
    controllers: [JobsController],
    providers: [Jobs, ...(withFilter ? [{ provide: APP_FILTER, useClass: DisLockExceptionFilter }] : [])],
  }).compile();
  const app = moduleRef.createNestApplication({ logger: false });
  await app.init();
  return app;
}

/** Fires two requests for the same job at once; returns the statuses and bodies, and what Nest logged as errors. */
async function race(app: INestApplication): Promise<{ statuses: number[]; conflict: unknown; errorLogs: number }> {
  const spy = vi.spyOn(Logger.prototype, 'error').mockImplementation(() => undefined);
  const staticSpy = vi.spyOn(Logger, 'error').mockImplementation(() => undefined);
  try {
    const answers = await Promise.all([1, 2].map(() => request(app.getHttpServer()).post('/jobs/7')));
    const conflict = answers.find((answer) => answer.status === 409)?.body as unknown;
    return {
      statuses: answers.map((answer) => answer.status).sort(),
      conflict,
      errorLogs: spy.mock.calls.length + staticSpy.mock.calls.length,
    };
  } finally {
    spy.mockRestore();
    staticSpy.mockRestore();
  }
}

describe('DisLockExceptionFilter', () => {
  it('without it: 409 with Nest default body, logged as an error', async () => {
    const app = await startApp(false);
    try {
      const { statuses, conflict, errorLogs } = await race(app);
      expect(statuses).toEqual([201, 409]);
      expect(conflict).toEqual({ statusCode: 409, message: 'Lock "job:7" is held by another owner' });
      expect(errorLogs).toBeGreaterThan(0);
    } finally {
      await app.close();
    }
  });

  it('with it: the same 409 answer, and nothing logged as an error', async () => {
    const app = await startApp(true);
    try {
      const { statuses, conflict, errorLogs } = await race(app);
      expect(statuses).toEqual([201, 409]);
      expect(conflict).toEqual({ statusCode: 409, message: 'Lock "job:7" is held by another owner' });
      expect(errorLogs).toBe(0);
    } finally {
      await app.close();
    }
  });
});
