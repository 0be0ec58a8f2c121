import { RedisUnavailableError } from './redis-unavailable.error';

/**
 * The Redis key a lock lives in (or the fencing counter of its slot) holds a value of another
 * type than this library writes there: another program uses that name. No wait would ever see it
 * released, so the acquisition fails at once instead of reading the lock as busy. Rename
 * (another `keyPrefix` for this module), or delete the key if it is stale.
 *
 * A `RedisUnavailableError` (answered 503, handled as a store failure): the lock cannot be taken
 * until someone fixes the data in Redis.
 */
export class LockKeyConflictError extends RedisUnavailableError {
  constructor(
    operation: string,
    lockName: string,
    /** The key that holds another type, as Redis names it (with the module's `keyPrefix`). */
    readonly key: string,
    /** The type Redis reported for it (`string`, `list`...), when known. */
    readonly keyType: string | undefined,
    /** `cause`: Redis's error reply. */
    options?: { cause?: unknown },
  ) {
    super(
      operation,
      lockName,
      `Could not ${operation} lock "${lockName}": the Redis key "${key}" holds ` +
        `${keyType ? `a ${keyType}` : 'another type'}, not a lock of nestjs-dislock: another program uses that ` +
        'name. Give DisLockModule another keyPrefix, or delete the key if it is stale',
      options,
    );
  }
}
