import { ExecutionError, Redlock } from '@sesamecare-oss/redlock';
import { countingClient, ready } from '../support/redis';
import { LEASE_MS, type Locker, type LockMode } from './locker';
import { redlockShaped } from './redlock';

/**
 * @sesamecare-oss/redlock (the maintained TypeScript fork of redlock, for ioredis 5+) on one Redis,
 * with the redlock 5 contender's settings. uncontended: `retryCount: 0` (one attempt). contended:
 * its defaults (retryCount 10, retryDelay 200 ms, retryJitter 100 ms; its README says 200, the
 * code 100): after ~2 s of retries `acquire` rejects with an ExecutionError, which counts as a
 * failure; the worker then tries again.
 *
 * Its API differs from redlock 5's in small ways: `Redlock` is a named export (no default), its
 * types ship with its CommonJS build (no declaration of ours), it installs its own no-op 'error'
 * listener, and it runs its scripts as ioredis custom commands (`defineCommand` on our client:
 * EVALSHA, EVAL on NOSCRIPT). Every script starts with a `SELECT` of its `db` setting (default 0),
 * so a cycle costs 2 more Redis calls than redlock 5's (8 against 6), the same round trips.
 */
export async function sesameRedlockLocker(mode: LockMode, redisUrl: string): Promise<Locker> {
  const { client, sent } = countingClient(redisUrl, `bench-sesame-redlock-${process.pid}`);
  await ready(client);
  const redlock = new Redlock([client], mode === 'uncontended' ? { retryCount: 0 } : {});

  return redlockShaped(
    client,
    sent,
    (key) => redlock.acquire([key], LEASE_MS),
    (error) => error instanceof ExecutionError,
  );
}
