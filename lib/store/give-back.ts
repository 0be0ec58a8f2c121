/** The first retry of a give-back whose release failed comes this long after; later ones double, up to a second. */
const FIRST_RETRY_MS = 50;
const LAST_RETRY_MS = 1_000;

/**
 * Give back a hold its caller will not use (see `LockStore.giveBack`): `release` now, and again
 * while it fails (the store does not answer), until a lease of `leaseMs` taken now would have
 * ended anyway, or `stopped()` (the store was closed). Resolves once the first try has settled;
 * never rejects. The release is owner-checked, so a try that comes late can never touch a lock
 * another owner took meanwhile.
 */
export function giveBackHold(release: () => Promise<unknown>, leaseMs: number, stopped: () => boolean): Promise<void> {
  const until = performance.now() + leaseMs;
  let delay = FIRST_RETRY_MS;
  const retry = (): void => {
    if (stopped() || performance.now() + delay >= until) return;
    const timer = setTimeout(() => void release().catch(retry), delay);
    timer.unref();
    delay = Math.min(delay * 2, LAST_RETRY_MS);
  };
  return release().then(
    () => undefined,
    () => retry(),
  );
}
