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
