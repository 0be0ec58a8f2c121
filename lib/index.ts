export { DisLockModule } from './module/dislock.module';
export { DisLock } from './decorator/dislock.decorator';
export type {
  DisLockAsPlainMethodDecorator,
  DisLockDecorator,
  DisLockMethodMustReturnPromiseOrObservable,
  LockableMethodCheck,
} from './decorator/lockable-method';
export { LockService } from './service/lock.service';
export type { LockHolder, LockInspection } from './service/inspection';
export { DisLockExceptionFilter } from './decorator/dislock-exception.filter';
export { DisLockHealthIndicator, type DisLockHealth, type DisLockHealthOptions } from './integrations/health';
export type { LockHandle } from './core/lock-handle';
export type { LockSetHandle } from './core/lock-set';
export type { LockLostEvent, LockLostHandler } from './events/lock-lost.event';
export type {
  LockEvent,
  LockEventListener,
  LockEventPayloads,
  LockEventType,
  LockHoldKind,
} from './events/lock-events';
export { DISLOCK_METADATA } from './decorator/dislock.constants';
export { DISLOCK_MODULE_OPTIONS } from './module/dislock.module-definition';
export {
  DEFAULT_MODULE_OPTIONS,
  MAX_LOCK_NAME_LENGTH,
  UNSET_EXPIRE,
  type DisLockModuleOptions,
  type DisLockOptions,
  type LockKey,
  type LockMode,
  type LockOptions,
  type LockTimingOptions,
  type PerLockOptions,
  type RedisConnection,
} from './options/dislock.options';
export { MIN_LEASE_MS } from './options/lease-margin';
export type { AcquireResult, LockStore, ReleaseResult } from './store/lock-store.interface';
export { MemoryLockStore } from './store/memory/memory-lock.store';
export {
  DisLockTestingModule,
  type DisLockOverrideOptions,
  type DisLockTestingOptions,
  type ProviderOverridingBuilder,
} from './testing/dislock-testing.module';
export { DisLockTesting, type TestHolder } from './testing/dislock-testing';
export { dislockAclRule } from './store/redis/acl.rule';
export * from './errors';
