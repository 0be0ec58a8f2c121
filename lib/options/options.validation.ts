import { InvalidLockOptionsError } from '../errors';
import {
  DEFAULT_MODULE_OPTIONS,
  DEFAULT_REDLOCK_DRIFT_FACTOR,
  type DisLockModuleOptions,
  type RedlockOptions,
  type ReplicaAckOptions,
  type DisLockOptions,
  type LockOptions,
  type ResolvedLockOptions,
  type ResolvedModuleOptions,
  UNSET_EXPIRE,
} from './dislock.options';
import { leaseMarginMs, MIN_LEASE_MS } from './lease-margin';
import { describeLoneSurrogate, loneSurrogateAt } from './well-formed';
import type { LockLostHandler } from '../events/lock-lost.event';
import type { LockStore } from '../store/lock-store.interface';

/** Node timers overflow past 2^31 - 1 ms and would fire at once; no duration may exceed it. */
const MAX_DURATION_MS = 2 ** 31 - 1;

const TIMING_FIELDS = ['expire', 'lockWatchdogTimeout', 'maxRenewTimes', 'waitTime'] as const;
const PER_LOCK_FIELDS = [...TIMING_FIELDS, 'lockAtLeastFor', 'onLockLost', 'mode', 'permits', 'label'] as const;

/** Longest `label`, in characters. */
const MAX_LABEL_LENGTH = 200;

/** Most names one multi-lock may take. */
export const MAX_LOCK_SET = 64;

/** Most permits a semaphore may have: far beyond any real use, and small enough to count in Lua. */
const MAX_PERMITS = 1_000_000;
const DECORATOR_FIELDS: ReadonlySet<string> = new Set([...PER_LOCK_FIELDS, 'key', 'ifExpireWhenFinish', 'onBusy']);
const LOCK_FIELDS: ReadonlySet<string> = new Set([...PER_LOCK_FIELDS, 'signal']);
const MODULE_FIELDS: ReadonlySet<string> = new Set([
  'redis',
  'store',
  'redlock',
  'replicas',
  'keyPrefix',
  'lockWatchdogTimeout',
  'maxRenewTimes',
  'waitTime',
  'operationTimeout',
  'whenDisconnected',
  'onLockLost',
  'telemetry',
  'appName',
]);

/** A URL-like string with its user and password masked, so that an error never quotes a password. */
function withoutCredentials(value: unknown): unknown {
  return typeof value === 'string' ? value.replace(/\/\/[^/@]*@/, '//***@') : value;
}

function describe(value: unknown): string {
  if (typeof value === 'string') return JSON.stringify(value);
  if (typeof value === 'number' || typeof value === 'boolean' || value == null) return String(value);
  return typeof value;
}

function fail(where: string, option: string, value: unknown, expected: string): never {
  throw new InvalidLockOptionsError(option, `${where}: option "${option}" must be ${expected}, got ${describe(value)}`);
}

function checkObject(where: string, value: unknown, allowed: ReadonlySet<string>): Record<string, unknown> {
  if (typeof value !== 'object' || value === null || Array.isArray(value)) {
    throw new InvalidLockOptionsError('options', `${where}: options must be an object, got ${describe(value)}`);
  }
  for (const field of Object.keys(value)) {
    if (!allowed.has(field)) {
      throw new InvalidLockOptionsError(
        field,
        `${where}: unknown option "${field}" (known: ${[...allowed].join(', ')})`,
      );
    }
  }
  return value as Record<string, unknown>;
}

function isWholeMs(value: unknown): value is number {
  return typeof value === 'number' && Number.isSafeInteger(value);
}

function positiveMs(where: string, option: string, value: unknown): number {
  if (!isWholeMs(value) || value <= 0 || value > MAX_DURATION_MS) {
    fail(where, option, value, `a whole number of milliseconds between 1 and ${MAX_DURATION_MS}`);
  }
  return value;
}

function nonNegativeMs(where: string, option: string, value: unknown): number {
  if (!isWholeMs(value) || value < 0 || value > MAX_DURATION_MS) {
    fail(where, option, value, `a whole number of milliseconds between 0 and ${MAX_DURATION_MS}`);
  }
  return value;
}

function wholeCount(where: string, option: string, value: unknown): number {
  if (!isWholeMs(value)) fail(where, option, value, 'a whole number (<= 0 means no limit)');
  return value;
}

/** A lease (`expire`, `lockWatchdogTimeout`): long enough to outlast the margin a holder counts it ended by. */
function leaseMs(where: string, option: string, value: unknown): number {
  const lease = positiveMs(where, option, value);
  if (lease < MIN_LEASE_MS) {
    throw new InvalidLockOptionsError(
      option,
      `${where}: option "${option}" (${lease} ms) is too short to be honoured: a holder counts its lease as ended ` +
        `${leaseMarginMs(lease)} ms early (2 ms + 1 %, for Redis's whole milliseconds and late timers), so every ` +
        `acquisition would find it over and the lock would always look taken; the shortest lease that works is ${MIN_LEASE_MS} ms`,
    );
  }
  return lease;
}

/** Validates the timing fields (and the `onLockLost` hook) that are present; absent ones stay absent. */
function checkTiming(where: string, raw: Record<string, unknown>): LockOptions {
  const out: { -readonly [K in keyof LockOptions]: LockOptions[K] } = {};
  if (raw.expire !== undefined) {
    out.expire = raw.expire === UNSET_EXPIRE ? UNSET_EXPIRE : leaseMs(where, 'expire', raw.expire);
  }
  if (raw.lockWatchdogTimeout !== undefined) {
    out.lockWatchdogTimeout = leaseMs(where, 'lockWatchdogTimeout', raw.lockWatchdogTimeout);
  }
  if (raw.maxRenewTimes !== undefined) out.maxRenewTimes = wholeCount(where, 'maxRenewTimes', raw.maxRenewTimes);
  if (raw.waitTime !== undefined) out.waitTime = nonNegativeMs(where, 'waitTime', raw.waitTime);
  if (raw.lockAtLeastFor !== undefined) out.lockAtLeastFor = positiveMs(where, 'lockAtLeastFor', raw.lockAtLeastFor);
  if (raw.onLockLost !== undefined) {
    if (typeof raw.onLockLost !== 'function') fail(where, 'onLockLost', raw.onLockLost, 'a function (event) => void');
    out.onLockLost = raw.onLockLost as LockLostHandler;
  }
  if (raw.mode !== undefined) {
    if (raw.mode !== 'read' && raw.mode !== 'write') {
      fail(where, 'mode', raw.mode, '"read" (shared with other readers) or "write" (exclusive, the default)');
    }
    out.mode = raw.mode;
  }
  if (raw.label !== undefined) {
    if (typeof raw.label !== 'string' || raw.label === '' || raw.label.length > MAX_LABEL_LENGTH) {
      fail(where, 'label', raw.label, `a non-empty string of at most ${MAX_LABEL_LENGTH} characters`);
    }
    out.label = raw.label;
  }
  if (raw.permits !== undefined) {
    if (!isWholeMs(raw.permits) || raw.permits < 1 || raw.permits > MAX_PERMITS) {
      fail(where, 'permits', raw.permits, `a whole number of holders from 1 to ${MAX_PERMITS}`);
    }
    out.permits = raw.permits;
    if (out.mode !== undefined) {
      throw new InvalidLockOptionsError(
        'permits',
        `${where}: set either "permits" (a semaphore) or "mode" (a read-write lock), not both`,
      );
    }
  }
  if (
    out.lockAtLeastFor !== undefined &&
    out.expire !== undefined &&
    out.expire > 0 &&
    out.lockAtLeastFor > out.expire
  ) {
    throw new InvalidLockOptionsError(
      'lockAtLeastFor',
      `${where}: option "lockAtLeastFor" (${out.lockAtLeastFor} ms) must not exceed "expire" (${out.expire} ms): the fixed lease ends the lock first`,
    );
  }
  if (out.expire !== undefined && out.expire > 0) {
    for (const field of ['lockWatchdogTimeout', 'maxRenewTimes'] as const) {
      if (out[field] !== undefined) {
        throw new InvalidLockOptionsError(
          field,
          `${where}: option "${field}" configures renewal, but "expire" sets a fixed lease that is never renewed; set one or the other`,
        );
      }
    }
  }
  return out;
}

/** Validates `@DisLock` options (the key template is compiled separately). */
export function validateDecoratorOptions(where: string, raw: unknown): DisLockOptions {
  const input = checkObject(where, raw, DECORATOR_FIELDS);
  const key = input.key;
  if (key === undefined) {
    throw new InvalidLockOptionsError('key', `${where}: option "key" is required`);
  }
  const isName = (part: unknown): boolean => typeof part === 'function' || (typeof part === 'string' && part !== '');
  if (Array.isArray(key)) {
    if (key.length === 0 || key.length > MAX_LOCK_SET || !key.every(isName)) {
      fail(
        where,
        'key',
        key.find((part) => !isName(part)) ?? `an array of ${key.length}`,
        `an array of 1 to ${MAX_LOCK_SET} template strings or functions of the method arguments (a multi-lock)`,
      );
    }
    for (const option of ['mode', 'permits'] as const) {
      if (input[option] !== undefined) {
        throw new InvalidLockOptionsError(
          option,
          `${where}: a multi-lock (an array "key") takes exclusive holds only; "${option}" cannot be set with it`,
        );
      }
    }
  } else if (!isName(key)) {
    fail(where, 'key', key, 'a non-empty template string or a function of the method arguments');
  }
  if (input.ifExpireWhenFinish !== undefined && typeof input.ifExpireWhenFinish !== 'boolean') {
    fail(where, 'ifExpireWhenFinish', input.ifExpireWhenFinish, 'a boolean');
  }
  const onBusy = input.onBusy;
  if (onBusy !== undefined && onBusy !== 'throw' && onBusy !== 'skip') {
    fail(where, 'onBusy', onBusy, '"throw" (reject when the lock is busy, the default) or "skip" (resolve undefined)');
  }
  return {
    ...checkTiming(where, input),
    key: key as DisLockOptions['key'],
    ...(input.ifExpireWhenFinish !== undefined && { ifExpireWhenFinish: input.ifExpireWhenFinish }),
    ...(onBusy !== undefined && { onBusy }),
  };
}

/** Validates the options argument of a `LockService` call. */
export function validateLockOptions(where: string, raw: unknown): LockOptions {
  if (raw === undefined) return {};
  const input = checkObject(where, raw, LOCK_FIELDS);
  const signal = input.signal;
  if (signal !== undefined && !(signal instanceof AbortSignal)) fail(where, 'signal', signal, 'an AbortSignal');
  return { ...checkTiming(where, input), ...(signal !== undefined && { signal }) };
}

/** A client (duck-typed: another copy of ioredis qualifies), a plain options object, or a URL. */
function isRedisConnection(value: unknown): value is DisLockModuleOptions['redis'] {
  if (typeof value === 'string') return /^rediss?:\/\/./.test(value);
  if (typeof value !== 'object' || value === null) return false;
  const client = value as { evalsha?: unknown; eval?: unknown };
  if (typeof client.evalsha === 'function' && typeof client.eval === 'function') return true;
  const proto: unknown = Object.getPrototypeOf(value);
  return proto === Object.prototype || proto === null;
}

function checkAppName(where: string, value: unknown): string | undefined {
  if (value === undefined) return undefined;
  if (typeof value !== 'string' || value === '' || value.length > MAX_LABEL_LENGTH) {
    fail(where, 'appName', value, `a non-empty string of at most ${MAX_LABEL_LENGTH} characters`);
  }
  return value;
}

function checkTelemetry(where: string, value: unknown): ResolvedModuleOptions['telemetry'] {
  if (value === undefined || typeof value === 'boolean') return { enabled: value ?? true, lockNames: false };
  const input = checkObject(`${where} telemetry`, value, new Set(['lockNames']));
  if (input.lockNames !== undefined && typeof input.lockNames !== 'boolean') {
    fail(where, 'telemetry.lockNames', input.lockNames, 'a boolean');
  }
  return { enabled: true, lockNames: input.lockNames === true };
}

const STORE_METHODS = ['acquire', 'leave', 'check', 'renew', 'release', 'watch', 'verify', 'close'] as const;

/** `'memory'`, or an object with every method of `LockStore`. */
function checkStore(where: string, value: unknown): 'memory' | LockStore {
  if (value === 'memory') return value;
  const candidate = value as Record<string, unknown> | null;
  const missing =
    typeof value === 'object' && candidate !== null
      ? STORE_METHODS.filter((method) => typeof candidate[method] !== 'function')
      : STORE_METHODS;
  if (missing.length > 0) {
    fail(
      where,
      'store',
      value,
      `"memory" or a LockStore (such as a MemoryLockStore)${typeof value === 'object' && value !== null ? `; this one has no ${missing.join(', ')}` : ''}`,
    );
  }
  return value as LockStore;
}

function isClusterLike(value: unknown): boolean {
  return typeof value === 'object' && value !== null && (value as { isCluster?: unknown }).isCluster === true;
}

function checkRedlock(where: string, raw: unknown): Required<RedlockOptions> {
  const input = checkObject(`${where} redlock`, raw, new Set(['nodes', 'driftFactor']));
  const nodes = input.nodes;
  if (!Array.isArray(nodes) || nodes.length < 3) {
    fail(where, 'redlock.nodes', nodes, 'an array of at least 3 independent Redis masters (clients, options or URLs)');
  }
  nodes.forEach((node: unknown, i) => {
    if (!isRedisConnection(node) || isClusterLike(node)) {
      fail(
        where,
        `redlock.nodes[${i}]`,
        node,
        'an ioredis Redis instance (not a Cluster), a RedisOptions object, or a redis:// URL',
      );
    }
  });
  const driftFactor = input.driftFactor ?? DEFAULT_REDLOCK_DRIFT_FACTOR;
  if (typeof driftFactor !== 'number' || !(driftFactor >= 0 && driftFactor < 0.5)) {
    fail(where, 'redlock.driftFactor', driftFactor, 'a number from 0 to below 0.5');
  }
  return { nodes: nodes as RedlockOptions['nodes'], driftFactor };
}

function checkReplicas(where: string, raw: unknown): Required<ReplicaAckOptions> {
  const input = checkObject(`${where} replicas`, raw, new Set(['min', 'timeout', 'onShortfall']));
  if (!isWholeMs(input.min) || input.min < 1 || input.min > 1_000) {
    fail(where, 'replicas.min', input.min, 'a whole number of replicas from 1 to 1000');
  }
  const timeout = positiveMs(where, 'replicas.timeout', input.timeout);
  const onShortfall = input.onShortfall ?? 'throw';
  if (onShortfall !== 'throw' && onShortfall !== 'warn') {
    fail(where, 'replicas.onShortfall', onShortfall, '"throw" or "warn"');
  }
  return { min: input.min, timeout, onShortfall };
}

/**
 * Redis Cluster hashes the text between a key's first "{" and the first "}" after it. A prefix
 * with a "{" must close a non-empty tag itself: otherwise the tag would depend on the lock name,
 * and the fencing counter (`${keyPrefix}#fence:{tag}`) could not be put in the lock's slot.
 */
function hashTagSafe(prefix: string): boolean {
  const open = prefix.indexOf('{');
  return open === -1 || prefix.indexOf('}', open + 1) > open + 1;
}

/** Validates `DisLockModule.forRoot` options and applies the module defaults. */
export function resolveModuleOptions(raw: unknown): ResolvedModuleOptions {
  const where = 'DisLockModule';
  // `isGlobal` is consumed by the module builder; tolerate it when the whole object is passed on.
  const { isGlobal: _isGlobal, ...rest } = checkObject(where, raw, new Set([...MODULE_FIELDS, 'isGlobal']));
  const input = rest as Partial<DisLockModuleOptions>;
  const redis = input.redis;
  const redlock = input.redlock === undefined ? undefined : checkRedlock(where, input.redlock);
  if (redlock && redis !== undefined) {
    throw new InvalidLockOptionsError('redlock', `${where}: set either "redis" or "redlock", not both`);
  }
  const store = input.store === undefined ? undefined : checkStore(where, input.store);
  if (store !== undefined && (redis !== undefined || redlock)) {
    throw new InvalidLockOptionsError(
      'store',
      `${where}: set one of "redis", "redlock" and "store"; "store" keeps the locks elsewhere`,
    );
  }
  if (!redlock && store === undefined && !isRedisConnection(redis)) {
    fail(
      where,
      'redis',
      withoutCredentials(redis),
      'an ioredis Redis or Cluster instance, a RedisOptions object, or a redis:// URL',
    );
  }
  const replicas = input.replicas === undefined ? undefined : checkReplicas(where, input.replicas);
  if (replicas && store !== undefined) {
    throw new InvalidLockOptionsError('replicas', `${where}: "replicas" applies to "redis", not to "store"`);
  }
  if (replicas && redlock) {
    throw new InvalidLockOptionsError(
      'replicas',
      `${where}: "replicas" applies to "redis" (a master with replicas); Redlock's nodes are independent masters`,
    );
  }
  if (input.keyPrefix !== undefined && typeof input.keyPrefix !== 'string') {
    fail(where, 'keyPrefix', input.keyPrefix, 'a string');
  }
  const lone = input.keyPrefix === undefined ? -1 : loneSurrogateAt(input.keyPrefix);
  if (input.keyPrefix !== undefined && lone !== -1) {
    throw new InvalidLockOptionsError(
      'keyPrefix',
      `${where}: option "keyPrefix" must be well-formed Unicode: ${describeLoneSurrogate(input.keyPrefix, lone)}`,
    );
  }
  if (input.keyPrefix !== undefined && !hashTagSafe(input.keyPrefix)) {
    fail(
      where,
      'keyPrefix',
      input.keyPrefix,
      'a prefix whose first "{" opens a non-empty hash tag closed by "}" (like "{app}:lock:"), or that has no "{"',
    );
  }
  const timing = checkTiming(where, rest);
  if (timing.expire !== undefined) {
    throw new InvalidLockOptionsError('expire', `${where}: "expire" is set per lock, not module-wide`);
  }
  const operationTimeout =
    input.operationTimeout === undefined
      ? DEFAULT_MODULE_OPTIONS.operationTimeout
      : positiveMs(where, 'operationTimeout', input.operationTimeout);
  const whenDisconnected = input.whenDisconnected ?? DEFAULT_MODULE_OPTIONS.whenDisconnected;
  if (whenDisconnected !== 'fail' && whenDisconnected !== 'wait') {
    fail(
      where,
      'whenDisconnected',
      whenDisconnected,
      '"fail" (fail at once while Redis is known unreachable, the default) or "wait" (wait up to operationTimeout for a reconnection)',
    );
  }
  if (replicas && replicas.timeout >= operationTimeout) {
    throw new InvalidLockOptionsError(
      'replicas',
      `${where}: "replicas.timeout" (${replicas.timeout} ms) must be shorter than "operationTimeout" (${operationTimeout} ms), which bounds the acquisition it is part of`,
    );
  }
  return {
    redis: redlock || store !== undefined ? undefined : redis,
    store,
    redlock,
    replicas,
    keyPrefix: input.keyPrefix ?? DEFAULT_MODULE_OPTIONS.keyPrefix,
    lockWatchdogTimeout: timing.lockWatchdogTimeout ?? DEFAULT_MODULE_OPTIONS.lockWatchdogTimeout,
    maxRenewTimes: timing.maxRenewTimes ?? DEFAULT_MODULE_OPTIONS.maxRenewTimes,
    waitTime: timing.waitTime ?? DEFAULT_MODULE_OPTIONS.waitTime,
    operationTimeout,
    whenDisconnected,
    onLockLost: timing.onLockLost,
    telemetry: checkTelemetry(where, input.telemetry),
    appName: checkAppName(where, input.appName),
  };
}

/** Fills the gaps of per-lock options with the module defaults. */
export function resolveLockOptions(defaults: ResolvedModuleOptions, options: LockOptions): ResolvedLockOptions {
  return {
    expire: options.expire ?? UNSET_EXPIRE,
    lockWatchdogTimeout: options.lockWatchdogTimeout ?? defaults.lockWatchdogTimeout,
    maxRenewTimes: options.maxRenewTimes ?? defaults.maxRenewTimes,
    waitTime: options.waitTime ?? defaults.waitTime,
    lockAtLeastFor: options.lockAtLeastFor ?? 0,
    onLockLost: options.onLockLost,
    mode: options.mode ?? 'write',
    permits: options.permits ?? 0,
    label: options.label,
  };
}
