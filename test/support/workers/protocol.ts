/**
 * What worker processes and their parent say to each other over the IPC channel, and the
 * child-side plumbing every worker shares (configuration, messages, a bounded lifetime).
 *
 * A worker is started as `node -r ./test/support/ts-register.js test/support/workers/<name>.ts '<json>'`
 * with an IPC channel (see worker-process.ts). Its configuration is the JSON argument.
 */

import type { HistoryEvent } from '../history/history';

/** A lease as `@DisLock` takes it: a fixed `expire`, or a watchdog lease (`lockWatchdogTimeout`). */
export type Lease = { expire: number } | { lockWatchdogTimeout: number };

/** Configuration of counter.worker.ts. */
export interface CounterWorkerConfig {
  redis: string;
  keyPrefix: string;
  iterations: number;
  /** `waitTime` of the locked method; with `0` the worker retries after each LockNotAcquiredError. */
  waitTime: number;
  lease: Lease;
  /** `false`: the same read-sleep-write without `@DisLock` (the control run: it must lose updates). */
  locked: boolean;
  /** The worker exits with code 3 if it is still running after this many ms. */
  deadlineMs: number;
}

/** Configuration of holder.worker.ts. */
export interface HolderWorkerConfig {
  redis: string;
  keyPrefix: string;
  name: string;
  lease: Lease;
  deadlineMs: number;
}

/**
 * Configuration of cron-job.worker.ts: a job that the process schedules every `periodMs` on a
 * clock that runs `skewMs` ahead of the real one (behind when negative), under
 * `@DisLock({ key: 'job', onBusy: 'skip', lockAtLeastFor, expire })`.
 */
export interface CronWorkerConfig {
  redis: string;
  keyPrefix: string;
  instance: string;
  periodMs: number;
  skewMs: number;
  jobMs: number;
  lockAtLeastFor: number;
  expire: number;
  deadlineMs: number;
}

/** What one counter worker did, sent when it is done. */
export interface CounterReport {
  /** Increments written (must equal `iterations`). */
  increments: number;
  /**
   * Calls that rejected with LockNotAcquiredError and were tried again: the lock was busy
   * (waitTime 0), or stayed busy for all of waitTime (the wait ran out).
   */
  conflicts: number;
  /** Critical sections whose lock signal had aborted by the time they ended. */
  lost: number;
  /** Critical sections that found the lock hash holding something other than `{ [owner]: '1' }`. */
  foreign: number;
  /** Largest holders count this worker saw on entering the critical section. */
  maxHolders: number;
  /** Longest successful call of the locked method, waiting included. */
  maxCallMs: number;
  /** From 'go' to the last increment. */
  ms: number;
}

export type ChildMessage =
  | { type: 'ready' }
  | { type: 'done'; report: CounterReport }
  | { type: 'locked'; key: string; owner: string }
  | { type: 'failed'; error: string }
  | { type: 'history'; events: HistoryEvent[] }
  | { type: 'history-done'; events: HistoryEvent[] };

export type ParentMessage = { type: 'go' } | { type: 'release' } | { type: 'stop' };

/** Redis keys of the counter experiment, next to the lock `counter` under the same prefix. */
export function counterKeys(keyPrefix: string) {
  return {
    lock: `${keyPrefix}counter`,
    counter: `${keyPrefix}data:counter`,
    holders: `${keyPrefix}data:holders`,
    maxHolders: `${keyPrefix}data:max-holders`,
    callers: `${keyPrefix}data:callers`,
    maxCallers: `${keyPrefix}data:max-callers`,
  };
}

/**
 * INCR a gauge (KEYS[1]) and raise its high-water mark (KEYS[2]) in one step; returns the new
 * value. Atomic in Redis, so the mark sees every overlap, whichever processes cause it.
 */
export const ENTER_GAUGE_SCRIPT = `
local n = redis.call('incr', KEYS[1])
local max = tonumber(redis.call('get', KEYS[2]) or '0')
if n > max then redis.call('set', KEYS[2], n) end
return n
`;

// ---- child side ----------------------------------------------------------------------------

/** The worker's configuration: its JSON argument. */
export function workerConfig<T>(): T {
  const json = process.argv[2];
  if (!json) throw new Error(`${process.argv[1]}: expected the configuration as a JSON argument`);
  return JSON.parse(json) as T;
}

/** Send a message to the parent; resolves once it is handed to the channel. */
export function toParent(message: ChildMessage): Promise<void> {
  return new Promise((resolve, reject) => {
    if (!process.send) return reject(new Error('not started with an IPC channel'));
    process.send(message, undefined, {}, (error) => (error ? reject(error) : resolve()));
  });
}

/** The next message of type `type` from the parent. */
export function fromParent<T extends ParentMessage['type']>(type: T): Promise<Extract<ParentMessage, { type: T }>> {
  return new Promise((resolve) => {
    const onMessage = (message: ParentMessage): void => {
      if (message?.type !== type) return;
      process.off('message', onMessage);
      resolve(message as Extract<ParentMessage, { type: T }>);
    };
    process.on('message', onMessage);
  });
}

/**
 * Keep the worker's lifetime bounded: exit(3) after `deadlineMs`, exit(5) as soon as the parent
 * goes away. Call `finish()` once the worker has cleaned up: it drops the IPC channel so the process
 * can end on its own, and exits with code 4 if something (an open handle) still keeps it alive a
 * second later. No timer here keeps the process alive by itself.
 */
export function boundLifetime(deadlineMs: number): { finish(): void } {
  const deadline = setTimeout(() => {
    console.error(`worker ${process.pid}: still running after ${deadlineMs} ms, exiting`);
    process.exit(3);
  }, deadlineMs);
  deadline.unref();
  const orphaned = (): void => process.exit(5);
  process.once('disconnect', orphaned);
  return {
    finish() {
      clearTimeout(deadline);
      process.off('disconnect', orphaned);
      if (process.connected) process.disconnect();
      setTimeout(() => {
        console.error(`worker ${process.pid}: an open handle keeps the process alive after cleanup`);
        process.exit(4);
      }, 1_000).unref();
    },
  };
}

/** Run a worker's main function; report a failure to the parent and exit non-zero. */
export function runWorker(main: () => Promise<void>): void {
  main().catch(async (error: unknown) => {
    const text = error instanceof Error ? (error.stack ?? error.message) : String(error);
    console.error(text);
    await toParent({ type: 'failed', error: text }).catch(() => undefined);
    process.exit(1);
  });
}
