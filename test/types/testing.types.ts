/**
 * The examples of docs/testing.md ("Testing your own code without Redis" and "Testing the whole
 * application"), as written there (with an `OrdersService` and an `AppModule` of their own):
 * `npm run typecheck` fails if one stops compiling. Never run; the e2e one runs as
 * test/app-on-memory-store.e2e-spec.ts. README's quick start test is in quick-start.types.ts.
 */
import { type INestApplication, Injectable, Module } from '@nestjs/common';
import { Test } from '@nestjs/testing';
import request from 'supertest';
import {
  DisLock,
  DisLockModule,
  DisLockTesting,
  DisLockTestingModule,
  LockNotAcquiredError,
  MemoryLockStore,
} from 'nestjs-dislock';

@Injectable()
class OrdersService {
  @DisLock({ key: 'order:{0}', expire: 5_000 })
  async pay(orderId: number): Promise<number> {
    return orderId;
  }
}

export function readmeExample(): void {
  it('answers 409 while another instance pays the same order', async () => {
    const moduleRef = await Test.createTestingModule({
      imports: [DisLockTestingModule.forRoot()],
      providers: [OrdersService],
    }).compile();
    const app = await moduleRef.init();
    app.get(DisLockTesting).occupy('order:42'); // held by "someone else" until free('order:42')
    await expect(app.get(OrdersService).pay(42)).rejects.toBeInstanceOf(LockNotAcquiredError);
    await app.close();
  });
}

@Module({ imports: [DisLockModule.forRoot({ redis: 'redis://localhost:6379' })], providers: [OrdersService] })
class AppModule {}

// test/app.e2e-spec.ts
export function wholeAppExample(): void {
  describe('orders (e2e)', () => {
    let app: INestApplication;

    beforeEach(async () => {
      const moduleRef = await DisLockTestingModule.override(
        Test.createTestingModule({ imports: [AppModule], providers: [DisLockTesting] }),
      ).compile();
      app = moduleRef.createNestApplication();
      await app.init();
    });

    afterEach(() => app.close());

    it('answers 409 while another instance pays the same order', async () => {
      app.get(DisLockTesting).occupy('order:42');
      await request(app.getHttpServer()).post('/orders/42/pay').expect(409);
    });
  });
}

/** The "Several instances" bullet: `override` with a shared store, chained with the app's own overrides. */
export async function severalInstances(): Promise<void> {
  const store = new MemoryLockStore();
  await DisLockTestingModule.override(Test.createTestingModule({ imports: [AppModule] }), { store })
    .overrideProvider(OrdersService)
    .useValue({})
    .compile();
}
