import { type DynamicModule, Module } from '@nestjs/common';
import { DisLockModule } from '../module/dislock.module';
import { trackTestingModule } from '../module/testing-module-guard';
import { DISLOCK_STORE, DISLOCK_TESTING_MODULE } from '../options/dislock.internal-constants';
import type { DisLockModuleOptions } from '../options/dislock.options';
import { MemoryLockStore } from '../store/memory/memory-lock.store';
import { DisLockTesting } from './dislock-testing';

/** Options of `DisLockTestingModule.forRoot`: the module's, without a Redis. */
export type DisLockTestingOptions = Omit<DisLockModuleOptions, 'redis' | 'redlock' | 'replicas' | 'store'> & {
  /** Share one store between several test applications (instances of a service); default: a fresh one. */
  store?: MemoryLockStore;
};

/** Options of `DisLockTestingModule.override`. */
export interface DisLockOverrideOptions {
  /** Share one store between several test applications (instances of a service); default: a fresh one. */
  store?: MemoryLockStore;
}

/**
 * What `DisLockTestingModule.override` needs of `@nestjs/testing`'s `TestingModuleBuilder` (which
 * `Test.createTestingModule(...)` returns): its `overrideProvider(token).useValue(value)`.
 */
export interface ProviderOverridingBuilder<B> {
  overrideProvider(token: symbol): { useValue(value: MemoryLockStore): B };
}

/**
 * `DisLockModule` on the in-memory store, plus the `DisLockTesting` helper, for an application's
 * own unit tests: `@DisLock` and `LockService` behave as on Redis, with no Redis.
 *
 * ```ts
 * const moduleRef = await Test.createTestingModule({
 *   imports: [DisLockTestingModule.forRoot()],
 *   providers: [OrdersService],
 * }).compile();
 * moduleRef.get(DisLockTesting).occupy('order:42'); // the next payment of order 42 gets a 409
 * ```
 *
 * For a test of the whole application (its own `AppModule`, which imports `DisLockModule`), see
 * `DisLockTestingModule.override`.
 */
@Module({})
export class DisLockTestingModule {
  static forRoot(options: DisLockTestingOptions = {}): DynamicModule {
    return trackTestingModule({
      module: DisLockTestingModule,
      global: true,
      imports: [DisLockModule.forRoot({ ...options, store: options.store ?? 'memory' })],
      providers: [DisLockTesting, { provide: DISLOCK_TESTING_MODULE, useValue: true }],
      exports: [DisLockTesting, DISLOCK_TESTING_MODULE],
    });
  }

  /**
   * Puts every `DisLockModule` of the application under test on an in-memory store, whatever its
   * options say (`redis`, `redlock`, from `forRoot` or `forRootAsync`); its other options
   * (`keyPrefix`, leases, hooks) stay. No Redis connection is made. Returns the builder, to chain on.
   *
   * ```ts
   * const moduleRef = await DisLockTestingModule.override(
   *   Test.createTestingModule({ imports: [AppModule], providers: [DisLockTesting] }),
   * ).compile();
   * ```
   *
   * `providers: [DisLockTesting]` is needed only to drive the locks (`occupy`, `holders`), and
   * needs the app's `DisLockModule` global (the default). `.overrideModule(DisLockModule)` cannot
   * do this: Nest matches an override by the very object imported, and `DisLockModule.forRoot()`
   * returns a new one per call.
   */
  static override<B extends ProviderOverridingBuilder<B>>(builder: B, options: DisLockOverrideOptions = {}): B {
    return builder.overrideProvider(DISLOCK_STORE).useValue(options.store ?? new MemoryLockStore());
  }
}
