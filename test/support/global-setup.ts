import { RedisServer } from './redis-server';

/**
 * One shared redis-server for the whole run (unless REDIS_URL names one); suites isolate by key
 * prefix. The URL reaches the test processes through the environment they are started with.
 */
export async function setup(): Promise<() => Promise<void>> {
  if (process.env.REDIS_URL) {
    process.env.DISLOCK_TEST_REDIS_URL = process.env.REDIS_URL;
    return async () => undefined;
  }
  const server = await RedisServer.start();
  process.env.DISLOCK_TEST_REDIS_URL = server.url;
  return () => server.dispose();
}
