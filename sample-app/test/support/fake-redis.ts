import { type Provider } from '@nestjs/common';
import { RedisService } from '../../src/redis.service';

/** What `multi()` returns: the commands the app queues, applied together by `exec()`. */
export interface FakeTransaction {
  set(key: string, value: string | number): FakeTransaction;
  del(...keys: string[]): FakeTransaction;
  sadd(key: string, ...members: string[]): FakeTransaction;
  rpush(key: string, ...values: string[]): FakeTransaction;
  ltrim(key: string, start: number, stop: number): FakeTransaction;
  exec(): Promise<[null, unknown][]>;
}

/**
 * The app's own data (stock counters, price lists, the digest), kept in memory: a stand-in for
 * the ioredis client of `RedisService` with just the commands the services call. It has nothing to
 * do with locks: those run on the library's real in-memory store (`DisLockTestingModule`).
 */
export class FakeRedisClient {
  readonly strings = new Map<string, string>();
  readonly lists = new Map<string, string[]>();
  readonly sets = new Map<string, Set<string>>();
  /**
   * ms each `exec()` takes before it writes (default 0): a slow or stuck Redis. It waits on the
   * global `setTimeout`, so fake timers move it.
   */
  execDelayMs = 0;
  /** Called at the start of each `exec()`, inside the caller's call chain (and lock). */
  onExec: (() => void) | undefined;

  async get(key: string): Promise<string | null> {
    return this.strings.get(key) ?? null;
  }

  async set(key: string, value: string | number): Promise<'OK'> {
    this.strings.set(key, String(value));
    return 'OK';
  }

  async mget(...keys: string[]): Promise<(string | null)[]> {
    return keys.map((key) => this.strings.get(key) ?? null);
  }

  async smembers(key: string): Promise<string[]> {
    return [...(this.sets.get(key) ?? [])];
  }

  async lrange(key: string, start: number, stop: number): Promise<string[]> {
    const list = this.lists.get(key) ?? [];
    return list.slice(start, stop === -1 ? undefined : stop + 1);
  }

  /** The app's data has no TTLs: -1 for a key it holds, -2 for one it does not (lock keys live in the lock store). */
  async pttl(key: string): Promise<number> {
    return this.strings.has(key) || this.lists.has(key) || this.sets.has(key) ? -1 : -2;
  }

  multi(): FakeTransaction {
    const queued: (() => unknown)[] = [];
    const transaction: FakeTransaction = {
      set: (key, value) => (queued.push(() => this.strings.set(key, String(value))), transaction),
      del: (...keys) => (queued.push(() => keys.forEach((key) => this.delete(key))), transaction),
      sadd: (key, ...members) => (queued.push(() => this.addToSet(key, members)), transaction),
      rpush: (key, ...values) => (queued.push(() => this.list(key).push(...values)), transaction),
      ltrim: (key, start, stop) => (queued.push(() => this.trim(key, start, stop)), transaction),
      exec: async () => {
        this.onExec?.();
        if (this.execDelayMs > 0) await new Promise((resolve) => setTimeout(resolve, this.execDelayMs));
        return queued.map((command): [null, unknown] => [null, command()]);
      },
    };
    return transaction;
  }

  private delete(key: string): void {
    this.strings.delete(key);
    this.lists.delete(key);
    this.sets.delete(key);
  }

  private addToSet(key: string, members: string[]): number {
    const set = this.sets.get(key) ?? new Set<string>();
    this.sets.set(key, set);
    const before = set.size;
    members.forEach((member) => set.add(member));
    return set.size - before;
  }

  private list(key: string): string[] {
    let list = this.lists.get(key);
    if (!list) this.lists.set(key, (list = []));
    return list;
  }

  /** LTRIM with Redis's negative indexes (the digest keeps `-100 .. -1`). */
  private trim(key: string, start: number, stop: number): 'OK' {
    const list = this.list(key);
    const from = start < 0 ? Math.max(0, list.length + start) : start;
    const to = stop < 0 ? list.length + stop : stop;
    this.lists.set(key, list.slice(from, to + 1));
    return 'OK';
  }
}

/** A stand-in for `RedisService`, backed by `client`: for `.overrideProvider(RedisService).useValue(...)`. */
export function fakeRedis(client = new FakeRedisClient()): Pick<RedisService, 'onApplicationShutdown'> & {
  client: FakeRedisClient;
} {
  return { client, onApplicationShutdown: async () => undefined };
}

/** `RedisService` for a test module, backed by `client` (one per app, or one shared by several apps). */
export function fakeRedisService(client = new FakeRedisClient()): Provider {
  return { provide: RedisService, useValue: fakeRedis(client) };
}
