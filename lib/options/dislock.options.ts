import type { Cluster, Redis, RedisOptions } from 'ioredis';
import type { LockLostHandler } from '../events/lock-lost.event';
import type { LockEventSubject, LockHoldKind } from '../events/lock-events';
import type { LockStore } from '../store/lock-store.interface';

/** A key template over the method's arguments (`'order:{0}'`, `'user:{0.id}'`) or a function of them. */
export type LockKey = string | ((...args: never[]) => string);

/** Timing options shared by `@DisLock`, `LockService` and the module-wide defaults. */
export interface LockTimingOptions {
  /**
   * Fixed lease in ms. When set (> 0) the lock expires after this long and is never renewed: the
   * longest a holder can keep it (ShedLock's `lockAtMostFor`). Default `-1`: unset, the watchdog
   * keeps the lock alive instead.
   */
  expire?: number;
  /** Lease in ms that the watchdog keeps resetting every `lockWatchdogTimeout / 3`. Default 30 000. */
  lockWatchdogTimeout?: number;
  /** Renewals at most; `<= 0` means no limit. Default 360 (360 x 10 s = 1 h). */
  maxRenewTimes?: number;
  /** ms to keep trying while another owner holds the lock; `0` fails at once. Default 0. */
  waitTime?: number;
}

/** What one acquisition can add to the timing: a minimum hold and a hook of its own for a lost lock. */
export interface PerLockOptions extends LockTimingOptions {
  /**
   * ms the lock stays taken after it was acquired, even when the hold ends sooner: the key is not
   * deleted but left to expire that long after acquisition (its lease is set to the time left), so
   * that an instance whose clock or scheduler runs a little late cannot run the same scheduled
   * tick again. A hold that ends later is released as usual. At most `expire` when that is set.
   * Only the outermost acquisition's value counts (a reentrant one shares its hold). Default: none.
   */
  lockAtLeastFor?: number;
  /**
   * Called when this lock is lost while held (besides the module's `onLockLost`, if any). Setting
   * either replaces the default warning.
   */
  onLockLost?: LockLostHandler;
  /**
   * A read-write lock: `'read'` is shared with every other reader, `'write'` excludes everyone (it
   * is the same hold as a plain lock of the name). Waiters are served in arrival order across
   * processes, so a writer is never starved by readers that come after it. A call chain holding
   * the write lock may take the read lock (it re-enters); one holding only the read lock cannot
   * take the write lock (`LockUpgradeError`, at once). Default: `'write'`.
   */
  mode?: LockMode;
  /**
   * A semaphore: at most `permits` holders of the name at once, across processes, each with its
   * own lease and renewal. An acquisition is admitted while fewer holders than its own `permits`
   * hold: lowering it for a name admits nobody new until enough holders have gone, raising it
   * admits more at once. Not with `mode`, nor over Redlock.
   */
  permits?: number;
  /**
   * A name for this kind of lock in metrics, spans and events, where the lock name itself would
   * have too many values (`'order'` for `order:{0}`). `@DisLock` uses its key template (or
   * `Class.method` for a key function) when unset; `LockService` calls have none unless given.
   */
  label?: string;
}

/** `'read'`: shared with other readers; `'write'`: exclusive. */
export type LockMode = 'read' | 'write';

/** Options of `LockService.tryLock`, `lock` and `withLock`. */
export interface LockOptions extends PerLockOptions {
  /**
   * Cancels a wait for a busy lock: `tryLock` then resolves `null`, `lock` and `withLock` reject
   * with `signal.reason`. An already aborted signal fails at once, without asking Redis. It has
   * no effect once the lock is held.
   */
  signal?: AbortSignal;
}

/** Options of `@DisLock`. */
export interface DisLockOptions extends PerLockOptions {
  /**
   * Lock name: a template over the method's own arguments, or a function of them. Required. An
   * array locks every name it resolves to, all or nothing (a multi-lock; exclusive holds only).
   */
  key: LockKey | readonly LockKey[];
  /**
   * On finish, `true` (default) releases the lock; `false` stops renewal and leaves the key to
   * expire on its own (useful to keep a job from running again within the lease).
   */
  ifExpireWhenFinish?: boolean;
  /**
   * When the lock is busy (still, after `waitTime`): `'throw'` (default) rejects with
   * `LockNotAcquiredError`; `'skip'` does not run the method, resolves the call with `undefined`
   * (an Observable completes without a value) and logs at debug level: for a scheduled job that
   * another instance is already running. Redis failures reject either way.
   */
  onBusy?: 'throw' | 'skip';
}

/**
 * What `DisLockModule.forRoot` accepts as `redis`: an ioredis client, `RedisOptions`, a `redis://` /
 * `rediss://` URL, or a URL with the `RedisOptions` it cannot carry (`tls: { ca, cert, key }`,
 * timeouts), as `{ url: 'rediss://user:pass@host:6380', tls: { ca } }`; what the URL names wins.
 */
export type RedisConnection = Redis | Cluster | RedisOptions | string | (RedisOptions & { url: string });

/** One independent Redis master of a Redlock set: a client, options or a URL (not a Cluster). */
export type RedlockNode = Redis | RedisOptions | string | (RedisOptions & { url: string });

/** Locks held by a majority of independent Redis masters (the Redlock algorithm). */
export interface RedlockOptions {
  /** The masters, at least 3 (an odd number tolerates the most failures per node). */
  nodes: readonly RedlockNode[];
  /**
   * Clock drift allowed between this process and the nodes, as a fraction of the lease (plus 2 ms):
   * a lock counts as held for `lease - elapsed - drift`. Default 0.01.
   */
  driftFactor?: number;
}

/**
 * Replica acknowledgement: an acquisition counts only once `WAIT` reports that `min` replicas have
 * it, so that a failover right after it cannot hand the lock to a second holder.
 */
export interface ReplicaAckOptions {
  /** Replicas that must have the lock before the acquisition counts (>= 1). */
  min: number;
  /** ms to wait for them (>= 1). */
  timeout: number;
  /**
   * Fewer replicas confirmed in time: `'throw'` (default) gives the lock back and rejects with
   * `ReplicationNotConfirmedError`; `'warn'` keeps the lock and logs a warning.
   */
  onShortfall?: 'throw' | 'warn';
}

export interface DisLockModuleOptions {
  /**
   * An ioredis `Redis` or `Cluster` instance (the application keeps ownership and closes it), or
   * `RedisOptions` / a `redis://` URL (the module creates the client and closes it on shutdown).
   * Set exactly one of `redis`, `redlock` and `store`.
   */
  redis?: RedisConnection;
  /**
   * Where locks are kept, instead of `redis` or `redlock`: `'memory'` for an in-process store of
   * this application's own (for its unit tests: no Redis needed, fake timers welcome), or a
   * `LockStore` instance: a `MemoryLockStore` shared by several test applications (they then
   * lock against each other, as instances sharing a Redis do), or a store of your own.
   */
  store?: 'memory' | LockStore;
  /** Redlock over independent masters, instead of `redis`. */
  redlock?: RedlockOptions;
  /** Wait for replicas to confirm each acquisition (with `redis` only). Default: off. */
  replicas?: ReplicaAckOptions;
  /** Prepended to every lock name to form the Redis key. Default `'dislock:'`. */
  keyPrefix?: string;
  /** Default `lockWatchdogTimeout` for every lock of this module. */
  lockWatchdogTimeout?: number;
  /** Default `maxRenewTimes` for every lock of this module. */
  maxRenewTimes?: number;
  /** Default `waitTime` for every lock of this module. */
  waitTime?: number;
  /**
   * Upper bound in ms on any single Redis round trip of a lock operation. Past it the operation
   * fails with `RedisUnavailableError` instead of waiting for a reconnect. Default 5 000.
   */
  operationTimeout?: number;
  /**
   * What a lock operation does while the Redis client is known to be cut off (not connected, and a
   * connection attempt has failed since it last was: a refused connection, a wrong password, every
   * Cluster node unreachable). `'fail'` (default): it fails at once with `RedisUnavailableError`
   * ("Redis is unreachable"), sending nothing; shutdown and the startup check do not wait either.
   * `'wait'`: it waits in the client's offline queue for a reconnection, up to `operationTimeout`.
   * An operation already sent when the connection drops waits for its answer either way.
   */
  whenDisconnected?: 'fail' | 'wait';
  /**
   * Called whenever a lock of this module is lost while held: a renewal or release found it gone
   * or taken, its lease ran out (Redis unreachable, fixed `expire`, `maxRenewTimes`), or the
   * application shut down. Default: a warning through Nest's `Logger`.
   */
  onLockLost?: LockLostHandler;
  /**
   * OpenTelemetry metrics and spans, through `@opentelemetry/api` when the application has it
   * installed (an optional peer; the SDK it registers decides where they go). `false` turns them
   * off; `{ lockNames: true }` labels them with each resolved lock name instead of its `label`
   * (mind the cardinality). Default: on when the API is installed.
   */
  telemetry?: boolean | { lockNames?: boolean };
  /**
   * This application's name, recorded with every lock it takes (with the host and pid) so that
   * `inspect` says who holds a lock. Default: none.
   */
  appName?: string;
}

/** Module options after defaults are applied and values validated. */
export interface ResolvedModuleOptions {
  /** Set unless `redlock` or `store` is. */
  readonly redis: RedisConnection | undefined;
  readonly store: 'memory' | LockStore | undefined;
  readonly redlock: Required<RedlockOptions> | undefined;
  readonly replicas: Required<ReplicaAckOptions> | undefined;
  readonly keyPrefix: string;
  readonly lockWatchdogTimeout: number;
  readonly maxRenewTimes: number;
  readonly waitTime: number;
  readonly operationTimeout: number;
  readonly whenDisconnected: 'fail' | 'wait';
  readonly onLockLost: LockLostHandler | undefined;
  readonly telemetry: { readonly enabled: boolean; readonly lockNames: boolean };
  readonly appName: string | undefined;
}

/** Timing of one acquisition, every default applied. `expire === -1` means the watchdog renews. */
export interface ResolvedLockOptions {
  readonly expire: number;
  readonly lockWatchdogTimeout: number;
  readonly maxRenewTimes: number;
  readonly waitTime: number;
  /** Minimum hold in ms after acquisition; `0`: none. */
  readonly lockAtLeastFor: number;
  /** The acquisition's own hook (the module's is called as well). */
  readonly onLockLost: LockLostHandler | undefined;
  /** `'read'`: a shared hold; `'write'`: exclusive (also every plain lock). */
  readonly mode: LockMode;
  /** A semaphore's holders at most; `0`: not a semaphore. */
  readonly permits: number;
  /** See `PerLockOptions.label`. */
  readonly label: string | undefined;
  /** What took the lock, for `inspect`: `Class.method` of a `@DisLock` method. */
  readonly caller?: string;
}

/** How an acquisition with these options holds its lock. */
export function holdKindOf(options: ResolvedLockOptions): LockHoldKind {
  if (options.permits > 0) return 'permit';
  return options.mode === 'read' ? 'read' : 'exclusive';
}

/** Which lock an event is about: its name, key, how it is held and its label. */
export function eventSubjectOf(name: string, key: string, options: ResolvedLockOptions): LockEventSubject {
  return { name, key, kind: holdKindOf(options), label: options.label };
}

/**
 * The store's `share` for an acquisition: undefined for an exclusive hold, the permits of a
 * semaphore, or 0 (no bound) for a reader.
 */
export function shareOf(options: ResolvedLockOptions): number | undefined {
  if (options.permits > 0) return options.permits;
  return options.mode === 'read' ? 0 : undefined;
}

export const UNSET_EXPIRE = -1;

export const DEFAULT_MODULE_OPTIONS = {
  keyPrefix: 'dislock:',
  lockWatchdogTimeout: 30_000,
  maxRenewTimes: 360,
  waitTime: 0,
  operationTimeout: 5_000,
  whenDisconnected: 'fail',
} as const satisfies Omit<
  ResolvedModuleOptions,
  'redis' | 'redlock' | 'replicas' | 'onLockLost' | 'store' | 'telemetry' | 'appName'
>;

export const DEFAULT_REDLOCK_DRIFT_FACTOR = 0.01;

/** Longest lock name (after template resolution, without the prefix), in characters. */
export const MAX_LOCK_NAME_LENGTH = 512;
