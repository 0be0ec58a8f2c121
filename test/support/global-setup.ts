import { RedisServer } from './redis-server';

declare global {
  var __DISLOCK_REDIS__: RedisServer | undefined;
}

/** One shared redis-server for the whole run (unless REDIS_URL names one); suites isolate by key prefix. */
export default async function globalSetup(): Promise<void> {
  if (process.env.REDIS_URL) {
    process.env.DISLOCK_TEST_REDIS_URL = process.env.REDIS_URL;
    return;
  }
  const server = await RedisServer.start();
  globalThis.__DISLOCK_REDIS__ = server;
  process.env.DISLOCK_TEST_REDIS_URL = server.url;
}
