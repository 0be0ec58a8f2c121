import {
  type BeforeApplicationShutdown,
  Inject,
  Injectable,
  Logger,
  type OnApplicationShutdown,
  type OnModuleInit,
} from '@nestjs/common';
import {
  holdKindOf,
  type LockOptions,
  type ResolvedLockOptions,
  type ResolvedModuleOptions,
} from '../options/dislock.options';
import { DISLOCK_RESOLVED_OPTIONS, DISLOCK_STORE } from '../options/dislock.internal-constants';
import { type BusyHold, InvalidLockOptionsError, LockNotAcquiredError, LockNotHeldError } from '../errors';
import type { Handle, LockHandle } from '../core/lock-handle';
import { LockSet, type LockSetHandle } from '../core/lock-set';
import { LockScope } from '../core/lock-scope';
import { type LockEventListener, LockEvents, type LockEventSubject, type LockEventType } from '../events/lock-events';
import type { LockStore, StoreHealth } from '../store/lock-store.interface';
import { resolveLockOptions, validateLockOptions } from '../options/options.validation';
import { type LockHolder, type LockInspection, Operator } from './inspection';
import { checkLockNames, describeNames } from './lock-names';
import { Acquisition } from './acquisition';
import { HeldLocks } from './held-locks';
import { LossReporter } from './loss-reporter';
import { ShutdownGate } from './shutdown-gate';
import { WaitLine } from './wait-line';

/** What a locked call holds: one lock, or a multi-lock's set. */
export type Held = Handle | LockSet;

/** The hold a busy caller asked for, which `LockNotAcquiredError` names what stands in the way of. */
function busyHoldOf(options: ResolvedLockOptions): BusyHold {
  const kind = holdKindOf(options);
  return kind === 'permit' ? { kind, permits: options.permits } : { kind };
}

/**
 * Distributed locks on Redis: owner-safe, renewed by a watchdog, reentrant within one async
 * call chain. The public API and the Nest lifecycle hooks; the work is done by the parts it wires
 * together: `Acquisition` (taking a lock), `WaitLine` (waiting for a busy one), `HeldLocks`
 * (holds, renewal, release), `LossReporter` (telling a holder its lock is lost) and the
 * `ShutdownGate`.
 */
@Injectable()
export class LockService implements OnModuleInit, BeforeApplicationShutdown, OnApplicationShutdown {
  private readonly scope = new LockScope();
  private readonly gate = new ShutdownGate();
  private readonly line: WaitLine;
  private readonly held: HeldLocks;
  private readonly acquisition: Acquisition;
  private readonly operator: Operator;
  private readonly logger = new Logger('DisLock');
  private readonly events = new LockEvents(this.logger);
  /** The options of a call that passes none: every module default. */
  private defaults: ResolvedLockOptions | undefined;
  /** Each `@DisLock` method's resolved options (see `resolveFor`). */
  private readonly resolvedFor = new WeakMap<LockOptions, ResolvedLockOptions>();

  constructor(
    @Inject(DISLOCK_RESOLVED_OPTIONS) private readonly options: ResolvedModuleOptions,
    @Inject(DISLOCK_STORE) private readonly store: LockStore,
  ) {
    const logger = this.logger;
    const events = this.events;
    this.line = new WaitLine(store, this.scope, this.gate);
    const reporter = new LossReporter(options, logger, this.scope, events);
    this.held = new HeldLocks(store, logger, this.scope, reporter, this.line, events);
    this.acquisition = new Acquisition(options, store, this.scope, this.held, this.line, this.gate, events);
    this.operator = new Operator(options, store, this.held, logger);
  }

  /**
   * Take the lock `name`, waiting up to `waitTime` while another owner holds it. Resolves `null`
   * when it is still busy after that, or `options.signal` aborted the wait; rejects with
   * `RedisUnavailableError` when Redis fails.
   * Inside a locked method or `withLock` callback that already holds `name`, re-enters it.
   * `{ mode: 'read' | 'write' }` takes a read-write lock, `{ permits }` a semaphore's permit; an
   * array of names takes them all or none (a multi-lock, see `LockSetHandle`).
   */
  tryLock(names: readonly string[], options?: LockOptions): Promise<LockSetHandle | null>;
  tryLock(name: string, options?: LockOptions): Promise<LockHandle | null>;
  tryLock(name: string | readonly string[], options?: LockOptions): Promise<LockHandle | null> {
    // Not an async function, which would only wrap the acquisition's promise in one more; a bad
    // argument still rejects rather than throws.
    try {
      const lockName = checkLockNames('LockService', name, options);
      const resolved = this.resolve('LockService.tryLock', options);
      return this.take(lockName, resolved, false, options?.signal);
    } catch (error) {
      // eslint-disable-next-line @typescript-eslint/prefer-promise-reject-errors -- what the checks threw, as is
      return Promise.reject(error);
    }
  }

  /**
   * Like `tryLock`, but rejects with `LockNotAcquiredError` when the lock stays busy, or with
   * `options.signal.reason` when the signal aborted the wait.
   */
  async lock(names: readonly string[], options?: LockOptions): Promise<LockSetHandle>;
  async lock(name: string, options?: LockOptions): Promise<LockHandle>;
  async lock(name: string | readonly string[], options?: LockOptions): Promise<LockHandle> {
    const lockName = checkLockNames('LockService', name, options);
    const resolved = this.resolve('LockService.lock', options);
    const signal = options?.signal;
    const handle = await this.take(lockName, resolved, false, signal);
    if (handle) return handle;
    if (signal?.aborted) throw signal.reason;
    throw new LockNotAcquiredError(describeNames(lockName), resolved.waitTime, busyHoldOf(resolved));
  }

  /**
   * Run `fn` while holding the lock `name` (or every lock of `names`), then release it (also when
   * `fn` throws). Rejects with `LockNotAcquiredError` when the lock stays busy. `fn`'s result and
   * errors pass through as they are; a failed release is logged, not thrown.
   */
  async withLock<T>(
    names: readonly string[],
    fn: (lock: LockSetHandle) => T | Promise<T>,
    options?: LockOptions,
  ): Promise<T>;
  async withLock<T>(name: string, fn: (lock: LockHandle) => T | Promise<T>, options?: LockOptions): Promise<T>;
  async withLock<T>(
    name: string | readonly string[],
    fn: ((lock: LockHandle) => T | Promise<T>) | ((lock: LockSetHandle) => T | Promise<T>),
    options?: LockOptions,
  ): Promise<T> {
    if (typeof fn !== 'function') {
      throw new InvalidLockOptionsError('fn', 'LockService.withLock: the second argument must be a function');
    }
    const handle = (await (typeof name === 'string' ? this.lock(name, options) : this.lock(name, options))) as Held;
    try {
      return await this.runInScope(handle, () => (fn as (lock: LockHandle) => T | Promise<T>)(handle));
    } finally {
      await this.finish(handle, true);
    }
  }

  /**
   * Listen for lock events of this application: `'acquired'`, `'waiting'`, `'busy'`, `'renewed'`,
   * `'renewal-failed'`, `'lost'`, `'released'` (see `LockEventPayloads`). The listener runs
   * synchronously where the event happens and must not throw (an error is logged). Returns a
   * function that removes it.
   */
  on<T extends LockEventType>(type: T, listener: LockEventListener<T>): () => void {
    return this.events.on(type, listener);
  }

  /**
   * The lock held by the running async call chain: the innermost one named `name`, or the
   * innermost of all when `name` is omitted. Only locks taken by `@DisLock` and `withLock` are
   * visible here (they run the code that follows inside the lock).
   */
  current(name?: string): LockHandle | undefined {
    return this.scope.find(name === undefined ? undefined : this.options.keyPrefix + name);
  }

  /**
   * Throws `LockNotHeldError` unless the running async call chain holds the lock `name` (any lock
   * when omitted), for code that must only ever run under one. Sees what `current` sees: locks
   * taken by `@DisLock` and `withLock`, across awaits and timers started under them.
   */
  assertLocked(name?: string): void {
    if (name !== undefined) checkLockNames('LockService', name, undefined);
    if (!this.current(name)) throw new LockNotHeldError(name);
  }

  /**
   * Who holds the lock `name` now, for an operator: every holder with its remaining lease, fencing
   * token and what its acquisition recorded (host, pid, `appName`, label, `@DisLock` method, since
   * when), and this application's hold count for its own; and how many processes wait. Reads only.
   */
  inspect(name: string): Promise<LockInspection> {
    return this.operator.inspect(checkLockNames('LockService.inspect', name, undefined) as string);
  }

  /**
   * Free the lock `name` whoever holds it, for an operator facing a stuck lock. Logged, with each
   * holder removed. Each holder finds out at its next renewal (its `signal` aborts, `not-owner`);
   * one with a fixed `expire` only when its lease ends or it releases. The holders removed.
   */
  forceUnlock(name: string): Promise<LockHolder[]> {
    return this.operator.forceUnlock(checkLockNames('LockService.forceUnlock', name, undefined) as string);
  }

  // ---- used by the interceptor -------------------------------------------------------------

  /**
   * @internal Acquire for a decorated method: the handle, or `null` when the lock stays busy (see
   * `busyFor`). `options` are the method's own, validated when its class was defined.
   */
  acquireFor(
    name: string | readonly string[],
    options: LockOptions,
    keepOnShutdown: boolean,
    cancel?: AbortSignal,
    caller?: string,
  ): Promise<Held | null> {
    // Not an async function, which would only wrap the acquisition's promise in one more.
    try {
      const names = typeof name === 'string' ? name : checkLockNames('LockService', name, options);
      return this.take(names, this.resolveFor(options, caller), keepOnShutdown, cancel);
    } catch (error) {
      // eslint-disable-next-line @typescript-eslint/prefer-promise-reject-errors -- what the checks threw, as is
      return Promise.reject(error);
    }
  }

  /**
   * @internal A decorated method's lock stayed busy (`acquireFor` resolved `null`): throws
   * `LockNotAcquiredError`, or (`onBusy: 'skip'`) logs at debug level and returns.
   */
  busyFor(
    name: string | readonly string[],
    options: LockOptions,
    onBusy: 'throw' | 'skip',
    cancel?: AbortSignal,
    caller?: string,
  ): void {
    const names = typeof name === 'string' ? name : checkLockNames('LockService', name, options);
    const resolved = this.resolveFor(options, caller);
    const busy = new LockNotAcquiredError(describeNames(names), resolved.waitTime, busyHoldOf(resolved));
    if (onBusy === 'throw') throw busy;
    if (!cancel?.aborted) this.logger.debug(`${busy.message}: skipped the call (onBusy: 'skip')`);
  }

  /** @internal Run `fn` with `handle` (every part of a multi-lock) as part of the async call chain's held locks. */
  runInScope<T>(handle: Held, fn: () => T): T {
    if (handle instanceof LockSet) {
      return handle.parts.reduceRight<() => T>((inner, part) => () => this.scope.run(part, inner), fn)();
    }
    return this.scope.run(handle, fn);
  }

  /**
   * @internal End one acquisition: release it, or (`release: false`, outermost only) leave the key
   * to expire: renewal goes on while reentrant holds of it still run, then stops. Never rejects: a
   * failure is logged, the lease then ends the lock on its own.
   */
  finish(handle: Held, release: boolean): Promise<void> {
    if (handle instanceof LockSet) return handle.finish(release);
    return this.held.finish(handle, release);
  }

  /** @internal Give back a lock no code ran under (its caller had gone when it arrived): at once, whatever `lockAtLeastFor` says. */
  abandon(handle: Held): Promise<void> {
    if (handle instanceof LockSet) return handle.abandon();
    return this.held.abandon(handle);
  }

  /** @internal Follow how many locks this application holds (the `dislock.locks.held` metric). */
  onHeldChange(listener: (delta: number, lock: LockEventSubject) => void): () => void {
    return this.events.onHeldChange(listener);
  }

  /** @internal What the health indicator reports: the store's answer, renewal lag, locks held. */
  async health(): Promise<{ store: StoreHealth; renewalLagMs: number; heldLocks: number }> {
    return { store: await this.store.health(), renewalLagMs: this.held.renewalLagMs(), heldLocks: this.held.count };
  }

  /**
   * @internal Report every lock `name` held by this application lost now, as a renewal finding
   * another owner would (see DisLockTesting.loseLock); how many there were.
   */
  loseHeld(name: string, detail: string): number {
    return this.held.loseKey(this.options.keyPrefix + name, detail);
  }

  // ---- lifecycle ---------------------------------------------------------------------------

  /** Fails startup with `RedisAccessError` when Redis refuses what locking needs (ACL, scripting). */
  async onModuleInit(): Promise<void> {
    await this.store.verify();
  }

  /** Releases every held lock (those of `ifExpireWhenFinish: false` are left to expire). */
  async beforeApplicationShutdown(): Promise<void> {
    this.gate.close();
    this.line.stopWaits();
    // Each is bounded by operationTimeout; one that lands now gives its lock back before the client closes.
    if (this.gate.busy) await this.gate.settled();
    await this.held.giveUpAll();
  }

  /** Closes the Redis client if the module created it. */
  async onApplicationShutdown(): Promise<void> {
    this.held.close();
    await this.store.close();
  }

  // ---- internals ---------------------------------------------------------------------------

  /** One lock, or every lock of a set (all or nothing). */
  private take(
    name: string | readonly string[],
    options: ResolvedLockOptions,
    keepOnShutdown: boolean,
    cancel: AbortSignal | undefined,
  ): Promise<Held | null> {
    return typeof name === 'string'
      ? this.acquisition.acquire(name, options, keepOnShutdown, cancel)
      : this.acquisition.acquireAll(name, options, keepOnShutdown, cancel);
  }

  private resolve(where: string, options: LockOptions | undefined): ResolvedLockOptions {
    if (options === undefined) return (this.defaults ??= resolveLockOptions(this.options, {}));
    return resolveLockOptions(this.options, validateLockOptions(where, options));
  }

  /**
   * A `@DisLock` method's options (validated when its class was defined, never changed since) with
   * the module defaults and its `caller`: resolved on its first call, the same object after that.
   */
  private resolveFor(options: LockOptions, caller: string | undefined): ResolvedLockOptions {
    let resolved = this.resolvedFor.get(options);
    if (resolved === undefined || resolved.caller !== caller) {
      resolved = { ...resolveLockOptions(this.options, options), caller };
      this.resolvedFor.set(options, resolved);
    }
    return resolved;
  }
}
