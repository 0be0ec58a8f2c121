import { Injectable } from '@nestjs/common';
import { DisLock, LockNotAcquiredError } from 'nestjs-dislock';
import { createTestApp, type TestApp } from './support/app';
import { sharedClient, sleep } from './support/shared-redis';

@Injectable()
class Orders {
  @DisLock({ key: 'order:{0}', expire: 2000 })
  async pay(id: number): Promise<string> {
    await sleep(100);
    return `paid ${id}`;
  }
}

describe('smoke', () => {
  let t: TestApp;
  const redis = sharedClient();
  beforeAll(async () => {
    t = await createTestApp([Orders]);
  });
  afterAll(async () => {
    await t.close();
    redis.disconnect();
  });

  it('locks, excludes, releases', async () => {
    const orders = t.get(Orders);
    const results = await Promise.allSettled([orders.pay(1), orders.pay(1)]);
    expect(results.map((r) => r.status).sort()).toEqual(['fulfilled', 'rejected']);
    const rejected = results.find((r): r is PromiseRejectedResult => r.status === 'rejected');
    expect(rejected?.reason).toBeInstanceOf(LockNotAcquiredError);
    expect(await redis.exists(`${t.prefix}order:1`)).toBe(0);
  });

  it('service lock has hash and ttl', async () => {
    const h = await t.locks.lock('x', { lockWatchdogTimeout: 600 });
    expect(await redis.hgetall(`${t.prefix}x`)).toEqual({ [h.owner]: '1' });
    await sleep(700);
    expect(await redis.pttl(`${t.prefix}x`)).toBeGreaterThan(0);
    expect(await h.release()).toBe(true);
    expect(await redis.exists(`${t.prefix}x`)).toBe(0);
  });
});
