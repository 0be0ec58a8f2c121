import type { ReleaseWatch } from './release-subscriber';

export type { ReleaseWatch };

/** Outcome of one acquire attempt. */
export type AcquireResult =
  /**
   * Taken (or re-entered): `count` is the owner's hold count after this call. `token` is the
   * fencing token issued to a fresh acquisition (absent on re-entry: the holder keeps its own).
   */
  | { readonly acquired: true; readonly count: number; readonly token?: number }
  /**
   * Held by another owner, or (re-entering) this owner's hold is gone: `ttl` is the key's
   * remaining lease in ms (-1 when the key has none, -2 when there is no key).
   */
  | { readonly acquired: false; readonly ttl: number };

/** One lock to renew: its key, the owner expected in it and the lease to reset it to. */
export interface RenewRequest {
  readonly key: string;
  readonly owner: string;
  readonly leaseMs: number;
}

/** Outcome of one renewal: `true` renewed, `false` not the owner (nothing changed), or why it could not be asked. */
export type RenewOutcome = boolean | { readonly error: unknown };

/** Outcome of one release call. */
export type ReleaseResult =
  /** The key is gone: this call freed the lock. */
  | 'released'
  /** The key is gone, and waiters elsewhere (other processes) were told: they are about to try. */
  | 'released-contended'
  /** The owner's hold count went down but is still above zero (a reentrant hold remains). */
  | 'decremented'
  /** The caller does not own the lock (any more); nothing was changed. */
  | 'not-owner';

/**
 * The narrow seam between the lock logic and a backend. Every method is atomic on the backend
 * and owner-checked; the lock for `key` is a hash `{ [owner]: holdCount }` whose TTL is the lease.
 *
 * Single-instance Redis implements it today; Cluster, Sentinel, Redlock and an in-memory store
 * for unit tests slot in beside it.
 */
export interface LockStore {
  /**
   * Take the free lock for a new `owner` with a lease of `leaseMs` and issue a fencing token that
   * is larger than every token issued for `key` before; or, with `reenter`, count up the hold that
   * `owner` already has (the lease is left alone, and a missing hold is not created).
   */
  acquire(key: string, owner: string, leaseMs: number, reenter?: boolean): Promise<AcquireResult>;
  /**
   * Reset the lease of each lock whose owner still holds it, in as few round trips as the backend
   * allows. One outcome per request, in order; never rejects (a failed call gives its requests an
   * `{ error }` outcome).
   */
  renew(requests: readonly RenewRequest[]): Promise<RenewOutcome[]>;
  /** Drop one hold of `owner` (`force`: all of them). Never touches a lock of another owner. */
  release(key: string, owner: string, force?: boolean): Promise<ReleaseResult>;
  /**
   * Listen for releases of `key` (by any process). Resolves once listening, or once that failed
   * (`listening: false`); never rejects. Call before the retry that follows a failed attempt, so
   * that a release in between is not missed.
   */
  watch(key: string): Promise<ReleaseWatch>;
  /** Close what the store opened itself; a client handed in by the application stays open. */
  close(): Promise<void>;
}
