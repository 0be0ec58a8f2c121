import { BadRequestException, ConflictException, Inject, Injectable } from '@nestjs/common';
import { setTimeout as sleep } from 'node:timers/promises';
import { DisLock, type LockHandle, LockService } from 'nestjs-dislock';
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

export interface Transfer {
  readonly units: number;
  /** Both stock levels right after the transfer. */
  readonly from: StockLevel;
  readonly to: StockLevel;
  readonly movedBy: string;
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

  /**
   * Moves `units` from one SKU to another: two counters read, checked and written back, so both
   * locks are needed for the whole of it. An array `key` takes `sku:<from>` and `sku:<to>` all or
   * nothing, always in the same (sorted) order: a transfer widget -> gadget and one gadget -> widget
   * running at once never deadlock, each holding one lock and waiting for the other. They are the
   * very locks `reserve` and `restock` take, so a transfer also excludes reservations of either SKU
   * on every instance. It queues for them like a reservation does (409 past 5 s).
   */
  @DisLock({ key: ['sku:{0}', 'sku:{1}'], ...QUEUE_FOR_LOCK })
  async transfer(from: string, to: string, units: number): Promise<Transfer> {
    // One name, one lock, two writes to the same counter: the second would undo the first.
    if (from === to) throw new BadRequestException('from and to must be different SKUs');
    const [fromKey, toKey] = [this.stockKey(from), this.stockKey(to)];
    const [fromStock, toStock] = (await this.redis.client.mget(fromKey, toKey)).map((value) => Number(value ?? 0));
    if (fromStock < units) throw new ConflictException(`${from} has ${fromStock} units, cannot move ${units}`);
    await sleep(this.config.reserveWorkMs); // e.g. asking the warehouse system between the read and the write
    // Never write on a lock that is no longer ours. Inside a locked method, `current(name)` is the
    // part of the multi-lock with that name; each part has its own signal.
    for (const sku of [from, to]) this.heldLock(`sku:${sku}`).signal.throwIfAborted();
    await this.redis.client
      .multi()
      .set(fromKey, fromStock - units)
      .set(toKey, toStock + units)
      .exec();
    return {
      units,
      from: { sku: from, stock: fromStock - units },
      to: { sku: to, stock: toStock + units },
      movedBy: this.config.instance,
    };
  }

  private heldLock(name: string): LockHandle {
    const lock = this.locks.current(name);
    if (!lock) throw new Error(`unreachable: the running call chain holds "${name}"`);
    return lock;
  }

  private stockKey(sku: string): string {
    return `${this.config.keyPrefix}stock:${sku}`;
  }
}
