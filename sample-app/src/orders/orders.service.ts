import { Inject, Injectable } from '@nestjs/common';
import { setTimeout as sleep } from 'node:timers/promises';
import { DisLock } from 'nestjs-dislock';
import { APP_CONFIG, type AppConfig } from '../app.config';

export interface Payment {
  readonly orderId: string;
  readonly paidBy: string;
}

@Injectable()
export class OrdersService {
  constructor(@Inject(APP_CONFIG) private readonly config: AppConfig) {}

  /**
   * One payment per order at a time, across every instance.
   *
   * A payment is short and bounded, so a fixed lease (`expire`) fits: no renewal traffic, and if
   * this process dies mid-payment the order unlocks by itself within 5 s. A second call for the
   * same order fails at once (waitTime 0) with LockNotAcquiredError, which Nest answers with
   * 409 Conflict. On return the lock is released, so the order can be paid again right away.
   */
  @DisLock({ key: 'order:{0}', expire: 5_000 })
  async pay(orderId: string): Promise<Payment> {
    await sleep(this.config.payWorkMs); // the call to the payment provider
    return { orderId, paidBy: this.config.instance };
  }
}
