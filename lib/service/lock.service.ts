import { randomBytes } from 'node:crypto';
import { describeError } from '../core/describe-error';
import { type BeforeApplicationShutdown, Inject, Injectable, Logger, type OnApplicationShutdown } from '@nestjs/common';
import {
  type LockOptions,
  MAX_LOCK_NAME_LENGTH,
  type ResolvedLockOptions,
  type ResolvedModuleOptions,
} from '../module/dislock.options';
import { DISLOCK_RESOLVED_OPTIONS, DISLOCK_STORE } from '../module/dislock.internal-constants';
import {
  DisLockError,
  InvalidLockOptionsError,
  LockLostError,
  type LockLostReason,
  LockNotAcquiredError,
  RedisUnavailableError,
} from '../errors';
import { Handle, HeldLock, type LockHandle, leaseValidUntil } from '../core/lock-handle';
import type { LockLostEvent, LockLostHandler } from '../core/lock-lost.event';
import { FENCE_MARKER } from '../store/fence-key';
import { LockScope } from '../core/lock-scope';
import type { LockStore } from '../store/lock-store.interface';
import { StoreTimeoutError } from '../store/store-timeout.error';
import { resolveLockOptions, validateLockOptions } from '../module/options.validation';
import { isPromiseLike } from '../core/promise-like';
import { wakeOrTimeout } from '../core/wake-or-timeout';
import { WaitQueue } from './wait-queue';
import { Watchdog } from '../core/watchdog';

const now = (): number => performance.now();

/**
 * Random 128-bit owner ids, cut from a pool filled 256 ids at a time: one `randomBytes` call per
 * acquisition cost a tenth of the CPU of an uncontended lock/release cycle.
 */
class OwnerIds {
  private pool = Buffer.alloc(0);
  private offset = 0;

  next(): string {
    if (this.offset === this.pool.length) {
      this.pool = randomBytes(16 * 256);
      this.offset = 0;
    }
    const id = this.pool.toString('hex', this.offset, this.offset + 16);
    this.offset += 16;
    return id;
  }
}

/**
 * Distributed locks on Redis: owner-safe, renewed by a watchdog, reentrant within one async
 * call chain. The one place that talks to the lock store.
 */
@Injectable()
export class LockService implements BeforeApplicationShutdown, OnApplicationShutdown {
  private readonly logger = new Logger('DisLock');
  private readonly ownerIds = new OwnerIds();
  private readonly scope = new LockScope();
  /** Locks this service holds and will release at shutdown; an entry lives only while held. */
  private readonly held = new Set<HeldLock>();
  private closing = false;
  /** Acquisitions under way: shutdown lets them land while the client is still open. */
  private acquiring = 0;
  /** Set by shutdown while acquisitions are under way; called when the last one has settled. */
  private acquisitionsDone: (() => void) | undefined;
  /** Waits in progress, one controller each: shutdown ends them. */
  private readonly waits = new Set<AbortController>();
  /** The local waiters of each key someone here is waiting for; an entry lives while it has waiters. */
  private readonly queues = new Map<string, WaitQueue>();
  /** Keys this process just released to waiters elsewhere, and until when it gives way (see `giveWay`). */
  private readonly givingWayUntil = new Map<string, number>();
  private readonly watchdog: Watchdog;

  constructor(
    @Inject(DISLOCK_RESOLVED_OPTIONS) private readonly options: ResolvedModuleOptions,
    @Inject(DISLOCK_STORE) private readonly store: LockStore,
  ) {
    this.watchdog = new Watchdog(
      store,
      this.logger,
      (lock, reason, detail, cause) => this.markLost(lock, reason, detail, cause),
      (fn) => this.scope.outside(fn),
    );
  }

  /**
   * Take the lock `name`, waiting up to `waitTime` while another owner holds it. Resolves `null`
   * when it is still busy after that, or `options.signal` aborted the wait; rejects with
   * `RedisUnavailableError` when Redis fails.
   * Inside a locked method or `withLock` callback that already holds `name`, re-enters it.
   */
  async tryLock(name: string, options?: LockOptions): Promise<LockHandle | null> {
    const lockName = this.checkName(name);
    const resolved = this.resolve('LockService.tryLock', options);
    return this.acquire(lockName, resolved, false, options?.signal);
  }

  /**
   * Like `tryLock`, but rejects with `LockNotAcquiredError` when the lock stays busy, or with
   * `options.signal.reason` when the signal aborted the wait.
   */
  async lock(name: string, options?: LockOptions): Promise<LockHandle> {
    const lockName = this.checkName(name);
    const resolved = this.resolve('LockService.lock', options);
    const signal = options?.signal;
    const handle = await this.acquire(lockName, resolved, false, signal);
    if (handle) return handle;
    if (signal?.aborted) throw signal.reason;
    throw new LockNotAcquiredError(lockName, resolved.waitTime);
  }

  /**
   * Run `fn` while holding the lock `name`, then release it (also when `fn` throws). Rejects with
   * `LockNotAcquiredError` when the lock stays busy. `fn`'s result and errors pass through as
   * they are; a failed release is logged, not thrown.
   */
  async withLock<T>(name: string, fn: (lock: LockHandle) => T | Promise<T>, options?: LockOptions): Promise<T> {
    if (typeof fn !== 'function') {
      throw new InvalidLockOptionsError('fn', 'LockService.withLock: the second argument must be a function');
    }
    const handle = (await this.lock(name, options)) as Handle;
    try {
      return await this.runInScope(handle, () => fn(handle));
    } finally {
      await this.finish(handle, true);
    }
  }

  /**
   * The lock held by the running async call chain: the innermost one named `name`, or the
   * innermost of all when `name` is omitted. Only locks taken by `@DisLock` and `withLock` are
   * visible here (they run the code that follows inside the lock).
   */
  current(name?: string): LockHandle | undefined {
    return this.scope.find(name === undefined ? undefined : this.options.keyPrefix + name);
  }

  // ---- used by the interceptor -------------------------------------------------------------

  /** @internal Acquire for a decorated method; rejects with `LockNotAcquiredError` when busy. */
  async acquireFor(name: string, options: LockOptions, keepOnShutdown: boolean, cancel?: AbortSignal): Promise<Handle> {
    const resolved = resolveLockOptions(this.options, options);
    const handle = await this.acquire(name, resolved, keepOnShutdown, cancel);
    if (!handle) throw new LockNotAcquiredError(name, resolved.waitTime);
    return handle;
  }

  /** @internal Run `fn` with `handle` as part of the async call chain's held locks. */
  runInScope<T>(handle: Handle, fn: () => T): T {
    return this.scope.run(handle, fn);
  }

  /**
   * @internal End one acquisition: release it, or (`release: false`, outermost only) leave the key
   * to expire: renewal goes on while reentrant holds of it still run, then stops. Never rejects: a
   * failure is logged, the lease then ends the lock on its own.
   */
  async finish(handle: Handle, release: boolean): Promise<void> {
    if (!release && !handle.reentrant) {
      if (!handle.finishKeeping()) return;
      const lock = handle.lock;
      lock.outerDone = true;
      lock.keepKey = true;
      lock.stopAsked = true;
      lock.holds -= 1;
      if (lock.holds === 0 && lock.state === 'held') this.detach(lock);
      return;
    }
    try {
      await handle.release();
    } catch (error) {
      // The log says what Redis reported: the error's own message leaves that to its cause.
      const why = error instanceof RedisUnavailableError ? error.cause : error;
      this.logger.warn(
        `Releasing lock "${handle.name}" failed (${describeError(why)}); it expires on its own within its lease`,
      );
    }
  }

  // ---- HoldKeeper (called by handles) --------------------------------------------------------------------------

  /** @internal */
  async releaseHold(lock: HeldLock, reentrant: boolean): Promise<boolean> {
    if (!reentrant) lock.outerDone = true;
    lock.holds -= 1;
    if (lock.state === 'shut-down') return false; // shutdown already released (or kept) every hold
    if (lock.holds > 0) {
      // Another hold of this owner still runs under the lock: nothing changes in Redis, and the
      // watchdog goes on renewing (or watching the fixed lease) for it.
      this.detachIfAsked(lock);
      return false;
    }
    if (lock.keepKey) {
      // The outermost method ended with `ifExpireWhenFinish: false` and this was the last
      // reentrant hold after it: leave the key to expire, as the outermost asked.
      if (lock.state === 'held') this.detach(lock);
      return false;
    }
    const wasHeld = lock.state === 'held';
    const wasLost = lock.state === 'lost';
    this.settle(lock, wasHeld ? 'released' : lock.state);
    let result;
    try {
      // Owner-checked: even for a lock known to be lost this only ever drops this owner's own hold.
      result = await this.store.release(lock.key, lock.owner);
    } catch (error) {
      if (wasLost) return false; // already reported; its hold, if Redis still has one, expires on its own
      throw redisFailed('release', lock.name, error);
    }
    // A plain release has woken the local line already (the store does that for every release it
    // knows has run); with waiters elsewhere too, the local head holds back first.
    if (result === 'released-contended') this.giveWay(lock.key);
    if (result === 'not-owner' && wasHeld) {
      // Expired or taken over before the watchdog noticed: the work it protected was not protected.
      this.markLost(lock, 'not-owner', 'its release found it gone or held by another owner');
    }
    return (result === 'released' || result === 'released-contended') && !wasLost;
  }

  /** @internal */
  stopRenewal(lock: HeldLock): void {
    if (lock.state !== 'held') return;
    lock.stopAsked = true;
    this.detachIfAsked(lock);
  }

  /**
   * Renewal was asked to stop: stop it once only the hold that asked is left (a reentrant hold
   * still running keeps it renewed, or watched, until it ends).
   */
  private detachIfAsked(lock: HeldLock): void {
    if (lock.state === 'held' && lock.stopAsked && lock.holds === (lock.outerDone ? 0 : 1)) this.detach(lock);
  }

  /** Stop renewing and leave the key to expire. */
  private detach(lock: HeldLock): void {
    this.settle(lock, 'detached');
    // A local waiter may be sleeping on this holder's release; it will now come at expiry, or
    // never: let the head ask Redis for the real remaining lease.
    this.queues.get(lock.key)?.wake();
  }

  /** @internal */
  async disposeHold(handle: LockHandle): Promise<void> {
    await this.finish(handle as Handle, true);
  }

  // ---- lifecycle ---------------------------------------------------------------------------

  /** Releases every held lock (those of `ifExpireWhenFinish: false` are left to expire). */
  async beforeApplicationShutdown(): Promise<void> {
    this.closing = true;
    for (const wait of this.waits) wait.abort();
    // Each is bounded by operationTimeout; one that lands now gives its lock back before the client closes.
    if (this.acquiring > 0) await new Promise<void>((resolve) => (this.acquisitionsDone = resolve));
    const locks = [...this.held];
    await Promise.all(
      locks.map(async (lock) => {
        this.settle(lock, 'shut-down');
        this.announce(
          lock,
          new LockLostError(lock.name, 'shutdown', `Lock "${lock.name}" given up: the application is shutting down`),
        );
        if (lock.keepOnShutdown) return;
        try {
          await this.store.release(lock.key, lock.owner);
        } catch (error) {
          this.logger.warn(
            `Could not release lock "${lock.name}" at shutdown (${describeError(error)}); it expires on its own`,
          );
        }
      }),
    );
  }

  /** Closes the Redis client if the module created it. */
  async onApplicationShutdown(): Promise<void> {
    await this.store.close();
  }

  // ---- internals ---------------------------------------------------------------------------

  private checkName(name: unknown): string {
    if (typeof name !== 'string' || name.length === 0 || name.length > MAX_LOCK_NAME_LENGTH) {
      const got = typeof name === 'string' ? `a string of ${name.length} characters` : typeof name;
      throw new InvalidLockOptionsError(
        'name',
        `LockService: the lock name must be a non-empty string of at most ${MAX_LOCK_NAME_LENGTH} characters, got ${got}`,
      );
    }
    return name;
  }

  private resolve(where: string, options: LockOptions | undefined): ResolvedLockOptions {
    return resolveLockOptions(this.options, validateLockOptions(where, options));
  }

  /**
   * A held lock is no longer safe to rely on. Called by the watchdog (renewal answered "not owner",
   * lease ran out) and by a release that found the lock gone; a lock already lost, given up at
   * shutdown or detached is left alone, so each loss is reported once.
   */
  private markLost(lock: HeldLock, reason: LockLostReason, detail: string, cause?: unknown): void {
    if (lock.state === 'lost' || lock.state === 'shut-down' || lock.state === 'detached') return;
    this.settle(lock, 'lost');
    this.queues.get(lock.key)?.wake(); // no release will announce it: let the next local waiter look
    const message = `Lock "${lock.name}" lost: ${detail}`;
    this.announce(lock, new LockLostError(lock.name, reason, message, cause === undefined ? undefined : { cause }));
  }

  /**
   * Abort the lock's signal and call the `onLockLost` hooks, or log when there are none. Never
   * throws. Runs outside every lock scope: whichever call noticed the loss (a timer, a release
   * elsewhere in the code), the listeners and hooks must not see that call's locks as their own.
   */
  private announce(lock: HeldLock, error: LockLostError): void {
    this.scope.outside(() => this.tell(lock, error));
  }

  private tell(lock: HeldLock, error: LockLostError): void {
    lock.controller.abort(error);
    const hooks = [lock.options.onLockLost, this.options.onLockLost].filter(
      (hook): hook is LockLostHandler => hook !== undefined,
    );
    if (hooks.length === 0) {
      if (error.reason === 'shutdown') this.logger.log(error.message);
      else this.logger.warn(error.message);
      return;
    }
    const event: LockLostEvent = {
      name: lock.name,
      key: lock.key,
      owner: lock.owner,
      fencingToken: lock.fencingToken,
      reason: error.reason,
      error,
    };
    const failed = (hookError: unknown): void =>
      this.logger.error(`onLockLost for lock "${lock.name}" failed: ${describeError(hookError)}`);
    for (const hook of hooks) {
      try {
        const result = hook(event);
        if (isPromiseLike(result)) result.then(undefined, failed);
      } catch (hookError) {
        failed(hookError);
      }
    }
  }

  /** Leave the `held` state: stop the watchdog and forget the lock. */
  private settle(lock: HeldLock, state: HeldLock['state']): void {
    this.watchdog.stop(lock);
    this.held.delete(lock);
    lock.state = state;
  }

  /**
   * Resolves `null` when the lock is still busy after `waitTime` or `cancel` aborted the wait;
   * rejects when Redis fails or the application is shutting down. Tracked while under way, so
   * that shutdown can wait for it.
   */
  private async acquire(
    name: string,
    options: ResolvedLockOptions,
    keepOnShutdown: boolean,
    cancel?: AbortSignal,
  ): Promise<Handle | null> {
    this.acquiring += 1;
    try {
      return await this.acquireNow(name, options, keepOnShutdown, cancel);
    } finally {
      this.acquiring -= 1;
      if (this.acquiring === 0) this.acquisitionsDone?.();
    }
  }

  private async acquireNow(
    name: string,
    options: ResolvedLockOptions,
    keepOnShutdown: boolean,
    cancel: AbortSignal | undefined,
  ): Promise<Handle | null> {
    this.assertOpen(name);
    if (name.startsWith(FENCE_MARKER)) {
      throw new InvalidLockOptionsError(
        'name',
        `Lock names starting with "${FENCE_MARKER}" are reserved for fencing counters, got "${name}"`,
      );
    }
    if (cancel?.aborted) return null;
    const key = this.options.keyPrefix + name;
    const deadline = now() + options.waitTime;
    const outer = this.scope.find(key)?.lock;
    if (outer) {
      // Inside the outer holder's call chain: only re-enter its hold (the lease stays the outer's).
      const handle = await this.reenter(outer);
      if (handle) return handle;
    }
    // Nobody here waits for it, or this caller will not wait: one attempt straight away. Otherwise
    // join the line, so that a newcomer cannot take the lock from under waiters that came first,
    // nor, just after this process released it, from waiters in other processes.
    const giveWay = this.givingWay(key);
    if ((!this.queues.has(key) && giveWay === 0) || options.waitTime === 0) {
      const first = await this.attempt(name, key, options, keepOnShutdown);
      if (first instanceof Handle) return first;
      if (deadline - now() <= 0 || cancel?.aborted) return null;
    }
    return this.waitInLine(name, key, options, keepOnShutdown, deadline, cancel, giveWay);
  }

  /**
   * Re-enter the outer holder's hold: one more local hold on the same lock, nothing new in Redis.
   * The hold is counted before Redis is asked whether the owner still has the lock, so that the
   * outer's release meanwhile leaves the lock in place for it. `undefined` when the lock has gone
   * (the outer has lost it, or its lease may have ended): this acquisition competes as a newcomer.
   */
  private async reenter(outer: HeldLock): Promise<Handle | undefined> {
    if (now() >= outer.leaseEndsAt) return undefined; // the watchdog reports the loss on its tick
    outer.holds += 1;
    const handle = new Handle(outer, true, this);
    let result;
    try {
      result = await this.store.check(outer.key, outer.owner);
    } catch (error) {
      await this.finish(handle, true);
      throw redisFailed('acquire', outer.name, error);
    }
    if (!result.held) {
      this.watchdog.lose(outer, 'not-owner', 'a reentrant acquisition found it gone or held by another owner');
    }
    if (outer.state === 'held' && now() < outer.leaseEndsAt) return handle;
    await this.finish(handle, true);
    return undefined;
  }

  /** One fresh attempt: the handle, or the holder's remaining lease in ms when the lock is busy. */
  private async attempt(
    name: string,
    key: string,
    options: ResolvedLockOptions,
    keepOnShutdown: boolean,
  ): Promise<Handle | number> {
    const owner = this.ownerIds.next();
    const lease = leaseOf(options);
    const sentAt = now();
    let result;
    try {
      result = await this.store.acquire(key, owner, lease);
    } catch (error) {
      throw redisFailed('acquire', name, error);
    }
    if (!result.acquired) return result.ttl;
    if (now() >= leaseValidUntil(sentAt, lease)) {
      // The answer came after the lease it granted may have ended in Redis: another owner may
      // hold the lock by now. Never hand that out: give the hold back (owner-checked) and count
      // this attempt as a miss.
      await this.store.release(key, owner).catch(() => undefined);
      return -2;
    }
    if (this.closing) await this.giveBack(name, key, owner);
    return this.keep(name, key, owner, result.token, options, sentAt, keepOnShutdown);
  }

  /** Shutdown began while this acquisition was on its way: nobody would release the lock. Throws. */
  private async giveBack(name: string, key: string, owner: string): Promise<never> {
    await this.store.release(key, owner).catch(() => undefined);
    this.assertOpen(name);
    throw new Error('unreachable: giveBack is only called while closing');
  }

  /** Start keeping a lock just taken in Redis. */
  private keep(
    name: string,
    key: string,
    owner: string,
    token: number,
    options: ResolvedLockOptions,
    sentAt: number,
    keepOnShutdown: boolean,
  ): Handle {
    const lock = new HeldLock(name, key, owner, token, options, sentAt, keepOnShutdown);
    this.held.add(lock);
    this.watchdog.start(lock);
    return new Handle(lock, false, this);
  }

  /**
   * Wait for the lock behind the local waiters that came first. Only the head of the line tries;
   * between tries it sleeps until a release is announced (pub/sub, or this process's own release),
   * the holder's lease runs out, `waitTime` ends, or the wait is cancelled or shut down.
   */
  private async waitInLine(
    name: string,
    key: string,
    options: ResolvedLockOptions,
    keepOnShutdown: boolean,
    deadline: number,
    cancel: AbortSignal | undefined,
    giveWay: number,
  ): Promise<Handle | null> {
    let queue = this.queues.get(key);
    if (!queue) {
      // Outside the caller's lock scope: the subscriber connection this may open outlives the call.
      queue = new WaitQueue(this.scope.outside(() => this.store.watch(key)));
      this.queues.set(key, queue);
    }
    const stop = new AbortController();
    const abort = (): void => stop.abort();
    cancel?.addEventListener('abort', abort, { once: true });
    this.waits.add(stop);
    const place = queue.join();
    try {
      const wait = deadline - now();
      const myTurn = wait > 0 && (await wakeOrTimeout(wait, stop.signal, (wake) => void place.turn.then(wake)));
      this.assertOpen(name);
      if (!myTurn) return null;
      const watch = await queue.watch;
      // The previous head left holding the lock: wait for its release before asking Redis. Or this
      // process has just released it to waiters elsewhere: give them a moment to take it first.
      let ttl = queue.heldLocally ? queue.heldLease : giveWay > 0 ? giveWay : -1;
      let tryNow = !queue.heldLocally && giveWay === 0;
      queue.heldLocally = false;
      for (let attempt = 0; ; attempt += 1) {
        this.assertOpen(name); // shutdown may have ended the wait while it was subscribing
        if (stop.signal.aborted) return null;
        if (tryNow) {
          const result = await this.attempt(name, key, options, keepOnShutdown);
          if (result instanceof Handle) {
            queue.heldLocally = true;
            queue.heldLease = result.lock.leaseMs;
            return result;
          }
          ttl = result;
        }
        tryNow = true;
        const remaining = deadline - now();
        if (remaining <= 0) return null;
        // Listening: sleep until a release is heard, or the holder's lease ends. Not listening
        // (the subscription failed): poll with a short back-off, never past the lease either.
        // PTTL 0 is a lease with under a millisecond left (retry right after it), -1 a key with no
        // expiry at all (only a release can free it), -2 a key already gone (retry at once).
        const lease = ttl === -1 ? Infinity : Math.max(0, ttl) + 1;
        const sleep = watch.listening ? lease : Math.min(lease, backoff(attempt));
        await watch.wait(Math.min(remaining, sleep), stop.signal);
        this.assertOpen(name);
      }
    } finally {
      this.waits.delete(stop);
      cancel?.removeEventListener('abort', abort);
      queue.leave(place);
      if (queue.empty && this.queues.get(key) === queue) {
        this.queues.delete(key);
        void queue.watch.then((watch) => watch.close());
      }
    }
  }

  /**
   * This process released `key` while other processes were waiting for it. Left alone, its own
   * next attempt (a local waiter, or the releasing code coming straight back) would reach Redis
   * before their woken waiters do, every time: the lock would never leave the process. So for
   * GIVE_WAY_MS local attempts hold back, unless a release is heard first.
   */
  private giveWay(key: string): void {
    if (this.givingWayUntil.size >= 1_024) {
      const at = now();
      for (const [k, until] of this.givingWayUntil) if (until <= at) this.givingWayUntil.delete(k);
    }
    this.givingWayUntil.set(key, now() + GIVE_WAY_MS);
    const queue = this.queues.get(key);
    if (queue) this.scope.outside(() => queue.wake(GIVE_WAY_MS)); // its timer belongs to no caller
  }

  /** ms left of giving way on `key` (0: none). */
  private givingWay(key: string): number {
    const until = this.givingWayUntil.get(key);
    if (until === undefined) return 0;
    const left = until - now();
    if (left > 0) return left;
    this.givingWayUntil.delete(key);
    return 0;
  }

  private assertOpen(name: string): void {
    if (this.closing) throw new DisLockError(`Cannot acquire lock "${name}": the application is shutting down`);
  }
}

/**
 * A store failure as the caller sees it. The message may reach an HTTP client (Nest 11's default
 * filter sends it as the body), so it says only what failed: the store's own error, which can name
 * the server's address or the connection error, stays in `cause`, for logs.
 */
function redisFailed(operation: 'acquire' | 'release', name: string, error: unknown): RedisUnavailableError {
  const why =
    error instanceof StoreTimeoutError ? `Redis did not answer within ${error.timeoutMs} ms` : 'Redis is unavailable';
  return new RedisUnavailableError(operation, name, `Could not ${operation} lock "${name}": ${why}`, { cause: error });
}

function leaseOf(options: ResolvedLockOptions): number {
  return options.expire > 0 ? options.expire : options.lockWatchdogTimeout;
}

/**
 * How long a process that released a lock other processes wait for holds back its own next attempt:
 * long enough for a woken waiter elsewhere to hear the release and reach Redis (a round trip and a
 * turn of its event loop), short enough to cost little when none does.
 */
const GIVE_WAY_MS = 3;

/** Poll back-off while the release channel is not heard: 5, 10, 20, 40, 80, then 100 ms, each +-50 %. */
function backoff(attempt: number): number {
  return Math.min(100, 5 * 2 ** Math.min(attempt, 8)) * (0.5 + Math.random());
}
