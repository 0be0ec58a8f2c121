import { DisLockError } from './dislock.error';

/**
 * A `@DisLock` method ran on an instance that Nest's dependency injection did not build (created
 * with `new`, `useValue` or `useFactory`), so the lock service never reached it. Thrown instead of
 * silently running the method without a lock.
 */
export class DisLockSetupError extends DisLockError {}
