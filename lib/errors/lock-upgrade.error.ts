import { DisLockError } from './dislock.error';

/**
 * A call chain that holds a shared hold of a lock (its read lock, or a semaphore's permit) asked
 * for the same lock exclusively (the write lock, or a plain lock of the name). It would wait for
 * its own hold forever, so it fails at once. Take the write lock first: a writer may take the
 * read lock inside it.
 */
export class LockUpgradeError extends DisLockError {
  constructor(
    /** The lock name (without the key prefix). */
    readonly lockName: string,
    /** What the call chain holds: `'read'` or `'permit'`. */
    readonly held: 'read' | 'permit',
  ) {
    super(
      held === 'read'
        ? `Lock "${lockName}" is held for reading by this call chain, which cannot take it for writing: it would wait for its own read lock. Take the write lock first (a writer may take the read lock inside it)`
        : `Lock "${lockName}" is held as a semaphore permit by this call chain, which cannot take it exclusively: it would wait for its own permit`,
    );
  }
}
