import type { INestApplication } from '@nestjs/common';
import { Test } from '@nestjs/testing';
import request from 'supertest';
import { AppModule } from '../sample-app/src/app.module';
import { RedisService } from '../sample-app/src/redis.service';
import { eventually, sharedClient, sharedRedisUrl, sleep, uniquePrefix } from './support/shared-redis';

/** Short timings so the suite runs fast: the watchdog renews the 300 ms lease every 100 ms. */
const LEASE = 300;
const TIMING = { lockWatchdogTimeout: LEASE, payWorkMs: 800, reportSteps: 8, reportStepMs: 120, reserveWorkMs: 30 };
const REPORT_MS = TIMING.reportSteps * TIMING.reportStepMs;

describe('sample app: two instances on one Redis', () => {
  const redis = sharedClient();
  const prefix = uniquePrefix('sample');
  const lockKey = (name: string): string => `${prefix}lock:${name}`;
  const apps: INestApplication[] = [];
  let a: INestApplication;
  let b: INestApplication;

  async function boot(instance: string): Promise<INestApplication> {
    const moduleRef = await Test.createTestingModule({
      imports: [AppModule.forRoot({ redisUrl: sharedRedisUrl(), instance, keyPrefix: prefix, ...TIMING })],
    }).compile();
    const app = moduleRef.createNestApplication({ logger: false });
    apps.push(app);
    await app.init();
    return app;
  }

  const http = (app: INestApplication) => request(app.getHttpServer());

  /** Sends every request at once; resolves with the responses in the same order. */
  const all = (requests: request.Test[]): Promise<request.Response[]> => Promise.all(requests.map((r) => r.then()));

  const busy = (name: string) => ({ statusCode: 409, message: `Lock "${name}" is held by another owner` });

  beforeAll(async () => {
    a = await boot('A');
    b = await boot('B');
  });

  afterAll(async () => {
    await Promise.all(apps.map((app) => app.close()));
    const keys = await redis.keys(`${prefix}*`);
    if (keys.length > 0) await redis.del(...keys);
    await redis.quit();
  });

  describe('POST /orders/:id/pay (@DisLock with a fixed expire)', () => {
    it('pays each order once across both instances; the concurrent others get 409', async () => {
      const ids = ['42', '42', '42', '42', '42', '42', '7', '8'];
      const via = ids.map((_, i) => (i % 2 === 0 ? a : b));
      const responses = all(ids.map((id, i) => http(via[i]).post(`/orders/${id}/pay`)));

      // While the payment runs, Redis holds the lock: one owner, one hold, the fixed 5 s lease.
      expect(await eventually(async () => (await redis.exists(lockKey('order:42'))) === 1)).toBe(true);
      const fields = await redis.hgetall(lockKey('order:42'));
      expect(Object.keys(fields)).toEqual([expect.stringMatching(/^[0-9a-f]{32}$/)]);
      expect(Object.values(fields)).toEqual(['1']);
      const pttl = await redis.pttl(lockKey('order:42'));
      expect(pttl).toBeGreaterThan(3_000);
      expect(pttl).toBeLessThanOrEqual(5_000);

      const answers = await responses;
      const for42 = answers.slice(0, 6);
      const paid = for42.filter((r) => r.status === 200);
      expect(paid).toHaveLength(1);
      expect(paid[0].body).toEqual({ orderId: '42', paidBy: expect.stringMatching(/^[AB]$/) });
      const refused = for42.filter((r) => r.status !== 200);
      expect(refused.map((r) => r.status)).toEqual([409, 409, 409, 409, 409]);
      for (const r of refused) expect(r.body).toEqual(busy('order:42'));
      // Other orders are other locks: paid at the same time, each by the instance it was sent to.
      expect(answers[6].status).toBe(200);
      expect(answers[6].body).toEqual({ orderId: '7', paidBy: 'A' });
      expect(answers[7].status).toBe(200);
      expect(answers[7].body).toEqual({ orderId: '8', paidBy: 'B' });

      // The decorator released every lock before answering (ifExpireWhenFinish defaults to true).
      for (const id of ['42', '7', '8']) expect(await redis.exists(lockKey(`order:${id}`))).toBe(0);
    });
  });

  describe('POST /reports/:name (@DisLock renewed by the watchdog)', () => {
    it('outlives its lockWatchdogTimeout thanks to renewal; the same report elsewhere gets 409', async () => {
      const key = lockKey('report:weekly');
      const job = http(a).post('/reports/weekly').then();
      expect(await eventually(async () => (await redis.exists(key)) === 1)).toBe(true);
      const appearedAt = Date.now();

      const second = await http(b).post('/reports/weekly');
      expect(second.status).toBe(409);
      expect(second.body).toEqual(busy('report:weekly'));

      // Watch the lease from outside until the key goes away: it keeps being reset to LEASE.
      const seen: { at: number; pttl: number }[] = [];
      for (
        let pttl = await redis.pttl(key);
        pttl > 0 && Date.now() - appearedAt < 5_000;
        pttl = await redis.pttl(key)
      ) {
        seen.push({ at: Date.now() - appearedAt, pttl });
        await sleep(15);
      }
      const resets = seen.filter((sample, i) => i > 0 && sample.pttl > seen[i - 1].pttl).length;
      expect(resets).toBeGreaterThanOrEqual(2);
      expect(seen.every((sample) => sample.pttl <= LEASE)).toBe(true);
      expect(seen[seen.length - 1].at).toBeGreaterThan(2 * LEASE); // alive long past one lease

      const report = await job;
      expect(report.status).toBe(200);
      expect(report.body).toEqual({
        name: 'weekly',
        generatedBy: 'A',
        completed: true,
        steps: TIMING.reportSteps,
        stepsPlanned: TIMING.reportSteps,
        durationMs: expect.any(Number),
        lockWatchdogTimeout: LEASE,
        pttlMs: expect.any(Array),
        fencingToken: expect.any(Number),
      });
      expect(report.body.durationMs).toBeGreaterThanOrEqual(REPORT_MS - 5);
      expect(report.body.durationMs).toBeGreaterThan(3 * LEASE);
      // What the job itself saw after each step: the key always alive, never above the lease.
      const pttlMs = report.body.pttlMs as number[];
      expect(pttlMs).toHaveLength(TIMING.reportSteps);
      for (const pttl of pttlMs) {
        expect(pttl).toBeGreaterThan(0);
        expect(pttl).toBeLessThanOrEqual(LEASE);
      }
      expect(await redis.exists(key)).toBe(0);
      // Every step was published to the archive under this run's fencing token.
      const archived = await http(b).get('/reports/weekly');
      expect(archived.body).toEqual({
        instance: 'A',
        fencingToken: report.body.fencingToken,
        steps: TIMING.reportSteps,
      });
    });

    it('refuses a stale holder at the fenced archive: a newer token has written, the old one stops', async () => {
      const record = `${prefix}archive:report:fenced`;
      const job = http(b).post('/reports/fenced').then();
      expect(await eventually(async () => (await redis.hexists(record, 'token')) === 1)).toBe(true);
      const staleToken = Number(await redis.hget(record, 'token'));
      // A holder that came after B (B froze past its lease, say) wrote with its larger token.
      await redis.hset(record, 'token', String(staleToken + 1), 'instance', 'newer', 'steps', '1');

      const report = await job;
      expect(report.body).toMatchObject({ generatedBy: 'B', completed: false, lostReason: 'fenced-out' });
      expect(report.body.fencingToken).toBe(staleToken);
      expect(report.body.steps).toBeLessThan(TIMING.reportSteps);
      // B's late writes bounced: the newer holder's record is intact.
      const archived = await http(a).get('/reports/fenced');
      expect(archived.body).toEqual({ instance: 'newer', fencingToken: staleToken + 1, steps: 1 });
      expect(await redis.exists(lockKey('report:fenced'))).toBe(0);

      // The next run gets a larger token than either, and may write again.
      const rerun = await http(a).post('/reports/fenced');
      expect(rerun.body).toMatchObject({ generatedBy: 'A', completed: true });
      expect(rerun.body.fencingToken).toBeGreaterThan(staleToken + 1);
      expect((await http(a).get('/reports/fenced')).body).toMatchObject({ instance: 'A', steps: TIMING.reportSteps });
      expect((await http(a).get('/reports/never-run')).status).toBe(404);
    });

    it('stops early when its lock is taken over, and leaves the new owner alone', async () => {
      const key = lockKey('report:stolen');
      const job = http(b).post('/reports/stolen').then();
      expect(await eventually(async () => (await redis.exists(key)) === 1)).toBe(true);
      // As if the lease had run out and another owner had taken the lock.
      await redis.multi().del(key).hset(key, 'intruder', '1').pexpire(key, 10_000).exec();

      const report = await job;
      expect(report.status).toBe(200);
      expect(report.body).toMatchObject({
        name: 'stolen',
        generatedBy: 'B',
        completed: false,
        lostReason: 'not-owner',
      });
      expect(report.body.steps).toBeLessThan(TIMING.reportSteps);
      // Neither the watchdog nor the release touched the other owner's lock.
      expect(await redis.hgetall(key)).toEqual({ intruder: '1' });
      expect(await redis.pttl(key)).toBeGreaterThan(8_000);
      await redis.del(key);
    });
  });

  describe('/inventory/:sku (LockService.withLock around a read-modify-write)', () => {
    it('keeps the stock exact under concurrent reservations on both instances', async () => {
      const stockKey = `${prefix}stock:widget`;
      const restocked = await http(a).put('/inventory/widget').send({ stock: 5 });
      expect(restocked.status).toBe(200);
      expect(restocked.body).toEqual({ sku: 'widget', stock: 5 });
      expect(await redis.get(stockKey)).toBe('5');

      const answers = await all(
        Array.from({ length: 8 }, (_, i) => http(i % 2 === 0 ? a : b).post('/inventory/widget/reserve')),
      );
      const reserved = answers.filter((r) => r.status === 200);
      // Each reservation saw a different count: they ran one at a time, none was lost.
      expect(reserved.map((r) => r.body.left as number).sort((x, y) => x - y)).toEqual([0, 1, 2, 3, 4]);
      for (const r of reserved)
        expect(r.body).toEqual({
          sku: 'widget',
          left: expect.any(Number),
          reservedBy: expect.stringMatching(/^[AB]$/),
        });
      const soldOut = answers.filter((r) => r.status !== 200);
      expect(soldOut.map((r) => r.status)).toEqual([409, 409, 409]);
      for (const r of soldOut) {
        expect(r.body).toEqual({ statusCode: 409, error: 'Conflict', message: 'widget is out of stock' });
      }

      const level = await http(b).get('/inventory/widget');
      expect(level.status).toBe(200);
      expect(level.body).toEqual({ sku: 'widget', stock: 0 });
      expect(await redis.get(stockKey)).toBe('0');
      expect(await redis.exists(lockKey('sku:widget'))).toBe(0);
    });

    it('rejects an invalid stock and reads an unknown sku as 0', async () => {
      for (const stock of [-1, 1.5, '3', null]) {
        const response = await http(a).put('/inventory/bolt').send({ stock });
        expect(response.status).toBe(400);
      }
      expect((await http(b).get('/inventory/bolt')).body).toEqual({ sku: 'bolt', stock: 0 });
      expect(await redis.exists(`${prefix}stock:bolt`)).toBe(0);
    });
  });

  describe('the digest job (@Cron every second, onBusy: skip, lockAtLeastFor)', () => {
    it('runs once per second across both instances, never twice in one', async () => {
      const list = `${prefix}digests`;
      const from = Math.floor(Date.now() / 1000) + 1; // whole seconds from the next one on
      await sleep((from + 3) * 1000 + 200 - Date.now());
      const seconds = new Map<number, string[]>();
      for (const entry of await redis.lrange(list, 0, -1)) {
        const [at, instance] = entry.split(':');
        const second = Math.floor(Number(at) / 1000);
        if (second >= from && second < from + 3) seconds.set(second, [...(seconds.get(second) ?? []), instance]);
      }
      expect([...seconds.keys()].sort()).toEqual([from, from + 1, from + 2]);
      for (const runs of seconds.values()) expect(runs).toHaveLength(1);
    });
  });

  describe('shutdown', () => {
    it('app.close() releases the locks an instance holds and closes its Redis connection', async () => {
      const c = await boot('C');
      const client = c.get(RedisService).client;
      const key = lockKey('report:quarterly');
      const job = http(c).post('/reports/quarterly').then();
      expect(await eventually(async () => (await redis.exists(key)) === 1)).toBe(true);

      await c.close();
      apps.splice(apps.indexOf(c), 1);
      expect(await redis.exists(key)).toBe(0);
      expect(client.status).toBe('end');
      // The running job saw its signal abort and stopped at its next step.
      const report = await job;
      expect(report.status).toBe(200);
      expect(report.body).toMatchObject({
        name: 'quarterly',
        generatedBy: 'C',
        completed: false,
        lostReason: 'shutdown',
      });
    });
  });
});
