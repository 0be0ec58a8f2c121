import type { INestApplication } from '@nestjs/common';
import { Test, type TestingModuleBuilder } from '@nestjs/testing';
import { DisLockTesting, DisLockTestingModule, LockService } from 'nestjs-dislock';
import { AppModule } from '../src/app.module';

// The app's own AppModule under Jest (test/jest-e2e.json, as `nest new` writes it, Jest's globals),
// with nestjs-dislock from the packed tarball: first on the memory store (no Redis), then on the
// redis-server that test/consumers/run.mjs starts (REDIS_URL).
async function listen(builder: TestingModuleBuilder): Promise<{ app: INestApplication; base: string }> {
  const app = (await builder.compile()).createNestApplication();
  await app.listen(0, '127.0.0.1');
  return { app, base: await app.getUrl() };
}

describe('AppModule on the memory store (DisLockTestingModule.override)', () => {
  let app: INestApplication;
  let base: string;

  beforeAll(async () => {
    ({ app, base } = await listen(
      DisLockTestingModule.override(Test.createTestingModule({ imports: [AppModule], providers: [DisLockTesting] })),
    ));
  });

  afterAll(async () => {
    await app?.close();
  });

  it('answers 409 while another owner holds the lock, 200 once it is free', async () => {
    const testing = app.get(DisLockTesting);
    testing.occupy('hold:jest-memory');
    expect((await fetch(`${base}/hold/jest-memory?ms=0`)).status).toBe(409);
    testing.free('hold:jest-memory');
    expect((await fetch(`${base}/hold/jest-memory?ms=0`)).status).toBe(200);
  });
});

describe('AppModule on Redis', () => {
  let app: INestApplication;
  let base: string;

  beforeAll(async () => {
    ({ app, base } = await listen(Test.createTestingModule({ imports: [AppModule] })));
  });

  afterAll(async () => {
    await app?.close();
  });

  it('injects LockService', () => {
    expect(app.get(LockService)).toBeInstanceOf(LockService);
  });

  it.each(['hold', 'stream'])('/%s: one of two concurrent requests gets 200, the other 409', async (route) => {
    const url = `${base}/${route}/jest?ms=300`;
    const [a, b] = await Promise.all([fetch(url), fetch(url)]);
    expect([a.status, b.status].sort()).toEqual([200, 409]);
    const body = (await (a.status === 409 ? a : b).json()) as { statusCode: number; message: string };
    expect(body.statusCode).toBe(409);
    expect(body.message).toContain(`${route}:jest`);
  });

  it('takes a lock through LockService', async () => {
    const response = await fetch(`${base}/service/jest-service`);
    expect(response.status).toBe(200);
    expect(((await response.json()) as { key: string }).key).toBe('dislock:jest-service');
  });
});
