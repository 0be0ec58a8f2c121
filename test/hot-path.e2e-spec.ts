/**
 * What an uncontended lock costs Redis (issue 22, "The hot path pays nothing for contention"):
 * counted with `INFO commandstats` on a redis-server of the suite's own, which counts every command
 * a script calls as well as the EVALSHA itself. Nothing here is timed: the counts are exact.
 *
 * One tryLock + release on a free lock that nobody waits for is 8 commands: the acquisition's
 * EVALSHA, one EXISTS of the lock and its line together, TIME and one SET ... GET for the fencing
 * token, HSET and PEXPIRE for the hold; the release's EVALSHA and one HDEL, which checks the owner,
 * drops the hold and its description, and says by its count that no waiting mark was there (see
 * WAITING_MARK). No PUBLISH (nobody listens), no second key per hold.
 *
 * The waiting mark is named after its holder, so that a release by someone who no longer holds the
 * lock (lost, released late) cannot drop the mark of the one who does: that holder's release must
 * still hand the lock to the waiter behind it at once.
 */
import { Injectable } from '@nestjs/common';
import type { Redis } from 'ioredis';
import { DisLock } from 'nestjs-dislock';
import { FENCE_MARKER } from '../lib/store/redis/fence-key';
import { WAITING_MARK } from '../lib/store/redis/scripts/line.lua';
import { createTestApp, type TestApp } from './support/app';
import { RedisServer } from './support/redis-server';
import { eventually } from './support/shared-redis';

const CYCLES = 200;

/** The commands of one uncontended tryLock + release, by name. */
const ONE_CYCLE = { evalsha: 2, exists: 1, time: 1, set: 1, hset: 1, pexpire: 1, hdel: 1 };

/**
 * A semaphore's permit (or a read lock): the same acquisition; its release drops the hold and
 * looks at the line (a shared hold carries no waiting mark): HDEL, then EXISTS.
 */
const ONE_SHARED_CYCLE = { evalsha: 2, exists: 2, time: 1, set: 1, hset: 1, pexpire: 1, hdel: 1 };

@Injectable()
class Orders {
  @DisLock({ key: 'order:{0}', expire: 10_000 })
  async pay(_id: number): Promise<string> {
    return 'paid';
  }
}

/** Calls per command since the last `CONFIG RESETSTAT`, without the ones the measurement sends. */
async function commandCalls(redis: Redis): Promise<Record<string, number>> {
  const calls: Record<string, number> = {};
  for (const line of (await redis.info('commandstats')).split('\r\n')) {
    const match = /^cmdstat_([^:]+):calls=(\d+),/.exec(line);
    if (match && !/^(config|info)/.test(match[1])) calls[match[1]] = Number(match[2]);
  }
  return calls;
}

const times = (per: Record<string, number>, n: number): Record<string, number> =>
  Object.fromEntries(Object.entries(per).map(([command, calls]) => [command, calls * n]));

describe('the uncontended hot path', () => {
  let server: RedisServer;
  let redis: Redis;
  let t: TestApp;

  beforeAll(async () => {
    server = await RedisServer.start();
    redis = server.client();
    t = await createTestApp([Orders], { redis: server.url, telemetry: false });
    // Load the scripts (the first call of each meets NOSCRIPT and sends EVAL).
    await (await t.locks.tryLock('warm-up', { expire: 10_000 }))?.release();
    await t.get(Orders).pay(0);
  });

  afterAll(async () => {
    await t?.close();
    redis?.disconnect();
    await server?.stop();
  });

  it(`one tryLock + release costs ${Object.values(ONE_CYCLE).reduce((a, b) => a + b)} Redis commands, no PUBLISH among them`, async () => {
    await redis.config('RESETSTAT');
    for (let i = 0; i < CYCLES; i += 1) {
      const handle = await t.locks.tryLock(`cycle:${i}`, { expire: 10_000 });
      expect(handle).not.toBeNull();
      expect(await handle?.release()).toBe(true);
    }
    expect(await commandCalls(redis)).toEqual(times(ONE_CYCLE, CYCLES));
    expect(await redis.keys(`${t.prefix}cycle:*`)).toEqual([]);
  });

  it(`one permit or read lock, taken and released, costs ${Object.values(ONE_SHARED_CYCLE).reduce((a, b) => a + b)} Redis commands`, async () => {
    await (await t.locks.tryLock('warm-up-shared', { permits: 2, expire: 10_000 }))?.release();
    await redis.config('RESETSTAT');
    for (let i = 0; i < CYCLES; i += 1) {
      const options = i % 2 === 0 ? { permits: 2 } : { mode: 'read' as const };
      const handle = await t.locks.tryLock(`shared-cycle:${i}`, { expire: 10_000, ...options });
      expect(handle).not.toBeNull();
      expect(await handle?.release()).toBe(true);
    }
    expect(await commandCalls(redis)).toEqual(times(ONE_SHARED_CYCLE, CYCLES));
    expect(await redis.keys(`${t.prefix}shared-cycle:*`)).toEqual([]);
  });

  it('an @DisLock method costs the same', async () => {
    await redis.config('RESETSTAT');
    for (let i = 1; i <= CYCLES; i += 1) expect(await t.get(Orders).pay(i)).toBe('paid');
    expect(await commandCalls(redis)).toEqual(times(ONE_CYCLE, CYCLES));
  });

  it('a held lock is one key in Redis: its hold and its description in one hash', async () => {
    const handles = await Promise.all(
      Array.from({ length: 100 }, (_, i) => t.locks.lock(`held:${i}`, { expire: 10_000 })),
    );
    try {
      const keys = (await redis.keys(`${t.prefix}*`)).filter((key) => !key.includes(FENCE_MARKER));
      expect(keys.sort()).toEqual(handles.map((handle) => handle.key).sort());
      for (const key of keys.slice(0, 5)) expect(await redis.type(key)).toBe('hash');
    } finally {
      await Promise.all(handles.map((handle) => handle.release()));
    }
  });

  it('a late release by a former holder leaves the waiting mark of the present one, whose release hands the lock on at once', async () => {
    const other = await createTestApp([], { redis: server.url, keyPrefix: t.prefix, telemetry: false });
    const listener = server.client();
    try {
      const name = 'marked';
      const key = `${t.prefix}${name}`;
      const former = await t.locks.lock(name, { expire: 30_000 });
      await t.locks.forceUnlock(name); // lost by `former`, who does not know yet
      const present = await other.locks.lock(name, { expire: 30_000 });
      const waiting = new Promise<void>((resolve) => t.locks.on('waiting', () => resolve()));
      const waiter = t.locks.lock(name, { expire: 30_000, waitTime: 20_000 });
      await waiting; // its attempt took its place, and marked the present hold
      expect(await redis.hget(key, `${WAITING_MARK}${present.owner}`)).toBe('1');

      expect(await former.release()).toBe(false);
      expect(await redis.hget(key, `${WAITING_MARK}${present.owner}`)).toBe('1');

      const announced: string[] = [];
      listener.on('message', (_channel: string, message: string) => announced.push(message));
      await listener.subscribe(key);
      expect(await present.release()).toBe(true);
      const next = await waiter;
      // The release granted the lock to the waiter's line, and said so (a token in the announcement,
      // which reaches this listener on a connection of its own, maybe after the waiter's).
      expect(await eventually(() => announced.length > 0, 2_000)).toBe(true);
      expect(announced).toHaveLength(1);
      expect(Number(announced[0].split(':').at(-1))).toBe(next.fencingToken);
      expect(await next.release()).toBe(true);
      expect(await redis.exists(key)).toBe(0);
    } finally {
      listener.disconnect();
      await other.close();
    }
  });
});
