import { Inject, Injectable } from '@nestjs/common';
import { DisLockSetupError } from '../errors';
import { DISLOCK_RESOLVED_OPTIONS, DISLOCK_STORE } from '../options/dislock.internal-constants';
import type { ResolvedModuleOptions } from '../options/dislock.options';
import { LockService } from '../service/lock.service';
import type { LockStore } from '../store/lock-store.interface';
import { MemoryLockStore } from '../store/memory/memory-lock.store';

/** One hold of a lock, as `DisLockTesting.holders` reports it. */
export interface TestHolder {
  readonly owner: string;
  /** A plain lock or a writer (`true`), or a reader or permit (`false`). */
  readonly exclusive: boolean;
  /** ms left of its lease (Infinity: held until freed). */
  readonly ttl: number;
}

/**
 * Drives the locks of an application under test, on the in-memory store (`DisLockTestingModule`):
 * make a lock busy to test a 409 or an `onBusy: 'skip'` path, or make a held lock lost to test
 * the code that watches `signal`. Names are lock names, without the module's `keyPrefix`.
 */
@Injectable()
export class DisLockTesting {
  private readonly store: MemoryLockStore;

  constructor(
    @Inject(DISLOCK_STORE) store: LockStore,
    @Inject(DISLOCK_RESOLVED_OPTIONS) private readonly options: ResolvedModuleOptions,
    private readonly locks: LockService,
  ) {
    if (!(store instanceof MemoryLockStore)) {
      throw new DisLockSetupError(
        'DisLockTesting works on the in-memory store: import DisLockTestingModule.forRoot() (or DisLockModule.forRoot({ store: "memory" })) in the test module, ' +
          'or, to test an AppModule that imports DisLockModule, put it on that store with ' +
          '`DisLockTestingModule.override(Test.createTestingModule({ imports: [AppModule], providers: [DisLockTesting] }))`',
      );
    }
    this.store = store;
  }

  /**
   * Hold `name` as another owner would, for `ms` (default: until `free(name)`): every acquisition
   * of it is busy meanwhile (409 from a controller, `null` from `tryLock`, a skipped job).
   */
  occupy(name: string, ms?: number): void {
    this.store.occupy(this.key(name), ms);
  }

  /** The next `times` acquisition attempts of `name` (default 1) find it busy, whoever holds it. */
  refuseNext(name: string, times = 1): void {
    this.store.refuseNext(this.key(name), times);
  }

  /** Drop every hold of `name`, also one made by `occupy`; waiters are woken. */
  free(name: string): void {
    this.store.free(this.key(name));
  }

  /**
   * Make `name` lost to this application now, as when its lease ran out and someone else took it:
   * its holds are dropped from the store, and each handle of it here has its `signal` aborted with
   * a `LockLostError` (reason `'not-owner'`) and `onLockLost` called. How many held locks were lost.
   */
  loseLock(name: string): number {
    this.store.free(this.key(name));
    return this.locks.loseHeld(name, 'made lost by DisLockTesting.loseLock');
  }

  /** Who holds `name` now. */
  holders(name: string): TestHolder[] {
    return this.store.holders(this.key(name));
  }

  private key(name: string): string {
    return this.options.keyPrefix + name;
  }
}
