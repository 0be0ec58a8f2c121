/**
 * InventoryService under Jest: a reservation checks `lock.signal` before writing the counter back.
 * The same kind of test as test/unit/inventory.service.spec.ts.
 */
import { jest } from '@jest/globals';
import { type INestApplicationContext } from '@nestjs/common';
import { Test } from '@nestjs/testing';
import { DisLockTesting, DisLockTestingModule, LockLostError, LockNotAcquiredError } from 'nestjs-dislock';
import { InventoryService } from '../../src/inventory/inventory.service';
import { APP_LOCK_OPTIONS, appConfig } from '../support/app-config';
import { fakeRedisService } from '../support/fake-redis';
import { until } from '../support/until';

describe('InventoryService (Jest)', () => {
  let app: INestApplicationContext;
  let inventory: InventoryService;
  let testing: DisLockTesting;

  async function start(reserveWorkMs = 0): Promise<void> {
    const moduleRef = await Test.createTestingModule({
      imports: [DisLockTestingModule.forRoot(APP_LOCK_OPTIONS)],
      providers: [appConfig({ reserveWorkMs }), fakeRedisService(), InventoryService],
    }).compile();
    app = await moduleRef.init();
    inventory = app.get(InventoryService);
    testing = app.get(DisLockTesting);
  }

  afterEach(async () => {
    await app.close();
    jest.useRealTimers();
  });

  it('does not write the counter when its lock is lost between the read and the write', async () => {
    await start(500);
    await inventory.restock('widget', 5);

    const reserving = inventory.reserve('widget');
    await until(() => testing.holders('sku:widget').length === 1);
    expect(testing.loseLock('sku:widget')).toBe(1);

    const error = await reserving.catch((e: unknown) => e);
    expect(error).toBeInstanceOf(LockLostError);
    expect((error as LockLostError).reason).toBe('not-owner');
    await expect(inventory.stock('widget')).resolves.toEqual({ sku: 'widget', stock: 5 });
  });

  it('waits up to its 5 s waitTime for a busy SKU, then answers 409 (fake timers)', async () => {
    jest.useFakeTimers();
    await start();
    await inventory.restock('widget', 3);

    testing.occupy('sku:widget', 2_000);
    const queued = inventory.reserve('widget');
    await jest.advanceTimersByTimeAsync(2_000);
    await expect(queued).resolves.toMatchObject({ left: 2 });

    testing.occupy('sku:widget');
    const refused = inventory.reserve('widget').catch((e: unknown) => e);
    await jest.advanceTimersByTimeAsync(5_000);
    expect(await refused).toBeInstanceOf(LockNotAcquiredError);
    expect(await refused).toMatchObject({ lockName: 'sku:widget', status: 409 });
  });
});
