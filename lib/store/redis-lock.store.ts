import { ACQUIRE_SCRIPT } from '../scripts/acquire.script';
import type { LuaScript } from '../scripts/lua-script';
import { RELEASE_SCRIPT } from '../scripts/release.script';
import { RENEW_SCRIPT } from '../scripts/renew.script';
import { fenceKeyFor, slotTag } from './fence-key';
import type { AcquireResult, LockStore, ReleaseResult } from './lock-store.interface';
import { closeRedis, type RedisClient } from './redis-client';

const RELEASE_RESULTS: Readonly<Record<number, ReleaseResult>> = { 0: 'not-owner', 1: 'released', 2: 'decremented' };

/** Poll back-off while waiting for a busy lock: 5, 10, 20, 40, 80, then 100 ms, each +-50 %. */
const BACKOFF_START_MS = 5;
const BACKOFF_MAX_MS = 100;

/** Thrown by the store when Redis does not answer within `operationTimeout`. */
export class StoreTimeoutError extends Error {
  constructor(timeoutMs: number) {
    super(`Redis did not answer within ${timeoutMs} ms`);
    this.name = 'StoreTimeoutError';
  }
}

/**
 * The lock store on one Redis (a standalone server, a Sentinel-managed master, or a Cluster, where
 * each script touches a single key). Every call is bounded by `operationTimeout`.
 */
export class RedisLockStore implements LockStore {
  constructor(
    private readonly client: RedisClient,
    private readonly owned: boolean,
    private readonly operationTimeout: number,
    /** The module's key prefix: fencing counters live beside the locks, as `${keyPrefix}#fence:{tag}`. */
    private readonly keyPrefix: string,
  ) {
    slotTag(0); // build the slot table now rather than on the first acquisition
  }

  async acquire(key: string, owner: string, leaseMs: number, reenter = false): Promise<AcquireResult> {
    const keys = [key, fenceKeyFor(this.keyPrefix, key)];
    const pending = ACQUIRE_SCRIPT.run(this.client, keys, [owner, leaseMs, reenter ? '1' : '0']);
    let reply: unknown;
    try {
      reply = await this.bounded(pending);
    } catch (error) {
      if (error instanceof StoreTimeoutError) {
        // The command may still reach Redis later (ioredis queues it while reconnecting). If it
        // then takes the lock, nobody would ever release it: give that one hold back as soon as it
        // lands (one hold only, so a late reentrant acquisition never frees its outer holder's lock).
        pending.then(
          (late) => {
            if (Array.isArray(late) && late[0] === 1) void this.release(key, owner).catch(() => undefined);
          },
          () => undefined,
        );
      }
      throw error;
    }
    const [taken, value, token] = reply as [number, number, number | undefined];
    if (taken !== 1) return { acquired: false, ttl: value };
    return token === undefined ? { acquired: true, count: value } : { acquired: true, count: value, token };
  }

  async renew(key: string, owner: string, leaseMs: number): Promise<boolean> {
    return (await this.run(RENEW_SCRIPT, key, [owner, leaseMs])) === 1;
  }

  async release(key: string, owner: string, force = false): Promise<ReleaseResult> {
    const reply = await this.run(RELEASE_SCRIPT, key, [owner, force ? '1' : '0']);
    const result = RELEASE_RESULTS[reply as number];
    if (result === undefined) throw new Error(`Unexpected reply from the release script: ${String(reply)}`);
    return result;
  }

  waitForRelease(
    _key: string,
    ttlHint: number,
    maxWaitMs: number,
    attempt: number,
    signal: AbortSignal,
  ): Promise<void> {
    const backoff = Math.min(BACKOFF_MAX_MS, BACKOFF_START_MS * 2 ** Math.min(attempt, 8));
    const jittered = backoff * (0.5 + Math.random());
    const delay = Math.max(1, Math.min(maxWaitMs, ttlHint > 0 ? ttlHint : Infinity, jittered));
    return new Promise((resolve) => {
      if (signal.aborted) return resolve();
      const done = (): void => {
        clearTimeout(timer);
        signal.removeEventListener('abort', done);
        resolve();
      };
      const timer = setTimeout(done, delay);
      signal.addEventListener('abort', done, { once: true });
    });
  }

  async close(): Promise<void> {
    if (this.owned) await closeRedis(this.client, this.operationTimeout);
  }

  private run(script: LuaScript, key: string, args: readonly (string | number)[]): Promise<unknown> {
    return this.bounded(script.run(this.client, [key], args));
  }

  private bounded<T>(operation: Promise<T>): Promise<T> {
    let timer: NodeJS.Timeout | undefined;
    const timeout = new Promise<never>((_, reject) => {
      timer = setTimeout(() => reject(new StoreTimeoutError(this.operationTimeout)), this.operationTimeout);
    });
    return Promise.race([operation, timeout]).finally(() => clearTimeout(timer));
  }
}
