import { DisLockError } from './dislock.error';

/** An option passed to `@DisLock`, `LockService` or `DisLockModule` is invalid. */
export class InvalidLockOptionsError extends DisLockError {
  constructor(
    /** The option at fault, e.g. `expire` or `key`. */
    readonly option: string,
    message: string,
  ) {
    super(message);
  }
}
