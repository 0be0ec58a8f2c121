import type { INestApplication } from '@nestjs/common';
import { Test } from '@nestjs/testing';
import { LockService } from 'nestjs-dislock';
import { AppModule } from '../src/app.module.js';

// Runs against the redis-server that test/consumers/run.mjs starts (REDIS_URL).
describe('AppModule with nestjs-dislock (Vitest + @nestjs/testing)', () => {
  let app: INestApplication;
  let base: string;

  beforeAll(async () => {
    const moduleRef = await Test.createTestingModule({ imports: [AppModule] }).compile();
    app = moduleRef.createNestApplication();
    await app.listen(0, '127.0.0.1');
    base = await app.getUrl();
  });

  afterAll(async () => {
    await app?.close();
  });

  it('injects LockService', () => {
    expect(app.get(LockService)).toBeInstanceOf(LockService);
  });

  it.each(['hold', 'stream'])('/%s: one of two concurrent requests gets 200, the other 409', async (route) => {
    const url = `${base}/${route}/vitest?ms=500`;
    const [a, b] = await Promise.all([fetch(url), fetch(url)]);
    expect([a.status, b.status].sort()).toEqual([200, 409]);
    const busy = a.status === 409 ? a : b;
    const body = (await busy.json()) as { statusCode: number; message: string };
    expect(body.statusCode).toBe(409);
    expect(body.message).toContain(`${route}:vitest`);
  });

  it('takes a lock through LockService', async () => {
    const response = await fetch(`${base}/service/vitest-service`);
    expect(response.status).toBe(200);
    const body = (await response.json()) as { key: string; fencingToken: number };
    expect(body.key).toBe('dislock:vitest-service');
    expect(typeof body.fencingToken).toBe('number');
  });
});
