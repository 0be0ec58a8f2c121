/** Provider token of the validated module options (`ResolvedModuleOptions`). */
export const DISLOCK_RESOLVED_OPTIONS = Symbol('DISLOCK_RESOLVED_OPTIONS');

/** Provider token of the `LockStore` the module's `LockService` uses. */
export const DISLOCK_STORE = Symbol('DISLOCK_STORE');
