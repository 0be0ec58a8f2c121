/** Settings of one instance of the sample app. */
export interface AppConfig {
  /** The Redis every instance shares: the locks and the stock counters live there. */
  readonly redisUrl: string;
  /** Name of this instance, echoed in answers so you can see which one did the work. */
  readonly instance: string;
  /** Namespace of every Redis key the app writes; locks go under `${keyPrefix}lock:`. */
  readonly keyPrefix: string;
  /**
   * Lease (ms) of the locks the watchdog renews (no `expire`). The library's default is 30 s;
   * the sample uses 1.5 s so that you can watch the lease being renewed.
   */
  readonly lockWatchdogTimeout: number;
  /** How long a payment takes (ms): stands in for the call to a payment provider. */
  readonly payWorkMs: number;
  /** Steps of the report job, and the length of each (ms). By default it runs 3x the lease. */
  readonly reportSteps: number;
  readonly reportStepMs: number;
  /**
   * Time (ms) between reading stock counters and writing them back, in a reservation or a
   * transfer: the window of a lost update.
   */
  readonly reserveWorkMs: number;
  /**
   * Time (ms) to read or write one price of a price list: stands in for a database round trip, and
   * makes a repricing last long enough that a reader could catch it half-done without the lock.
   */
  readonly priceStepMs: number;
  /** How long a report export takes (ms). By default longer than the lease: the watchdog renews each permit. */
  readonly exportWorkMs: number;
}

/** What `AppModule.forRoot` takes: everything but the Redis URL and the instance name is optional. */
export type AppConfigInput = Pick<AppConfig, 'redisUrl' | 'instance'> & Partial<AppConfig>;

/** Injection token of the resolved `AppConfig`. */
export const APP_CONFIG = Symbol('APP_CONFIG');

export function resolveConfig(input: AppConfigInput): AppConfig {
  const lockWatchdogTimeout = input.lockWatchdogTimeout ?? 1_500;
  const reportSteps = input.reportSteps ?? 12;
  return {
    redisUrl: input.redisUrl,
    instance: input.instance,
    keyPrefix: input.keyPrefix ?? 'sample:',
    lockWatchdogTimeout,
    payWorkMs: input.payWorkMs ?? 500,
    reportSteps,
    reportStepMs: input.reportStepMs ?? Math.ceil((3 * lockWatchdogTimeout) / reportSteps),
    reserveWorkMs: input.reserveWorkMs ?? 20,
    priceStepMs: input.priceStepMs ?? 50,
    exportWorkMs: input.exportWorkMs ?? 2 * lockWatchdogTimeout,
  };
}
