/**
 * What fair-line.worker.ts and test/fair-line.e2e-spec.ts say to each other over IPC, and the
 * worker's keys on the data Redis. (A module of its own: importing the worker would run it.)
 *
 * A worker process serves several tests in turn: 'init' starts a Nest app with DisLockModule on
 * the given Redis and key prefix (the test's), 'reset' closes it again.
 */

/** The worker's command-line configuration: what stays the same across tests. */
export interface FairLineWorkerConfig {
  /** Where the holders gauge and the churn counter live (never stopped by the tests). */
  data: string;
  deadlineMs: number;
}

/** One test's setup of a worker. */
export interface FairLineInit {
  /** The lock Redis. */
  redis: string;
  keyPrefix: string;
  /** The lock's name. */
  name: string;
}

/** Keys on the data Redis, under the worker's key prefix. */
export function fairDataKeys(keyPrefix: string) {
  return {
    holders: `${keyPrefix}data:holders`,
    maxHolders: `${keyPrefix}data:max-holders`,
    counter: `${keyPrefix}data:counter`,
    /** A list of `<pid>:<id>` entries, one per critical section, in the order they were entered. */
    history: `${keyPrefix}data:history`,
  };
}

export type FairParentMessage =
  | ({ type: 'init' } & FairLineInit)
  /** Close the app (ending whatever it still does) and answer 'reset-done'. */
  | { type: 'reset' }
  /**
   * Wait for the lock: `lock()` with `waitTime` (or `withLock`), hold it for `holdMs` (or until
   * 'release' when omitted). `retryOnError`: a rejection other than "not acquired" is retried until
   * `waitTime` has passed since the first call.
   */
  | {
      type: 'lock';
      id: string;
      waitTime: number;
      expire: number;
      holdMs?: number;
      via?: 'lock' | 'withLock';
      retryOnError?: boolean;
    }
  | { type: 'release'; id: string }
  | { type: 'abort'; id: string }
  /** One `tryLock` with waitTime 0; a lock it gets is released at once. */
  | { type: 'try'; id: string }
  /** `tryLock` with waitTime 0 every `everyMs` until 'stop-spin'; each lock got is held 1 ms. */
  | { type: 'spin'; id: string; everyMs: number }
  | { type: 'stop-spin'; id: string }
  /** `loops` concurrent loops calling a `@DisLock` method (1 ms non-atomic increment) for `durationMs`. */
  | { type: 'churn'; loops: number; durationMs: number };

export type FairChildMessage =
  | { type: 'ready'; pid: number }
  | { type: 'waiting'; id: string; at: number }
  | { type: 'granted'; id: string; at: number; owner: string; token: number; holders: number; errors: number }
  | { type: 'released'; id: string; at: number; ok: boolean }
  | { type: 'gave-up'; id: string; at: number; how: 'null' | 'aborted' | 'not-acquired' | 'error'; error?: string }
  | { type: 'tried'; id: string; at: number; got: boolean }
  | { type: 'spun'; id: string; attempts: number; got: { at: number; releasedAt: number }[] }
  | { type: 'churned'; acquired: number; conflicts: number; errors: string[]; maxHolders: number }
  | { type: 'reset-done' }
  | { type: 'failed'; error: string };
