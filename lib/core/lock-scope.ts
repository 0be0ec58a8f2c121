import { AsyncLocalStorage, AsyncResource } from 'node:async_hooks';
import type { Handle } from './lock-handle';

/** One link of the chain of locks held by the running async call chain, innermost first. */
interface ScopeLink {
  readonly handle: Handle;
  readonly parent: ScopeLink | undefined;
}

function isLive(handle: Handle): boolean {
  return handle.lock.state === 'held' && !handle.isReleased;
}

/**
 * Which locks the running async call chain holds: the Node counterpart of Redisson's
 * `uuid:threadId`. Code running inside a locked method or `withLock` callback sees the locks of
 * its callers; two independent calls never see each other's. One instance per `LockService`, so
 * two applications in one process never share it.
 */
export class LockScope {
  private readonly storage = new AsyncLocalStorage<ScopeLink>();
  private readonly home = new AsyncResource('DisLockScope');

  /**
   * Run `fn` with `handle` added to the current chain. Links of locks no longer held are dropped
   * on the way, so work that reschedules itself from inside its lock (a poller, a retry loop) does
   * not grow a chain of every lock it ever took.
   */
  run<T>(handle: Handle, fn: () => T): T {
    let parent = this.storage.getStore();
    while (parent && !isLive(parent.handle)) parent = parent.parent;
    return this.storage.run({ handle, parent }, fn);
  }

  /**
   * Run `fn` outside every chain: timers, listeners and connections made in it, and hooks called
   * from it, see no held lock, whoever's call happened to set them up.
   */
  outside<T>(fn: () => T): T {
    // The context this scope was made in (dependency injection, before any lock of it existed),
    // rather than `storage.exit()`, which turns the async hooks off and on again at every call.
    return this.home.runInAsyncScope(fn);
  }

  /** The innermost handle of the chain for `key` (any key when omitted) whose lock is still held. */
  find(key?: string): Handle | undefined {
    for (let link = this.storage.getStore(); link; link = link.parent) {
      const { handle } = link;
      if ((key === undefined || handle.key === key) && isLive(handle)) {
        return handle;
      }
    }
    return undefined;
  }
}
