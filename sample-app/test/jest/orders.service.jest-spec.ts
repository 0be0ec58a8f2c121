/**
 * OrdersService's lock under Jest: the same kind of unit test as test/unit/orders.service.spec.ts.
 * `DisLockTestingModule` gives `@DisLock` the library's in-memory store (no Redis).
 */
import { type INestApplicationContext } from '@nestjs/common';
import { Test } from '@nestjs/testing';
import { DisLockTesting, DisLockTestingModule, LockNotAcquiredError, MemoryLockStore } from 'nestjs-dislock';
import { OrdersService } from '../../src/orders/orders.service';
import { APP_LOCK_OPTIONS, appConfig } from '../support/app-config';
import { until } from '../support/until';

async function startApp(
  options: { store?: MemoryLockStore; instance?: string; payWorkMs?: number } = {},
): Promise<INestApplicationContext> {
  const moduleRef = await Test.createTestingModule({
    imports: [DisLockTestingModule.forRoot({ ...APP_LOCK_OPTIONS, store: options.store })],
    providers: [appConfig({ instance: options.instance, payWorkMs: options.payWorkMs }), OrdersService],
  }).compile();
  return moduleRef.init();
}

describe('OrdersService.pay (Jest)', () => {
  it('answers 409 while the same order is being paid elsewhere, and pays it once that is done', async () => {
    const app = await startApp();
    const orders = app.get(OrdersService);
    const testing = app.get(DisLockTesting);
    testing.occupy('order:42');

    const error = await orders.pay('42').catch((e: unknown) => e);
    expect(error).toBeInstanceOf(LockNotAcquiredError);
    expect(error).toMatchObject({ lockName: 'order:42', status: 409 });

    testing.free('order:42');
    await expect(orders.pay('42')).resolves.toEqual({ orderId: '42', paidBy: 'test' });
    expect(testing.holders('order:42')).toEqual([]);
    await app.close();
  });

  it('two instances sharing one MemoryLockStore exclude each other', async () => {
    const store = new MemoryLockStore();
    const one = await startApp({ store, instance: 'one', payWorkMs: 500 });
    const two = await startApp({ store, instance: 'two' });

    const paying = one.get(OrdersService).pay('7');
    await until(() => two.get(DisLockTesting).holders('order:7').length === 1);
    await expect(two.get(OrdersService).pay('7')).rejects.toBeInstanceOf(LockNotAcquiredError);
    await expect(paying).resolves.toEqual({ orderId: '7', paidBy: 'one' });
    await expect(two.get(OrdersService).pay('7')).resolves.toEqual({ orderId: '7', paidBy: 'two' });

    await one.close();
    await two.close();
  });
});
