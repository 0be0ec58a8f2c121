import { type ChildProcess, spawn, spawnSync } from 'node:child_process';
import { mkdtempSync, rmSync } from 'node:fs';
import { createServer } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { Cluster, Redis } from 'ioredis';
import { hr, sleep } from './clock';
import type { Metrics, RedisTarget } from './protocol';

export async function freePort(): Promise<number> {
  return new Promise((resolve, reject) => {
    const server = createServer();
    server.unref();
    server.on('error', reject);
    server.listen(0, '127.0.0.1', () => {
      const address = server.address();
      server.close(() =>
        typeof address === 'object' && address ? resolve(address.port) : reject(new Error('no free port')),
      );
    });
  });
}

export function redisServerOnPath(): boolean {
  return spawnSync('redis-server', ['--version']).status === 0;
}

/** A plain client: one connection, commands fail fast instead of queueing through a reconnect. */
export function plainClient(url: string, name: string): Redis {
  const client = new Redis(url, { connectionName: name, maxRetriesPerRequest: 1, enableAutoPipelining: false });
  client.on('error', () => undefined); // the failing command reports it
  return client;
}

/**
 * A client that counts the commands it sends: one per round trip (auto-pipelining is off). Clients
 * made from it with `duplicate()` (a pub/sub subscriber connection, say) count into the same total.
 */
export interface CountingClient {
  readonly client: Redis;
  sent(): number;
}

function instrument(client: Redis, count: () => void): void {
  const send = client.sendCommand.bind(client);
  client.sendCommand = (...args: Parameters<Redis['sendCommand']>) => {
    count();
    return send(...args);
  };
  const duplicate = client.duplicate.bind(client);
  client.duplicate = (...args: Parameters<Redis['duplicate']>) => {
    const copy = duplicate(...args);
    instrument(copy, count);
    return copy;
  };
}

export function countingClient(url: string, name: string): CountingClient {
  const client = plainClient(url, name);
  let sent = 0;
  instrument(client, () => void (sent += 1));
  return { client, sent: () => sent };
}

/**
 * A Cluster client counts at its node connections, where a command goes on the wire: once per node
 * it is sent to (a MOVED or ASK redirection is one more round trip, and counts), plus connections
 * made from a node with `duplicate()` (nestjs-dislock's sharded subscribers; the client's own
 * CLUSTER SLOTS refreshes) and Clusters made with `duplicate()`.
 */
function instrumentCluster(cluster: Cluster, count: () => void): void {
  const seen = new WeakSet<Redis>();
  cluster.on('+node', (node: Redis) => {
    if (seen.has(node)) return;
    seen.add(node);
    instrument(node, count);
  });
  const duplicate = cluster.duplicate.bind(cluster);
  cluster.duplicate = (...args: Parameters<Cluster['duplicate']>) => {
    const copy = duplicate(...args);
    instrumentCluster(copy, count);
    return copy;
  };
}

export interface CountingCluster {
  readonly client: Cluster;
  sent(): number;
}

/**
 * An ioredis `Cluster` client, no auto-pipelining, commands fail fast (like `plainClient`), that
 * counts its round trips (see instrumentCluster). It connects at once; `ready()` waits until it has
 * loaded the slot map.
 */
export function countingCluster(seeds: readonly { host: string; port: number }[], name: string): CountingCluster {
  const client = new Cluster(
    seeds.map((seed) => ({ ...seed })),
    {
      lazyConnect: true, // so that every node connection is instrumented, from the first
      enableAutoPipelining: false,
      redisOptions: { connectionName: name, maxRetriesPerRequest: 1 },
    },
  );
  client.on('error', () => undefined); // the failing command reports it
  let sent = 0;
  instrumentCluster(client, () => void (sent += 1));
  client.connect().catch(() => undefined); // `ready()` reports a client that never gets there
  return { client, sent: () => sent };
}

/** A counting client for `target`: a plain `Redis` on the single server, a `Cluster` on the Cluster. */
export function countingConnection(target: RedisTarget, name: string): CountingClient | CountingCluster {
  return target.kind === 'server' ? countingClient(target.url, name) : countingCluster(target.seeds, name);
}

/** The single server's URL; for the scenarios that run only there. */
export function serverUrl(target: RedisTarget): string {
  if (target.kind !== 'server') throw new Error('this scenario runs on the single redis-server only');
  return target.url;
}

/**
 * Plain clients for INFO (and FLUSHALL): the server, or one per master of the Cluster (in the seed
 * order), whose counts `infoSnapshot` sums.
 */
export function adminClients(target: RedisTarget, name: string): Redis[] {
  return target.kind === 'server'
    ? [plainClient(target.url, name)]
    : target.seeds.map((seed) => plainClient(`redis://${seed.host}:${seed.port}`, name));
}

export async function ready(client: Redis | Cluster, timeoutMs = 10_000): Promise<void> {
  const deadline = hr() + timeoutMs;
  while (client.status !== 'ready') {
    if (hr() > deadline) throw new Error(`Redis client not ready after ${timeoutMs} ms (status ${client.status})`);
    await sleep(10);
  }
}

/** A `redis-server` of the benchmark's own: loopback only, on a free port, persisting nothing. */
export class OwnRedis {
  private constructor(
    readonly port: number,
    private readonly child: ChildProcess,
    private readonly dir: string,
  ) {}

  static async start(): Promise<OwnRedis> {
    const port = await freePort();
    const dir = mkdtempSync(join(tmpdir(), 'dislock-bench-redis-'));
    const args = ['--port', String(port), '--bind', '127.0.0.1', '--save', '', '--appendonly', 'no', '--dir', dir];
    const child = spawn('redis-server', args, { stdio: 'ignore' });
    const server = new OwnRedis(port, child, dir);
    const client = plainClient(server.url, 'bench-probe');
    try {
      const deadline = hr() + 10_000;
      for (;;) {
        if (child.exitCode !== null) throw new Error(`redis-server exited with code ${child.exitCode}`);
        if (client.status === 'ready' && (await client.ping().catch(() => '')) === 'PONG') break;
        if (hr() > deadline) throw new Error(`redis-server on port ${port} did not answer within 10 s`);
        await sleep(20);
      }
    } catch (error) {
      server.killNow();
      throw error;
    } finally {
      client.disconnect();
    }
    return server;
  }

  get url(): string {
    return `redis://127.0.0.1:${this.port}`;
  }

  get pid(): number | undefined {
    return this.child.pid;
  }

  /** Synchronous, for exit handlers. */
  killNow(): void {
    if (this.child.exitCode === null && this.child.signalCode === null) this.child.kill('SIGKILL');
    rmSync(this.dir, { recursive: true, force: true });
  }

  async stop(): Promise<void> {
    if (this.child.exitCode === null && this.child.signalCode === null) {
      const exited = new Promise<void>((resolve) => this.child.once('exit', () => resolve()));
      this.child.kill('SIGTERM');
      const timer = setTimeout(() => this.child.kill('SIGKILL'), 3_000);
      await exited;
      clearTimeout(timer);
    }
    rmSync(this.dir, { recursive: true, force: true });
  }
}

/**
 * What `INFO commandstats`, `INFO errorstats` and `INFO cpu` said at one moment: of one server, or
 * summed over a Cluster's masters.
 */
export interface InfoSnapshot {
  readonly at: number;
  readonly calls: Record<string, number>;
  readonly usec: Record<string, number>;
  /** used_cpu_sys + used_cpu_user, in ms. */
  readonly cpuMs: number;
  /** Calls per command of each node (one entry for a single server; the masters in seed order). */
  readonly nodeCalls: readonly Record<string, number>[];
  /** Error replies by their first word (MOVED, ASK, NOSCRIPT...); Redis >= 6.2, else empty. */
  readonly errors: Record<string, number>;
}

export interface InfoDelta {
  readonly ms: number;
  /** Every command executed, including those run inside Lua scripts (Redis counts both). */
  readonly totalCalls: number;
  readonly calls: Record<string, number>;
  readonly redisCpuMs: number;
  /** `totalCalls` node by node (the order of `InfoSnapshot.nodeCalls`). */
  readonly nodeCalls: number[];
  /** MOVED and ASK replies: commands a Cluster client sent to a node that does not serve the slot. */
  readonly redirections: number;
}

/**
 * Commands of the benchmark's own bookkeeping, left out of the deltas. SELECT is not one: no client
 * here selects a database, and @sesamecare-oss/redlock runs one inside each of its scripts, which
 * Redis counts like any other call.
 */
const BOOKKEEPING = new Set(['info', 'flushall', 'config', 'client', 'ping', 'quit', 'hello']);

function parseInfo(text: string): Record<string, string> {
  const fields: Record<string, string> = {};
  for (const line of text.split('\r\n')) {
    const colon = line.indexOf(':');
    if (colon > 0 && !line.startsWith('#')) fields[line.slice(0, colon)] = line.slice(colon + 1);
  }
  return fields;
}

function add(into: Record<string, number>, key: string, value: number): void {
  into[key] = (into[key] ?? 0) + value;
}

/** One server's snapshot, or the sum over several (a Cluster's masters), read at the same moment. */
export async function infoSnapshot(admins: Redis | readonly Redis[]): Promise<InfoSnapshot> {
  const nodes = Array.isArray(admins) ? (admins as readonly Redis[]) : [admins as Redis];
  const at = hr();
  const replies = await Promise.all(
    nodes.map((admin) => Promise.all([admin.info('commandstats'), admin.info('cpu'), admin.info('errorstats')])),
  );
  const calls: Record<string, number> = {};
  const usec: Record<string, number> = {};
  const errors: Record<string, number> = {};
  const nodeCalls: Record<string, number>[] = [];
  let cpuMs = 0;
  for (const [stats, cpu, errorStats] of replies) {
    const own: Record<string, number> = {};
    for (const [field, value] of Object.entries(parseInfo(stats))) {
      if (!field.startsWith('cmdstat_')) continue;
      const command = field.slice('cmdstat_'.length);
      own[command] = Number(/calls=(\d+)/.exec(value)?.[1] ?? 0);
      add(calls, command, own[command]);
      add(usec, command, Number(/usec=(\d+)/.exec(value)?.[1] ?? 0));
    }
    nodeCalls.push(own);
    for (const [field, value] of Object.entries(parseInfo(errorStats))) {
      if (field.startsWith('errorstat_'))
        add(errors, field.slice('errorstat_'.length), Number(/count=(\d+)/.exec(value)?.[1] ?? 0));
    }
    const cpuFields = parseInfo(cpu);
    cpuMs += (Number(cpuFields.used_cpu_sys) + Number(cpuFields.used_cpu_user)) * 1000;
  }
  return { at, calls, usec, cpuMs, nodeCalls, errors };
}

/** Calls per command from `from` to `to`, bookkeeping left out. */
function callsDelta(from: Record<string, number>, to: Record<string, number>): Record<string, number> {
  const calls: Record<string, number> = {};
  for (const [command, count] of Object.entries(to)) {
    if (BOOKKEEPING.has(command.split('|')[0])) continue;
    const delta = count - (from[command] ?? 0);
    if (delta > 0) calls[command] = delta;
  }
  return calls;
}

const sum = (values: Record<string, number>): number => Object.values(values).reduce((a, b) => a + b, 0);

export function infoDelta(from: InfoSnapshot, to: InfoSnapshot): InfoDelta {
  const calls = callsDelta(from.calls, to.calls);
  const redirections = ['MOVED', 'ASK'].reduce(
    (n, error) => n + (to.errors[error] ?? 0) - (from.errors[error] ?? 0),
    0,
  );
  return {
    ms: to.at - from.at,
    totalCalls: sum(calls),
    calls,
    redisCpuMs: to.cpuMs - from.cpuMs,
    nodeCalls: to.nodeCalls.map((node, i) => sum(callsDelta(from.nodeCalls[i] ?? {}, node))),
    redirections,
  };
}

export async function redisVersion(admin: Redis): Promise<string> {
  return parseInfo(await admin.info('server')).redis_version ?? 'unknown';
}

/** Per-command counts of a delta divided by `per`, as `redis.<command>` metrics (for the JSON file). */
export function perCommand(delta: InfoDelta | undefined, per: number): Record<string, number> {
  if (!delta || per <= 0) return {};
  return Object.fromEntries(Object.entries(delta.calls).map(([command, calls]) => [`redis.${command}`, calls / per]));
}

/**
 * On a Cluster (more than one node in the INFO delta): the busiest master's share of the Redis calls
 * (33% = an even spread over 3 masters, 100% = one master did everything), and the MOVED / ASK
 * replies in the window (0 once the client has the slot map and no slot moves).
 */
export function clusterMetrics(info: InfoDelta | undefined): Metrics {
  if (!info || info.nodeCalls.length < 2) return {};
  return {
    busiestMasterPct: info.totalCalls > 0 ? (100 * Math.max(...info.nodeCalls)) / info.totalCalls : NaN,
    redirections: info.redirections,
  };
}
