/**
 * How much sooner than Redis a holder counts its lease as ended: 2 ms + 1 % of the lease. Redis
 * keeps expiry times in whole milliseconds (a lease can end up to 1 ms before this process's
 * sub-millisecond clock says), and a timer set for the end fires a little late; the margin keeps a
 * loss reported before another owner can take the lock. See `leaseValidUntil` (core/lock-handle.ts).
 */
export function leaseMarginMs(leaseMs: number): number {
  return 2 + leaseMs / 100;
}

/**
 * What a lease must leave beyond its margin: the acquisition's own round trip has to fit in it
 * (the lease starts counting when the command is sent), and Redis counts in whole milliseconds.
 */
const LEASE_HEADROOM_MS = 1;

/**
 * The shortest lease (`expire`, `lockWatchdogTimeout`) that can be honoured: the smallest whole
 * number of ms that outlasts its own margin by a millisecond. A shorter one would count as ended
 * before its acquisition is even answered, so a free lock would always look taken.
 */
export const MIN_LEASE_MS = ((): number => {
  let lease = 1;
  while (lease - leaseMarginMs(lease) < LEASE_HEADROOM_MS) lease += 1;
  return lease;
})();
