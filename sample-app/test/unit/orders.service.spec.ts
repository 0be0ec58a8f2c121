/**
 * OrdersService's lock, unit-tested as the app team would: `DisLockTestingModule` gives `@DisLock`
 * the library's in-memory store (no Redis), and `DisLockTesting` makes an order's lock busy.
 */
import { type INestApplicationContext } from '@nestjs/common';
import { Test } from '@nestjs/testing';
import { DisLockTesting, DisLockTestingModule, LockNotAcquiredError, MemoryLockStore } from 'nestjs-dislock';
import { OrdersService } from '../../src/orders/orders.service';
import { APP_LOCK_OPTIONS, appConfig } from '../support/app-config';

async function startApp(
  options: { store?: MemoryLockStore; instance?: string; payWorkMs?: number } = {},
): Promise<INestApplicationContext> {
  const moduleRef = await Test.createTestingModule({
    imports: [DisLockTestingModule.forRoot({ ...APP_LOCK_OPTIONS, store: options.store })],
    providers: [appConfig({ instance: options.instance, payWorkMs: options.payWorkMs }), OrdersService],
  }).compile();
  return moduleRef.init();
}

describe('OrdersService.pay', () => {
  let app: INestApplicationContext;
  let orders: OrdersService;
  let testing: DisLockTesting;

  beforeEach(async () => {
    app = await startApp();
    orders = app.get(OrdersService);
    testing = app.get(DisLockTesting);
  });

  afterEach(() => app.close());

  it('pays an order and gives its lock back', async () => {
    await expect(orders.pay('42')).resolves.toEqual({ orderId: '42', paidBy: 'test' });
    expect(testing.holders('order:42')).toEqual([]);
  });

  it('answers 409 while the same order is being paid elsewhere, and pays it once that is done', async () => {
    testing.occupy('order:42'); // held by "another instance" until free()

    const error = await orders.pay('42').catch((e: unknown) => e);
    expect(error).toBeInstanceOf(LockNotAcquiredError);
    expect(error).toMatchObject({ lockName: 'order:42', status: 409 }); // what Nest answers over HTTP

    await expect(orders.pay('43')).resolves.toMatchObject({ orderId: '43' }); // other orders go on

    testing.free('order:42');
    await expect(orders.pay('42')).resolves.toMatchObject({ orderId: '42' });
  });

  it('holds the order under the fixed 5 s lease of its @DisLock while it pays', async () => {
    const slow = await startApp({ payWorkMs: 500 });
    const slowTesting = slow.get(DisLockTesting);
    const paying = slow.get(OrdersService).pay('7');
    await vi.waitFor(() => expect(slowTesting.holders('order:7')).toHaveLength(1), { interval: 5 });
    const [holder] = slowTesting.holders('order:7');
    expect(holder.exclusive).toBe(true);
    expect(holder.ttl).toBeLessThanOrEqual(5_000);
    expect(holder.ttl).toBeGreaterThan(4_000);
    await paying;
    expect(slowTesting.holders('order:7')).toEqual([]);
    await slow.close();
  });
});

describe('OrdersService.pay on two instances of the app', () => {
  it('sharing one MemoryLockStore, the second instance gets 409 while the first pays the order', async () => {
    const store = new MemoryLockStore(); // stands for the Redis both instances share
    const one = await startApp({ store, instance: 'one', payWorkMs: 500 });
    const two = await startApp({ store, instance: 'two' });

    const paying = one.get(OrdersService).pay('7');
    await vi.waitFor(() => expect(two.get(DisLockTesting).holders('order:7')).toHaveLength(1), { interval: 5 });

    await expect(two.get(OrdersService).pay('7')).rejects.toBeInstanceOf(LockNotAcquiredError);
    await expect(paying).resolves.toEqual({ orderId: '7', paidBy: 'one' });
    await expect(two.get(OrdersService).pay('7')).resolves.toEqual({ orderId: '7', paidBy: 'two' });

    await one.close();
    await two.close();
  });
});
