/**
 * Someone else's key at a lock's name (issue 23, "bad input named"): a string, a list... where the
 * library keeps a lock hash, or where it counts the fencing tokens of the lock's slot. Such a lock
 * was read as "held by another owner" forever (tryLock null, a waiter waiting out its whole
 * waitTime). Now every acquisition fails at once with LockKeyConflictError, which names the key
 * and its type, and leaves the foreign key as it was.
 */
import type { Redis } from 'ioredis';
import { LockKeyConflictError, RedisUnavailableError } from 'nestjs-dislock';
import { fenceKeyFor } from '../lib/store/redis/fence-key';
import { createTestApp, type TestApp } from './support/app';
import { sharedClient } from './support/shared-redis';

const rejection = (promise: Promise<unknown>): Promise<unknown> =>
  promise.then(
    () => new Error('resolved'),
    (error: unknown) => error,
  );

describe('a key of another type where a lock lives', () => {
  let t: TestApp;
  let redis: Redis;

  beforeAll(async () => {
    redis = sharedClient();
    t = await createTestApp();
  });

  afterAll(async () => {
    await t?.close();
    redis?.disconnect();
  });

  it('a string at the lock name: tryLock, a waiting lock, a reader and a permit fail at once, naming the key and its type', async () => {
    const key = `${t.prefix}foreign`;
    await redis.set(key, 'someone else');
    const started = performance.now();
    const attempts = [
      t.locks.tryLock('foreign'),
      t.locks.lock('foreign', { waitTime: 10_000 }),
      t.locks.tryLock('foreign', { mode: 'read' }),
      t.locks.tryLock('foreign', { permits: 3, waitTime: 10_000 }),
    ];
    for (const attempt of attempts) {
      const error = await rejection(attempt);
      expect(error).toBeInstanceOf(LockKeyConflictError);
      expect(error).toBeInstanceOf(RedisUnavailableError); // answered 503, handled as a store failure
      expect((error as LockKeyConflictError).key).toBe(key);
      expect((error as LockKeyConflictError).keyType).toBe('string');
      expect((error as Error).message).toContain(`the Redis key "${key}" holds a string`);
      expect((error as Error).message).toContain('keyPrefix');
    }
    expect(performance.now() - started).toBeLessThan(5_000); // not the waitTime of 10 s
    // An operator asking about it hears the same, not "held by 0 holders".
    const inspected = await rejection(t.locks.inspect('foreign'));
    expect(inspected).toBeInstanceOf(LockKeyConflictError);
    expect((inspected as Error).message).toMatch(/^Could not inspect lock "foreign": the Redis key/);
    expect(await redis.get(key)).toBe('someone else');
  });

  it('a list at the fencing counter of the lock slot: fails, and writes no hold', async () => {
    const key = `${t.prefix}fenced`;
    const fence = fenceKeyFor(t.prefix, key);
    await redis.rpush(fence, 'x');
    try {
      const error = await rejection(t.locks.tryLock('fenced'));
      expect(error).toBeInstanceOf(LockKeyConflictError);
      expect((error as LockKeyConflictError).key).toBe(fence);
      expect((error as LockKeyConflictError).keyType).toBe('list');
      expect(await redis.exists(key)).toBe(0);
    } finally {
      await redis.del(fence);
    }
    // The counter gone, the same lock is taken as ever.
    const handle = await t.locks.tryLock('fenced');
    expect(handle).not.toBeNull();
    expect(await handle?.release()).toBe(true);
  });
});
