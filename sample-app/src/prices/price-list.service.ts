import { BadRequestException, Inject, Injectable, NotFoundException } from '@nestjs/common';
import { setTimeout as sleep } from 'node:timers/promises';
import { DisLock, LockService } from 'nestjs-dislock';
import { APP_CONFIG, type AppConfig } from '../app.config';
import { RedisService } from '../redis.service';

export interface PriceList {
  readonly list: string;
  /** Goes up by one with every change of the list; every price below belongs to this revision. */
  readonly revision: number;
  /** Price of each SKU, in cents, by SKU. */
  readonly prices: Record<string, number>;
  readonly servedBy: string;
}

/**
 * A price list kept the way a database keeps rows: one Redis key per price
 * (`<keyPrefix>prices:<list>:sku:<sku>`), beside the list's SKUs (a set) and its revision. Reading
 * the list takes one round trip per price, and so does changing it: without a lock, a reader
 * running during a repricing would return some old prices and some new ones, under either revision.
 *
 * A read-write lock per list (`prices:<list>`) fixes that without serializing the readers:
 * - `read` takes it with `mode: 'read'`: any number of reads run at once, on every instance, each
 *   with its own lease (Redis holds one field per reader).
 * - `replace` and `reprice` take it with `mode: 'write'`: a change runs alone, once the reads in
 *   progress are done, and no read starts until it has finished, so none sees it half-done.
 * - The line is fair: a change waiting for the readers is not overtaken by reads that arrive
 *   after it; they wait for the change and see the new prices.
 *
 * Both wait for the lock (reads up to 5 s, changes up to 10 s) rather than answering 409 at once:
 * the lock is held for a few round trips only.
 */
@Injectable()
export class PriceListService {
  constructor(
    private readonly locks: LockService,
    private readonly redis: RedisService,
    @Inject(APP_CONFIG) private readonly config: AppConfig,
  ) {}

  /** The whole list, as of one revision; 404 when it was never set. */
  @DisLock({ key: 'prices:{0}', mode: 'read', waitTime: 5_000 })
  async read(list: string): Promise<PriceList> {
    const revision = await this.redis.client.get(this.revisionKey(list));
    if (revision === null) throw new NotFoundException(`No price list "${list}"`);
    const prices: [string, number][] = [];
    for (const sku of (await this.redis.client.smembers(this.skusKey(list))).sort()) {
      prices.push([sku, Number(await this.redis.client.get(this.priceKey(list, sku)))]);
      await sleep(this.config.priceStepMs);
    }
    // fromEntries, not `prices[sku] = ...`: a SKU named `__proto__` stays a price.
    return { list, revision: Number(revision), prices: Object.fromEntries(prices), servedBy: this.config.instance };
  }

  /** Sets the whole list (a new revision): the prices given, and no others. */
  @DisLock({ key: 'prices:{0}', mode: 'write', waitTime: 10_000 })
  async replace(list: string, prices: Readonly<Record<string, number>>): Promise<PriceList> {
    const skus = Object.keys(prices).sort();
    if (skus.length === 0) throw new BadRequestException('A price list has at least one price');
    const revision = Number((await this.redis.client.get(this.revisionKey(list))) ?? 0) + 1;
    const previous = await this.redis.client.smembers(this.skusKey(list));
    for (const sku of skus) {
      this.stillWriting(list);
      await this.redis.client.set(this.priceKey(list, sku), prices[sku]);
      await sleep(this.config.priceStepMs);
    }
    const dropped = previous.filter((sku) => !Object.hasOwn(prices, sku));
    this.stillWriting(list);
    const transaction = this.redis.client.multi();
    if (dropped.length > 0) transaction.del(...dropped.map((sku) => this.priceKey(list, sku)));
    await transaction
      .del(this.skusKey(list))
      .sadd(this.skusKey(list), ...skus)
      .set(this.revisionKey(list), revision)
      .exec();
    return {
      list,
      revision,
      prices: Object.fromEntries(skus.map((sku) => [sku, prices[sku]])),
      servedBy: this.config.instance,
    };
  }

  /**
   * Every price up (or down) by `percent`, rounded to the cent: a read-modify-write of every key of
   * the list. It reads the list through `read`: a call chain holding the write lock may take the
   * read lock, and does so by re-entering it (nothing more in Redis), rather than waiting for itself.
   */
  @DisLock({ key: 'prices:{0}', mode: 'write', waitTime: 10_000 })
  async reprice(list: string, percent: number): Promise<PriceList> {
    const current = await this.read(list); // 404 for an unknown list
    const prices: [string, number][] = [];
    for (const [sku, cents] of Object.entries(current.prices)) {
      const repriced = Math.round((cents * (100 + percent)) / 100);
      this.stillWriting(list);
      await this.redis.client.set(this.priceKey(list, sku), repriced);
      prices.push([sku, repriced]);
      await sleep(this.config.priceStepMs);
    }
    const revision = current.revision + 1;
    this.stillWriting(list);
    await this.redis.client.set(this.revisionKey(list), revision);
    return { list, revision, prices: Object.fromEntries(prices), servedBy: this.config.instance };
  }

  /**
   * Throws unless the running call chain still holds the write lock of `list`: a writer whose lock
   * was lost (Redis unreachable for a whole lease, the app shutting down) stops before its next
   * write instead of writing beside readers.
   */
  private stillWriting(list: string): void {
    const lock = this.locks.current(`prices:${list}`);
    if (!lock) throw new Error(`unreachable: the running call chain holds "prices:${list}"`);
    lock.signal.throwIfAborted();
  }

  private priceKey(list: string, sku: string): string {
    return `${this.config.keyPrefix}prices:${list}:sku:${sku}`;
  }

  private skusKey(list: string): string {
    return `${this.config.keyPrefix}prices:${list}:skus`;
  }

  private revisionKey(list: string): string {
    return `${this.config.keyPrefix}prices:${list}:revision`;
  }
}
