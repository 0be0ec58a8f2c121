import type { LockLostError, LockLostReason } from '../errors';

/** What `onLockLost` receives when a held lock stops being safe to rely on. */
export interface LockLostEvent {
  /** The lock name, without the key prefix. */
  readonly name: string;
  /** The Redis key. */
  readonly key: string;
  /** The owner id that held it. */
  readonly owner: string;
  /** The fencing token of the lost acquisition: a fenced resource should now refuse it. */
  readonly fencingToken: number;
  /** Why: `not-owner`, `lease-expired`, `expired`, `max-renewals` or `shutdown`. */
  readonly reason: LockLostReason;
  /** The error the handle's `signal` was aborted with (`signal.reason`). */
  readonly error: LockLostError;
}

/**
 * Called once per lost acquisition, from a timer or a release: it must not rely on being awaited.
 * What it throws, or a Promise it returns that rejects, is logged and goes no further.
 */
export type LockLostHandler = (event: LockLostEvent) => void | Promise<void>;
