/**
 * The example of docs/testing.md ("Testing your own code without Redis"), as written there (with
 * an `OrdersService` of its own): `npm run typecheck` fails if it stops compiling. Never run.
 * README's quick start test is in quick-start.types.ts.
 */
import { Injectable } from '@nestjs/common';
import { Test } from '@nestjs/testing';
import { DisLock, DisLockTesting, DisLockTestingModule, LockNotAcquiredError } from 'nestjs-dislock';

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
