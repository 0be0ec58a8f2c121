import { type DynamicModule, Module } from '@nestjs/common';
import { DisLockModule } from '../module/dislock.module';
import type { DisLockModuleOptions } from '../options/dislock.options';
import type { MemoryLockStore } from '../store/memory/memory-lock.store';
import { DisLockTesting } from './dislock-testing';

/** Options of `DisLockTestingModule.forRoot`: the module's, without a Redis. */
export type DisLockTestingOptions = Omit<DisLockModuleOptions, 'redis' | 'redlock' | 'replicas' | 'store'> & {
  /** Share one store between several test applications (instances of a service); default: a fresh one. */
  store?: MemoryLockStore;
};

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
 */
@Module({})
export class DisLockTestingModule {
  static forRoot(options: DisLockTestingOptions = {}): DynamicModule {
    return {
      module: DisLockTestingModule,
      global: true,
      imports: [DisLockModule.forRoot({ ...options, store: options.store ?? 'memory' })],
      providers: [DisLockTesting],
      exports: [DisLockTesting],
    };
  }
}
