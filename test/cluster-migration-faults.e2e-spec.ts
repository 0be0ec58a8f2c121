/**
 * Lock calls that meet a Cluster slot in migration, found by an adversarial review of the slot guard
 * (a script that changes a lock is refused with TRYAGAIN while its slot is open, see `slotGuardFor`),
 * on a real 3-master Cluster with slots moved the way `redis-cli --cluster reshard` moves them:
 *
 * - An acquisition refused with TRYAGAIN and then rejected by ioredis's own `commandTimeout` is
 *   still in ioredis's queue of commands to send again: it runs once the slot has settled, after
 *   the give-back's release answered "not yours", and took the lock for an owner id nobody holds,
 *   for a whole lease (8 of 8 rounds before the fix). It must be given back.
 * - Waiters whose attempts spent ioredis's 16 redirections on TRYAGAIN, when the slot lands on a
 *   master that has not loaded the scripts, got "Too many Cluster redirections. Last error:
 *   NOSCRIPT" and failed with seconds of their `waitTime` left (4 of 6 rounds). They must get
 *   their locks, and a release sent meanwhile must succeed.
 */
import { Logger } from '@nestjs/common';
import type { Cluster } from 'ioredis';
import type { LockHandle } from '../lib';
import { ACQUIRE_SCRIPT } from '../lib/store/redis/scripts/acquire.script';
import { RELEASE_SCRIPT } from '../lib/store/redis/scripts/release.script';
import { createTestApp, type TestApp } from './support/app';
import { RedisCluster } from './support/cluster';
import { holdsOf } from './support/lock-hash';
import { Resharder } from './support/reshard';
import { eventually, uniquePrefix } from './support/shared-redis';

const ROUNDS = 4;
/** Long enough that a lock held by nobody for its lease cannot pass as one given back late. */
const LEASE_MS = 8_000;

/** An error and its causes, as one line. */
function chainOf(error: unknown): string {
  const chain: string[] = [];
  for (let e = error; e instanceof Error; e = e.cause) chain.push(e.message.slice(0, 110));
  return chain.join(' <- ');
}

describe('a Cluster slot in migration: lock calls that time out or outlast the redirections', () => {
  let cluster: RedisCluster;
  let resharder: Resharder;
  const apps: TestApp[] = [];
  const clients: Cluster[] = [];

  beforeAll(async () => {
    vi.spyOn(Logger.prototype, 'warn').mockImplementation(() => undefined);
    vi.spyOn(Logger.prototype, 'error').mockImplementation(() => undefined);
    cluster = await RedisCluster.start();
    resharder = new Resharder(cluster);
  }, 60_000);

  afterAll(async () => {
    await Promise.allSettled(apps.map((app) => app.close()));
    for (const client of clients) client.disconnect();
    resharder?.close();
    await cluster?.dispose();
    vi.restoreAllMocks();
  });

  async function app(prefix: string, commandTimeout?: number): Promise<TestApp> {
    const client = await cluster.readyClient(commandTimeout ? { redisOptions: { commandTimeout } } : {});
    clients.push(client);
    const made = await createTestApp([], { redis: client, keyPrefix: prefix, lockWatchdogTimeout: LEASE_MS });
    apps.push(made);
    return made;
  }

  /** Another master than the one that owns `slot`. */
  async function otherMaster(slot: number): Promise<number> {
    const source = await resharder.ownerOf(slot);
    const other = (await cluster.masters()).find((master) => master.port !== source);
    if (!other) throw new Error('a Cluster of one master');
    return other.port;
  }

  it('an acquisition rejected by ioredis commandTimeout while its slot migrates is given back when ioredis sends it later', async () => {
    const prefix = uniquePrefix('late-acquire');
    const a = await app(prefix, 150);
    const b = await app(prefix);
    const rounds: string[] = [];
    let heldByNobody = 0;
    let withLateRun = 0;
    for (let round = 0; round < ROUNDS; round += 1) {
      const name = `late-${round}`;
      const key = prefix + name;
      const slot = await cluster.slotOf(key);
      // Every master knows the scripts: a late copy of the acquire runs where it lands, rather than
      // being answered NOSCRIPT.
      for (const master of await cluster.masters()) {
        for (const script of [ACQUIRE_SCRIPT, RELEASE_SCRIPT])
          await resharder.node(master.port).script('LOAD', script.source);
      }
      // The acquire script's runs naming the lock on the master the slot goes to, by MONITOR.
      const target = await otherMaster(slot);
      let settledAt = Infinity;
      let lateRuns = 0;
      const monitor = await resharder.node(target).monitor();
      monitor.on('monitor', (_: string, args: string[]) => {
        const acquire = args[1] === ACQUIRE_SCRIPT.sha || args[1] === ACQUIRE_SCRIPT.source;
        if (acquire && args.includes(key) && performance.now() >= settledAt) lateRuns += 1;
      });
      const migration = await resharder.begin(slot, target);
      const attempt = a.locks.tryLock(name).then(
        (handle) => ({ handle, error: undefined }),
        (error: unknown) => ({ handle: null, error }),
      );
      // The slot settles while the refused acquire waits in ioredis's queue, after commandTimeout
      // has rejected it: ioredis then sends it, and it takes the lock.
      await new Promise((resolve) => setTimeout(resolve, 110 + (round % 4) * 10));
      await migration.finish();
      settledAt = performance.now();
      const { handle, error } = await attempt;
      if (handle) {
        await handle.release();
        monitor.disconnect();
        rounds.push(`round ${round}: A got it (the acquire ran in time)`);
        continue;
      }
      // A was told it failed. Wait for the late copy to run (ioredis redirects it for up to 16 ×
      // 100 ms), then whatever it took must be given back within a second, not kept for the 8 s lease.
      const ran = await eventually(() => lateRuns > 0, 2_500);
      if (ran) withLateRun += 1;
      const owner = await resharder.ownerOf(slot);
      const given = await eventually(async () => !(await b.locks.inspect(name)).held, 1_000);
      const left = await holdsOf(resharder.node(owner), key);
      const taken = await b.locks.tryLock(name);
      if (!taken) heldByNobody += 1;
      monitor.disconnect();
      rounds.push(
        `round ${round}: A's call: ${chainOf(error)}; its late copy ${ran ? 'ran' : 'did not run'}; ` +
          `${given ? 'free within 1 s' : `still held; Redis holds ${JSON.stringify(left)}`}; B ${taken ? 'took it' : 'was refused'}`,
      );
      await taken?.release();
    }
    expect(withLateRun, `no round had a late copy run: the test could not fail\n${rounds.join('\n')}`).toBeGreaterThan(
      0,
    );
    expect(heldByNobody, rounds.join('\n')).toBe(0);
  }, 120_000);

  it('waiters whose redirections ran out on TRYAGAIN get their locks when the slot lands on a master without the scripts; a release sent meanwhile succeeds', async () => {
    const prefix = uniquePrefix('noscript');
    const a = await app(prefix);
    const rounds: string[] = [];
    let failed = 0;
    for (let round = 0; round < ROUNDS; round += 1) {
      const [held, wanted] = [`{r${round}}held`, `{r${round}}wanted`];
      const holder = await a.locks.tryLock(held);
      if (!holder) throw new Error(`${held} is busy`);
      const slot = await cluster.slotOf(prefix + held);
      const target = await otherMaster(slot);
      const migration = await resharder.begin(slot, target, { keys: 1 });
      await resharder.node(target).call('SCRIPT', 'FLUSH'); // a master that has not run the lock scripts yet
      const handles: LockHandle[] = [];
      const waits = Array.from({ length: 8 }, (_, i) =>
        a.locks.tryLock(`${wanted}${i}`, { waitTime: 5_000 }).then(
          (handle) => (handle && handles.push(handle), handle ? 'got it' : 'busy'),
          (error: unknown) => `failed: ${chainOf(error)}`,
        ),
      );
      const released = holder.release().then(
        () => 'released',
        (error: unknown) => `failed: ${chainOf(error)}`,
      );
      // Past ioredis's 16 redirections, 100 ms apart: the waiters' EVALSHA has none left.
      await new Promise((resolve) => setTimeout(resolve, 1_700 + (round % 4) * 50));
      await migration.finish();
      const outcomes = [...(await Promise.all(waits)), await released];
      if (outcomes.some((outcome) => outcome.startsWith('failed'))) failed += 1;
      rounds.push(`round ${round}: ${outcomes.join('; ')}`);
      await Promise.all(handles.map((handle) => handle.release()));
    }
    expect(failed, rounds.join('\n')).toBe(0);
  }, 120_000);
});
