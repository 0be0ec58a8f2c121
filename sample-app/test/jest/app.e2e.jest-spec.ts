/**
 * The whole sample app (its own `AppModule.forRoot`, HTTP included) in a `@nestjs/testing` test,
 * with no Redis: `DisLockTestingModule.override` puts its locks on the in-memory store and the
 * app's own data goes to the fake `RedisService`. Its Redis URL points at a closed port, so a lock
 * taken on Redis would fail. The same test as test/unit/app.e2e.spec.ts, under Jest.
 */
import { type INestApplication } from '@nestjs/common';
import { Test } from '@nestjs/testing';
import request from 'supertest';
import { DisLockTesting, DisLockTestingModule } from 'nestjs-dislock';
import { AppModule } from '../../src/app.module';
import { RedisService } from '../../src/redis.service';
import { closedPort } from '../support/closed-port';
import { fakeRedis } from '../support/fake-redis';
import { until } from '../support/until';

describe('the sample AppModule on the in-memory store (e2e, no Redis; Jest)', () => {
  let app: INestApplication;
  let testing: DisLockTesting;

  beforeEach(async () => {
    const moduleRef = await DisLockTestingModule.override(
      Test.createTestingModule({
        imports: [
          AppModule.forRoot({ redisUrl: `redis://127.0.0.1:${await closedPort()}`, instance: 'e2e', payWorkMs: 300 }),
        ],
        providers: [DisLockTesting],
      }),
    )
      .overrideProvider(RedisService) // the app's own data, in memory
      .useValue(fakeRedis())
      .compile();
    app = moduleRef.createNestApplication({ logger: false });
    await app.init();
    testing = app.get(DisLockTesting);
  });

  afterEach(() => app?.close());

  it('holds order:42 during a payment: a second payment of it gets a 409, another order is paid', async () => {
    const http = () => request(app.getHttpServer());
    const first = http().post('/orders/42/pay').then();
    await until(() => testing.holders('order:42').length === 1);

    const second = await http().post('/orders/42/pay');
    expect(second.status).toBe(409);
    expect(second.body).toEqual({ statusCode: 409, message: 'Lock "order:42" is held by another owner' });
    expect((await http().post('/orders/43/pay')).body).toEqual({ orderId: '43', paidBy: 'e2e' });

    expect((await first).body).toEqual({ orderId: '42', paidBy: 'e2e' });
    expect(testing.holders('order:42')).toEqual([]);
  });

  it('answers 409 for an order that DisLockTesting occupies, and the health check is up', async () => {
    testing.occupy('order:7');
    expect((await request(app.getHttpServer()).post('/orders/7/pay')).status).toBe(409);
    const health = await request(app.getHttpServer()).get('/health');
    expect(health.status).toBe(200);
    expect(health.body).toMatchObject({ status: 'ok' });
  });
});
