export { DisLockModule } from './dislock.module';
export { DisLock } from './dislock.decorator';
export type {
  DisLockAsPlainMethodDecorator,
  DisLockDecorator,
  DisLockMethodMustReturnPromiseOrObservable,
  LockableMethodCheck,
} from './lockable-method';
export { LockService } from './lock.service';
export { DisLockExceptionFilter } from './dislock-exception.filter';
export type { LockHandle } from './lock-handle';
export type { LockLostEvent, LockLostHandler } from './lock-lost.event';
export { DISLOCK_METADATA } from './dislock.constants';
export { DISLOCK_MODULE_OPTIONS } from './dislock.module-definition';
export {
  DEFAULT_MODULE_OPTIONS,
  MAX_LOCK_NAME_LENGTH,
  UNSET_EXPIRE,
  type DisLockModuleOptions,
  type DisLockOptions,
  type LockKey,
  type LockOptions,
  type LockTimingOptions,
  type PerLockOptions,
  type RedisConnection,
} from './dislock.options';
export type { AcquireResult, LockStore, ReleaseResult } from './store/lock-store.interface';
export * from './errors';
