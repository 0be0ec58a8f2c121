/**
 * Resolves `true` as soon as `start` calls the `wake` it is given, `false` after `ms` or when
 * `signal` aborts, whichever comes first. Never rejects. What `start` returns is called the moment
 * it settles, before anything else runs, so that a late `wake` finds nothing to call.
 */
export function wakeOrTimeout(
  ms: number,
  signal: AbortSignal,
  start: (wake: () => void) => (() => void) | void,
): Promise<boolean> {
  if (signal.aborted) return Promise.resolve(false);
  return new Promise((resolve) => {
    let settled = false;
    let cleanup: (() => void) | void = undefined;
    const done = (woken: boolean): void => {
      if (settled) return;
      settled = true;
      clearTimeout(timer);
      signal.removeEventListener('abort', stopped);
      cleanup?.();
      resolve(woken);
    };
    const stopped = (): void => done(false);
    const timer = setTimeout(stopped, ms);
    signal.addEventListener('abort', stopped, { once: true });
    cleanup = start(() => done(true));
    if (settled) cleanup?.();
  });
}

/**
 * A sleeper that a wake never misses: `wait` resolves at the next `wake` since the previous
 * `wait` (at once if one came in between), after `maxWaitMs`, or when `signal` aborts. What a
 * release watch is made of (the Redis store's and the memory store's).
 */
export class Wakeable {
  private pending = false;
  private wakeUp: (() => void) | undefined;

  async wait(maxWaitMs: number, signal: AbortSignal): Promise<void> {
    if (this.pending || signal.aborted) {
      this.pending = false;
      return;
    }
    await wakeOrTimeout(Math.max(1, maxWaitMs), signal, (wake) => {
      this.wakeUp = wake;
      return () => (this.wakeUp = undefined); // a wake from now on is kept as pending
    });
  }

  wake(): void {
    if (this.wakeUp) this.wakeUp();
    else this.pending = true;
  }

  /** Wake a `wait` in progress, without keeping a wake for the next one (the watch is closing). */
  protected wakeWaiting(): void {
    this.wakeUp?.();
  }
}
