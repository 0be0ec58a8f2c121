/** Provider token of the validated module options (`ResolvedModuleOptions`). */
export const DISLOCK_RESOLVED_OPTIONS = Symbol('DISLOCK_RESOLVED_OPTIONS');

/** Provider token of the `LockStore` the module's `LockService` uses. */
export const DISLOCK_STORE = Symbol('DISLOCK_STORE');

/**
 * Provider token that `DisLockTestingModule.forRoot()` provides (globally): a `DisLockModule` of the
 * same application that would connect to Redis finds it and stops, as the testing module was
 * meant to replace it.
 */
export const DISLOCK_TESTING_MODULE = Symbol('DISLOCK_TESTING_MODULE');
