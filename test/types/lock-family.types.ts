/**
 * The examples of docs/lock-family.md ("Read-write locks, semaphores and multi-locks"), as
 * written there: `npm run typecheck` fails if one of them stops compiling. Never run. README's
 * shorter lock family recipe is in recipes.types.ts.
 */
import { Injectable } from '@nestjs/common';
import { DisLock, LockService } from 'nestjs-dislock';

@Injectable()
export class PriceList {
  private readonly prices = new Map<string, number>(); // stands in for your database

  @DisLock({ key: 'prices:{0}', mode: 'read', waitTime: 2_000 })
  async quote(region: string): Promise<number> {
    return this.prices.get(region) ?? 0; // many quotes at once, across every instance
  }

  @DisLock({ key: 'prices:{0}', mode: 'write', waitTime: 10_000 })
  async reprice(region: string, price: number): Promise<void> {
    this.prices.set(region, price); // alone: no quote of this region runs meanwhile
  }
}

@Injectable()
export class Exports {
  @DisLock({ key: 'export', permits: 3, waitTime: 30_000 })
  async render(reportId: string): Promise<string> {
    return `reports/${reportId}.pdf`; // at most three renders at a time, cluster-wide
  }
}

@Injectable()
export class Transfers {
  private readonly balances = new Map<string, number>(); // stands in for your database

  constructor(private readonly locks: LockService) {}

  @DisLock({ key: ['account:{0}', 'account:{1}'], waitTime: 5_000 })
  async transfer(from: string, to: string, amount: number): Promise<void> {
    // both accounts are held, whichever order other callers name them in
    this.balances.set(from, (this.balances.get(from) ?? 0) - amount);
    this.balances.set(to, (this.balances.get(to) ?? 0) + amount);
  }

  async audit(a: string, b: string): Promise<number> {
    return this.locks.withLock([`account:${a}`, `account:${b}`], async (set) => {
      set.signal.throwIfAborted(); // aborts if either part is lost; set.locks are the parts
      return (this.balances.get(a) ?? 0) + (this.balances.get(b) ?? 0);
    });
  }
}
