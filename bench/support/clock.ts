import { setTimeout as sleep } from 'node:timers/promises';

/**
 * Milliseconds on the system-wide monotonic clock (CLOCK_MONOTONIC on Linux). Every process on the
 * machine reads the same clock, so timestamps taken in different child processes can be compared.
 */
export function hr(): number {
  return Number(process.hrtime.bigint()) / 1e6;
}

export { sleep };

/** Sleep until `at` (an `hr()` time); returns at once when it is already past. */
export async function sleepUntil(at: number): Promise<void> {
  const delay = at - hr();
  if (delay > 0) await sleep(delay);
}

/** CPU time (user + system) of this process in µs. */
export function cpuMicros(): number {
  const { user, system } = process.cpuUsage();
  return user + system;
}
