import { Handle, HeldLock, leaseValidUntil } from '../core/lock-handle';
import type { LockScope } from '../core/lock-scope';
import { LockSet } from '../core/lock-set';
import { OwnerIds } from '../core/owner-ids';
import { InvalidLockOptionsError, LockUpgradeError } from '../errors';
import type { LockEvents, LockEventSubject } from '../events/lock-events';
import { hostname } from 'node:os';
import {
  eventSubjectOf,
  type ResolvedLockOptions,
  type ResolvedModuleOptions,
  shareOf,
} from '../options/dislock.options';
import type { LockStore } from '../store/lock-store.interface';
import { ForeignKeyError, SlotMigratingError, StoreDisconnectedError, wasHandedOver } from '../store/store-errors';
import type { HeldLocks } from './held-locks';
import { redisFailed } from './redis-failed';
import type { ShutdownGate } from './shutdown-gate';
import type { Attempter, WaitLine } from './wait-line';
import type { HandOver, LineSeat } from './wait-queue';

const now = (): number => performance.now();

/** A waiter whose attempt met a Cluster slot migrating for a whole operationTimeout looks again this much later. */
const MIGRATING_LOOK_MS = 100;

function leaseOf(options: ResolvedLockOptions): number {
  return options.expire > 0 ? options.expire : options.lockWatchdogTimeout;
}

/**
 * Taking a lock: re-entering a hold the caller's async call chain already has, one attempt against
 * the store when nobody here waits for the key, otherwise a place in the wait line.
 */
export class Acquisition implements Attempter {
  private readonly ownerIds = new OwnerIds();
  /** The part of every holder's description that never changes: where this application runs. */
  private readonly identity: string;
  /** The description of a holder with neither label nor caller: the identity alone. */
  private readonly plainDescription: string;
  /** The description of each `@DisLock` method's options, made on its first attempt. */
  private readonly descriptions = new WeakMap<ResolvedLockOptions, string>();

  constructor(
    private readonly options: ResolvedModuleOptions,
    private readonly store: LockStore,
    private readonly scope: LockScope,
    private readonly held: HeldLocks,
    private readonly line: WaitLine,
    private readonly gate: ShutdownGate,
    private readonly events: LockEvents,
  ) {
    const identity = JSON.stringify({ host: hostname(), pid: process.pid, app: options.appName });
    this.identity = identity.slice(1, -1);
    this.plainDescription = `{${this.identity}}`;
  }

  /**
   * The holder's description for `inspect` (JSON): where it runs, and what took the lock. Made once
   * per `@DisLock` method (its options are resolved once, with the method as `caller`), not on
   * every attempt; a `LockService` call's options are resolved per call, so its label is written
   * per call.
   */
  private describe(options: ResolvedLockOptions): string {
    if (options.caller === undefined) {
      return options.label === undefined ? this.plainDescription : this.describeNow(options);
    }
    let description = this.descriptions.get(options);
    if (description === undefined) {
      description = this.describeNow(options);
      this.descriptions.set(options, description);
    }
    return description;
  }

  private describeNow(options: ResolvedLockOptions): string {
    return `{${this.identity},${JSON.stringify({ label: options.label, caller: options.caller }).slice(1)}`;
  }

  /**
   * Resolves `null` when the lock is still busy after `waitTime` or `cancel` aborted the wait;
   * rejects when Redis fails or the application is shutting down. Tracked while under way, so
   * that shutdown can wait for it.
   */
  async acquire(
    name: string,
    options: ResolvedLockOptions,
    keepOnShutdown: boolean,
    cancel?: AbortSignal,
  ): Promise<Handle | null> {
    const startedAt = now();
    const progress = { waited: false };
    this.gate.enter();
    try {
      const key = this.keyOf(name, options);
      let handle: Handle | null;
      if (cancel?.aborted) {
        handle = null;
      } else if (options.waitTime === 0 && !this.scope.find(key) && !this.line.leaving(key)) {
        // The common case, without one more async function: one attempt, with no hold of the
        // caller's own to re-enter and no leave of the key's line on its way.
        const only = await this.attempt(name, key, options, keepOnShutdown, undefined, undefined, undefined, startedAt);
        handle = only instanceof Handle ? only : null;
      } else {
        handle = await this.acquireNow(name, key, options, keepOnShutdown, cancel, progress, startedAt);
      }
      if (handle && cancel?.aborted) {
        // The caller gave up while the attempt that took the lock was on its way: it will not use
        // the lock, so it goes back at once.
        await this.held.abandon(handle);
        handle = null;
      }
      if (handle) {
        if (this.events.listens('acquired')) {
          const { lock } = handle;
          this.events.emit('acquired', lock.eventBase, {
            owner: lock.owner,
            fencingToken: lock.fencingToken,
            reentrant: handle.reentrant,
            waited: progress.waited,
            waitedMs: now() - startedAt,
          });
        }
      } else if (this.events.listens('busy')) {
        this.events.emit('busy', this.eventBase(name, options), {
          waited: progress.waited,
          waitedMs: now() - startedAt,
        });
      }
      return handle;
    } finally {
      this.gate.leave();
    }
  }

  /**
   * Every lock of `names` (distinct, sorted: the canonical order), one after another, each waiting
   * within what is left of the one `waitTime`; all or nothing: when one stays busy or Redis fails,
   * the parts already taken are released before this resolves `null` or rejects.
   */
  async acquireAll(
    names: readonly string[],
    options: ResolvedLockOptions,
    keepOnShutdown: boolean,
    cancel?: AbortSignal,
  ): Promise<LockSet | null> {
    const deadline = now() + options.waitTime;
    // Parts of a set that was never held whole: no code ran under them, so none is kept for lockAtLeastFor.
    const giveBack = (parts: readonly Handle[]): Promise<unknown> =>
      Promise.all(parts.map((part) => this.held.abandon(part)));
    for (;;) {
      const parts: Handle[] = [];
      try {
        for (const name of names) {
          const waitTime = Math.max(0, Math.ceil(deadline - now()));
          const handle = await this.acquire(name, { ...options, waitTime }, keepOnShutdown, cancel);
          if (!handle) break;
          parts.push(handle);
        }
      } catch (error) {
        await giveBack(parts);
        throw error;
      }
      if (parts.length === names.length && parts.every((part) => part.lock.state === 'held')) {
        return new LockSet(parts, this.held);
      }
      // Busy past the waitTime; or a part was lost while a later one was waited for, so the set
      // was never held whole: give every part back, and try again while there is time.
      await giveBack(parts);
      if (parts.length < names.length || deadline - now() <= 0 || cancel?.aborted) return null;
    }
  }

  /** The key of the lock `name`; throws when the application is shutting down, or `name` or `options` are refused. */
  private keyOf(name: string, options: ResolvedLockOptions): string {
    this.gate.assertOpen(name);
    for (const reserved of this.store.reservedPrefixes) {
      if (!name.startsWith(reserved)) continue;
      throw new InvalidLockOptionsError(
        'name',
        `Lock names starting with "${reserved}" are reserved for the library's own keys, got "${name}"`,
      );
    }
    if (options.permits > 0 && !this.store.boundsShares) {
      throw new InvalidLockOptionsError(
        'permits',
        `Lock "${name}": semaphores ("permits") are not offered over Redlock, whose nodes each count their own holders (more than "permits" could each win a majority); use a single Redis, Sentinel or a Cluster`,
      );
    }
    return this.options.keyPrefix + name;
  }

  /** Every other case: re-entering the caller's own hold, after a leave of the key's line, or waiting. */
  private async acquireNow(
    name: string,
    key: string,
    options: ResolvedLockOptions,
    keepOnShutdown: boolean,
    cancel: AbortSignal | undefined,
    progress: { waited: boolean },
    startedAt: number,
  ): Promise<Handle | null> {
    const deadline = startedAt + options.waitTime;
    const outer = this.scope.find(key)?.lock;
    if (outer) {
      // A shared hold cannot become exclusive: the call would wait for itself.
      if (outer.shared && shareOf(options) === undefined) {
        throw new LockUpgradeError(name, outer.options.permits > 0 ? 'permit' : 'read');
      }
      // Inside the outer holder's call chain: only re-enter its hold (the lease stays the outer's).
      const handle = await this.reenter(outer);
      if (handle) return handle;
    }
    const leaving = this.line.leaving(key);
    if (leaving) await leaving; // this process just left the key's line: that goes first (see WaitLine.leaving)
    // This caller will not wait: one attempt, without a place in the line (a free lock with
    // waiters ahead of it is busy for it too).
    if (options.waitTime === 0) {
      const only = await this.attempt(name, key, options, keepOnShutdown);
      return only instanceof Handle ? only : null;
    }
    // Nobody here waits for it: one attempt straight away, which takes a place in the lock's line
    // if the lock is busy. Otherwise join the local line, so that a newcomer cannot take the lock
    // from under waiters that came first.
    if (!this.line.hasWaiters(key)) {
      const place = this.line.newSeat(shareOf(options) !== undefined);
      const first = await this.attempt(name, key, options, keepOnShutdown, place, deadline);
      if (first instanceof Handle) return first;
      place.inLine = true;
      if (deadline - now() <= 0 || cancel?.aborted) {
        this.line.leave(key, place.id);
        return null;
      }
      this.waiting(name, options, progress);
      return this.line.wait(this, name, key, options, keepOnShutdown, deadline, cancel, { place, ttl: first });
    }
    this.waiting(name, options, progress);
    return this.line.wait(this, name, key, options, keepOnShutdown, deadline, cancel);
  }

  /** The acquisition goes on to wait for the lock. */
  private waiting(name: string, options: ResolvedLockOptions, progress: { waited: boolean }): void {
    progress.waited = true;
    if (this.events.listens('waiting')) {
      this.events.emit('waiting', this.eventBase(name, options), { waitTime: options.waitTime });
    }
  }

  private eventBase(name: string, options: ResolvedLockOptions): LockEventSubject {
    return eventSubjectOf(name, this.options.keyPrefix + name, options);
  }

  /**
   * Re-enter the outer holder's hold: one more local hold on the same lock, nothing new in Redis
   * (a writer taking the read lock, a permit holder asking again: the outer hold serves).
   * The hold is counted before Redis is asked whether the owner still has the lock, so that the
   * outer's release meanwhile leaves the lock in place for it. `undefined` when the lock has gone
   * (the outer has lost it, or its lease may have ended): this acquisition competes as a newcomer.
   */
  private async reenter(outer: HeldLock): Promise<Handle | undefined> {
    if (now() >= outer.leaseEndsAt) return undefined; // the watchdog reports the loss on its tick
    outer.holds += 1;
    const handle = new Handle(outer, true, this.held);
    let result;
    try {
      result = await this.store.check(outer.key, outer.owner);
    } catch (error) {
      await this.held.finish(handle, true);
      throw redisFailed('acquire', outer.name, error);
    }
    if (!result.held) {
      this.held.lose(outer, 'not-owner', 'a reentrant acquisition found it gone or held by another owner');
    }
    if (outer.state === 'held' && now() < outer.leaseEndsAt) return handle;
    await this.held.finish(handle, true);
    return undefined;
  }

  /**
   * One fresh attempt: the handle, or when the lock is busy the holder's remaining lease in ms (or,
   * free with others ahead in its line, how long their head has to take it; -3 when unknown).
   * With a `seat` (a waiting line's place in the store's line), the attempt keeps that place, or
   * takes up a grant to it (a release handed the lock to the head of the line): either way the hold
   * starts on the store's reply, with the caller's own lease counted from when the attempt was sent.
   * With a `handOver` (a finished holder's offer, of the kind this attempt asks for), the attempt
   * takes that holder's hold over in the same step, and tells the holder how it went.
   */
  async attempt(
    name: string,
    key: string,
    options: ResolvedLockOptions,
    keepOnShutdown: boolean,
    seat?: LineSeat,
    until?: number,
    handOver?: HandOver,
    /** A clock reading taken just before, to count the lease from (earlier than the send: safe). */
    sentAt = now(),
  ): Promise<Handle | number> {
    const share = shareOf(options);
    const owner = this.ownerIds.next(share !== undefined);
    const lease = leaseOf(options);
    let result;
    try {
      result = await this.store.acquire(key, owner, lease, {
        waiter: seat?.id,
        share,
        describe: this.describe(options),
        retryUntil: until,
        from: handOver?.from,
      });
    } catch (error) {
      // Never sent, or refused by the script (someone else's key): the holder still holds, and
      // releases as usual. Handed over, then refused (the new hold's replicas fell short): the
      // holder's hold is gone. Otherwise it cannot be known (a slot migrating may still run a copy
      // the client held back): the store gives this owner's hold back, and the holder its own.
      const ranNot = error instanceof StoreDisconnectedError || error instanceof ForeignKeyError;
      handOver?.settle(wasHandedOver(error) ? 'handed-over' : ranNot ? 'declined' : { error });
      // The lock's Cluster slot was migrating for the whole operationTimeout (nothing ran): a
      // waiter with time left goes on waiting, and looks again shortly.
      if (error instanceof SlotMigratingError && until !== undefined && now() + MIGRATING_LOOK_MS < until) {
        return MIGRATING_LOOK_MS;
      }
      throw redisFailed('acquire', name, error);
    }
    // Only a hold the store says it replaced needs no release of its own.
    handOver?.settle(result.acquired && result.handedOver === true ? 'handed-over' : 'declined');
    if (!result.acquired) {
      if (seat) seat.missedAt = sentAt;
      // Free with others ahead in the line: look again once the head's turn has passed, if no
      // release (the head's) wakes this waiter before.
      return result.ttl === -3 && result.turnMs !== undefined ? Math.max(0, result.turnMs) : result.ttl;
    }
    const validMs = result.validMs ?? Infinity;
    // The answer came after the lease it granted may have ended in Redis: another owner may hold
    // the lock by now. Never hand that out: give the hold back (owner-checked) and count this
    // attempt as a miss.
    const late = now() >= Math.min(leaseValidUntil(sentAt, lease), sentAt + validMs);
    // Shutdown began while this acquisition was on its way: nobody would release the lock.
    if (late || this.gate.closing) return this.giveBackUnkept(name, key, owner, lease, late);
    return this.keep(name, key, owner, result.token, options, sentAt, keepOnShutdown, validMs);
  }

  /** Give back a hold just taken that is not kept: -2 (a miss) when its answer came late, else shutdown's error. */
  private async giveBackUnkept(
    name: string,
    key: string,
    owner: string,
    lease: number,
    late: boolean,
  ): Promise<number> {
    await this.store.giveBack(key, owner, lease);
    if (!late) this.gate.assertOpen(name);
    return -2;
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
    validMs: number,
  ): Handle {
    const lock = new HeldLock(name, key, owner, token, options, sentAt, keepOnShutdown, validMs);
    this.held.add(lock);
    return new Handle(lock, false, this.held);
  }
}
