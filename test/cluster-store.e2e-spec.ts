import { RENEW_SCRIPT } from '../lib/store/redis/scripts/renew.script';
import { type Cluster, Redis } from 'ioredis';
import { lineKeysFor } from '../lib/store/redis/fence-key';
import { createTestApp, type TestApp } from './support/app';
import { RedisCluster } from './support/cluster';
import { eventually, sleep, uniquePrefix } from './support/shared-redis';

/**
 * What the Redis store does differently on a Cluster (3 masters × 1 replica): renewals grouped
 * into one request per master, release channels subscribed with SSUBSCRIBE on the master that owns
 * the lock's slot, and WAIT sent to that master for replica acknowledgement.
 */
describe('the Redis store on a Cluster', () => {
  let cluster: RedisCluster;
  const apps: TestApp[] = [];
  const plain = new Map<number, Redis>();

  /** A plain connection to one node, for what that node alone holds or sees. */
  function nodeClient(port: number): Redis {
    let client = plain.get(port);
    if (!client) {
      client = new Redis({ host: '127.0.0.1', port, maxRetriesPerRequest: 1 });
      client.on('error', () => undefined);
      plain.set(port, client);
    }
    return client;
  }

  beforeAll(async () => {
    cluster = await RedisCluster.start();
  }, 30_000);

  afterEach(async () => {
    await Promise.all(apps.splice(0).map((app) => app.close()));
  });

  afterAll(async () => {
    for (const client of plain.values()) client.disconnect();
    await cluster?.dispose();
  });

  async function app(client: Cluster, options: Record<string, unknown> = {}): Promise<TestApp> {
    const created = await createTestApp([], { redis: client, keyPrefix: uniquePrefix('cs'), ...options });
    apps.push(created);
    return created;
  }

  /** Counts the requests the client sends: pipelines, and script calls sent on their own. */
  /** Pipelines sent, and renew script calls sent on their own (not the data-set probe's, see EPOCH_SCRIPT). */
  function countRequests(client: Cluster): { pipelines: number; scripts: number } {
    const counts = { pipelines: 0, scripts: 0 };
    const pipeline = client.pipeline.bind(client);
    const evalsha = client.evalsha.bind(client);
    Object.assign(client, {
      pipeline: (...args: Parameters<typeof pipeline>) => {
        counts.pipelines += 1;
        return pipeline(...args);
      },
      evalsha: (...args: Parameters<typeof evalsha>) => {
        if (args[0] === RENEW_SCRIPT.sha) counts.scripts += 1;
        return evalsha(...args);
      },
    });
    return counts;
  }

  it('renews 500 watchdog locks over hundreds of slots with at most one request per master per interval', async () => {
    const client = await cluster.readyClient();
    const { locks, prefix } = await app(client);
    const takenFrom = performance.now();
    const handles = await Promise.all(
      Array.from({ length: 500 }, (_, i) => locks.lock(`renew-${i}`, { lockWatchdogTimeout: 900 })),
    );
    // Renewals due within 50 ms of each other go out together: locks taken over a longer span (a
    // busy machine) fall due in that many groups, each one pipeline per master per interval.
    const groups = Math.ceil((performance.now() - takenFrom) / 50);
    const slots = new Set(await Promise.all(handles.map((_, i) => cluster.slotOf(`${prefix}renew-${i}`))));
    expect(slots.size).toBeGreaterThan(300);
    const counts = countRequests(client);
    await sleep(2_000); // about 6 renewal intervals of 300 ms
    // 500 locks taken within a few ms of each other fall due together: one pipeline per master
    // per interval (3 × ~7), never one script call per lock or per slot.
    // A master's part of a group that is one lock goes as a script call of its own: that happens
    // only when a busy machine spread the acquisitions over more than one group.
    const requests = counts.pipelines + counts.scripts;
    expect(counts.scripts).toBeLessThanOrEqual(3 * 8 * (groups - 1));
    expect(requests).toBeGreaterThanOrEqual(3 * 5);
    expect(requests).toBeLessThanOrEqual(3 * 8 * groups);
    expect(requests).toBeLessThan(slots.size); // one per slot would be ~6 × slots
    for (const handle of handles) expect(handle.signal.aborted).toBe(false);
    const ttls = await Promise.all(handles.map((_, i) => client.pttl(`${prefix}renew-${i}`)));
    for (const ttl of ttls) expect(ttl).toBeGreaterThan(500);
    await Promise.all(handles.map((handle) => handle.release()));
    const left = await Promise.all(handles.map((_, i) => client.exists(`${prefix}renew-${i}`)));
    expect(left.filter((exists) => exists === 1)).toHaveLength(0);
  });

  it('listens for a release with SSUBSCRIBE on the master that owns the slot, and on no other node', async () => {
    const holder = await app(await cluster.readyClient());
    const waiter = await app(await cluster.readyClient(), { keyPrefix: holder.prefix });
    const name = 'sharded';
    const key = holder.prefix + name;
    const owner = await cluster.masterOf(key);
    const held = await holder.locks.lock(name, { lockWatchdogTimeout: 5_000 });
    const waiting = waiter.locks.tryLock(name, { waitTime: 3_000 });
    const shardSubscribers = async (port: number): Promise<number> => {
      const node = nodeClient(port);
      const [, count] = (await node.call('PUBSUB', 'SHARDNUMSUB', key)) as [string, number];
      return count;
    };
    expect(await eventually(async () => (await shardSubscribers(owner)) === 1)).toBe(true);
    for (const master of await cluster.masters()) {
      if (master.port !== owner) expect(await shardSubscribers(master.port)).toBe(0);
      const [, classic] = (await nodeClient(master.port).call('PUBSUB', 'NUMSUB', key)) as [string, number];
      expect(classic).toBe(0);
    }
    const releasedAt = performance.now();
    await held.release();
    const handle = await waiting;
    expect(handle).not.toBeNull();
    expect(performance.now() - releasedAt).toBeLessThan(500); // woken by the release, not by the 5 s lease
    await handle?.release();
    expect(await eventually(async () => (await shardSubscribers(owner)) === 0)).toBe(true);
  });

  it('with replicas: { min: 1 } the acquisition waits for the replica of its own master', async () => {
    const client = await cluster.readyClient();
    const { locks, prefix } = await app(client, { replicas: { min: 1, timeout: 500 } });
    for (let i = 0; i < 6; i += 1) {
      const name = `acked-${i}`;
      const handle = await locks.lock(name, { expire: 5_000 });
      const replica = await cluster.replicaOf(await cluster.masterOf(prefix + name));
      // WAIT returned only once the replica had the write: it holds the key now, no polling needed.
      const onReplica = nodeClient(replica.port);
      await onReplica.call('READONLY');
      expect(await onReplica.exists(prefix + name)).toBe(1);
      await handle.release();
    }
  });

  it('a Cluster client with its own ioredis keyPrefix: locks, fencing counters and line keys share a slot; waiters are woken', async () => {
    const clientPrefix = 'app:';
    const holder = await app(await cluster.readyClient({ keyPrefix: clientPrefix }));
    const waiter = await app(await cluster.readyClient({ keyPrefix: clientPrefix }), { keyPrefix: holder.prefix });
    const plainClient = await cluster.readyClient();
    // Many names over many slots: a fencing counter or line key in another slot than its lock
    // would fail the acquire script with CROSSSLOT.
    const handles = await Promise.all(
      Array.from({ length: 60 }, (_, i) => holder.locks.lock(`prefixed-${i}`, { lockWatchdogTimeout: 600 })),
    );
    for (const handle of handles) {
      expect(await plainClient.exists(clientPrefix + handle.key)).toBe(1);
    }
    const name = 'prefixed-0';
    const waiting = waiter.locks.tryLock(name, { waitTime: 3_000 });
    // The waiter has taken its place in the line (in the lock's slot, under the client's prefix).
    const key = holder.prefix + name;
    const [lineKey] = lineKeysFor(holder.prefix, clientPrefix + key, key);
    expect(await eventually(async () => (await plainClient.exists(clientPrefix + lineKey)) === 1)).toBe(true);
    await sleep(700); // past the first lease: alive only if renewed
    for (const handle of handles) expect(handle.signal.aborted).toBe(false);
    const releasedAt = performance.now();
    await handles[0].release();
    const handle = await waiting;
    expect(handle).not.toBeNull();
    expect(performance.now() - releasedAt).toBeLessThan(500); // woken by the release, not by polling
    await handle?.release();
    await Promise.all(handles.slice(1).map((h) => h.release()));
  });

  describe('on servers without sharded pub/sub (SSUBSCRIBE and SPUBLISH renamed away, as before Redis 7)', () => {
    let old: RedisCluster;

    beforeAll(async () => {
      const gone = ['SSUBSCRIBE', 'SUNSUBSCRIBE', 'SPUBLISH'].flatMap((command) => ['--rename-command', command, '']);
      old = await RedisCluster.start({ args: gone });
    }, 30_000);

    afterAll(async () => {
      await old?.dispose();
    });

    it('falls back to PUBLISH and SUBSCRIBE: a waiter in another app is still woken by the release', async () => {
      const holder = await app(await old.readyClient());
      const waiter = await app(await old.readyClient(), { keyPrefix: holder.prefix });
      for (let i = 0; i < 3; i += 1) {
        const name = `classic-${i}`;
        const held = await holder.locks.lock(name, { lockWatchdogTimeout: 5_000 });
        const waiting = waiter.locks.tryLock(name, { waitTime: 3_000 });
        const key = holder.prefix + name;
        const subscribers = async (): Promise<number> => {
          const counts = await Promise.all(
            (await old.masters()).map(async (master) => {
              const client = new Redis({ host: '127.0.0.1', port: master.port, maxRetriesPerRequest: 1 });
              try {
                const [, count] = (await client.call('PUBSUB', 'NUMSUB', key)) as [string, number];
                return count;
              } finally {
                client.disconnect();
              }
            }),
          );
          return counts.reduce((a, b) => a + b, 0);
        };
        expect(await eventually(async () => (await subscribers()) === 1)).toBe(true);
        const releasedAt = performance.now();
        await held.release();
        const handle = await waiting;
        expect(handle).not.toBeNull();
        expect(performance.now() - releasedAt).toBeLessThan(500);
        await handle?.release();
      }
    });
  });
});
