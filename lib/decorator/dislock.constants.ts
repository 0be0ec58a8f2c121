/**
 * Metadata key under which `@DisLock` stores its validated options (an array, one entry per
 * decorator, outermost last) on the method: `Reflect.getMetadata(DISLOCK_METADATA, proto.method)`.
 */
export const DISLOCK_METADATA = 'dislock:options';

/**
 * Property under which Nest injects the interceptor into classes with `@DisLock` methods (internal:
 * not exported from the package).
 */
export const DISLOCK_INTERCEPTOR_PROPERTY = Symbol('dislock:interceptor');
