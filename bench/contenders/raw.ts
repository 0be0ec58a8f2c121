import { sleep, hr } from '../support/clock';
import { countingClient, ready } from '../support/redis';
import { type Body, LEASE_MS, type Locker, type LockMode, NOTHING_LOGGED, WAIT_MS } from './locker';

const SET_NX_PX = "return redis.call('set', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2])";
const COMPARE_AND_DELETE =
  "if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('del', KEYS[1]) end return 0";
const POLL_MS = 1;

/**
 * The floor: plain ioredis, no library.
 * - uncontended (`raw`): EVALSHA of a `SET key token NX PX` script, then EVALSHA of compare-and-delete:
 *   two round trips, nothing else.
 * - contended (`raw-poll-1ms`): `SET key token NX PX`; when busy, sleep 1 ms and try again (for up
 *   to 10 s); then compare-and-delete by EVALSHA.
 */
export async function rawLocker(mode: LockMode, redisUrl: string): Promise<Locker> {
  const { client, sent } = countingClient(redisUrl, `bench-raw-${process.pid}`);
  await ready(client);
  const setSha = (await client.script('LOAD', SET_NX_PX)) as string;
  const delSha = (await client.script('LOAD', COMPARE_AND_DELETE)) as string;
  let counter = 0;

  const acquireOnce = async (key: string, token: string): Promise<boolean> =>
    (await client.evalsha(setSha, 1, key, token, LEASE_MS)) === 'OK';

  const acquirePolling = async (key: string, token: string): Promise<boolean> => {
    const deadline = hr() + WAIT_MS;
    for (;;) {
      if ((await client.set(key, token, 'PX', LEASE_MS, 'NX')) === 'OK') return true;
      if (hr() >= deadline) return false;
      await sleep(POLL_MS);
    }
  };

  return {
    async critical(name: string, body: Body): Promise<boolean> {
      const key = `raw:${name}`;
      const token = `${process.pid}:${++counter}`;
      if (!(await (mode === 'contended' ? acquirePolling(key, token) : acquireOnce(key, token)))) return false;
      try {
        await body();
      } finally {
        await client.evalsha(delSha, 1, key, token);
      }
      return true;
    },
    sent,
    logged: () => NOTHING_LOGGED,
    async close() {
      await client.quit();
    },
  };
}
