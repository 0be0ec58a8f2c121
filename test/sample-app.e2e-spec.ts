import type { INestApplication } from '@nestjs/common';
import { Test } from '@nestjs/testing';
import request from 'supertest';
import { LockService } from 'nestjs-dislock';
import { AppModule } from '../sample-app/src/app.module';
import { RedisService } from '../sample-app/src/redis.service';
import { eventually, sharedClient, sharedRedisUrl, sleep, uniquePrefix } from './support/shared-redis';
import { holdsOf } from './support/lock-hash';

/** Short timings so the suite runs fast: the watchdog renews the 300 ms lease every 100 ms. */
const LEASE = 300;
const TIMING = {
  lockWatchdogTimeout: LEASE,
  payWorkMs: 800,
  reportSteps: 8,
  reportStepMs: 120,
  reserveWorkMs: 30,
  priceStepMs: 20,
  exportWorkMs: 600,
};
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

  /** The server's clock in ms: shared holds store the end of their lease in it. */
  const serverMs = async (): Promise<number> => {
    const [seconds, micros] = await redis.time();
    return Number(seconds) * 1000 + Math.floor(Number(micros) / 1000);
  };

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
      const fields = await holdsOf(redis, lockKey('order:42'));
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
      expect(await holdsOf(redis, key)).toEqual({ intruder: '1' });
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

  describe('POST /inventory/transfer (@DisLock with an array key: a multi-lock)', () => {
    const stockKey = (sku: string): string => `${prefix}stock:${sku}`;
    const transfer = (app: INestApplication, from: string, to: string, units: number) =>
      http(app).post('/inventory/transfer').send({ from, to, units });

    it('keeps the total exact under transfers both ways and reservations of both SKUs, on both instances', async () => {
      await http(a).put('/inventory/left').send({ stock: 30 }).expect(200);
      await http(b).put('/inventory/right').send({ stock: 30 }).expect(200);

      // Every kind of request at once, interleaved: 6 x (left -> right, 2 units) via A, 6 x
      // (right -> left, 3 units) via B, and 4 reservations of each SKU, half via each instance.
      const requests: { kind: string; via: string; send: () => request.Test }[] = [];
      for (let i = 0; i < 6; i += 1) {
        requests.push({ kind: 'l->r', via: 'A', send: () => transfer(a, 'left', 'right', 2) });
        requests.push({ kind: 'r->l', via: 'B', send: () => transfer(b, 'right', 'left', 3) });
        if (i < 4) {
          const [app, via] = i % 2 === 0 ? [a, 'A'] : [b, 'B'];
          requests.push({ kind: 'reserve', via, send: () => http(app).post('/inventory/left/reserve') });
          requests.push({ kind: 'reserve', via, send: () => http(app).post('/inventory/right/reserve') });
        }
      }
      const answers = await all(requests.map((r) => r.send()));

      // No deadlock (both directions took the two locks in the same order), none refused: every
      // transfer and reservation waited its turn and was done by the instance it was sent to.
      expect(answers.map((r) => r.status)).toEqual(requests.map(() => 200));
      requests.forEach(({ kind, via }, i) => {
        if (kind === 'reserve') expect(answers[i].body.reservedBy).toBe(via);
        else
          expect(answers[i].body).toEqual({
            units: kind === 'l->r' ? 2 : 3,
            from: { sku: kind === 'l->r' ? 'left' : 'right', stock: expect.any(Number) },
            to: { sku: kind === 'l->r' ? 'right' : 'left', stock: expect.any(Number) },
            movedBy: via,
          });
      });
      // Exact, not just plausible: 30 - 6 x 2 + 6 x 3 - 4 and 30 + 6 x 2 - 6 x 3 - 4. One lost
      // update (two read-modify-writes of one counter overlapping) would show here.
      expect(await redis.mget(stockKey('left'), stockKey('right'))).toEqual(['32', '20']);
      expect((await http(b).get('/inventory/left')).body).toEqual({ sku: 'left', stock: 32 });
      expect((await http(a).get('/inventory/right')).body).toEqual({ sku: 'right', stock: 20 });
      expect(await redis.exists(lockKey('sku:left'), lockKey('sku:right'))).toBe(0);
    });

    it('holds the lock of one SKU while it waits for the other; a reservation of that SKU waits behind it', async () => {
      await http(a).put('/inventory/north').send({ stock: 10 }).expect(200);
      await http(a).put('/inventory/south').send({ stock: 0 }).expect(200);
      // Someone on instance A holds `sku:south` (a long restock, say).
      const south = await a.get(LockService).lock('sku:south');

      const moving = transfer(b, 'north', 'south', 4).then();
      // The names are taken in sorted order: B holds sku:north (one owner, exclusive) and waits in
      // sku:south's line. A reservation of north, via A, now waits for the transfer.
      expect(await eventually(async () => (await redis.exists(lockKey('sku:north'))) === 1)).toBe(true);
      expect(Object.values(await holdsOf(redis, lockKey('sku:north')))).toEqual(['1']);
      expect(Object.keys(await holdsOf(redis, lockKey('sku:south')))).toEqual([south.owner]);
      const reserving = http(a).post('/inventory/north/reserve').then();
      await sleep(150);
      expect(await redis.get(stockKey('north'))).toBe('10'); // nothing moved, nothing reserved yet

      expect(await south.release()).toBe(true);
      const [moved, reserved] = await Promise.all([moving, reserving]);
      expect(moved.status).toBe(200);
      expect(moved.body).toEqual({
        units: 4,
        from: { sku: 'north', stock: 6 },
        to: { sku: 'south', stock: 4 },
        movedBy: 'B',
      });
      expect(reserved.status).toBe(200);
      expect(reserved.body).toEqual({ sku: 'north', left: 5, reservedBy: 'A' }); // after the transfer
      expect(await redis.mget(stockKey('north'), stockKey('south'))).toEqual(['5', '4']);
      expect(await redis.exists(lockKey('sku:north'), lockKey('sku:south'))).toBe(0);
    });

    it('answers 409 when the source lacks the units and 400 for a bad body, changing nothing', async () => {
      await http(b).put('/inventory/east').send({ stock: 3 }).expect(200);
      const short = await transfer(a, 'east', 'west', 4);
      expect(short.status).toBe(409);
      expect(short.body).toEqual({ statusCode: 409, error: 'Conflict', message: 'east has 3 units, cannot move 4' });
      const fromNothing = await transfer(b, 'west', 'east', 1);
      expect(fromNothing.status).toBe(409);
      expect(fromNothing.body.message).toBe('west has 0 units, cannot move 1');

      const bad: [unknown, string[]][] = [
        [{}, ['from must be a SKU', 'to must be a SKU', 'units must be a whole number >= 1']],
        [{ from: 'east', to: 'east', units: 1 }, ['from and to must be different SKUs']],
        [{ from: 'east', to: 'west', units: 0 }, ['units must be a whole number >= 1']],
        [{ from: 'east', to: 'west', units: 1.5 }, ['units must be a whole number >= 1']],
        [{ from: 'east', to: 'west', units: '1' }, ['units must be a whole number >= 1']],
        [{ from: 'east', to: 'west', units: -2 }, ['units must be a whole number >= 1']],
        [{ from: 'east', to: 'we st', units: 1 }, ['to must be a SKU']],
        [{ from: 'x'.repeat(65), to: 'west', units: 1 }, ['from must be a SKU']],
        [{ from: ['east'], to: 'west', units: 1 }, ['from must be a SKU']],
        [[], ['from must be a SKU', 'to must be a SKU', 'units must be a whole number >= 1']],
      ];
      for (const [body, problems] of bad) {
        const response = await http(a)
          .post('/inventory/transfer')
          .send(body as object);
        expect(response.status, JSON.stringify(body)).toBe(400);
        expect(response.body.error).toBe('Bad Request');
        expect(response.body.message).toEqual(problems.map((start) => expect.stringContaining(start)));
      }
      expect(await redis.mget(stockKey('east'), stockKey('west'))).toEqual(['3', null]);
      expect(await redis.exists(lockKey('sku:east'), lockKey('sku:west'))).toBe(0);
    });
  });

  describe('/prices/:list (a read-write lock: @DisLock mode read and write)', () => {
    const catalog = { bolt: 120, nut: 35, screw: 60, washer: 8 };
    const fields = async (list: string): Promise<Record<string, string>> => holdsOf(redis, lockKey(`prices:${list}`));

    it('runs reads at once across both instances, each reader with its own lease in Redis', async () => {
      const put = await http(a).put('/prices/shared').send({ prices: catalog });
      expect(put.status).toBe(200);
      expect(put.body).toEqual({ list: 'shared', revision: 1, prices: catalog, servedBy: 'A' });

      const via = [a, b, a, b, a, b];
      const reads = all(via.map((app) => http(app).get('/prices/shared')));
      // Six readers in the lock's hash at once: one field per reader, whose value is the end of
      // its own lease in the server's clock (an exclusive hold would be a single field "1").
      let most: Record<string, string> = {};
      await eventually(async () => {
        const now = await fields('shared');
        if (Object.keys(now).length > Object.keys(most).length) most = now;
        return Object.keys(most).length === via.length;
      });
      expect(Object.keys(most)).toHaveLength(via.length);
      const now = await serverMs();
      for (const [owner, leaseEnd] of Object.entries(most)) {
        expect(owner).toMatch(/^s[0-9a-f]{32}$/); // a shared hold's owner id (see OwnerIds)
        expect(Number(leaseEnd)).toBeGreaterThan(now - 500); // sampled a moment ago
        expect(Number(leaseEnd)).toBeLessThanOrEqual(now + LEASE);
      }

      const answers = await reads;
      answers.forEach((r, i) => {
        expect(r.status).toBe(200);
        expect(r.body).toEqual({ list: 'shared', revision: 1, prices: catalog, servedBy: i % 2 === 0 ? 'A' : 'B' });
      });
      expect(await redis.exists(lockKey('prices:shared'))).toBe(0);
    });

    it('never shows a reprice half-done: every read is exactly one revision of the list', async () => {
      const put = await http(b).put('/prices/tools').send({ prices: catalog });
      const states = new Map<number, Record<string, number>>([[1, put.body.prices]]);

      // Three repricings (via both instances, 200 ms apart) and, all along, reads on each instance.
      let writing = true;
      const reads: request.Response[] = [];
      const reader = async (app: INestApplication): Promise<void> => {
        while (writing) reads.push(await http(app).get('/prices/tools'));
      };
      // Whatever Redis holds at any moment: readers only, or one writer alone.
      const samples: Record<string, string>[] = [];
      const sampler = async (): Promise<void> => {
        while (writing) {
          samples.push(await fields('tools'));
          await sleep(5);
        }
      };
      const background = Promise.all([reader(a), reader(b), reader(a), reader(b), sampler()]);
      const reprice = async (app: INestApplication, percent: number, afterMs: number) => {
        await sleep(afterMs);
        return http(app).post('/prices/tools/reprice').send({ percent });
      };
      const reprices = await Promise.all([reprice(a, 10, 50), reprice(b, -20, 250), reprice(a, 5, 450)]);
      await sleep(50);
      writing = false;
      await background;

      // The repricings ran one at a time: revisions 2, 3 and 4, each applied to the one before.
      for (const r of reprices) expect(r.status).toBe(200);
      const byRevision = [...reprices].sort((x, y) => x.body.revision - y.body.revision);
      expect(byRevision.map((r) => r.body.revision)).toEqual([2, 3, 4]);
      const percents = new Map(reprices.map((r, i) => [r, [10, -20, 5][i]]));
      for (const r of byRevision) {
        const before = states.get(r.body.revision - 1)!;
        const percent = percents.get(r)!;
        const expected = Object.fromEntries(
          Object.entries(before).map(([sku, cents]) => [sku, Math.round((cents * (100 + percent)) / 100)]),
        );
        expect(r.body.prices).toEqual(expected);
        states.set(r.body.revision, expected);
      }

      // Every read saw one revision whole: never some prices of one and some of the next.
      expect(reads.length).toBeGreaterThan(8);
      for (const r of reads) {
        expect(r.status).toBe(200);
        expect(r.body.prices).toEqual(states.get(r.body.revision));
      }
      expect(new Set(reads.map((r) => r.body.revision)).size).toBeGreaterThanOrEqual(3); // reads ran between them
      // In Redis: shared holds only (lease ends), or a single exclusive one ("1", or "0" while
      // granted to the head of the line), never both.
      const exclusive = samples.filter((held) => Object.values(held).some((v) => v === '0' || v === '1'));
      expect(exclusive.length).toBeGreaterThan(0);
      for (const held of exclusive) expect(Object.keys(held)).toHaveLength(1);
      expect(samples.some((held) => Object.keys(held).length >= 2)).toBe(true);

      expect((await http(a).get('/prices/tools')).body).toMatchObject({ revision: 4, prices: states.get(4) });
      expect(await redis.exists(lockKey('prices:tools'))).toBe(0);
    });

    it('serves a waiting reprice before reads that arrive after it (writers are not starved)', async () => {
      const big = Object.fromEntries(Array.from({ length: 12 }, (_, i) => [`part-${i}`, 100 + i]));
      await http(a).put('/prices/fair').send({ prices: big }).expect(200);

      const first = http(a).get('/prices/fair').then(); // holds the read lock for 12 steps
      expect(await eventually(async () => Object.keys(await fields('fair')).length === 1)).toBe(true);
      const reprice = http(b).post('/prices/fair/reprice').send({ percent: 50 }).then();
      // The writer waits for the reader, and stands in the lock's line in Redis.
      const line = `${prefix}lock:#line:*q:${lockKey('prices:fair')}`;
      expect(await eventually(async () => (await redis.keys(line)).length === 1)).toBe(true);
      expect(Object.keys(await fields('fair'))).toHaveLength(1); // the first reader still alone
      const later = http(a).get('/prices/fair').then(); // free to a reader, but a writer waits ahead

      const [r1, w, r2] = await Promise.all([first, reprice, later]);
      expect(r1.body).toMatchObject({ revision: 1, prices: big });
      expect(w.body).toMatchObject({ revision: 2, servedBy: 'B' });
      expect(r2.body).toMatchObject({ revision: 2, prices: w.body.prices, servedBy: 'A' });
      expect(await redis.exists(lockKey('prices:fair'))).toBe(0);
    });

    it('answers 404 for an unknown list and 400 for bad input', async () => {
      expect((await http(a).get('/prices/nothing')).status).toBe(404);
      expect((await http(b).post('/prices/nothing/reprice').send({ percent: 5 })).status).toBe(404);
      expect((await http(a).get('/prices/no%20such')).status).toBe(400);
      for (const prices of [undefined, [], {}, { bolt: -1 }, { bolt: 1.5 }, { bolt: '12' }, { 'a b': 1 }]) {
        expect((await http(a).put('/prices/bad').send({ prices })).status, JSON.stringify(prices)).toBe(400);
      }
      for (const percent of [undefined, '10', -100, 1_001, null]) {
        expect((await http(b).post('/prices/bad/reprice').send({ percent })).status).toBe(400);
      }
      expect(await redis.keys(`${prefix}prices:bad*`)).toEqual([]);
      expect(await redis.keys(`${prefix}prices:nothing*`)).toEqual([]);
    });
  });

  describe('POST /reports/:name/export (a semaphore: @DisLock permits 2)', () => {
    it('runs two exports at once across the instances; a third, on either one, gets 409', async () => {
      const key = lockKey('exports');
      const first = http(a).post('/reports/q1/export').then();
      const second = http(b).post('/reports/q2/export').then();
      // Two permits taken: two fields, one per holder, each with the end of its own lease.
      expect(await eventually(async () => Object.keys(await holdsOf(redis, key)).length === 2)).toBe(true);
      const startedAt = Date.now();
      const now = await serverMs();
      for (const [owner, leaseEnd] of Object.entries(await holdsOf(redis, key))) {
        expect(owner).toMatch(/^s[0-9a-f]{32}$/); // a shared hold's owner id (see OwnerIds)
        expect(Number(leaseEnd)).toBeGreaterThan(now);
        expect(Number(leaseEnd)).toBeLessThanOrEqual(now + LEASE);
      }

      for (const app of [a, b]) {
        const third = await http(app).post('/reports/q3/export');
        expect(third.status).toBe(409);
        expect(third.body).toEqual({ statusCode: 409, message: 'All 2 permits of "exports" are taken' });
      }

      // Each permit is renewed by its holder's watchdog: the lease ends move on past the first lease.
      const leaseEnds = new Set<number>();
      for (let held = await holdsOf(redis, key); Object.keys(held).length === 2; held = await holdsOf(redis, key)) {
        for (const end of Object.values(held)) leaseEnds.add(Number(end));
        if (Date.now() - startedAt > 5_000) break;
        await sleep(20);
      }
      const ends = [...leaseEnds].sort((x, y) => x - y);
      expect(ends[ends.length - 1] - ends[0]).toBeGreaterThan(LEASE);

      const answers = await Promise.all([first, second]);
      expect(answers.map((r) => r.status)).toEqual([200, 200]);
      expect(answers[0].body).toEqual({
        name: 'q1',
        file: 'exports/q1.pdf',
        exportedBy: 'A',
        durationMs: expect.any(Number),
      });
      expect(answers[1].body).toMatchObject({ name: 'q2', exportedBy: 'B' });
      for (const r of answers) expect(r.body.durationMs).toBeGreaterThan(LEASE); // outlived its first lease
      expect(await redis.exists(key)).toBe(0);

      // The permits are back: the export refused a moment ago runs now.
      const retried = await http(b).post('/reports/q3/export');
      expect(retried.status).toBe(200);
      expect(retried.body).toMatchObject({ name: 'q3', exportedBy: 'B' });
    });

    it('gives a permit back as soon as one export ends, while the other still runs', async () => {
      const key = lockKey('exports');
      const long = http(a).post('/reports/long/export').then();
      expect(await eventually(async () => Object.keys(await holdsOf(redis, key)).length === 1)).toBe(true);
      const [longOwner] = Object.keys(await holdsOf(redis, key));
      await sleep(TIMING.exportWorkMs / 2);
      const short = http(b).post('/reports/short/export').then();
      expect(await eventually(async () => Object.keys(await holdsOf(redis, key)).length === 2)).toBe(true);
      expect((await http(b).post('/reports/other/export')).status).toBe(409);

      expect((await long).status).toBe(200);
      const held = await holdsOf(redis, key);
      expect(Object.keys(held)).toHaveLength(1);
      expect(Object.keys(held)).not.toContain(longOwner);
      const next = await http(a).post('/reports/next/export'); // takes the freed permit
      expect(next.status).toBe(200);
      expect((await short).status).toBe(200);
      expect(await redis.exists(key)).toBe(0);
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

  describe('GET /health (the locks health indicator under @nestjs/terminus)', () => {
    it('is up on both instances, with the locks each holds and its Redis round trip', async () => {
      for (const app of [a, b]) {
        const response = await http(app).get('/health').expect(200);
        expect(response.body).toMatchObject({
          status: 'ok',
          info: { locks: { status: 'up', heldLocks: expect.any(Number), renewalLagMs: expect.any(Number) } },
        });
        expect(response.body.info.locks.latencyMs).toBeLessThan(1_000);
      }
    });
  });

  describe('shutdown', () => {
    it('app.close() releases the locks an instance holds and closes its Redis connection', async () => {
      const c = await boot('C');
      const client = c.get(RedisService).client;
      const key = lockKey('report:quarterly');
      const job = http(c).post('/reports/quarterly').then();
      // Running, not just acquiring: the key appears in Redis before C hears that it got the
      // lock, and a close() in between makes the acquisition fail instead (a 500, not a report).
      const record = `${prefix}archive:report:quarterly`;
      expect(await eventually(async () => (await redis.hexists(record, 'token')) === 1)).toBe(true);
      expect(await redis.exists(key)).toBe(1);

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
