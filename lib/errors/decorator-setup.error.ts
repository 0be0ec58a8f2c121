import { DisLockError } from './dislock.error';

/**
 * The library is wired up in a way that cannot lock as meant, thrown instead of going on silently:
 * a `@DisLock` method ran on an instance that Nest's dependency injection did not build (created
 * with `new`, `useValue` or `useFactory`), so the lock service never reached it; or, in a test, an
 * application meant to run on the in-memory store would lock on Redis (`DisLockTestingModule`
 * imported beside a `DisLockModule`, or handed to an `overrideModule` that Nest ignores), or
 * `DisLockTesting` was asked for on a module that is not on the in-memory store.
 */
export class DisLockSetupError extends DisLockError {}
