/**
 * The snippets of README's "Recipes" ("A scheduled job, once per tick", "Waiting for a busy lock",
 * "The lock family", "Errors and HTTP"), as written there: `npm run typecheck` fails if one of
 * them stops compiling. Never run.
 */
import { Injectable, Module } from '@nestjs/common';
import { APP_FILTER } from '@nestjs/core';
import { Cron } from '@nestjs/schedule';
import { DisLock, DisLockExceptionFilter, LockService } from 'nestjs-dislock';

// A scheduled job, once per tick
@Injectable()
export class Reports {
  @Cron('0 * * * * *') // every minute, on every instance
  @DisLock({ key: 'reports:minutely', onBusy: 'skip', lockAtLeastFor: 30_000, expire: 50_000 })
  async send(): Promise<void> {
    // runs on one instance per minute
  }
}

// Waiting for a busy lock
@Injectable()
export class Inventory {
  private readonly stock = new Map<string, number>(); // stands in for your database

  constructor(private readonly locks: LockService) {}

  @DisLock({ key: 'sku:{0}', waitTime: 2_000 }) // wait up to 2 s for the lock, then 409
  async restock(sku: string, units: number): Promise<void> {
    this.stock.set(sku, (this.stock.get(sku) ?? 0) + units);
  }

  reserve(sku: string, units: number): Promise<boolean> {
    return this.locks.withLock(
      `sku:${sku}`, // the same lock as restock's
      async (lock) => {
        lock.signal.throwIfAborted(); // the signal aborts if the lock is lost
        const left = this.stock.get(sku) ?? 0;
        if (left < units) return false;
        this.stock.set(sku, left - units);
        return true;
      },
      { waitTime: 1_000 },
    );
  }
}

// The lock family
@Injectable()
export class Catalog {
  private readonly prices = new Map<string, number>(); // stands in for your database

  @DisLock({ key: 'prices:{0}', mode: 'read' }) // shared with every other reader of the region
  async quote(region: string): Promise<number> {
    return this.prices.get(region) ?? 0;
  }

  @DisLock({ key: 'prices:{0}', mode: 'write', waitTime: 10_000 }) // alone: no reader, no other writer
  async reprice(region: string, price: number): Promise<void> {
    this.prices.set(region, price);
  }

  @DisLock({ key: 'exports', permits: 3, waitTime: 30_000 }) // at most 3 at once, across every instance
  async exportAll(format: string): Promise<string> {
    return `catalog.${format}`;
  }

  @DisLock({ key: ['prices:{0}', 'prices:{1}'], waitTime: 5_000 }) // both names, all or nothing
  async copy(from: string, to: string): Promise<void> {
    this.prices.set(to, this.prices.get(from) ?? 0);
  }
}

// Errors and HTTP
@Module({
  providers: [{ provide: APP_FILTER, useClass: DisLockExceptionFilter }],
})
export class AppModule {}
