import { Logger } from '@nestjs/common';
import type { Cluster, ClusterOptions } from 'ioredis';
import type { LockHandle, LockLostEvent } from 'nestjs-dislock';
import { createTestApp, type TestApp } from './support/app';
import { waitFor } from './support/async';
import { RedisCluster } from './support/cluster';
import { Resharder, type SlotMigration } from './support/reshard';
import { uniquePrefix } from './support/shared-redis';

/**
 * Issue 25, finding 1: waiters keep hearing their releases when the slots of their locks move to
 * another master, and when their subscriber connection to a master drops.
 *
 * Redis 7.0 drops the shard-channel subscriptions of a slot on the node it leaves; the library
 * must subscribe them on the new owner. It used to do that with one SSUBSCRIBE naming the channels
 * of several slots, which Redis refuses (CROSSSLOT); the error was ignored and the waiters went
 * deaf: a hand-over took their line refresh (~1 s) instead of tens of ms.
 *
 * Each scenario: a holder application holds watchdog locks whose keys are in several slots of one
 * master (two of the names share a slot), a waiter application (its own Cluster client) waits for
 * each of them; the slots move to another master for real (test/support/reshard.ts: IMPORTING /
 * MIGRATING, MIGRATE of every key of the slot, the library's line and fence keys included, SETSLOT
 * NODE on every master). Once the waiter's client routes the slots to the new owner, every channel
 * must be subscribed there (PUBSUB SHARDNUMSUB, asked of the node) and on no other master, and each
 * release must reach its waiter within 200 ms (a deaf waiter takes up to its 1 s line refresh).
 * The same after moving them back (state left behind), after a move in stages, and after the
 * waiter's subscriber connection to a master is killed (CLIENT KILL TYPE pubsub): with ioredis's
 * autoResubscribe (the default, which re-subscribes one channel per SSUBSCRIBE by itself, so that
 * case passed before the fix too) and without it, where only the library re-subscribes.
 *
 * Before the fix (4fb4211), every case but the autoResubscribe one failed: 0 subscribers on the
 * new owner, and most hand-overs took 1,001-1,010 ms.
 */

/** The Cluster clients' own ioredis keyPrefix: channels are named like the keys Redis sees. */
const CLIENT_PREFIX = 'rs:';
/** The longest a hand-over may take from the start of the release to the waiter holding the lock. */
const HAND_OVER_MS = 200;
/** How long a channel may take to be subscribed on its slot's new owner (the fix retries at 50 ms, doubling). */
const RESUBSCRIBE_MS = 3_000;
/** Long enough for the setup, a move, a failed re-subscription and 5 deaf hand-overs of ~1 s each. */
const WAIT_TIME_MS = 15_000;

interface Wait {
  readonly name: string;
  readonly promise: Promise<LockHandle | null>;
  /** `performance.now()` when the wait settled. */
  settledAt?: number;
  handle?: LockHandle | null;
  error?: unknown;
}

/** What one scenario saw, for the assertions and their messages. */
interface HandOvers {
  /** The lock keys (= channel names), in name order. */
  readonly channels: string[];
  /** SHARDNUMSUB of each channel on the slots' new owner, once all were 1 or RESUBSCRIBE_MS passed. */
  readonly onTarget: number[];
  /** How long after the client routed the slots to the new owner the channels were subscribed there. */
  readonly resubscribedMs: number | undefined;
  /** The channels subscribed on another master too (PUBSUB SHARDNUMSUB there). */
  readonly elsewhere: string[];
  /** Per name: ms from the start of its release to its waiter holding it (undefined: not by the end). */
  readonly handOverMs: (number | undefined)[];
  readonly waits: Wait[];
  readonly holds: LockHandle[];
  readonly released: boolean[];
  readonly report: string;
}

describe('a Cluster that reshards (3 masters × 1 replica): waiters keep hearing their releases', () => {
  const warn = vi.spyOn(Logger.prototype, 'warn').mockImplementation(() => undefined);
  const log = vi.spyOn(Logger.prototype, 'log').mockImplementation(() => undefined);

  let cluster: RedisCluster;
  let resharder: Resharder;
  let holderClient: Cluster;
  let holder: TestApp;
  let waiterClient: Cluster;
  let waiter: TestApp;
  /** The masters, by the slot range they started with: 0-5460, 5461-10922, 10923-16383. */
  let masters: [number, number, number];
  const prefix = uniquePrefix('reshard');
  const lost: LockLostEvent[] = [];
  const apps: TestApp[] = [];

  beforeAll(async () => {
    cluster = await RedisCluster.start();
    resharder = new Resharder(cluster);
    const byRange = (await cluster.masters()).sort((x, y) => x.slots[0][0] - y.slots[0][0]);
    masters = [byRange[0].port, byRange[1].port, byRange[2].port];
    holderClient = await cluster.readyClient({ keyPrefix: CLIENT_PREFIX });
    holder = await createTestApp([], { redis: holderClient, keyPrefix: prefix, onLockLost: (e) => void lost.push(e) });
    apps.push(holder);
    waiterClient = await cluster.readyClient({ keyPrefix: CLIENT_PREFIX });
    waiter = await createTestApp([], { redis: waiterClient, keyPrefix: prefix });
    apps.push(waiter);
  }, 30_000);

  afterAll(async () => {
    await Promise.allSettled(apps.map((app) => app.close()));
    resharder?.close();
    await cluster?.dispose();
    warn.mockRestore();
    log.mockRestore();
  });

  /** The key (and release channel) of lock `name`, as Redis sees it. */
  const channelOf = (name: string): string => CLIENT_PREFIX + prefix + name;

  /**
   * Lock names on the master on `port`, in `slotCount` different slots (hash tags `{<label><i>}`),
   * the first slot holding two names: `slotCount + 1` names, and their slots.
   */
  async function namesOn(
    port: number,
    label: string,
    slotCount: number,
  ): Promise<{ names: string[]; slots: number[] }> {
    const owned = (await cluster.node(port)).slots;
    const names: string[] = [];
    const slots: number[] = [];
    for (let i = 0; slots.length < slotCount; i += 1) {
      const tag = `${label}${i}`;
      const slot = await cluster.slotOf(channelOf(`{${tag}}`));
      if (slots.includes(slot) || !owned.some(([a, b]) => slot >= a && slot <= b)) continue;
      names.push(...(slots.length === 0 ? [`{${tag}}a`, `{${tag}}b`] : [`{${tag}}a`]));
      slots.push(slot);
    }
    return { names, slots };
  }

  /** PUBSUB SHARDNUMSUB of each channel, asked of the node on `port` (what that node alone has). */
  async function subscribersOn(port: number, channels: readonly string[]): Promise<number[]> {
    const reply = await resharder.node(port).call('PUBSUB', 'SHARDNUMSUB', ...channels);
    if (!Array.isArray(reply) || reply.length !== channels.length * 2)
      throw new Error(`Unexpected reply to PUBSUB SHARDNUMSUB: ${JSON.stringify(reply)}`);
    return channels.map((_, i) => Number(reply[i * 2 + 1]));
  }

  /** This suite's channels subscribed on the node on `port` (PUBSUB SHARDCHANNELS). */
  async function channelsOn(port: number): Promise<string[]> {
    const reply = await resharder.node(port).call('PUBSUB', 'SHARDCHANNELS', `${CLIENT_PREFIX}${prefix}*`);
    if (!Array.isArray(reply)) throw new Error(`Unexpected reply to PUBSUB SHARDCHANNELS: ${JSON.stringify(reply)}`);
    return reply.map(String).sort();
  }

  /** Wait until every channel has one subscriber on the node on `port`; throws after 5 s. */
  async function awaitListening(port: number, channels: readonly string[], what: string): Promise<void> {
    await waitFor(
      async () => (await subscribersOn(port, channels)).every((n) => n === 1),
      5_000,
      `the waiters to listen on port ${port} (${what})`,
    );
  }

  function startWait(app: TestApp, name: string): Wait {
    const wait: Wait = {
      name,
      promise: app.locks.tryLock(name, { waitTime: WAIT_TIME_MS, expire: 5_000 }),
    };
    wait.promise.then(
      (handle) => {
        wait.settledAt = performance.now();
        wait.handle = handle;
      },
      (error: unknown) => {
        wait.settledAt = performance.now();
        wait.error = error;
      },
    );
    return wait;
  }

  /** Resolves when `wait` settles, or after `ms`, whichever comes first. */
  async function settledWithin(wait: Wait, ms: number): Promise<void> {
    let timer: NodeJS.Timeout | undefined;
    await Promise.race([
      wait.promise.then(
        () => undefined,
        () => undefined,
      ),
      new Promise<void>((resolve) => (timer = setTimeout(resolve, ms))),
    ]);
    clearTimeout(timer);
  }

  /**
   * The holder holds `names` (watchdog), `listener` waits for each, and `disturb` happens (a move,
   * a killed connection) while they wait, after which the channels must be subscribed on `port`.
   * Then each lock is released in turn, and the time its waiter takes to hold it measured.
   * Everything is released at the end, whatever happened.
   */
  async function handOversAfter(
    listener: TestApp,
    names: readonly string[],
    listeningOn: number,
    disturb: () => Promise<void>,
    port: number,
  ): Promise<HandOvers> {
    const channels = names.map(channelOf);
    const holds: LockHandle[] = [];
    const waits: Wait[] = [];
    const released: boolean[] = [];
    try {
      holds.push(...(await Promise.all(names.map((name) => holder.locks.lock(name, { lockWatchdogTimeout: 6_000 })))));
      waits.push(...names.map((name) => startWait(listener, name)));
      await awaitListening(listeningOn, channels, 'before the slots move or the connection drops');

      await disturb();
      const from = performance.now();
      let onTarget: number[] = [];
      let resubscribedMs: number | undefined;
      await waitFor(
        async () => {
          onTarget = await subscribersOn(port, channels);
          if (onTarget.some((n) => n !== 1)) return false;
          resubscribedMs = Math.round(performance.now() - from);
          return true;
        },
        RESUBSCRIBE_MS,
        'the channels to be subscribed on their new node',
      ).catch(() => undefined); // asserted below, with the hand-overs it leads to
      const elsewhere: string[] = [];
      for (const other of masters.filter((master) => master !== port)) {
        const counts = await subscribersOn(other, channels);
        elsewhere.push(...channels.filter((_, i) => counts[i] > 0).map((channel) => `${channel} on port ${other}`));
      }

      const handOverMs: (number | undefined)[] = [];
      for (const [i, wait] of waits.entries()) {
        const releasing = performance.now();
        released.push(await holds[i].release());
        // Past a deaf waiter's 1 s refresh, so that the report says how long it took instead.
        await settledWithin(wait, 1_500);
        handOverMs.push(wait.settledAt === undefined ? undefined : Math.round(wait.settledAt - releasing));
      }
      await Promise.allSettled(waits.map((wait) => wait.promise));
      const report = [
        `subscribed on port ${port}: ${onTarget.join(' ')} (after ${resubscribedMs ?? 'never'} ms); elsewhere: ${elsewhere.join(' ') || 'none'}`,
        ...waits.map(
          (wait, i) =>
            `${wait.name}: released ${String(released[i])}, waiter ${wait.handle ? 'holds it' : String(wait.handle ?? wait.error)} after ${handOverMs[i] ?? 'never'} ms`,
        ),
      ].join('\n');
      return { channels, onTarget, resubscribedMs, elsewhere, handOverMs, waits, holds, released, report };
    } finally {
      await Promise.allSettled(holds.map((hold) => hold.release()));
      const got = await Promise.allSettled(waits.map((wait) => wait.promise));
      const taken = got.flatMap((result) => (result.status === 'fulfilled' && result.value ? [result.value] : []));
      await Promise.allSettled(taken.map((handle) => handle.release()));
    }
  }

  /** What every scenario must show: listened to on `port` only, and every hand-over prompt. */
  async function expectPromptHandOvers(seen: HandOvers, port: number): Promise<void> {
    const { report } = seen;
    expect(seen.onTarget, `every channel subscribed once on port ${port}\n${report}`).toEqual(
      seen.channels.map(() => 1),
    );
    expect(seen.elsewhere, `channels left on another master\n${report}`).toEqual([]);
    expect(seen.released, report).toEqual(seen.channels.map(() => true));
    for (const [i, wait] of seen.waits.entries()) {
      expect(wait.handle, `${wait.name}: the waiter holds it\n${report}`).toBeTruthy();
      expect(wait.handle?.fencingToken, report).toBeGreaterThan(seen.holds[i].fencingToken);
      expect(seen.handOverMs[i], `${wait.name}: hand-over within ${HAND_OVER_MS} ms\n${report}`).toBeLessThan(
        HAND_OVER_MS,
      );
    }
    expect(lost, report).toEqual([]);
    // Nothing of the locks left once every hold is released.
    for (const channel of seen.channels)
      expect(await holderClient.exists(channel.slice(CLIENT_PREFIX.length)), channel).toBe(0);
  }

  /** The keys the node on `port` holds in `slot`. */
  async function keysIn(port: number, slot: number): Promise<string[]> {
    const reply = await resharder.node(port).call('CLUSTER', 'GETKEYSINSLOT', String(slot), '1000');
    if (!Array.isArray(reply)) throw new Error(`Unexpected reply to CLUSTER GETKEYSINSLOT: ${JSON.stringify(reply)}`);
    return reply.map(String).sort();
  }

  /**
   * Move the slots of `names` from the master on `from` to the one on `to`, every key in them (the
   * locks, their fencing counter, their lines), then wait until both applications' clients route
   * the slots there.
   */
  async function move(names: readonly string[], slots: readonly number[], from: number, to: number): Promise<void> {
    const library = (keys: readonly string[]): string[] =>
      keys.filter((key) => key.startsWith(`${CLIENT_PREFIX}${prefix}#fence:`) || key.includes('#line:')).sort();
    const before = await Promise.all(slots.map((slot) => keysIn(from, slot)));
    for (const [i, slot] of slots.entries()) {
      expect(
        library(before[i]).some((key) => key.includes('#fence:')),
        `a fencing counter in slot ${slot}`,
      ).toBe(true);
      expect(
        library(before[i]).some((key) => key.includes('#line:')),
        `a line in slot ${slot}`,
      ).toBe(true);
    }
    await resharder.move(slots, to);
    const after = await Promise.all(slots.map((slot) => keysIn(to, slot)));
    expect(await Promise.all(slots.map((slot) => keysIn(from, slot))), `keys left on port ${from}`).toEqual(
      slots.map(() => []),
    );
    for (const [i, slot] of slots.entries()) expect(library(after[i]), `slot ${slot}`).toEqual(library(before[i]));
    for (const name of names) expect(after.flat(), name).toContain(channelOf(name));
    await Promise.all(
      slots.flatMap((slot) =>
        [waiterClient, holderClient].map((client) => cluster.awaitClientRoutes(client, slot, to)),
      ),
    );
  }

  let moving: { names: string[]; slots: number[] };

  it('moves 4 slots (5 locks) from master A to master B: re-subscribed on B only, each waiter holds its lock within 200 ms of the release', async () => {
    const [a, b] = masters;
    moving = await namesOn(a, 'mv', 4);
    expect(new Set(moving.slots).size).toBe(4);
    const seen = await handOversAfter(waiter, moving.names, a, () => move(moving.names, moving.slots, a, b), b);
    for (const slot of moving.slots) expect(await resharder.ownerOf(slot)).toBe(b);
    expect(await channelsOn(a), 'nothing left subscribed on A').toEqual([]);
    await expectPromptHandOvers(seen, b);
  });

  it('moves them back from B to A: no state left behind, the same', async () => {
    const [a, b] = masters;
    for (const slot of moving.slots) expect(await resharder.ownerOf(slot), 'the slots are on B').toBe(b);
    const seen = await handOversAfter(waiter, moving.names, b, () => move(moving.names, moving.slots, b, a), a);
    for (const slot of moving.slots) expect(await resharder.ownerOf(slot)).toBe(a);
    await expectPromptHandOvers(seen, a);
  });

  it("moves 2 slots in stages (MIGRATING, then their keys, then the owner): the channels stay on A until the slots are B's, then the same", async () => {
    const [a, b] = masters;
    const { names, slots } = await namesOn(a, 'st', 2);
    const channels = names.map(channelOf);
    const seen = await handOversAfter(
      waiter,
      names,
      a,
      async () => {
        const migrations: SlotMigration[] = [];
        for (const slot of slots) migrations.push(await resharder.begin(slot, b));
        // Redis keeps a MIGRATING slot's subscriptions on its owner, and the library keeps them there.
        await new Promise<void>((resolve) => waiterClient.refreshSlotsCache(() => resolve()));
        expect(await subscribersOn(a, channels), 'MIGRATING: still on A').toEqual(channels.map(() => 1));
        for (const migration of migrations)
          expect(await migration.migrateKeys(), `keys of ${migration.slot}`).toBeGreaterThan(0);
        for (const slot of slots) expect(await keysIn(a, slot), `slot ${slot} emptied on A`).toEqual([]);
        expect(await subscribersOn(a, channels), "keys moved, slot still A's: still on A").toEqual(
          channels.map(() => 1),
        );
        for (const migration of migrations) await migration.finish();
        await Promise.all(
          slots.flatMap((slot) =>
            [waiterClient, holderClient].map((client) => cluster.awaitClientRoutes(client, slot, b)),
          ),
        );
      },
      b,
    );
    for (const slot of slots) expect(await resharder.ownerOf(slot)).toBe(b);
    await expectPromptHandOvers(seen, b);
  });

  it.each<[string, ClusterOptions['redisOptions']]>([
    ['ioredis re-subscribes by itself (autoResubscribe, the default)', {}],
    ['autoResubscribe: false, so the library alone re-subscribes', { autoResubscribe: false }],
  ])(
    'a killed subscriber connection to a master, %s: every waiter, on 3 slots, holds its lock within 200 ms of the release',
    async (label, redisOptions) => {
      const c = masters[2];
      const client = await cluster.readyClient({ keyPrefix: CLIENT_PREFIX, redisOptions });
      const listener = await createTestApp([], { redis: client, keyPrefix: prefix });
      apps.push(listener);
      const { names } = await namesOn(c, label.startsWith('ioredis') ? 'kd' : 'kn', 3);
      const seen = await handOversAfter(
        listener,
        names,
        c,
        async () => {
          const killed = Number(await resharder.node(c).call('CLIENT', 'KILL', 'TYPE', 'pubsub'));
          expect(killed, 'pub/sub connections killed on C').toBeGreaterThanOrEqual(1);
          // The connection comes back no sooner than 50 ms later (the library's reconnect delay).
          expect(await subscribersOn(c, names.map(channelOf)), 'unsubscribed by the kill').toEqual(names.map(() => 0));
        },
        c,
      );
      await expectPromptHandOvers(seen, c);
    },
  );
});
