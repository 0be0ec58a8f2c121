/**
 * How soon a client the module creates tries again after Redis goes away: 50 ms, doubling to 400 ms,
 * with at most a tenth more at random (ioredis 6's own default waits 50-250 ms before the first
 * attempt and backs off to 5.2 s). Read from the delays ioredis announces with each `reconnecting`,
 * against a redis-server this test starts and kills.
 */
import { Logger } from '@nestjs/common';
import type { RedisConnection } from '../lib/options/dislock.options';
import { closeRedis, connectRedis } from '../lib/store/redis/redis-client';
import { RedisServer } from './support/redis-server';
import { eventually } from './support/shared-redis';

/** The delays announced while the server stays down for `downMs`, then the client closed. */
async function delaysWhileDown(connection: RedisConnection, server: RedisServer, downMs: number): Promise<number[]> {
  const logger = new Logger('reconnect-test');
  vi.spyOn(logger, 'warn').mockImplementation(() => undefined);
  const { client } = connectRedis(connection, logger);
  const delays: number[] = [];
  try {
    expect(await eventually(() => client.status === 'ready', 5_000)).toBe(true);
    client.on('reconnecting', (delay: number) => delays.push(delay));
    await server.stop();
    await new Promise((resolve) => setTimeout(resolve, downMs));
    return delays;
  } finally {
    await closeRedis(client, 100);
  }
}

describe('reconnecting after Redis goes away', () => {
  let server: RedisServer;
  beforeEach(async () => {
    server = await RedisServer.start();
  });
  afterEach(async () => {
    await server.dispose();
  });

  it('a created client retries after 50 ms, doubling, never more than 440 ms apart', async () => {
    const delays = await delaysWhileDown(server.url, server, 2_500);
    // 50, 100, 200 and then 400 ms (+ up to a tenth) fit 7 times in 2.5 s; ioredis 6's default
    // would have announced 1,600 ms and more by then, and waited up to 250 ms before the first.
    expect(delays.length).toBeGreaterThanOrEqual(6);
    const base = [50, 100, 200, 400];
    delays.forEach((delay, attempt) => {
      const expected = base[Math.min(attempt, base.length - 1)];
      expect(delay).toBeGreaterThanOrEqual(expected);
      expect(delay).toBeLessThanOrEqual(expected * 1.1);
    });
  });

  it("the application's own retryStrategy wins", async () => {
    const delays = await delaysWhileDown(
      { host: '127.0.0.1', port: server.port, retryStrategy: () => 30 },
      server,
      300,
    );
    expect(delays.length).toBeGreaterThanOrEqual(3);
    expect(new Set(delays)).toEqual(new Set([30]));
  });
});
