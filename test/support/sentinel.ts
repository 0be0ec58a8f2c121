/**
 * Replicated Redis topologies owned by a test, built from Debian's `redis-server`:
 *
 * - `ReplicatedPair`: a master and one replica, no Sentinel. The replica replicates through a
 *   `ReplicationLink` (a byte pipe the test can cut), and can be promoted by hand
 *   (`REPLICAOF NO ONE`) and attached again: the quickest way to replay a failover many times.
 * - `SentinelTopology`: the same pair watched by 3 sentinels (`redis-server <conf> --sentinel`),
 *   quorum 2, `down-after-milliseconds` 1000, so `SENTINEL FAILOVER` completes in about a second
 *   and a killed master is replaced within a few.
 *
 * ```ts
 * const topology = await SentinelTopology.start();
 * DisLockModule.forRoot({ redis: topology.connection, keyPrefix }); // { sentinels, name }
 * const { ms } = await topology.failover();  // resolves once all 3 sentinels name the new master
 * await topology.dispose();                  // every process killed, every temp dir removed
 * ```
 *
 * Every process runs on a free loopback port, persists nothing and lives in a temp dir of its own.
 * `dispose()` kills what is left (also after a failed test); a process-exit hook kills whatever a
 * crashed test file did not dispose.
 */
import { waitFor } from './async';
import { type ChildProcess, spawn } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { createServer, connect, type Server, type Socket } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { Redis } from 'ioredis';
import { freePort, RedisServer } from './redis-server';

export interface HostPort {
  readonly host: string;
  readonly port: number;
}

/** Children still running in this process, killed on exit if a test never disposed them. */
const live = new Set<ChildProcess>();
process.once('exit', () => {
  for (const child of live) child.kill('SIGKILL');
});

/** A client for the harness's own questions: fails fast, never retries for long, never throws events. */
function plainClient(port: number): Redis {
  const client = new Redis({
    port,
    host: '127.0.0.1',
    maxRetriesPerRequest: 1,
    connectTimeout: 1_000,
    retryStrategy: (times) => (times > 50 ? null : 50),
  });
  client.on('error', () => undefined);
  return client;
}

/** `INFO replication` as fields. */
export async function replicationInfo(client: Redis): Promise<Record<string, string>> {
  const text = await client.info('replication');
  const fields: Record<string, string> = {};
  for (const line of text.split('\r\n')) {
    const at = line.indexOf(':');
    if (at > 0) fields[line.slice(0, at)] = line.slice(at + 1);
  }
  return fields;
}

/** A flat `[field, value, ...]` reply as an object. */
function pairs(reply: unknown): Record<string, string> {
  const list = reply as string[];
  const out: Record<string, string> = {};
  for (let i = 0; i + 1 < list.length; i += 2) out[list[i]] = list[i + 1];
  return out;
}

/**
 * A byte pipe on a free loopback port in front of the master, for the replica's replication
 * connection only. `cut()` makes it a partition: both connections stay open, but every byte
 * either way is dropped from then on, so nothing the master writes reaches the replica, ever
 * (also not later: dropped, not delayed) and the replica's acknowledgements stop (`WAIT` counts
 * it out). `heal()` closes the cut connections; the replica reconnects through the pipe and
 * resynchronizes (a partial resync from the master's backlog, or a full one).
 */
export class ReplicationLink {
  private readonly pairs = new Set<[Socket, Socket]>();
  private cutNow = false;

  private constructor(
    private readonly server: Server,
    readonly port: number,
    private targetPort: number,
  ) {}

  static async start(targetPort: number): Promise<ReplicationLink> {
    const server = createServer();
    server.on('error', () => undefined);
    const port = await new Promise<number>((resolve, reject) => {
      server.once('error', reject);
      server.listen(0, '127.0.0.1', () => {
        const address = server.address();
        if (typeof address === 'object' && address) resolve(address.port);
        else reject(new Error('no port'));
      });
    });
    const link = new ReplicationLink(server, port, targetPort);
    server.on('connection', (socket) => link.accept(socket));
    return link;
  }

  get isCut(): boolean {
    return this.cutNow;
  }

  /** Forward new connections to another port (the connections open now are left as they are). */
  retarget(port: number): void {
    this.targetPort = port;
  }

  /** Drop every byte either way from now on, on the connections open now and on new ones. */
  cut(): void {
    this.cutNow = true;
  }

  /** End the cut: close the connections it stalled, so the replica reconnects and resynchronizes. */
  heal(): void {
    this.cutNow = false;
    for (const [a, b] of this.pairs) {
      a.destroy();
      b.destroy();
    }
    this.pairs.clear();
  }

  async close(): Promise<void> {
    this.heal();
    await new Promise<void>((resolve) => this.server.close(() => resolve()));
  }

  private accept(client: Socket): void {
    const upstream = connect({ port: this.targetPort, host: '127.0.0.1' });
    const pair: [Socket, Socket] = [client, upstream];
    this.pairs.add(pair);
    const end = (): void => {
      client.destroy();
      upstream.destroy();
      this.pairs.delete(pair);
    };
    for (const socket of pair) {
      socket.setNoDelay(true);
      socket.on('error', end);
      socket.on('close', end);
    }
    client.on('data', (chunk: Buffer) => {
      if (!this.cutNow) upstream.write(chunk);
    });
    upstream.on('data', (chunk: Buffer) => {
      if (!this.cutNow) client.write(chunk);
    });
  }
}

/**
 * Arguments for a `redis-server` that takes part in replication. A full resync writes its snapshot
 * to disk (a few KB here): a diskless one would start the command stream only at the replica's
 * first `REPLCONF ACK`, up to a second later. `repl-timeout` 60 s (the default, made explicit):
 * a cut link is not noticed by either side while a test runs.
 */
const REPLICATION_ARGS = ['--repl-diskless-sync', 'no', '--repl-diskless-sync-delay', '0', '--repl-timeout', '60'];

/**
 * A master and a replica. Before any promotion, `master` is the node the replica follows
 * (through `link`, which can be cut); `promote()` and `reattach()` replay a failover by hand.
 * `master` and `replica` always name the nodes' roles now; `nodes` keeps their start order.
 */
export class ReplicatedPair {
  private readonly clients: Redis[] = [];
  private readonly admins: (Redis | undefined)[] = [undefined, undefined];

  protected constructor(
    readonly nodes: readonly [RedisServer, RedisServer],
    readonly link: ReplicationLink,
    /** Index in `nodes` of the node that is master now. */
    protected masterIndex: 0 | 1,
  ) {}

  static async start(): Promise<ReplicatedPair> {
    const [nodes, link] = await ReplicatedPair.startNodes();
    const pair = new ReplicatedPair(nodes, link, 0);
    try {
      await pair.waitForSync();
    } catch (error) {
      await pair.dispose();
      throw error;
    }
    return pair;
  }

  /** Master (nodes[0]) and replica (nodes[1]) replicating through a link; not waited for yet. */
  protected static async startNodes(): Promise<[[RedisServer, RedisServer], ReplicationLink]> {
    const master = await RedisServer.start({ args: REPLICATION_ARGS });
    let link: ReplicationLink | undefined;
    try {
      link = await ReplicationLink.start(master.port);
      const replica = await RedisServer.start({
        args: [...REPLICATION_ARGS, '--replicaof', '127.0.0.1', String(link.port)],
      });
      return [[master, replica], link];
    } catch (error) {
      await link?.close();
      await master.dispose();
      throw error;
    }
  }

  get master(): RedisServer {
    return this.nodes[this.masterIndex];
  }

  get replica(): RedisServer {
    return this.nodes[1 - this.masterIndex];
  }

  /** A plain client to the node that is master now (closed by `dispose()`). */
  masterClient(): Redis {
    return this.track(plainClient(this.master.port));
  }

  /** A plain client to the node that is replica now (closed by `dispose()`). */
  replicaClient(): Redis {
    return this.track(plainClient(this.replica.port));
  }

  /** A plain client to a node (closed by `dispose()`). */
  clientOf(node: RedisServer): Redis {
    return this.track(plainClient(node.port));
  }

  /**
   * Stop replication (see `ReplicationLink.cut`): the master's writes never reach the replica.
   * Only while the replica follows through the link: not after Sentinel re-pointed it.
   */
  cutReplication(): void {
    this.link.cut();
  }

  /** Let replication flow again; resolves once the replica has everything the master has. */
  async restoreReplication(timeoutMs = 5_000): Promise<void> {
    this.link.heal();
    await this.waitForSync(timeoutMs);
  }

  /**
   * Resolves once the replica's link to the master is up and the replica acknowledged a write
   * made just now. Asking `WAIT` about a fresh write matters: after a full resync, Redis 7 streams
   * nothing to the replica until its first `REPLCONF ACK` (sent once a second), and an older
   * write's `WAIT` can be answered from an acknowledgement of before the resync.
   */
  async waitForSync(timeoutMs = 5_000): Promise<void> {
    const master = this.admin(this.master);
    const replica = this.admin(this.replica);
    await waitFor(
      async () => {
        const info = await replicationInfo(replica);
        if (info.role !== 'slave' || info.master_link_status !== 'up') return false;
        // PUBLISH is replicated and advances this connection's offset without creating a key.
        await master.publish('__dislock-test:sync', '1');
        return (await master.call('WAIT', '1', '100')) === 1;
      },
      timeoutMs,
      `the replica on port ${this.replica.port} to sync with the master on port ${this.master.port}`,
      10,
    );
  }

  /**
   * A failover by hand: the replica becomes a master (`REPLICAOF NO ONE`); the old master is left
   * running as it is (a master nobody follows), as if it had been partitioned away.
   */
  async promote(): Promise<RedisServer> {
    await this.admin(this.replica).call('REPLICAOF', 'NO', 'ONE');
    this.masterIndex = this.masterIndex === 0 ? 1 : 0;
    return this.master;
  }

  /**
   * Undo `promote()`: the old master is master again and the promoted node follows it again
   * through the link, with the old master's data (a full resync); resolves once it has synced.
   */
  async reattach(timeoutMs = 5_000): Promise<void> {
    this.masterIndex = this.masterIndex === 0 ? 1 : 0;
    this.link.retarget(this.master.port);
    this.link.heal();
    await this.admin(this.replica).call('REPLICAOF', '127.0.0.1', String(this.link.port));
    await this.waitForSync(timeoutMs);
  }

  async dispose(): Promise<void> {
    for (const client of this.clients.splice(0)) client.disconnect();
    await this.link.close().catch(() => undefined);
    await Promise.all(this.nodes.map((node) => node.dispose().catch(() => undefined)));
  }

  /** The harness's own connection to a node, kept open (a promotion must not wait for a connect). */
  protected admin(node: RedisServer): Redis {
    const index = this.nodes.indexOf(node);
    return (this.admins[index] ??= this.track(plainClient(node.port)));
  }

  protected track(client: Redis): Redis {
    this.clients.push(client);
    return client;
  }

  protected untrack(client: Redis): void {
    client.disconnect();
    const at = this.clients.indexOf(client);
    if (at >= 0) this.clients.splice(at, 1);
  }
}

interface SentinelProcess {
  readonly port: number;
  readonly id: string;
  readonly dir: string;
  child: ChildProcess | undefined;
}

export interface SentinelTopologyOptions {
  /** `sentinel down-after-milliseconds`: how long a node must be silent to be called down. Default 1000. */
  readonly downAfterMs?: number;
  /**
   * `sentinel failover-timeout`. Default 30 000, which does not slow a failover down (it goes on
   * as soon as the promoted replica reports its new role: about 1 s). The replica follows the
   * master through the cuttable link, i.e. another address than the master's: with a short
   * timeout (2 000 tried) Sentinel re-points it ("+fix-slave-config") as a failover starts, and
   * `SENTINEL FAILOVER` aborts (`-failover-abort-no-good-slave`).
   */
  readonly failoverTimeoutMs?: number;
}

/**
 * 1 master + 1 replica + 3 sentinels (quorum 2). The sentinels are told about each other and the
 * replica in their config files (`sentinel known-sentinel`, `known-replica`), so the topology is
 * ready as soon as their first pings are answered, without waiting for hello messages.
 */
export class SentinelTopology extends ReplicatedPair {
  readonly name = 'dislock';
  private readonly sentinelProcesses: SentinelProcess[] = [];

  private constructor(nodes: [RedisServer, RedisServer], link: ReplicationLink) {
    super(nodes, link, 0);
  }

  static override async start(options: SentinelTopologyOptions = {}): Promise<SentinelTopology> {
    const [nodes, link] = await ReplicatedPair.startNodes();
    const topology = new SentinelTopology(nodes, link);
    try {
      await topology.startSentinels(options.downAfterMs ?? 1_000, options.failoverTimeoutMs ?? 30_000);
      await topology.waitForSync();
      await topology.waitUntilReady();
    } catch (error) {
      await topology.dispose();
      throw error;
    }
    return topology;
  }

  /** The sentinels' addresses, as ioredis takes them. */
  get sentinels(): HostPort[] {
    return this.sentinelProcesses.map(({ port }) => ({ host: '127.0.0.1', port }));
  }

  /** `{ sentinels, name }`: ioredis options for the master (add any other RedisOptions). */
  get connection(): { sentinels: HostPort[]; name: string } {
    return { sentinels: this.sentinels, name: this.name };
  }

  /** A plain client to sentinel `index` (closed by `dispose()`). */
  sentinelClient(index: number): Redis {
    return this.track(plainClient(this.sentinelProcesses[index].port));
  }

  /** The master's port according to each running sentinel (undefined when one does not answer). */
  async reportedMasterPorts(): Promise<(number | undefined)[]> {
    return Promise.all(
      this.sentinelProcesses.map(async (sentinel) => {
        if (!sentinel.child) return undefined;
        const client = this.track(plainClient(sentinel.port));
        try {
          const reply = (await client.call('SENTINEL', 'GET-MASTER-ADDR-BY-NAME', this.name)) as string[] | null;
          return reply ? Number(reply[1]) : undefined;
        } catch {
          return undefined;
        } finally {
          this.untrack(client);
        }
      }),
    );
  }

  /**
   * `SENTINEL FAILOVER`: the replica is promoted; resolves once every sentinel names it as the
   * master, with how long that took. The old master keeps running as a master until Sentinel
   * turns it into a replica (about 8–10 s later; `waitForReplica()` waits for that).
   */
  async failover(timeoutMs = 10_000): Promise<{ ms: number; master: RedisServer }> {
    const oldMaster = this.master;
    const started = performance.now();
    const sentinel = this.track(plainClient(this.sentinelProcesses[0].port));
    try {
      await sentinel.call('SENTINEL', 'FAILOVER', this.name);
    } finally {
      this.untrack(sentinel);
    }
    await this.waitForNewMaster(oldMaster, timeoutMs);
    return { ms: performance.now() - started, master: this.master };
  }

  /** SIGKILL the master; resolves once every sentinel names the replica as the new master. */
  async killMaster(timeoutMs = 15_000): Promise<{ ms: number; master: RedisServer }> {
    const oldMaster = this.master;
    const started = performance.now();
    await oldMaster.stop();
    await this.waitForNewMaster(oldMaster, timeoutMs);
    return { ms: performance.now() - started, master: this.master };
  }

  /** Resolves once the non-master node is a replica of the master again, in sync. */
  async waitForReplica(timeoutMs = 20_000): Promise<void> {
    await this.waitForSync(timeoutMs);
  }

  /** SIGKILL one sentinel (it stays down). */
  killSentinel(index: number): void {
    const sentinel = this.sentinelProcesses[index];
    sentinel.child?.kill('SIGKILL');
    sentinel.child = undefined;
  }

  /** The log of sentinel `index` (for a failing test's diagnosis). */
  sentinelLog(index: number): string {
    try {
      return readFileSync(join(this.sentinelProcesses[index].dir, 'sentinel.log'), 'utf8');
    } catch {
      return '';
    }
  }

  override async dispose(): Promise<void> {
    await Promise.all(
      this.sentinelProcesses.map(async (sentinel) => {
        const child = sentinel.child;
        sentinel.child = undefined;
        if (child && child.exitCode === null && child.signalCode === null) {
          const exited = new Promise<void>((resolve) => child.once('exit', () => resolve()));
          child.kill('SIGKILL');
          await exited;
        }
        if (child) live.delete(child);
        rmSync(sentinel.dir, { recursive: true, force: true });
      }),
    );
    await super.dispose();
  }

  private async waitForNewMaster(oldMaster: RedisServer, timeoutMs: number): Promise<void> {
    const next = this.nodes.find((node) => node !== oldMaster) as RedisServer;
    await waitFor(
      async () => {
        const ports = await this.reportedMasterPorts();
        return ports.every((port, i) => port === next.port || !this.sentinelProcesses[i].child);
      },
      timeoutMs,
      `the sentinels to name port ${next.port} as the master`,
    );
    this.masterIndex = this.nodes[0] === next ? 0 : 1;
  }

  private async startSentinels(downAfterMs: number, failoverTimeoutMs: number): Promise<void> {
    for (let i = 0; i < 3; i++) {
      this.sentinelProcesses.push({
        port: await freePort(),
        id: randomBytes(20).toString('hex'),
        dir: mkdtempSync(join(tmpdir(), 'dislock-sentinel-')),
        child: undefined,
      });
    }
    const [master, replica] = this.nodes;
    for (const sentinel of this.sentinelProcesses) {
      const others = this.sentinelProcesses.filter((other) => other !== sentinel);
      const config = [
        `port ${sentinel.port}`,
        'bind 127.0.0.1',
        `dir ${sentinel.dir}`,
        `logfile ${join(sentinel.dir, 'sentinel.log')}`,
        'loglevel notice',
        `sentinel myid ${sentinel.id}`,
        `sentinel monitor ${this.name} 127.0.0.1 ${master.port} 2`,
        `sentinel down-after-milliseconds ${this.name} ${downAfterMs}`,
        `sentinel failover-timeout ${this.name} ${failoverTimeoutMs}`,
        `sentinel parallel-syncs ${this.name} 1`,
        `sentinel known-replica ${this.name} 127.0.0.1 ${replica.port}`,
        ...others.map((other) => `sentinel known-sentinel ${this.name} 127.0.0.1 ${other.port} ${other.id}`),
        '',
      ].join('\n');
      const file = join(sentinel.dir, 'sentinel.conf');
      writeFileSync(file, config);
      const child = spawn('redis-server', [file, '--sentinel'], { stdio: 'ignore' });
      child.on('error', () => undefined);
      child.once('exit', () => live.delete(child));
      live.add(child);
      sentinel.child = child;
    }
  }

  /** Every sentinel sees the master, the replica (link ok) and the 2 other sentinels, all up. */
  private async waitUntilReady(timeoutMs = 10_000): Promise<void> {
    const clients = this.sentinelProcesses.map((sentinel) => this.track(plainClient(sentinel.port)));
    try {
      await waitFor(
        async () => {
          for (const client of clients) {
            const master = pairs(await client.call('SENTINEL', 'MASTER', this.name));
            if (master.flags !== 'master' || Number(master['num-other-sentinels']) !== 2) return false;
            if (Number(master['port']) !== this.master.port) return false;
            const replicas = (await client.call('SENTINEL', 'REPLICAS', this.name)) as unknown[];
            const replica = replicas.map(pairs).find((r) => Number(r.port) === this.replica.port);
            if (!replica || replica.flags !== 'slave' || replica['master-link-status'] !== 'ok') return false;
            const peers = ((await client.call('SENTINEL', 'SENTINELS', this.name)) as unknown[]).map(pairs);
            if (peers.length !== 2 || peers.some((peer) => peer.flags !== 'sentinel')) return false;
          }
          return true;
        },
        timeoutMs,
        'the sentinels to agree on the topology',
      );
    } finally {
      for (const client of clients) this.untrack(client);
    }
  }
}
