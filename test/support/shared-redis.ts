import { randomBytes } from 'node:crypto';
import { Redis } from 'ioredis';

/** URL of the run's shared Redis (started by the global setup, or REDIS_URL). */
export function sharedRedisUrl(): string {
  const url = process.env.DISLOCK_TEST_REDIS_URL;
  if (!url) throw new Error('DISLOCK_TEST_REDIS_URL is not set: run the tests through vitest (npm test)');
  return url;
}

/** A key prefix no other test uses, so suites can share one Redis. */
export function uniquePrefix(label = 't'): string {
  return `dislock-test:${label}:${randomBytes(4).toString('hex')}:`;
}

/** A client on the shared Redis, for assertions on what it holds. */
export function sharedClient(): Redis {
  const client = new Redis(sharedRedisUrl(), { maxRetriesPerRequest: 1 });
  client.on('error', () => undefined);
  return client;
}

export const sleep = (ms: number): Promise<void> => new Promise((resolve) => setTimeout(resolve, ms));

/** Poll `check` until it returns true or `timeoutMs` passes; returns whether it became true. */
export async function eventually(
  check: () => boolean | Promise<boolean>,
  timeoutMs = 2_000,
  everyMs = 10,
): Promise<boolean> {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    if (await check()) return true;
    if (Date.now() >= deadline) return false;
    await sleep(everyMs);
  }
}
