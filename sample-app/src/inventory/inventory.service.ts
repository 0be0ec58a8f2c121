import { ConflictException, Inject, Injectable } from '@nestjs/common';
import { setTimeout as sleep } from 'node:timers/promises';
import { LockService } from 'nestjs-dislock';
import { APP_CONFIG, type AppConfig } from '../app.config';
import { RedisService } from '../redis.service';

export interface StockLevel {
  readonly sku: string;
  readonly stock: number;
}

export interface Reservation {
  readonly sku: string;
  /** Units left after this reservation. */
  readonly left: number;
  readonly reservedBy: string;
}

/**
 * Reservations wait for the lock instead of failing: each one holds it for a few ms, so a queue
 * of concurrent requests drains quickly. Past 5 s the caller gets 409.
 */
const QUEUE_FOR_LOCK = { waitTime: 5_000 };

@Injectable()
export class InventoryService {
  constructor(
    private readonly locks: LockService,
    private readonly redis: RedisService,
    @Inject(APP_CONFIG) private readonly config: AppConfig,
  ) {}

  async stock(sku: string): Promise<StockLevel> {
    return { sku, stock: Number((await this.redis.client.get(this.stockKey(sku))) ?? 0) };
  }

  /** Sets the stock, under the same lock, so it never lands in the middle of a reservation. */
  async restock(sku: string, stock: number): Promise<StockLevel> {
    return this.locks.withLock(
      `sku:${sku}`,
      async () => {
        await this.redis.client.set(this.stockKey(sku), stock);
        return { sku, stock };
      },
      QUEUE_FOR_LOCK,
    );
  }

  /**
   * Takes one unit. The read-modify-write below is not atomic on purpose: it stands for any
   * check-then-act on shared state (a database row, an external system). Without the lock, two
   * instances could read the same count and sell the same unit twice. `withLock` (rather than
   * `@DisLock`) holds the lock only around this critical section.
   */
  async reserve(sku: string): Promise<Reservation> {
    return this.locks.withLock(
      `sku:${sku}`,
      async (lock) => {
        const stock = Number((await this.redis.client.get(this.stockKey(sku))) ?? 0);
        if (stock <= 0) throw new ConflictException(`${sku} is out of stock`);
        await sleep(this.config.reserveWorkMs); // e.g. a fraud check between the read and the write
        lock.signal.throwIfAborted(); // never write on a lock that is no longer ours
        await this.redis.client.set(this.stockKey(sku), stock - 1);
        return { sku, left: stock - 1, reservedBy: this.config.instance };
      },
      QUEUE_FOR_LOCK,
    );
  }

  private stockKey(sku: string): string {
    return `${this.config.keyPrefix}stock:${sku}`;
  }
}
