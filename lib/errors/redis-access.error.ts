import { DisLockError } from './dislock.error';

/**
 * Redis refused something the library needs: an ACL without a command, the key prefix or the
 * release channels (`NOPERM`), or a server with scripting disabled. Thrown by the startup access
 * check, before any lock is taken, so that a missing permission shows at deployment rather than
 * as a 503 on the first lock.
 *
 * The message names what Redis refused and the ACL rule to grant. It never carries credentials:
 * Redis names commands, keys and channels, not passwords.
 */
export class RedisAccessError extends DisLockError {
  constructor(
    /** What was refused, as Redis named it: `command 'hset'`, `key "dislock:#probe:…"`, `channel "…"`, `scripting`. */
    readonly denied: readonly string[],
    /** The ACL rule that grants everything the library needs (`~prefix* &prefix* -@all +evalsha …`). */
    readonly aclRule: string,
    message: string,
    /** `cause`: the first refusal Redis answered. */
    options?: { cause?: unknown },
  ) {
    super(message, options);
  }
}
