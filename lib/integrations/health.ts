import { Injectable } from '@nestjs/common';
import { withoutAddresses } from '../errors/without-addresses';
import { LockService } from '../service/lock.service';

/** What the health indicator reports under its key (the shape `@nestjs/terminus` reads). */
export interface DisLockHealth {
  readonly status: 'up' | 'down';
  /** The store's round trip for one lock script, in ms (absent when it did not answer). */
  readonly latencyMs?: number;
  /** How far behind lock renewal runs, in ms. */
  readonly renewalLagMs: number;
  /** Locks this application holds now. */
  readonly heldLocks: number;
  /** Why it is down: what failed and why (`Redis is unreachable (connection refused)`), never an address or a password. */
  readonly message?: string;
  /** What endangers locks although Redis answers (an eviction policy that may evict them); the status stays up. */
  readonly warnings?: readonly string[];
}

/** Options of `DisLockHealthIndicator.isHealthy`. */
export interface DisLockHealthOptions {
  /** Renewals running later than this (ms) count as down: leases may end before they are renewed. Default 1 000. */
  readonly maxRenewalLagMs?: number;
}

/**
 * A health indicator for `@nestjs/terminus` (an optional peer: this class needs nothing from it,
 * it answers in the shape Terminus reads): down when Redis does not answer, refuses the lock
 * scripts (an ACL without `+evalsha`/`+eval`, scripting disabled), or when renewals run late
 * (a blocked event loop or a slow Redis: locks may be lost).
 *
 * ```ts
 * @Get('health')
 * @HealthCheck()
 * check() {
 *   return this.health.check([() => this.dislock.isHealthy('locks')]);
 * }
 * ```
 */
@Injectable()
export class DisLockHealthIndicator {
  constructor(private readonly locks: LockService) {}

  async isHealthy(key = 'dislock', options: DisLockHealthOptions = {}): Promise<Record<string, DisLockHealth>> {
    const maxLag = options.maxRenewalLagMs ?? 1_000;
    const { store, renewalLagMs, heldLocks } = await this.locks.health();
    const problems: string[] = [];
    // The body may reach any HTTP client: a store of the application's own may name an address.
    if (!store.up) problems.push(withoutAddresses(store.problem));
    if (renewalLagMs > maxLag) {
      problems.push(`lock renewals run ${Math.round(renewalLagMs)} ms late (more than ${maxLag} ms)`);
    }
    return {
      [key]: {
        status: problems.length === 0 ? 'up' : 'down',
        ...(store.up && { latencyMs: Math.round(store.latencyMs * 100) / 100 }),
        renewalLagMs: Math.round(renewalLagMs),
        heldLocks,
        ...(problems.length > 0 && { message: problems.join('; ') }),
        ...(store.up && store.warnings && { warnings: store.warnings.map(withoutAddresses) }),
      },
    };
  }
}
