/**
 * An application's own `AppModule`, as users write it (`ConfigModule` + `forRootAsync` reading
 * REDIS_URL), booted by `@nestjs/testing` on the in-memory store with no Redis reachable: REDIS_URL
 * points at a closed port, so a lock taken on Redis would fail instead of answering. This is
 * docs/testing.md's "Your whole AppModule" snippet, run. The natural-but-wrong ways
 * (`overrideModule(DisLockModule)`, `DisLockTestingModule.forRoot()` beside `AppModule`) fail at
 * startup with an error that names the fix, instead of a timeout on Redis.
 */
import { createServer } from 'node:net';
import {
  Controller,
  HttpCode,
  Injectable,
  type INestApplication,
  Module,
  Param,
  ParseIntPipe,
  Post,
} from '@nestjs/common';
import { ConfigModule, ConfigService } from '@nestjs/config';
import { Test } from '@nestjs/testing';
import request from 'supertest';
import {
  DisLock,
  DisLockModule,
  DisLockSetupError,
  DisLockTesting,
  DisLockTestingModule,
  MemoryLockStore,
} from 'nestjs-dislock';

/** The app's payment provider: replaced in the test by one that pays when the test says so. */
@Injectable()
class PaymentGateway {
  async charge(orderId: number): Promise<void> {
    throw new Error(`no payment provider in a test (order ${orderId})`);
  }
}

@Injectable()
class OrdersService {
  constructor(private readonly payments: PaymentGateway) {}

  @DisLock({ key: 'order:{0}', expire: 5_000 })
  async pay(orderId: number): Promise<{ orderId: number; paid: boolean }> {
    await this.payments.charge(orderId);
    return { orderId, paid: true };
  }
}

@Controller('orders')
class OrdersController {
  constructor(private readonly orders: OrdersService) {}

  @Post(':id/pay')
  @HttpCode(200)
  pay(@Param('id', ParseIntPipe) id: number) {
    return this.orders.pay(id);
  }

  @Post(':id/cancel')
  @HttpCode(200)
  @DisLock('order:{0}')
  async cancel(@Param('id', ParseIntPipe) id: number): Promise<{ orderId: number; cancelled: boolean }> {
    return { orderId: id, cancelled: true };
  }
}

@Module({
  imports: [
    ConfigModule.forRoot({ isGlobal: true, ignoreEnvFile: true }),
    DisLockModule.forRootAsync({
      inject: [ConfigService],
      useFactory: (config: ConfigService) => ({
        redis: config.getOrThrow<string>('REDIS_URL'),
        keyPrefix: 'shop:lock:',
      }),
    }),
  ],
  controllers: [OrdersController],
  providers: [OrdersService, PaymentGateway],
})
class AppModule {}

/** A TCP port that nothing listens on. */
async function closedPort(): Promise<number> {
  const server = createServer();
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  const address = server.address();
  await new Promise<void>((resolve) => server.close(() => resolve()));
  if (address === null || typeof address === 'string') throw new Error('no port');
  return address.port;
}

/** A payment gateway whose charges end when the test calls `settle()`. */
function heldGateway() {
  let settle = (): void => undefined;
  const paid = new Promise<void>((resolve) => (settle = resolve));
  return { gateway: { charge: () => paid }, settle: () => settle() };
}

const failure = (promise: Promise<unknown>): Promise<unknown> =>
  promise.then(
    () => {
      throw new Error('expected the application to fail at startup');
    },
    (reason: unknown) => reason,
  );

describe("an application's own AppModule on the in-memory store, no Redis reachable", () => {
  const redisUrlBefore = process.env.REDIS_URL;
  const apps: INestApplication[] = [];

  beforeAll(async () => {
    process.env.REDIS_URL = `redis://127.0.0.1:${await closedPort()}`;
  });

  afterEach(async () => {
    await Promise.all(apps.splice(0).map((app) => app.close()));
  });

  afterAll(() => {
    if (redisUrlBefore === undefined) delete process.env.REDIS_URL;
    else process.env.REDIS_URL = redisUrlBefore;
  });

  it('DisLockTestingModule.override: a payment holds order:42 on the memory store, a second one and a cancel get 409', async () => {
    const { gateway, settle } = heldGateway();
    const moduleRef = await DisLockTestingModule.override(
      Test.createTestingModule({ imports: [AppModule], providers: [DisLockTesting] }),
    )
      .overrideProvider(PaymentGateway)
      .useValue(gateway)
      .compile();
    const app = moduleRef.createNestApplication({ logger: false });
    apps.push(app);
    await app.init();
    const testing = app.get(DisLockTesting);
    const http = () => request(app.getHttpServer());

    const first = http().post('/orders/42/pay').then();
    await vi.waitFor(() => expect(testing.holders('order:42')).toHaveLength(1));
    expect(testing.holders('order:42')[0]).toMatchObject({ exclusive: true });

    const second = await http().post('/orders/42/pay');
    expect(second.status).toBe(409);
    expect(second.body).toEqual({ statusCode: 409, message: 'Lock "order:42" is held by another owner' });
    expect((await http().post('/orders/42/cancel')).status).toBe(409);
    expect((await http().post('/orders/7/cancel')).body).toEqual({ orderId: 7, cancelled: true });

    settle();
    const paid = await first;
    expect(paid.status).toBe(200);
    expect(paid.body).toEqual({ orderId: 42, paid: true });
    expect(testing.holders('order:42')).toEqual([]);
  });

  it('DisLockTesting drives the locks of the app under test: occupy gives a 409, free lets it through', async () => {
    const moduleRef = await DisLockTestingModule.override(
      Test.createTestingModule({ imports: [AppModule], providers: [DisLockTesting] }),
    ).compile();
    const app = moduleRef.createNestApplication({ logger: false });
    apps.push(app);
    await app.init();
    const testing = app.get(DisLockTesting);

    testing.occupy('order:9');
    expect((await request(app.getHttpServer()).post('/orders/9/cancel')).status).toBe(409);
    testing.free('order:9');
    expect((await request(app.getHttpServer()).post('/orders/9/cancel')).status).toBe(200);
  });

  it('two applications given one MemoryLockStore exclude each other, as two instances on one Redis', async () => {
    const store = new MemoryLockStore();
    const { gateway, settle } = heldGateway();
    const boot = async (): Promise<INestApplication> => {
      const moduleRef = await DisLockTestingModule.override(
        Test.createTestingModule({ imports: [AppModule], providers: [DisLockTesting] }),
        { store },
      )
        .overrideProvider(PaymentGateway)
        .useValue(gateway)
        .compile();
      const app = moduleRef.createNestApplication({ logger: false });
      apps.push(app);
      return app.init();
    };
    const one = await boot();
    const two = await boot();

    const paying = request(one.getHttpServer()).post('/orders/5/pay').then();
    await vi.waitFor(() => expect(two.get(DisLockTesting).holders('order:5')).toHaveLength(1));
    expect((await request(two.getHttpServer()).post('/orders/5/pay')).status).toBe(409);
    settle();
    expect((await paying).status).toBe(200);
  });

  it('overrideModule(DisLockModule).useModule(DisLockTestingModule.forRoot()) fails at startup, naming the fix', async () => {
    const error = await failure(
      Test.createTestingModule({ imports: [AppModule] })
        .overrideModule(DisLockModule)
        .useModule(DisLockTestingModule.forRoot())
        .compile(),
    );
    expect(error).toBeInstanceOf(DisLockSetupError);
    expect((error as Error).message).toContain('overrideModule(DisLockModule)');
    expect((error as Error).message).toContain('DisLockTestingModule.override(');
  });

  it('DisLockTestingModule.forRoot() imported beside an AppModule that has a DisLockModule fails at startup, naming the fix', async () => {
    const error = await failure(
      Test.createTestingModule({ imports: [AppModule, DisLockTestingModule.forRoot()] }).compile(),
    );
    expect(error).toBeInstanceOf(DisLockSetupError);
    expect((error as Error).message).toContain('adds a second DisLockModule');
    expect((error as Error).message).toContain('DisLockTestingModule.override(');
  });

  it('a DisLockTestingModule.forRoot() that a unit test did import does not stop a later app on Redis', async () => {
    const unit = await Test.createTestingModule({ imports: [DisLockTestingModule.forRoot()] }).compile();
    await unit.close();
    const port = await closedPort();
    const onRedis = await Test.createTestingModule({
      imports: [DisLockModule.forRoot({ redis: { lazyConnect: true, host: '127.0.0.1', port } })],
    }).compile();
    await onRedis.close();
  });

  it('DisLockTesting in an AppModule test without the override says what is missing', async () => {
    const error = await failure(
      Test.createTestingModule({ imports: [AppModule], providers: [DisLockTesting] }).compile(),
    );
    expect(error).toBeInstanceOf(DisLockSetupError);
    expect((error as Error).message).toContain('DisLockTesting works on the in-memory store');
    expect((error as Error).message).toContain('DisLockTestingModule.override(');
  });
});
