import { createHook } from 'node:async_hooks';

export interface TrackedTimer {
  readonly timer: NodeJS.Timeout;
  /** Where it was created (30 frames). */
  readonly stack: string;
}

/** Records the timers created from now on; `pending()` lists those not yet fired or cleared. */
export function trackTimers(): { pending(): TrackedTimer[]; stop(): void } {
  const live = new Map<number, TrackedTimer>();
  const stackLimit = Error.stackTraceLimit;
  Error.stackTraceLimit = 30;
  const hook = createHook({
    init(id, type, _trigger, resource) {
      if (type === 'Timeout') live.set(id, { timer: resource as NodeJS.Timeout, stack: new Error().stack ?? '' });
    },
    destroy(id) {
      live.delete(id);
    },
  }).enable();
  return {
    pending: () => [...live.values()].filter(({ timer }) => !(timer as unknown as { _destroyed?: boolean })._destroyed),
    stop: () => {
      hook.disable();
      Error.stackTraceLimit = stackLimit;
    },
  };
}
