import { spawn } from 'node:child_process';
import { join, resolve } from 'node:path';
import { Injectable, Logger } from '@nestjs/common';
import type { Cluster } from 'ioredis';
import { DisLock, type LockHandle, type LockLostEvent, LockLostError } from 'nestjs-dislock';
import { createTestApp, type TestApp } from './support/app';
import { abortReason, lostReason } from './support/async';
import { RedisCluster } from './support/cluster';
import { eventually, sleep, uniquePrefix } from './support/shared-redis';
import { holdsOf } from './support/lock-hash';

/**
 * The library on a real Redis Cluster (3 masters × 1 replica, test/support/cluster.ts), through
 * its public API only, each "process" an application with its own Cluster client. Assertions are
 * on what Redis holds (read through a Cluster client of the test's own) and on what callers see.
 */

/** `count` lock names per master of `cluster`, for keys under `prefix`: `Map<master port, names>`. */
async function namesPerMaster(
  cluster: RedisCluster,
  prefix: string,
  label: string,
  count: number,
): Promise<Map<number, string[]>> {
  const masters = await cluster.masters();
  const byMaster = new Map<number, string[]>(masters.map((m) => [m.port, []]));
  for (let i = 0; [...byMaster.values()].some((names) => names.length < count); i += 1) {
    const batch = Array.from({ length: 16 }, (_, j) => `${label}-${i * 16 + j}`);
    const slots = await Promise.all(batch.map((name) => cluster.slotOf(prefix + name)));
    batch.forEach((name, j) => {
      const owner = masters.find((m) => m.slots.some(([a, b]) => slots[j] >= a && slots[j] <= b));
      const names = owner && byMaster.get(owner.port);
      if (names && names.length < count) names.push(name);
    });
  }
  return byMaster;
}

/** One name on each master, in master order. */
async function onePerMaster(cluster: RedisCluster, prefix: string, label: string): Promise<string[]> {
  return [...(await namesPerMaster(cluster, prefix, label, 1)).values()].map(([name]) => name);
}

const root = resolve(__dirname, '..');

/** Wall-clock ms with sub-ms precision, comparable across processes on this machine. */
const clock = (): number => performance.timeOrigin + performance.now();

interface Churn {
  /** Resolves once every name has been taken 5 times. */
  readonly running: Promise<void>;
  /** Ends the worker (killing it if it does not exit within 5 s); when each name was taken. */
  stop(): Promise<number[][]>;
}

/**
 * The churn worker (test/support/workers/cluster-churn.ts) in a process of its own, with its own
 * application and Cluster client, taking `names` in a tight loop.
 */
function startChurn(config: { seeds: unknown; keyPrefix: string; names: string[]; loopsPerName?: number }): Churn {
  const child = spawn(
    process.execPath,
    [
      '-r',
      join(root, 'test/support/ts-register.js'),
      join(root, 'test/support/workers/cluster-churn.ts'),
      JSON.stringify(config),
    ],
    { cwd: root, stdio: ['ignore', 'inherit', 'inherit', 'ipc'] },
  );
  let acquiredAt: number[][] = [];
  const exited = new Promise<void>((resolveExit) => child.once('exit', () => resolveExit()));
  const running = new Promise<void>((resolveRunning, reject) => {
    child.on('message', (message: { type?: string; acquiredAt?: number[][] }) => {
      if (message.type === 'running') resolveRunning();
      if (message.type === 'stopped') acquiredAt = message.acquiredAt ?? [];
    });
    void exited.then(() => reject(new Error('the churn worker exited before it was running')));
  });
  running.catch(() => undefined);
  return {
    running,
    async stop() {
      if (child.exitCode === null && child.signalCode === null) {
        if (child.connected) child.send({ type: 'stop' });
        const timer = setTimeout(() => child.kill('SIGKILL'), 5_000);
        await exited;
        clearTimeout(timer);
      }
      return acquiredAt;
    },
  };
}

/** The same lock name's critical sections never overlap: throws if they do. */
class Exclusive {
  private readonly inside = new Set<string>();
  overlaps = 0;
  runs = 0;

  async run(name: string, ms: number): Promise<void> {
    if (this.inside.has(name)) this.overlaps += 1;
    this.inside.add(name);
    this.runs += 1;
    await sleep(ms);
    this.inside.delete(name);
  }
}

const exclusive = new Exclusive();

@Injectable()
class Jobs {
  @DisLock({ key: 'job:{0}', waitTime: 5_000, expire: 3_000 })
  async run(name: string): Promise<void> {
    await exclusive.run(`job:${name}`, 2);
  }
}

describe('on a Redis Cluster (3 masters × 1 replica)', () => {
  const warn = vi.spyOn(Logger.prototype, 'warn').mockImplementation(() => undefined);
  const log = vi.spyOn(Logger.prototype, 'log').mockImplementation(() => undefined);
  afterAll(() => {
    warn.mockRestore();
    log.mockRestore();
  });

  describe('a healthy Cluster', () => {
    let cluster: RedisCluster;
    let redis: Cluster;
    let a: TestApp;
    let b: TestApp;
    const prefix = uniquePrefix('cluster');
    const lostA: LockLostEvent[] = [];
    const lostB: LockLostEvent[] = [];
    const apps: TestApp[] = [];

    beforeAll(async () => {
      cluster = await RedisCluster.start();
      redis = await cluster.readyClient();
      a = await createTestApp([Jobs], {
        redis: await cluster.readyClient(),
        keyPrefix: prefix,
        onLockLost: (event) => void lostA.push(event),
      });
      b = await createTestApp([Jobs], {
        redis: await cluster.readyClient(),
        keyPrefix: prefix,
        onLockLost: (event) => void lostB.push(event),
      });
      apps.push(a, b);
    });

    afterAll(async () => {
      await Promise.allSettled(apps.map((app) => app.close()));
      await cluster?.dispose();
    });

    beforeEach(() => {
      lostA.length = 0;
      lostB.length = 0;
    });

    it('spreads the test names over all 3 masters', async () => {
      const names = await namesPerMaster(cluster, prefix, 'spread', 4);
      expect(names.size).toBe(3);
      for (const list of names.values()) expect(list).toHaveLength(4);
    });

    it('multi-locks over names on all 3 masters (different slots): all or nothing, no deadlock in opposite orders', async () => {
      const names = await onePerMaster(cluster, prefix, 'multi');
      const set = await a.locks.lock(names, { lockWatchdogTimeout: 600 });
      expect(set.locks.map((part) => part.name)).toEqual([...names].sort());
      await sleep(700); // past a lease: every part renewed on its own master
      for (const part of set.locks) expect(await holdsOf(redis, part.key)).toEqual({ [part.owner]: '1' });
      expect(set.signal.aborted).toBe(false);
      expect(await b.locks.tryLock([names[2], names[0]])).toBeNull();
      for (const name of names) expect(Object.keys(await holdsOf(redis, prefix + name))).toHaveLength(1);
      expect(await set.release()).toBe(true);
      for (const name of names) expect(await redis.exists(prefix + name)).toBe(0);

      let inside = 0;
      let overlaps = 0;
      const loop = async (app: TestApp, order: string[]): Promise<void> => {
        for (let i = 0; i < 10; i += 1) {
          await app.locks.withLock(
            order,
            async () => {
              inside += 1;
              if (inside > 1) overlaps += 1;
              await sleep(1);
              inside -= 1;
            },
            { waitTime: 5_000 },
          );
        }
      };
      await Promise.all([loop(a, names), loop(b, [...names].reverse()), loop(a, [names[1], names[2], names[0]])]);
      expect(overlaps).toBe(0);
    });

    it('semaphores and read-write locks on each master', async () => {
      for (const name of await onePerMaster(cluster, prefix, 'shared')) {
        const permits = [await a.locks.tryLock(name, { permits: 2 }), await b.locks.tryLock(name, { permits: 2 })];
        expect(permits.every((p) => p !== null)).toBe(true);
        expect(await a.locks.tryLock(name, { permits: 2 })).toBeNull();
        expect(Object.keys(await holdsOf(redis, prefix + name))).toHaveLength(2);
        const waiter = b.locks.lock(name, { permits: 2, waitTime: 3_000 });
        await sleep(20);
        await permits[0]?.release();
        const third = await waiter;
        expect(third.fencingToken).toBeGreaterThan(permits[1]?.fencingToken ?? Infinity);
        await Promise.all([permits[1]?.release(), third.release()]);
        expect(await redis.exists(prefix + name)).toBe(0);

        const reader = await a.locks.lock(name, { mode: 'read' });
        const writer = b.locks.lock(name, { mode: 'write', waitTime: 3_000 });
        await sleep(20);
        expect(await b.locks.tryLock(name, { mode: 'read' })).toBeNull(); // the writer waits ahead
        await reader.release();
        const held = await writer;
        expect(await holdsOf(redis, prefix + name)).toEqual({ [held.owner]: '1' });
        await held.release();
      }
    });

    it('excludes across two apps on 30 names over all 3 masters: one winner each, then no overlap', async () => {
      const byMaster = await namesPerMaster(cluster, prefix, 'excl', 10);
      const names = [...byMaster.values()].flat();
      // Both apps grab every name at once: exactly one of them holds each.
      const grabs = await Promise.all(
        names.map(async (name) => {
          const [fromA, fromB] = await Promise.all([
            a.locks.tryLock(name, { expire: 5_000 }),
            b.locks.tryLock(name, { expire: 5_000 }),
          ]);
          return { name, fromA, fromB };
        }),
      );
      for (const { name, fromA, fromB } of grabs) {
        const held = [fromA, fromB].filter((h): h is LockHandle => h !== null);
        expect(held, name).toHaveLength(1);
        expect(await holdsOf(redis, prefix + name)).toEqual({ [held[0].owner]: '1' });
      }
      for (const { fromA, fromB } of grabs) expect(await (fromA ?? fromB)?.release()).toBe(true);
      for (const name of names) expect(await redis.exists(prefix + name)).toBe(0);

      // Then both apps run critical sections on every name through @DisLock, waiting for each other.
      const before = exclusive.runs;
      await Promise.all(names.flatMap((name) => [a, b].flatMap((app) => [0, 1].map(() => app.get(Jobs).run(name)))));
      expect(exclusive.runs - before).toBe(names.length * 4);
      expect(exclusive.overlaps).toBe(0);
      for (const name of names) expect(await redis.exists(`${prefix}job:${name}`)).toBe(0);
    });

    it('wakes a waiter in the other app promptly when the holder releases, on each master', async () => {
      for (const name of await onePerMaster(cluster, prefix, 'wake')) {
        const holder = await a.locks.lock(name, { expire: 5_000 });
        const waiting = b.locks.tryLock(name, { waitTime: 4_000, expire: 2_000 });
        await sleep(250); // the waiter has tried once and is waiting for the release
        const releasedAt = performance.now();
        expect(await holder.release()).toBe(true);
        const waiter = await waiting;
        const wokeAfter = performance.now() - releasedAt;
        expect(waiter, name).not.toBeNull();
        expect(wokeAfter, `${name}: woke ${Math.round(wokeAfter)} ms after the release`).toBeLessThan(300);
        expect(await holdsOf(redis, prefix + name)).toEqual({ [(waiter as LockHandle).owner]: '1' });
        expect(await (waiter as LockHandle).release()).toBe(true);
      }
    });

    it('keeps watchdog locks (600 ms lease) held for 2 s on every master, resetting PTTL', async () => {
      const names = [...(await namesPerMaster(cluster, prefix, 'renew', 3)).values()].flat();
      const handles = await Promise.all(names.map((name) => a.locks.lock(name, { lockWatchdogTimeout: 600 })));
      const started = performance.now();
      const seen = new Map<string, number[]>(names.map((n) => [n, []]));
      while (performance.now() - started < 2_000) {
        await Promise.all(
          names.map(async (name) => {
            const pttl = await redis.pttl(prefix + name);
            seen.get(name)?.push(pttl);
          }),
        );
        await sleep(100);
      }
      for (const [name, pttls] of seen) {
        expect(Math.min(...pttls), name).toBeGreaterThan(0); // never gone, never without a lease
        expect(Math.max(...pttls.slice(-5)), name).toBeGreaterThan(400); // still being reset at the end
      }
      for (const [i, handle] of handles.entries()) {
        expect(handle.signal.aborted).toBe(false);
        expect(await holdsOf(redis, prefix + names[i])).toEqual({ [handle.owner]: '1' });
        expect(await handle.release()).toBe(true);
      }
      expect(lostA).toEqual([]);
    });

    it('renews 240 watchdog locks over many slots without a CROSSSLOT error or a loss', async () => {
      const names = Array.from({ length: 240 }, (_, i) => `many-${i}`);
      const slots = new Set(await Promise.all(names.map((n) => cluster.slotOf(prefix + n))));
      expect(slots.size).toBeGreaterThan(200);
      const handles = await Promise.all(names.map((name) => a.locks.lock(name, { lockWatchdogTimeout: 600 })));
      await sleep(1_500); // 7 renewal rounds; the keys would be gone after 600 ms without them
      const pttls = await Promise.all(names.map((name) => redis.pttl(prefix + name)));
      expect(pttls.filter((pttl) => pttl <= 0)).toEqual([]);
      expect(lostA).toEqual([]);
      expect(handles.filter((h) => h.signal.aborted)).toEqual([]);
      expect(await Promise.all(handles.map((h) => h.release()))).toEqual(handles.map(() => true));
      for (const name of names) expect(await redis.exists(prefix + name)).toBe(0);
    });

    it('reports a key deleted behind the holder back: onLockLost, and the signal aborts', async () => {
      for (const name of await onePerMaster(cluster, prefix, 'loss')) {
        const onLockLost = vi.fn();
        const handle = await a.locks.lock(name, { lockWatchdogTimeout: 600, onLockLost });
        expect(await redis.del(prefix + name)).toBe(1);
        const reason = await abortReason(handle.signal, 1_500);
        expect(reason).toBeInstanceOf(LockLostError);
        expect(lostReason(reason)).toBe('not-owner');
        expect(onLockLost).toHaveBeenCalledTimes(1);
        expect(onLockLost.mock.calls[0][0]).toMatchObject({ name, owner: handle.owner, reason: 'not-owner' });
        expect(await handle.release()).toBe(false);
        expect(await redis.exists(prefix + name)).toBe(0);
      }
    });

    it('issues strictly increasing fencing tokens per name across acquisitions from both apps', async () => {
      for (const name of await onePerMaster(cluster, prefix, 'fence')) {
        const tokens: number[] = [];
        for (let i = 0; i < 6; i += 1) {
          const app = i % 2 === 0 ? a : b;
          const handle = await app.locks.lock(name, { expire: 2_000 });
          tokens.push(handle.fencingToken);
          expect(await handle.release()).toBe(true);
        }
        for (let i = 1; i < tokens.length; i += 1) expect(tokens[i], name).toBeGreaterThan(tokens[i - 1]);
      }
    });

    it('leaves no lock key after app.close()', async () => {
      const c = await createTestApp([], { redis: await cluster.readyClient(), keyPrefix: prefix });
      apps.push(c);
      const byMaster = await namesPerMaster(cluster, prefix, 'close', 3);
      const names = [...byMaster.values()].flat();
      await Promise.all(
        names.map((name, i) =>
          i % 2 === 0 ? c.locks.lock(name, { lockWatchdogTimeout: 5_000 }) : c.locks.lock(name, { expire: 5_000 }),
        ),
      );
      for (const name of names) expect(await redis.exists(prefix + name)).toBe(1);
      await c.close();
      for (const name of names) expect(await redis.exists(prefix + name), name).toBe(0);
    });

    it('keeps watchdog locks through a manual failover (CLUSTER FAILOVER): still held, still renewed', async () => {
      const names = await namesPerMaster(cluster, prefix, 'manual', 3);
      const [masterPort, onIt] = [...names][0];
      const handles = await Promise.all(onIt.map((name) => a.locks.lock(name, { lockWatchdogTimeout: 1_500 })));
      const replica = await cluster.replicaOf(masterPort);
      // Only the test's own client is made to follow; the app's learns of the move from Redis
      // (MOVED). Its three locks are in three slots of one master: one renewal pipeline per master.
      await cluster.failover(replica.port, [redis]);
      await sleep(1_000); // two renewals, which have to reach the new master
      for (const [i, handle] of handles.entries()) {
        expect(await holdsOf(redis, prefix + onIt[i])).toEqual({ [handle.owner]: '1' });
        const pttl = await redis.pttl(prefix + onIt[i]);
        expect(
          pttl,
          `${onIt[i]}: not renewed since the failover; lost: ${lostA.map((e) => e.reason).join(', ')}`,
        ).toBeGreaterThan(500);
        expect(handle.signal.aborted).toBe(false);
        expect(await handle.release()).toBe(true);
      }
      expect(lostA).toEqual([]);
    });

    describe('the findings the library must fix', () => {
      // 3. PUBLISH on a Cluster counts only the subscribers connected to the node it runs on, so a
      // release cannot tell that another process waits: the releaser takes the lock straight back.
      // The test's app B waits for names that a worker process (app A) takes in a tight loop. B must
      // get each one, and A must see that B waits: once B listens, A's next release gives way
      // instead of taking the lock straight back.
      it('on Cluster, contention is seen: a waiter in another app gets a lock the holder keeps re-taking', async () => {
        const names = await onePerMaster(cluster, prefix, 'contend');
        const churn = startChurn({ seeds: cluster.seeds, keyPrefix: prefix, names, loopsPerName: 2 });
        const waits: { name: number; from: number; to: number; got: boolean }[] = [];
        let acquiredAt: number[][] = [];
        try {
          await churn.running;
          for (let i = 0; i < 20 && waits.filter((w) => !w.got).length < 3; i += 1) {
            const from = clock();
            const handle = await b.locks.tryLock(names[i % names.length], { waitTime: 2_000, expire: 2_000 });
            waits.push({ name: i % names.length, from, to: clock(), got: handle !== null });
            if (!handle) continue;
            await sleep(1);
            expect(await handle.release()).toBe(true);
          }
        } finally {
          acquiredAt = await churn.stop();
        }
        // How often A took the name again while B was waiting for it. Before B listens (its first
        // attempt, then connecting and subscribing) A goes on, and a wake-up may lose a race now
        // and then, but A must not keep taking it back. Measured on this suite's 2-core machine,
        // over 20 waits: at most 3 to 6 times in one wait and 19 to 33 in all when releases see
        // B; 12 to 130 times in one wait and 55 to 293 in all when they do not.
        const retaken = waits.map(
          ({ name, from, to }) => acquiredAt[name]?.filter((t) => t > from && t < to).length ?? 0,
        );
        const report = waits
          .map(
            (w, i) =>
              `${names[w.name]}: ${w.got ? 'got it' : 'never'} after ${Math.round(w.to - w.from)} ms, A re-took it ${retaken[i]}×`,
          )
          .join('\n');
        const missed = waits.filter((w) => !w.got);
        expect(missed, report).toEqual([]);
        expect(waits, report).toHaveLength(20);
        const total = retaken.reduce((sum, n) => sum + n, 0);
        expect(Math.max(...retaken), report).toBeLessThanOrEqual(10);
        expect(total, report).toBeLessThanOrEqual(2.5 * waits.length);
      });
    });
  });

  describe('a Cluster losing nodes', () => {
    let cluster: RedisCluster;
    let redis: Cluster;
    let a: TestApp;
    const prefix = uniquePrefix('cluster-kill');
    const lostA: LockLostEvent[] = [];
    const apps: TestApp[] = [];

    beforeAll(async () => {
      cluster = await RedisCluster.start();
      redis = await cluster.readyClient();
      a = await createTestApp([], {
        redis: await cluster.readyClient(),
        keyPrefix: prefix,
        onLockLost: (event) => void lostA.push(event),
      });
      apps.push(a);
    });

    afterAll(async () => {
      await Promise.allSettled(apps.map((app) => app.close()));
      await cluster?.dispose();
    });

    it('keeps locks with long leases through kill -9 of their master: still there, owner-safe, and new ones work', async () => {
      const b = await createTestApp([], { redis: await cluster.readyClient(), keyPrefix: prefix });
      apps.push(b);
      const byMaster = await namesPerMaster(cluster, prefix, 'kill', 5);
      const [victim, victimNames] = [...byMaster][0];
      const onVictim = victimNames.slice(0, 4);
      const elsewhere = [...byMaster].slice(1).flatMap(([, names]) => names.slice(0, 2));
      const held = [...onVictim, ...elsewhere];
      // Even: a fixed 15 s lease. Odd: the watchdog with a 6 s lease, renewed every 2 s, so that a
      // renewal falls into the failover (2 to 3 s) and the next ones must reach the promoted master.
      const watched = (i: number): boolean => i % 2 === 1;
      const handles = await Promise.all(
        held.map((name, i) =>
          watched(i) ? a.locks.lock(name, { lockWatchdogTimeout: 6_000 }) : a.locks.lock(name, { expire: 15_000 }),
        ),
      );
      await cluster.awaitReplicated(victim); // replication is asynchronous: see Failure semantics

      const { promotedPort } = await cluster.killMaster(victim);
      expect(await cluster.masterOf(prefix + onVictim[0])).toBe(promotedPort);

      // Still there, with their owners and leases; the watchdog's renewed on the promoted master.
      for (const [i, name] of held.entries()) {
        expect(await holdsOf(redis, prefix + name), name).toEqual({ [handles[i].owner]: '1' });
        expect(await redis.pttl(prefix + name), name).toBeGreaterThan(watched(i) ? 0 : 10_000);
      }
      const samples: string[] = [];
      const promotedAt = performance.now();
      const renewed = async (): Promise<boolean> => {
        const pttls = await Promise.all(held.filter((_, i) => watched(i)).map((name) => redis.pttl(prefix + name)));
        samples.push(`+${Math.round(performance.now() - promotedAt)} ms: ${pttls.join(' ')}`);
        return pttls.every((pttl) => pttl > 5_000);
      };
      const renewedInTime = await eventually(renewed, 4_000, 50);
      expect(renewedInTime, `PTTLs after the failover: ${samples.join(', ')}; lost: ${lostA.length}`).toBe(true);
      // Owner-safe: the other app cannot take them.
      for (const name of onVictim) expect(await b.locks.tryLock(name), name).toBeNull();
      // New acquisitions on the promoted master work.
      const fresh = await b.locks.lock(victimNames[4], { expire: 5_000 });
      expect(await holdsOf(redis, prefix + fresh.name)).toEqual({ [fresh.owner]: '1' });
      expect(await fresh.release()).toBe(true);
      // The holder still holds and releases them; then the other app can take them.
      expect(lostA).toEqual([]);
      for (const handle of handles) {
        expect(handle.signal.aborted).toBe(false);
        expect(await handle.release()).toBe(true);
      }
      for (const name of held) expect(await redis.exists(prefix + name)).toBe(0);
      const next = await b.locks.lock(onVictim[0], { expire: 2_000 });
      const victimIndex = held.indexOf(onVictim[0]);
      expect(next.fencingToken).toBeGreaterThan(handles[victimIndex].fencingToken);
      expect(await next.release()).toBe(true);
    });

    describe('the findings the library must fix', () => {
      /** A Cluster client seeded with one replica only, connected, whose seed is then killed. */
      async function clientWithDeadSeed(): Promise<Cluster> {
        const replica = (await cluster.replicas())[0];
        const client = await cluster.readyClient({}, [{ host: '127.0.0.1', port: replica.port }]);
        await Promise.all(client.nodes('master').map((node) => node.ping()));
        await cluster.killNode(replica.port);
        return client;
      }

      let deadSeedClient: Cluster | undefined;
      const deadSeed = async (): Promise<Cluster> => (deadSeedClient ??= await clientWithDeadSeed());

      // 1. The subscriber connection is made from the client's seed list (Cluster#duplicate), which
      // may be long gone: it never connects, and a waiter hears no release.
      it('a waiter whose client lost its seed node hears the release within 500 ms', async () => {
        const client = await deadSeed();
        const b = await createTestApp([], { redis: client, keyPrefix: prefix, operationTimeout: 3_000 });
        apps.push(b);
        const name = (await onePerMaster(cluster, prefix, 'seed'))[0];
        const holder = await a.locks.lock(name, { expire: 5_000 });
        const waiting = b.locks.tryLock(name, { waitTime: 3_000, expire: 2_000 });
        await sleep(300);
        const releasedAt = performance.now();
        expect(await holder.release()).toBe(true);
        const waiter = await waiting;
        const wokeAfter = performance.now() - releasedAt;
        expect(waiter).not.toBeNull();
        expect(wokeAfter, `woke ${Math.round(wokeAfter)} ms after the release`).toBeLessThan(500);
        await waiter?.release();
      });

      // 2. A wait blocks on subscribing, which is bounded only by operationTimeout.
      it('bounds a wait by its waitTime when the seed-only client cannot subscribe', async () => {
        const client = await deadSeed();
        const b = await createTestApp([], { redis: client, keyPrefix: prefix, operationTimeout: 3_000 });
        apps.push(b);
        const name = (await onePerMaster(cluster, prefix, 'deadline-seed'))[1];
        const holder = await a.locks.lock(name, { expire: 5_000 });
        const started = performance.now();
        const result = await b.locks.tryLock(name, { waitTime: 500 });
        const took = performance.now() - started;
        expect(result).toBeNull();
        expect(took, `tryLock took ${Math.round(took)} ms`).toBeLessThan(800);
        expect(await holder.release()).toBe(true);
      });

      it('bounds a wait by its waitTime when no node accepts a new (subscriber) connection', async () => {
        const b = await createTestApp([], {
          redis: await cluster.readyClient(),
          keyPrefix: prefix,
          operationTimeout: 3_000,
        });
        apps.push(b);
        const name = (await onePerMaster(cluster, prefix, 'deadline-refused'))[2];
        const holder = await a.locks.lock(name, { expire: 5_000 });
        expect(await b.locks.tryLock(name)).toBeNull(); // b's lock connections are open
        await cluster.refuseNewConnections(true);
        try {
          const started = performance.now();
          const result = await b.locks.tryLock(name, { waitTime: 500 });
          const took = performance.now() - started;
          expect(result).toBeNull();
          expect(took, `tryLock took ${Math.round(took)} ms`).toBeLessThan(800);
        } finally {
          await cluster.refuseNewConnections(false);
        }
        expect(await holder.release()).toBe(true);
      });
    });
  });
});
