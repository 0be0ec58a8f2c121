/**
 * Metadata key under which `@DisLock` stores its validated options (an array, one entry per
 * decorator, outermost last) on the method: `Reflect.getMetadata(DISLOCK_METADATA, proto.method)`.
 */
export const DISLOCK_METADATA = 'dislock:options';

/**
 * Property under which Nest injects the interceptor into classes with `@DisLock` methods (internal:
 * not exported from the package). When no `DisLockModule` is imported, Nest's startup error names
 * this property ("make sure that the "Symbol(...)" property is available"), so its description is
 * what a user who forgot the module needs to read.
 */
export const DISLOCK_INTERCEPTOR_PROPERTY = Symbol(
  '@DisLock needs DisLockModule: add DisLockModule.forRoot() or forRootAsync() to the imports of the root module',
);
