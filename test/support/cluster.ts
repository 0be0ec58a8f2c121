import { waitFor } from './async';
import { type ChildProcess, spawn } from 'node:child_process';
import { mkdirSync, mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { createServer } from 'node:net';
import { join } from 'node:path';
import { Cluster, type ClusterNode, type ClusterOptions, Redis } from 'ioredis';
import { freePort } from './redis-server';

const HOST = '127.0.0.1';

/** What one node of the Cluster is, as the Cluster itself says (CLUSTER NODES). */
export interface ClusterNodeInfo {
  readonly port: number;
  readonly id: string;
  readonly role: 'master' | 'replica';
  /** The port of its master (replicas only). */
  readonly masterPort?: number;
  /** Slot ranges served (masters only), `[first, last]`. */
  readonly slots: readonly (readonly [number, number])[];
  /** Whether the process is running (a killed node keeps its last known role). */
  readonly alive: boolean;
}

export interface ClusterStartOptions {
  /**
   * `cluster-node-timeout` in ms: how long a silent node takes to be failed over. Default 1000. A
   * longer one applies from the moment `start()` returns (the Cluster is built on 1000, see
   * BUILD_NODE_TIMEOUT_MS), and to every node restarted later.
   */
  nodeTimeoutMs?: number;
  /** More `redis-server` arguments for every node (e.g. `--rename-command SPUBLISH ''`). */
  args?: readonly string[];
}

interface Node {
  readonly port: number;
  readonly dir: string;
  process: ChildProcess | undefined;
  /** An admin connection (CLUSTER, INFO, ROLE), opened on demand. */
  admin: Redis | undefined;
}

/**
 * The node timeout a Cluster is built on. A master that has seen a majority of the masters out of
 * reach (as each does while the MEETs are under way) says `cluster_state:ok` only once its
 * rejoin delay has passed, which is the node timeout (0.5-5 s): built on 5 s, a Cluster took
 * 5-6 s to be ready instead of 2 (Redis's own 2 s writable delay). A longer timeout is set with
 * CONFIG SET once the Cluster is healthy.
 */
const BUILD_NODE_TIMEOUT_MS = 1_000;

/** Whether a loopback port can be listened on right now. */
function canListen(port: number): Promise<boolean> {
  return new Promise((resolve) => {
    const server = createServer();
    server.once('error', () => resolve(false));
    server.listen(port, HOST, () => server.close(() => resolve(true)));
  });
}

/** Every running Cluster's processes and dirs, killed and removed if the test process exits first. */
const running = new Set<ChildProcess>();
const roots = new Set<string>();
let exitHookInstalled = false;
function installExitHook(): void {
  if (exitHookInstalled) return;
  exitHookInstalled = true;
  process.once('exit', () => {
    for (const orphan of running) orphan.kill('SIGKILL');
    for (const root of roots) rmSync(root, { recursive: true, force: true });
  });
}
function track(child: ChildProcess): void {
  running.add(child);
  child.once('exit', () => running.delete(child));
}

/**
 * A real Redis Cluster owned by a test: 3 masters with 1 replica each, from the machine's
 * `redis-server`, on free loopback ports, persisting nothing, each node in its own temp dir. Built
 * by hand (ADDSLOTSRANGE, SET-CONFIG-EPOCH, MEET, REPLICATE) rather than by `redis-cli --cluster
 * create`, which sleeps a second per step. `start()` returns once every node says
 * `cluster_state:ok`, agrees on the topology and every replica is in sync. `dispose()` kills every
 * process and removes the dirs; a process exit kills whatever is left.
 */
export class RedisCluster {
  private readonly nodes = new Map<number, Node>();
  private readonly clients = new Set<Cluster | Redis>();

  private constructor(
    private readonly root: string,
    private readonly nodeTimeoutMs: number,
    private readonly extraArgs: readonly string[] = [],
  ) {
    installExitHook();
    roots.add(root);
  }

  /** Ports of the masters at start, then of their replicas (replica i follows master i). */
  private masterPorts: number[] = [];
  private replicaPorts: number[] = [];

  static async start(options: ClusterStartOptions = {}): Promise<RedisCluster> {
    const cluster = new RedisCluster(
      mkdtempSync(join(tmpdir(), 'dislock-cluster-')),
      options.nodeTimeoutMs ?? 1_000,
      options.args,
    );
    try {
      await cluster.build();
    } catch (error) {
      await cluster.dispose();
      throw error;
    }
    return cluster;
  }

  /** The seed list: every node (masters first), as ioredis takes it. */
  get seeds(): ClusterNode[] {
    return [...this.masterPorts, ...this.replicaPorts].map((port) => ({ host: HOST, port }));
  }

  /** A Cluster client, closed by `dispose()`. `seeds` defaults to every node. */
  client(options: ClusterOptions = {}, seeds: ClusterNode[] = this.seeds): Cluster {
    const client = new Cluster(seeds, options);
    client.on('error', () => undefined);
    this.clients.add(client);
    return client;
  }

  /** A Cluster client that has loaded the slot map (status `ready`). */
  async readyClient(options: ClusterOptions = {}, seeds: ClusterNode[] = this.seeds): Promise<Cluster> {
    const client = this.client(options, seeds);
    await waitFor(async () => client.status === 'ready', 10_000, 'the Cluster client to be ready');
    return client;
  }

  /** The whole topology, as a live node reports it. */
  async topology(): Promise<ClusterNodeInfo[]> {
    return this.parseNodes(await this.clusterNodes(this.anyLivePort()));
  }

  /** One node's info. */
  async node(port: number): Promise<ClusterNodeInfo> {
    const info = (await this.topology()).find((n) => n.port === port);
    if (!info) throw new Error(`No Cluster node on port ${port}`);
    return info;
  }

  async masters(): Promise<ClusterNodeInfo[]> {
    return (await this.topology()).filter((n) => n.role === 'master' && n.alive);
  }

  async replicas(): Promise<ClusterNodeInfo[]> {
    return (await this.topology()).filter((n) => n.role === 'replica' && n.alive);
  }

  /** The live replica of the master on `masterPort`. */
  async replicaOf(masterPort: number): Promise<ClusterNodeInfo> {
    const replica = (await this.replicas()).find((n) => n.masterPort === masterPort);
    if (!replica) throw new Error(`The master on port ${masterPort} has no live replica`);
    return replica;
  }

  /** The hash slot of `key` (asked of Redis). */
  async slotOf(key: string): Promise<number> {
    return Number(await this.admin(this.anyLivePort()).cluster('KEYSLOT', key));
  }

  /** The port of the master that serves `key`'s slot now. */
  async masterOf(key: string): Promise<number> {
    const slot = await this.slotOf(key);
    const owner = (await this.masters()).find((m) => m.slots.some(([a, b]) => slot >= a && slot <= b));
    if (!owner) throw new Error(`No master serves slot ${slot}`);
    return owner.port;
  }

  /** Whether a node's process is running. */
  isAlive(port: number): boolean {
    const child = this.nodes.get(port)?.process;
    return child !== undefined && child.exitCode === null && child.signalCode === null;
  }

  /** SIGKILL one node, whatever its role; returns once the process is gone. */
  async killNode(port: number): Promise<void> {
    const node = this.nodes.get(port);
    if (!node) throw new Error(`No Cluster node on port ${port}`);
    node.admin?.disconnect();
    node.admin = undefined;
    const child = node.process;
    node.process = undefined;
    if (!child || child.exitCode !== null || child.signalCode !== null) return;
    const exited = new Promise<void>((resolve) => child.once('exit', () => resolve()));
    child.kill('SIGCONT');
    child.kill('SIGKILL');
    await exited;
  }

  /**
   * SIGKILL one node and start it again on the same port from its own `nodes.conf` (its id, its
   * slots, its peers) with an empty data set, nothing being persisted: a restart without
   * persistence. Returns once it answers PING. A master restarted so serves its slots again only
   * once it says `cluster_state:ok` (Redis holds a restarted master back about 2 s): see
   * `awaitNodeOk`. Its replica then resynchronizes from it and forgets too. The Cluster takes it
   * back as it was only if it came back before the others failed it over (`nodeTimeoutMs`).
   */
  async restartNode(port: number): Promise<void> {
    const node = this.nodes.get(port);
    if (!node) throw new Error(`No Cluster node on port ${port}`);
    await this.killNode(port);
    await this.launch(node);
  }

  /** Wait until the node on `port` says `cluster_state:ok` (it serves its slots). */
  async awaitNodeOk(port: number, timeoutMs = 10_000): Promise<void> {
    await waitFor(
      async () => String(await this.admin(port).cluster('INFO')).includes('cluster_state:ok'),
      timeoutMs,
      `the node on port ${port} to say cluster_state:ok`,
    );
  }

  /**
   * SIGKILL a master and wait until its replica has taken over: the replica is master, every live
   * node says `cluster_state:ok` and agrees. Returns how long that took, from the kill, and which
   * port serves the slots now.
   */
  async killMaster(port: number, timeoutMs = 15_000): Promise<{ promotedPort: number; tookMs: number }> {
    const before = await this.node(port);
    if (before.role !== 'master') throw new Error(`Port ${port} is not a master`);
    const replica = await this.replicaOf(port);
    const started = performance.now();
    await this.killNode(port);
    await this.awaitMaster(replica.port, before.slots, timeoutMs);
    return { promotedPort: replica.port, tookMs: Math.round(performance.now() - started) };
  }

  /**
   * A manual failover (CLUSTER FAILOVER on the replica; the old master becomes its replica): waits
   * until the replica is master everywhere, and until each given client routes its slots there.
   */
  async failover(replicaPort: number, clients: readonly Cluster[] = [], timeoutMs = 10_000): Promise<number> {
    const before = await this.node(replicaPort);
    if (before.role !== 'replica' || before.masterPort === undefined)
      throw new Error(`Port ${replicaPort} is not a replica`);
    const slots = (await this.node(before.masterPort)).slots;
    const started = performance.now();
    await this.admin(replicaPort).cluster('FAILOVER');
    await this.awaitMaster(replicaPort, slots, timeoutMs);
    await Promise.all(clients.map((client) => this.awaitClientRoutes(client, slots[0][0], replicaPort, timeoutMs)));
    const tookMs = Math.round(performance.now() - started);
    await this.awaitHealthy(timeoutMs); // the old master follows the new one, in sync
    return tookMs;
  }

  /** Wait until `client`'s slot map sends `slot` to the node on `port` (refreshing it meanwhile). */
  async awaitClientRoutes(client: Cluster, slot: number, port: number, timeoutMs = 10_000): Promise<void> {
    await waitFor(
      async () => {
        if (client.slots[slot]?.[0] === `${HOST}:${port}`) return true;
        client.refreshSlotsCache();
        return false;
      },
      timeoutMs,
      `the client to route slot ${slot} to port ${port}`,
    );
  }

  /** Wait until the replica of the master on `masterPort` has every write the master had when called. */
  async awaitReplicated(masterPort: number, timeoutMs = 5_000): Promise<void> {
    const replica = await this.replicaOf(masterPort);
    const field = (info: string, name: string): number => Number(new RegExp(`${name}:(\\d+)`).exec(info)?.[1] ?? NaN);
    const target = field(String(await this.admin(masterPort).info('replication')), 'master_repl_offset');
    await waitFor(
      async () => field(String(await this.admin(replica.port).info('replication')), 'slave_repl_offset') >= target,
      timeoutMs,
      `the replica on port ${replica.port} to catch up with its master`,
    );
  }

  /**
   * Every live node refuses new connections (`maxclients` 1; the connections already open keep
   * working, a new one is answered "max number of clients reached" and closed), or accepts them again.
   */
  async refuseNewConnections(refuse: boolean): Promise<void> {
    const live = [...this.nodes.keys()].filter((port) => this.isAlive(port));
    await Promise.all(live.map((port) => this.admin(port).config('SET', 'maxclients', refuse ? '1' : '10000')));
  }

  /** Kill every process, close every client, remove the dirs. Safe to call twice. */
  async dispose(): Promise<void> {
    for (const client of this.clients) client.disconnect();
    this.clients.clear();
    await Promise.all([...this.nodes.keys()].map((port) => this.killNode(port)));
    rmSync(this.root, { recursive: true, force: true });
    roots.delete(this.root);
  }

  // ---- building ------------------------------------------------------------------------------

  private async build(): Promise<void> {
    const ports: number[] = [];
    while (ports.length < 6) {
      const port = await freePort();
      // Each node also listens on its cluster bus port, port + 10000: that one must be free too.
      const bus = port + 10_000;
      if (bus > 65_535 || ports.includes(port) || ports.some((p) => p + 10_000 === port || p === bus)) continue;
      if (await canListen(bus)) ports.push(port);
    }
    this.masterPorts = ports.slice(0, 3);
    this.replicaPorts = ports.slice(3);
    await Promise.all(ports.map((port) => this.spawnNode(port)));

    // Slots in three ranges, distinct config epochs (as redis-cli does), then one handshake from
    // the first node to all others.
    const ranges: [number, number][] = [
      [0, 5460],
      [5461, 10922],
      [10923, 16383],
    ];
    await Promise.all(ports.map((port, i) => this.admin(port).call('CLUSTER', 'SET-CONFIG-EPOCH', String(i + 1))));
    await Promise.all(
      this.masterPorts.map((port, i) => this.admin(port).call('CLUSTER', 'ADDSLOTSRANGE', ranges[i][0], ranges[i][1])),
    );
    const ids = await Promise.all(ports.map((port) => this.admin(port).cluster('MYID')));
    await Promise.all(ports.slice(1).map((port) => this.admin(ports[0]).cluster('MEET', HOST, port)));
    await waitFor(
      async () => {
        const views = await Promise.all(ports.map((port) => this.clusterNodes(port)));
        return views.every((view) => {
          const lines = view.trim().split('\n');
          return lines.length === 6 && lines.every((line) => !/handshake|noaddr/.test(line));
        });
      },
      10_000,
      'every node to know the 5 others',
    );
    await Promise.all(this.replicaPorts.map((port, i) => this.admin(port).cluster('REPLICATE', ids[i])));
    await this.awaitHealthy(10_000);
    if (this.nodeTimeoutMs !== BUILD_NODE_TIMEOUT_MS) {
      const timeout = String(this.nodeTimeoutMs);
      await Promise.all(ports.map((port) => this.admin(port).config('SET', 'cluster-node-timeout', timeout)));
    }
  }

  private async spawnNode(port: number): Promise<void> {
    const dir = join(this.root, String(port));
    mkdirSync(dir);
    const node: Node = { port, dir, process: undefined, admin: undefined };
    this.nodes.set(port, node);
    await this.launch(node, Math.min(this.nodeTimeoutMs, BUILD_NODE_TIMEOUT_MS));
  }

  /** Start a node's process in its dir (a first start, or a restart from its `nodes.conf`). */
  private async launch(node: Node, nodeTimeoutMs = this.nodeTimeoutMs): Promise<void> {
    const { port, dir } = node;
    const args = [
      '--port',
      String(port),
      '--bind',
      HOST,
      '--cluster-enabled',
      'yes',
      '--cluster-config-file',
      join(dir, 'nodes.conf'),
      '--cluster-node-timeout',
      String(nodeTimeoutMs),
      '--save',
      '',
      '--appendonly',
      'no',
      '--repl-diskless-sync',
      'yes',
      '--repl-diskless-sync-delay',
      '0',
      '--repl-diskless-load',
      'swapdb',
      '--dir',
      dir,
      '--logfile',
      join(dir, 'redis.log'),
      '--loglevel',
      'notice',
      ...this.extraArgs,
    ];
    const child = spawn('redis-server', args, { stdio: 'ignore' });
    child.on('error', () => undefined);
    node.process = child;
    track(child);
    await waitFor(async () => (await this.admin(port).ping()) === 'PONG', 10_000, `redis-server on port ${port}`);
  }

  /**
   * Every live node says `cluster_state:ok`, they all report the same masters and replicas (each
   * master with its slots and one live replica linked to it), and every replica is in sync.
   */
  private async awaitHealthy(timeoutMs: number): Promise<void> {
    const live = [...this.nodes.keys()].filter((port) => this.isAlive(port));
    await waitFor(
      async () => {
        for (const port of live) {
          const info = String(await this.admin(port).cluster('INFO'));
          if (!info.includes('cluster_state:ok')) return false;
        }
        const views = await Promise.all(live.map(async (port) => this.describe(await this.clusterNodes(port))));
        if (views.some((view) => view !== views[0])) return false;
        const topology = this.parseNodes(await this.clusterNodes(live[0]));
        const replicas = topology.filter((n) => n.role === 'replica' && n.alive);
        for (const replica of replicas) {
          const repl = String(await this.admin(replica.port).info('replication'));
          if (!repl.includes('master_link_status:up') || !repl.includes('master_sync_in_progress:0')) return false;
        }
        return true;
      },
      timeoutMs,
      'the Cluster to be healthy (state ok, one view, replicas in sync)',
    );
  }

  /** Wait until the node on `port` is master of `slots` in every live node's view, and the state is ok. */
  private async awaitMaster(port: number, slots: ClusterNodeInfo['slots'], timeoutMs: number): Promise<void> {
    const live = (): number[] => [...this.nodes.keys()].filter((p) => this.isAlive(p));
    await waitFor(
      async () => {
        for (const viewer of live()) {
          const info = String(await this.admin(viewer).cluster('INFO'));
          if (!info.includes('cluster_state:ok')) return false;
          const me = this.parseNodes(await this.clusterNodes(viewer)).find((n) => n.port === port);
          if (me?.role !== 'master') return false;
          if (!slots.every(([a, b]) => me.slots.some(([x, y]) => x <= a && b <= y))) return false;
        }
        return true;
      },
      timeoutMs,
      `port ${port} to be master of its slots on every node`,
    );
  }

  // ---- talking to nodes ----------------------------------------------------------------------

  private admin(port: number): Redis {
    const node = this.nodes.get(port);
    if (!node) throw new Error(`No Cluster node on port ${port}`);
    if (!node.admin) {
      node.admin = new Redis({
        port,
        host: HOST,
        maxRetriesPerRequest: 1,
        retryStrategy: () => 50,
        enableOfflineQueue: true,
      });
      node.admin.on('error', () => undefined);
    }
    return node.admin;
  }

  private anyLivePort(): number {
    const port = [...this.nodes.keys()].find((p) => this.isAlive(p));
    if (port === undefined) throw new Error('No Cluster node is running');
    return port;
  }

  private async clusterNodes(port: number): Promise<string> {
    return String(await this.admin(port).cluster('NODES'));
  }

  /** A viewer-independent summary of CLUSTER NODES: roles, masters, slots and liveness. */
  private describe(nodes: string): string {
    return this.parseNodes(nodes)
      .map((n) => `${n.port}:${n.role}:${n.masterPort ?? ''}:${n.slots.map((r) => r.join('-')).join(',')}:${n.alive}`)
      .sort()
      .join('|');
  }

  private parseNodes(text: string): ClusterNodeInfo[] {
    const lines = text.trim().split('\n');
    const byId = new Map<string, number>();
    const parsed = lines.map((line) => {
      const [id, address, flags, master, , , , , ...slotFields] = line.trim().split(' ');
      const port = Number(address.split('@')[0].split(':').pop());
      byId.set(id, port);
      return { id, port, flags: flags.split(','), master, slotFields };
    });
    return parsed.map(({ id, port, flags, master, slotFields }) => {
      const role = flags.includes('master') ? ('master' as const) : ('replica' as const);
      const slots = slotFields
        .filter((field) => !field.startsWith('['))
        .map((field): [number, number] => {
          const [a, b] = field.split('-').map(Number);
          return [a, b ?? a];
        });
      return {
        port,
        id,
        role,
        masterPort: role === 'replica' ? byId.get(master) : undefined,
        slots,
        alive: !flags.includes('fail') && !flags.includes('fail?') && this.isAlive(port),
      };
    });
  }
}
