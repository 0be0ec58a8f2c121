import { Cluster } from 'ioredis';
import { sleep, hr } from '../support/clock';
import type { RedisTarget } from '../support/protocol';
import { countingConnection, ready } from '../support/redis';
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
 * On a Cluster, the same through an ioredis `Cluster` client (which routes each key to its master),
 * with the scripts loaded on every master first.
 */
export async function rawLocker(mode: LockMode, target: RedisTarget): Promise<Locker> {
  const { client, sent } = countingConnection(target, `bench-raw-${process.pid}`);
  await ready(client);
  // SCRIPT LOAD has no key: on a Cluster, load on every master (the SHA is the same everywhere).
  const servers = client instanceof Cluster ? client.nodes('master') : [client];
  const load = async (script: string): Promise<string> =>
    (await Promise.all(servers.map((server) => server.script('LOAD', script) as Promise<string>)))[0];
  const setSha = await load(SET_NX_PX);
  const delSha = await load(COMPARE_AND_DELETE);
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
