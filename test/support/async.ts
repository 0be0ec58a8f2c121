import { LockLostError } from 'nestjs-dislock';

/** The signal's reason once it aborts, or `undefined` if it does not abort within `ms`. */
export async function abortReason(signal: AbortSignal, ms: number): Promise<unknown> {
  if (signal.aborted) return signal.reason;
  let timer: NodeJS.Timeout | undefined;
  let listener: (() => void) | undefined;
  try {
    return await new Promise<unknown>((resolve) => {
      listener = () => resolve(signal.reason);
      signal.addEventListener('abort', listener, { once: true });
      timer = setTimeout(() => resolve(undefined), ms);
    });
  } finally {
    clearTimeout(timer);
    if (listener) signal.removeEventListener('abort', listener);
  }
}

/** The `LockLostError.reason` of an abort reason, or `undefined` for anything else. */
export function lostReason(reason: unknown): string | undefined {
  return reason instanceof LockLostError ? reason.reason : undefined;
}

/** A promise with its resolve function, to hold code inside its lock until the test lets go. */
export function gate(): { promise: Promise<void>; open: () => void } {
  let open!: () => void;
  const promise = new Promise<void>((resolve) => (open = resolve));
  return { promise, open };
}

/** Settles `promise` and reports how, and after how many ms. */
export async function settle<T>(
  promise: Promise<T>,
): Promise<{ ok: true; value: T; ms: number } | { ok: false; error: unknown; ms: number }> {
  const started = performance.now();
  try {
    const value = await promise;
    return { ok: true, value, ms: performance.now() - started };
  } catch (error) {
    return { ok: false, error, ms: performance.now() - started };
  }
}

/**
 * Polls `check` every `everyMs` until it returns a value other than `undefined` or `false`, and
 * returns it; throws after `timeoutMs`, naming `what` and the last error `check` threw.
 */
export async function waitFor<T>(
  check: () => Promise<T | undefined | false>,
  timeoutMs: number,
  what: string,
  everyMs = 20,
): Promise<T> {
  const deadline = Date.now() + timeoutMs;
  let last: unknown;
  for (;;) {
    try {
      const value = await check();
      if (value !== undefined && value !== false) return value;
    } catch (error) {
      last = error;
    }
    if (Date.now() >= deadline) {
      const detail = last instanceof Error ? ` (last error: ${last.message})` : '';
      throw new Error(`Timed out after ${timeoutMs} ms waiting for ${what}${detail}`);
    }
    await new Promise((resolve) => setTimeout(resolve, everyMs));
  }
}

/** What a function threw (synchronously). */
export function thrown(fn: () => unknown): unknown {
  try {
    fn();
  } catch (error) {
    return error;
  }
  return undefined;
}
