/**
 * The snippets of README's "Quick start" (steps 2, 3, 4 and 6: app.module.ts, main.ts,
 * orders.service.ts, orders.controller.ts and orders.service.spec.ts), as written there, in one
 * file: the imports between those files are dropped, and main.ts and the spec are wrapped in
 * functions so that nothing runs; with the e2e expression step 6 quotes after its spec.
 * `npm run typecheck` fails if one of them stops compiling.
 */
import { Controller, Injectable, Module, Param, ParseIntPipe, Post } from '@nestjs/common';
import { NestFactory } from '@nestjs/core';
import { Test } from '@nestjs/testing';
import { DisLock, DisLockModule, DisLockTesting, DisLockTestingModule, LockNotAcquiredError } from 'nestjs-dislock';

// orders.service.ts
@Injectable()
export class OrdersService {
  @DisLock({ key: 'order:{0}', expire: 5_000 }) // one payment per order at a time, a 5 s lease at most
  async pay(orderId: number): Promise<{ orderId: number; paid: boolean }> {
    await new Promise((resolve) => setTimeout(resolve, 2_000)); // stands in for the payment provider
    return { orderId, paid: true };
  }
}

// orders.controller.ts
@Controller('orders')
export class OrdersController {
  constructor(private readonly orders: OrdersService) {}

  @Post(':id/pay')
  pay(@Param('id', ParseIntPipe) id: number) {
    return this.orders.pay(id); // the provider's method takes the lock
  }

  @Post(':id/cancel')
  @DisLock('order:{0}') // on the route itself: {0} is the id as ParseIntPipe made it
  async cancel(@Param('id', ParseIntPipe) id: number): Promise<{ orderId: number; cancelled: boolean }> {
    return { orderId: id, cancelled: true };
  }
}

// app.module.ts
@Module({
  imports: [DisLockModule.forRoot({ redis: 'redis://localhost:6379' })],
  controllers: [OrdersController],
  providers: [OrdersService],
})
export class AppModule {}

// main.ts
export function mainTs(): void {
  async function bootstrap() {
    const app = await NestFactory.create(AppModule);
    app.enableShutdownHooks(); // on SIGTERM or Ctrl+C, run app.close(): give the held locks back
    await app.listen(process.env.PORT ?? 3000);
  }
  void bootstrap();
}

// orders.service.spec.ts
export function ordersServiceSpec(): void {
  describe('OrdersService', () => {
    it('refuses to pay an order that is being paid elsewhere', async () => {
      const moduleRef = await Test.createTestingModule({
        imports: [DisLockTestingModule.forRoot()],
        providers: [OrdersService],
      }).compile();
      const app = await moduleRef.init();
      app.get(DisLockTesting).occupy('order:42'); // held by "another instance" until free('order:42')
      await expect(app.get(OrdersService).pay(42)).rejects.toBeInstanceOf(LockNotAcquiredError);
      await app.close();
    });
  });
}

// step 6, the e2e test of the whole AppModule (the full test is in testing.types.ts)
export function appE2eBuilder() {
  return DisLockTestingModule.override(Test.createTestingModule({ imports: [AppModule] }));
}
