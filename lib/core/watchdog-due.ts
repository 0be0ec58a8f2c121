/** What is due next for a lock the watchdog keeps. */
export type WatchdogDue =
  /** Renew it (a watchdog lock, between renewals). */
  | 'renew'
  /** Check that Redis still has it (a fixed lease: verified on the renewal schedule, never extended). */
  | 'check'
  /** Its lease ends: the fixed `expire`, the last lease after `maxRenewTimes`, or a lease that ran out while renewing. */
  | 'expired'
  | 'max-renewals'
  | 'lease-expired';
