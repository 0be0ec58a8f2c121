/**
 * InventoryService: a reservation reads a stock counter, works a while, and writes it back under the
 * SKU's lock, and checks `lock.signal` before it writes. The counters live in a fake of the app's
 * Redis; the locks in the library's in-memory store.
 */
import { ConflictException, type INestApplicationContext } from '@nestjs/common';
import { Test } from '@nestjs/testing';
import { DisLockTesting, DisLockTestingModule, LockLostError, LockNotAcquiredError } from 'nestjs-dislock';
import { InventoryService } from '../../src/inventory/inventory.service';
import { APP_LOCK_OPTIONS, appConfig } from '../support/app-config';
import { FakeRedisClient, fakeRedisService } from '../support/fake-redis';

describe('InventoryService', () => {
  let app: INestApplicationContext;
  let inventory: InventoryService;
  let testing: DisLockTesting;
  let redis: FakeRedisClient;

  async function start(reserveWorkMs = 0): Promise<void> {
    redis = new FakeRedisClient();
    const moduleRef = await Test.createTestingModule({
      imports: [DisLockTestingModule.forRoot(APP_LOCK_OPTIONS)],
      providers: [appConfig({ reserveWorkMs }), fakeRedisService(redis), InventoryService],
    }).compile();
    app = await moduleRef.init();
    inventory = app.get(InventoryService);
    testing = app.get(DisLockTesting);
  }

  afterEach(async () => {
    await app.close();
    vi.useRealTimers();
  });

  it('reserves one unit at a time, and answers 409 when none is left', async () => {
    await start();
    await inventory.restock('widget', 2);
    await expect(inventory.reserve('widget')).resolves.toEqual({ sku: 'widget', left: 1, reservedBy: 'test' });
    await expect(inventory.reserve('widget')).resolves.toMatchObject({ left: 0 });
    await expect(inventory.reserve('widget')).rejects.toBeInstanceOf(ConflictException);
    expect(testing.holders('sku:widget')).toEqual([]);
  });

  it('does not write the counter when its lock is lost between the read and the write', async () => {
    await start(500); // the reservation works 500 ms between reading and writing the counter
    await inventory.restock('widget', 5);

    const reserving = inventory.reserve('widget');
    await vi.waitFor(() => expect(testing.holders('sku:widget')).toHaveLength(1), { interval: 5 });
    expect(testing.loseLock('sku:widget')).toBe(1); // its lease ran out, someone else may hold it now

    const error = await reserving.catch((e: unknown) => e);
    expect(error).toBeInstanceOf(LockLostError);
    expect((error as LockLostError).reason).toBe('not-owner');
    await expect(inventory.stock('widget')).resolves.toEqual({ sku: 'widget', stock: 5 }); // not written
  });

  it('queues a reservation behind another holder of the SKU, for up to 5 s (fake timers)', async () => {
    vi.useFakeTimers();
    await start();
    await inventory.restock('widget', 3);

    testing.occupy('sku:widget', 2_000); // another instance holds the SKU for 2 s
    const queued = inventory.reserve('widget');
    await vi.advanceTimersByTimeAsync(2_000);
    await expect(queued).resolves.toMatchObject({ left: 2 });

    testing.occupy('sku:widget'); // and now one that never lets go
    const refused = inventory.reserve('widget').catch((e: unknown) => e);
    await vi.advanceTimersByTimeAsync(5_000);
    expect(await refused).toBeInstanceOf(LockNotAcquiredError);
    await expect(inventory.stock('widget')).resolves.toMatchObject({ stock: 2 });
  });

  it('takes both SKUs of a transfer or neither: a busy one answers 409 and leaves the other free', async () => {
    vi.useFakeTimers();
    await start();
    await inventory.restock('widget', 4);

    testing.occupy('sku:gadget');
    const refused = inventory.transfer('widget', 'gadget', 1).catch((e: unknown) => e);
    await vi.advanceTimersByTimeAsync(5_000); // its waitTime
    // A multi-lock's error names the whole set it asked for (sorted), not only the busy part.
    expect(await refused).toMatchObject({ lockName: 'sku:gadget, sku:widget', status: 409 });
    expect(testing.holders('sku:widget')).toEqual([]);

    testing.free('sku:gadget');
    await expect(inventory.transfer('widget', 'gadget', 1)).resolves.toMatchObject({
      from: { sku: 'widget', stock: 3 },
      to: { sku: 'gadget', stock: 1 },
    });
  });
});
