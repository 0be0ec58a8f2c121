import { DisLockError } from './dislock.error';

/** Why a held lock stopped being safe to rely on. */
export type LockLostReason =
  /** A renewal found the lock owned by someone else, or gone. */
  | 'not-owner'
  /** Redis could not be reached to renew, and the lease ran out. */
  | 'lease-expired'
  /** The lock had a fixed `expire` and it ran out while the holder still held it. */
  | 'expired'
  /** Renewal stopped at `maxRenewTimes` and the last lease ran out. */
  | 'max-renewals'
  /** The application shut down while the lock was held. */
  | 'shutdown';

/**
 * The reason an `AbortSignal` of a `LockHandle` carries when the lock is lost. Code that
 * checks `handle.signal.aborted` or listens for `abort` can read `signal.reason.reason`.
 */
export class LockLostError extends DisLockError {
  constructor(
    readonly lockName: string,
    readonly reason: LockLostReason,
    message: string,
    options?: { cause?: unknown },
  ) {
    super(message, options);
  }
}
