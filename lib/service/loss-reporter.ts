import type { Logger } from '@nestjs/common';
import { describeError } from '../errors/describe-error';
import type { HeldLock } from '../core/lock-handle';
import type { LockLostEvent, LockLostHandler } from '../events/lock-lost.event';
import type { LockScope } from '../core/lock-scope';
import { isPromiseLike } from '../core/promise-like';
import type { LockLostError } from '../errors';
import type { LockEvents } from '../events/lock-events';
import type { ResolvedModuleOptions } from '../options/dislock.options';

/** Tells the holder of a lock that it is lost: its signal, its `onLockLost` hooks, or the log. */
export class LossReporter {
  constructor(
    private readonly options: ResolvedModuleOptions,
    private readonly logger: Logger,
    private readonly scope: LockScope,
    private readonly events: LockEvents,
  ) {}

  /**
   * Abort the lock's signal and call the `onLockLost` hooks, or log when there are none. Never
   * throws. Runs outside every lock scope: whichever call noticed the loss (a timer, a release
   * elsewhere in the code), the listeners and hooks must not see that call's locks as their own.
   */
  announce(lock: HeldLock, error: LockLostError): void {
    this.scope.outside(() => this.tell(lock, error));
  }

  private tell(lock: HeldLock, error: LockLostError): void {
    lock.controller.abort(error);
    if (this.events.listens('lost'))
      this.events.emit('lost', lock.eventBase, { owner: lock.owner, reason: error.reason });
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
}
