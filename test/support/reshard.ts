import { Redis } from 'ioredis';
import { waitFor } from './async';
import type { ClusterNodeInfo, RedisCluster } from './cluster';

const HOST = '127.0.0.1';

/** How a slot's keys are moved. */
export interface MigrateOptions {
  /** Keys per `MIGRATE` (and per `CLUSTER GETKEYSINSLOT`). Default 100. */
  batch?: number;
  /** `MIGRATE`'s own timeout, in ms. Default 5000. */
  timeoutMs?: number;
}

/** What moving slots did. */
export interface MoveReport {
  /** Keys migrated, per slot. */
  readonly keys: ReadonlyMap<number, number>;
  /** From the first `SETSLOT ... IMPORTING` until every live node agreed on the new owners. */
  readonly tookMs: number;
}

/**
 * One slot on its way from a master to another, stopped mid-way: `IMPORTING` on the target,
 * `MIGRATING` on the source, and some (or none) of its keys already on the target. Until
 * `finish()`, the source still owns the slot: a command on a key already moved is answered `ASK`,
 * a script on keys split between the two `TRYAGAIN`.
 */
export interface SlotMigration {
  readonly slot: number;
  readonly sourcePort: number;
  readonly targetPort: number;
  /** Keys migrated so far. */
  readonly moved: number;
  /** Migrate up to `count` more of the slot's keys (every one left when omitted); how many moved. */
  migrateKeys(count?: number): Promise<number>;
  /**
   * Migrate the keys left, then give the slot to the target (`CLUSTER SETSLOT <slot> NODE` on the
   * target, the source, then every other master) and wait until every live node agrees.
   */
  finish(): Promise<void>;
}

/** `reply` as strings, or an error naming `what` (Redis replies are untyped). */
function strings(reply: unknown, what: string): string[] {
  if (!Array.isArray(reply) || !reply.every((item) => typeof item === 'string'))
    throw new Error(`Unexpected reply to ${what}: ${JSON.stringify(reply)}`);
  return reply;
}

/** The owner's port of each slot range in a `CLUSTER SLOTS` reply: `[first, last, port]`. */
function slotRanges(reply: unknown): [number, number, number][] {
  if (!Array.isArray(reply)) throw new Error(`Unexpected reply to CLUSTER SLOTS: ${JSON.stringify(reply)}`);
  return reply.map((range: unknown): [number, number, number] => {
    if (!Array.isArray(range) || !Array.isArray(range[2]))
      throw new Error(`Unexpected range in CLUSTER SLOTS: ${JSON.stringify(range)}`);
    return [Number(range[0]), Number(range[1]), Number(range[2][1])];
  });
}

/**
 * Moves hash slots between the masters of a test `RedisCluster` the way `redis-cli --cluster
 * reshard` does: `CLUSTER SETSLOT <slot> IMPORTING <source>` on the target, `CLUSTER SETSLOT <slot>
 * MIGRATING <target>` on the source, the slot's keys moved in batches (`CLUSTER GETKEYSINSLOT`,
 * `MIGRATE ... KEYS`), then `CLUSTER SETSLOT <slot> NODE <target>` on the target, the source and
 * every other master. `move()` does all of it; `begin()` stops a slot mid-way (MIGRATING) for a
 * test to go on from. It talks to each node over a connection of its own (`close()` ends them).
 */
export class Resharder {
  private readonly connections = new Map<number, Redis>();

  constructor(private readonly cluster: RedisCluster) {}

  /** A plain connection to the node on `port` (opened on first use, closed by `close()`). */
  node(port: number): Redis {
    let connection = this.connections.get(port);
    if (!connection) {
      connection = new Redis({ host: HOST, port, maxRetriesPerRequest: 1, retryStrategy: () => 50 });
      connection.on('error', () => undefined);
      this.connections.set(port, connection);
    }
    return connection;
  }

  /** The port of the master that serves `slot`, as the Cluster says now. */
  async ownerOf(slot: number): Promise<number> {
    return (await this.master(slot)).port;
  }

  /**
   * Move `slots` to the master on `targetPort`. Each slot is set IMPORTING/MIGRATING and has all
   * its keys migrated; then every slot is given to the target, one after the other (within a few
   * ms, so that a client refreshing its slot map sees them move together), and the call returns
   * once every live node, replicas included, says the target serves them. A slot the target
   * already serves is left alone.
   */
  async move(slots: readonly number[], targetPort: number, options: MigrateOptions = {}): Promise<MoveReport> {
    const started = performance.now();
    const migrations: SlotMigration[] = [];
    for (const slot of slots) {
      if ((await this.ownerOf(slot)) === targetPort) continue;
      const migration = await this.begin(slot, targetPort, { ...options, keys: Infinity });
      migrations.push(migration);
    }
    const topology = await this.cluster.topology();
    for (const migration of migrations) await this.assign(migration.slot, migration.sourcePort, targetPort, topology);
    await this.awaitOwner(slots, targetPort);
    return {
      keys: new Map(migrations.map((migration) => [migration.slot, migration.moved])),
      tookMs: Math.round(performance.now() - started),
    };
  }

  /**
   * Start moving `slot` to the master on `targetPort` and stop mid-way: the slot is `IMPORTING`
   * on the target and `MIGRATING` on the source, and `options.keys` of its keys (default none)
   * are migrated. The returned migration goes on from there.
   */
  async begin(
    slot: number,
    targetPort: number,
    options: MigrateOptions & { keys?: number } = {},
  ): Promise<SlotMigration> {
    const topology = await this.cluster.topology();
    const source = this.ownerIn(topology, slot);
    const target = topology.find((node) => node.port === targetPort && node.role === 'master' && node.alive);
    if (!target) throw new Error(`No live master on port ${targetPort}`);
    if (source.port === targetPort) throw new Error(`Slot ${slot} is already served by port ${targetPort}`);
    // The target first: once the source redirects (ASK), the target must accept.
    await this.node(targetPort).call('CLUSTER', 'SETSLOT', String(slot), 'IMPORTING', source.id);
    await this.node(source.port).call('CLUSTER', 'SETSLOT', String(slot), 'MIGRATING', target.id);
    let moved = 0;
    let finished = false;
    const migrateKeys = async (count = Infinity): Promise<number> => {
      if (finished) throw new Error(`Slot ${slot} has been moved already`);
      const n = await this.migrateKeys(slot, source.port, targetPort, count, options);
      moved += n;
      return n;
    };
    await migrateKeys(options.keys ?? 0);
    return {
      slot,
      sourcePort: source.port,
      targetPort,
      get moved() {
        return moved;
      },
      migrateKeys,
      finish: async () => {
        await migrateKeys();
        finished = true;
        await this.assign(slot, source.port, targetPort, await this.cluster.topology());
        await this.awaitOwner([slot], targetPort);
      },
    };
  }

  /**
   * Wait until every live node (masters and replicas) says, in `CLUSTER SLOTS`, that the master on
   * `port` serves every one of `slots`.
   */
  async awaitOwner(slots: readonly number[], port: number, timeoutMs = 10_000): Promise<void> {
    await waitFor(
      async () => {
        const live = (await this.cluster.topology()).filter((node) => node.alive);
        for (const node of live) {
          const ranges = slotRanges(await this.node(node.port).call('CLUSTER', 'SLOTS'));
          const served = (slot: number): boolean =>
            ranges.some(([first, last, owner]) => slot >= first && slot <= last && owner === port);
          if (!slots.every(served)) return false;
        }
        return true;
      },
      timeoutMs,
      `every node to say port ${port} serves slots ${slots.join(', ')}`,
    );
  }

  /** Close every connection this opened. */
  close(): void {
    for (const connection of this.connections.values()) connection.disconnect();
    this.connections.clear();
  }

  /** Up to `count` of `slot`'s keys from the source to the target, in batches; how many moved. */
  private async migrateKeys(
    slot: number,
    sourcePort: number,
    targetPort: number,
    count: number,
    options: MigrateOptions,
  ): Promise<number> {
    const batch = options.batch ?? 100;
    const timeoutMs = options.timeoutMs ?? 5_000;
    const source = this.node(sourcePort);
    let moved = 0;
    while (moved < count) {
      const want = Math.min(batch, count - moved);
      const keys = strings(
        await source.call('CLUSTER', 'GETKEYSINSLOT', String(slot), String(want)),
        'CLUSTER GETKEYSINSLOT',
      );
      if (keys.length === 0) break;
      const reply = await source.call('MIGRATE', HOST, String(targetPort), '', '0', String(timeoutMs), 'KEYS', ...keys);
      // NOKEY: every one of them expired or was deleted in between; the next round looks again.
      if (reply !== 'OK' && reply !== 'NOKEY') throw new Error(`MIGRATE of slot ${slot} replied ${String(reply)}`);
      moved += keys.length;
    }
    return moved;
  }

  /**
   * `CLUSTER SETSLOT <slot> NODE <target>` on the target first (it stops importing and bumps its
   * epoch), then the source (which refuses while it still holds keys of the slot), then the other
   * masters, as `redis-cli` does.
   */
  private async assign(
    slot: number,
    sourcePort: number,
    targetPort: number,
    topology: readonly ClusterNodeInfo[],
  ): Promise<void> {
    const target = topology.find((node) => node.port === targetPort);
    if (!target) throw new Error(`No node on port ${targetPort}`);
    const others = topology.filter(
      (node) => node.role === 'master' && node.alive && node.port !== targetPort && node.port !== sourcePort,
    );
    for (const port of [targetPort, sourcePort, ...others.map((node) => node.port)])
      await this.node(port).call('CLUSTER', 'SETSLOT', String(slot), 'NODE', target.id);
  }

  private async master(slot: number): Promise<ClusterNodeInfo> {
    return this.ownerIn(await this.cluster.topology(), slot);
  }

  private ownerIn(topology: readonly ClusterNodeInfo[], slot: number): ClusterNodeInfo {
    const owner = topology.find(
      (node) => node.role === 'master' && node.alive && node.slots.some(([a, b]) => slot >= a && slot <= b),
    );
    if (!owner) throw new Error(`No live master serves slot ${slot}`);
    return owner;
  }
}
