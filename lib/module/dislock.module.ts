import { type DynamicModule, Logger, Module } from '@nestjs/common';
import { guardFactoryInjection } from './async-options-guard';
import { DisLockInterceptor } from '../decorator/dislock.interceptor';
import { DISLOCK_RESOLVED_OPTIONS, DISLOCK_STORE, DISLOCK_TESTING_MODULE } from '../options/dislock.internal-constants';
import {
  DisLockConfigurableModule,
  DISLOCK_MODULE_OPTIONS,
  type DISLOCK_ASYNC_OPTIONS_TYPE,
  type DISLOCK_OPTIONS_TYPE,
} from './dislock.module-definition';
import type { RedisConnection, ResolvedModuleOptions } from '../options/dislock.options';
import { DisLockHealthIndicator } from '../integrations/health';
import { DisLockTelemetry } from '../integrations/opentelemetry';
import { LockService } from '../service/lock.service';
import { resolveModuleOptions } from '../options/options.validation';
import { connectRedis } from '../store/redis/redis-client';
import type { LockStore } from '../store/lock-store.interface';
import { MemoryLockStore } from '../store/memory/memory-lock.store';
import { RedisLockStore } from '../store/redis/redis-lock.store';
import { createRedlockStore } from '../store/redlock/redlock.store';
import { ReplicaAck } from '../store/redis/replica-ack';
import { refuseRedisInTest } from './testing-module-guard';
import { registerBuild, warnOfBothBuilds } from './package-builds';

function createStore(options: ResolvedModuleOptions, testingModule: true | undefined): LockStore {
  if (options.store === 'memory') return new MemoryLockStore();
  if (options.store) return options.store;
  refuseRedisInTest(testingModule === true);
  const logger = new Logger('DisLock');
  if (options.redlock) return createRedlockStore(options.redlock, options, logger);
  // resolveModuleOptions guarantees `redis` whenever `redlock` is absent.
  const { client, owned } = connectRedis(options.redis as RedisConnection, logger);
  const replicaAck = options.replicas && new ReplicaAck(options.replicas, logger);
  return new RedisLockStore(
    client,
    owned,
    options.operationTimeout,
    options.keyPrefix,
    replicaAck,
    options.whenDisconnected,
  );
}

/**
 * Distributed locks for a Nest application.
 *
 * ```ts
 * DisLockModule.forRoot({ redis: 'redis://localhost:6379' })
 * DisLockModule.forRootAsync({
 *   imports: [ConfigModule],
 *   inject: [ConfigService],
 *   useFactory: (config: ConfigService) => ({ redis: config.getOrThrow('REDIS_URL') }),
 * })
 * ```
 * Global by default (`isGlobal: false` to import it where needed). On shutdown, held locks are
 * released and a Redis client the module created is closed.
 */
@Module({
  providers: [
    { provide: DISLOCK_RESOLVED_OPTIONS, useFactory: resolveModuleOptions, inject: [DISLOCK_MODULE_OPTIONS] },
    {
      provide: DISLOCK_STORE,
      useFactory: createStore,
      inject: [DISLOCK_RESOLVED_OPTIONS, { token: DISLOCK_TESTING_MODULE, optional: true }],
    },
    LockService,
    DisLockInterceptor,
    DisLockTelemetry,
    DisLockHealthIndicator,
  ],
  // The store and the options also serve DisLockTestingModule's helper.
  exports: [LockService, DisLockInterceptor, DisLockHealthIndicator, DISLOCK_STORE, DISLOCK_RESOLVED_OPTIONS],
})
export class DisLockModule extends DisLockConfigurableModule {
  constructor() {
    super();
    // Nest builds the module when the application starts, once every file of it has loaded.
    warnOfBothBuilds();
  }

  /** Configure with options known up front; they are validated here, before the app starts. */
  static forRoot(options: typeof DISLOCK_OPTIONS_TYPE): DynamicModule {
    resolveModuleOptions(options);
    return super.forRoot(options);
  }

  /**
   * Configure from other providers (`useFactory`, `useClass` or `useExisting`); validated at startup.
   * An `inject` token that DisLockModule cannot see fails with an error that says which `imports` to add.
   */
  static forRootAsync(options: typeof DISLOCK_ASYNC_OPTIONS_TYPE): DynamicModule {
    return super.forRootAsync(guardFactoryInjection(options));
  }
}

registerBuild();
