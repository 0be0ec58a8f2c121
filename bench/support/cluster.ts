import { type ChildProcess, spawn } from 'node:child_process';
import { mkdirSync, mkdtempSync, rmSync } from 'node:fs';
import { createServer } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import type { Redis } from 'ioredis';
import { hr, sleep } from './clock';
import { freePort, plainClient } from './redis';
import calculateSlot from 'cluster-key-slot';

const HOST = '127.0.0.1';

/** Redis Cluster's number of hash slots. */
export const HASH_SLOTS = 16_384;

/** The slots of master i, as `redis-cli --cluster create` splits them over 3 masters. */
export const SLOT_RANGES: readonly (readonly [number, number])[] = [
  [0, 5460],
  [5461, 10922],
  [10923, 16383],
];

/** One node as ioredis's `Cluster` takes it in its seed list. */
export interface ClusterSeed {
  readonly host: string;
  readonly port: number;
}

/** Whether a loopback port can be listened on right now (a node's bus port, port + 10000). */
function canListen(port: number): Promise<boolean> {
  return new Promise((resolve) => {
    const server = createServer();
    server.once('error', () => resolve(false));
    server.listen(port, HOST, () => server.close(() => resolve(true)));
  });
}

async function until(check: () => Promise<boolean>, timeoutMs: number, what: string): Promise<void> {
  const deadline = hr() + timeoutMs;
  let last: unknown;
  for (;;) {
    try {
      if (await check()) return;
    } catch (error) {
      last = error;
    }
    if (hr() > deadline) {
      const detail = last instanceof Error ? ` (last error: ${last.message})` : '';
      throw new Error(`Redis Cluster: timed out after ${timeoutMs} ms waiting for ${what}${detail}`);
    }
    await sleep(20);
  }
}

/**
 * The benchmark's own Redis Cluster: 3 masters, no replicas, from the machine's `redis-server`, on
 * free loopback ports, persisting nothing, each node in its own temp dir; built by hand
 * (SET-CONFIG-EPOCH, ADDSLOTSRANGE, MEET) in about a second.
 *
 * Why not test/support/cluster.ts (the tests' 3 x 1 Cluster, built the same way): bench/ compiles on
 * its own, with `rootDir` bench/ into bench/dist/ (tsconfig.build.json), and a file outside it is
 * an error (TS6059); widening rootDir would move every output path (bench/dist/bench/run.js) and
 * compile test helpers into the benchmark. And the benchmark wants no replicas: on a 2-core
 * machine, three replica processes applying every write would take CPU from the cells they measure
 * (the single-server groups have no replica either). Without replicas, nothing can fail over, so the
 * node timeout stays at Redis's default of 15 s: a node starved of CPU for a moment on a busy
 * machine must not be marked failed (which, without a replica, would take the Cluster down).
 */
export class OwnCluster {
  private readonly admins = new Map<number, Redis>();
  private readonly children: ChildProcess[] = [];
  private dir: string | undefined;
  /** Master i serves SLOT_RANGES[i]; set by `start()`. */
  readonly ports: number[] = [];

  /**
   * Builds the Cluster; kills what it started if that fails. The caller holds the instance before
   * this resolves, so that its exit handler can `killNow()` a Cluster still being built.
   */
  async start(): Promise<void> {
    if (this.dir !== undefined) throw new Error('OwnCluster.start() twice');
    const dir = mkdtempSync(join(tmpdir(), 'dislock-bench-cluster-'));
    this.dir = dir;
    const { ports } = this;
    try {
      while (ports.length < SLOT_RANGES.length) {
        const port = await freePort();
        const bus = port + 10_000;
        if (bus > 65_535 || ports.includes(port) || ports.some((p) => p + 10_000 === port || p === bus)) continue;
        if (await canListen(bus)) ports.push(port);
      }
      for (const port of ports) {
        const nodeDir = join(dir, String(port));
        mkdirSync(nodeDir);
        // Flags as the single server's (OwnRedis), plus Cluster mode.
        const args = [
          '--port',
          String(port),
          '--bind',
          HOST,
          '--save',
          '',
          '--appendonly',
          'no',
          '--dir',
          nodeDir,
          '--cluster-enabled',
          'yes',
          '--cluster-config-file',
          join(nodeDir, 'nodes.conf'),
          '--cluster-node-timeout',
          '15000',
        ];
        const child = spawn('redis-server', args, { stdio: 'ignore' });
        child.on('error', () => undefined);
        this.children.push(child);
      }
      await this.build();
    } catch (error) {
      this.killNow();
      throw error;
    }
  }

  /** Every node (all masters): the seed list for a `Cluster` client. */
  get seeds(): ClusterSeed[] {
    return this.ports.map((port) => ({ host: HOST, port }));
  }

  /** A `redis://` URL per master, for plain per-node clients (INFO, FLUSHALL). */
  get urls(): string[] {
    return this.ports.map((port) => `redis://${HOST}:${port}`);
  }

  /** Synchronous, for exit handlers. */
  killNow(): void {
    for (const admin of this.admins.values()) admin.disconnect();
    this.admins.clear();
    for (const child of this.children) {
      if (child.exitCode === null && child.signalCode === null) child.kill('SIGKILL');
    }
    if (this.dir !== undefined) rmSync(this.dir, { recursive: true, force: true });
  }

  async stop(): Promise<void> {
    for (const admin of this.admins.values()) admin.disconnect();
    this.admins.clear();
    await Promise.all(
      this.children.map(async (child) => {
        if (child.exitCode !== null || child.signalCode !== null) return;
        const exited = new Promise<void>((resolve) => child.once('exit', () => resolve()));
        child.kill('SIGTERM');
        const timer = setTimeout(() => child.kill('SIGKILL'), 3_000);
        await exited;
        clearTimeout(timer);
      }),
    );
    if (this.dir !== undefined) rmSync(this.dir, { recursive: true, force: true });
  }

  private admin(port: number): Redis {
    let admin = this.admins.get(port);
    if (!admin) {
      admin = plainClient(`redis://${HOST}:${port}`, 'bench-cluster-builder');
      this.admins.set(port, admin);
    }
    return admin;
  }

  private async build(): Promise<void> {
    const { ports } = this;
    await until(
      async () => {
        const exited = this.children.find((child) => child.exitCode !== null);
        if (exited) throw new Error(`redis-server exited with code ${exited.exitCode}`);
        const pongs = await Promise.all(ports.map((port) => this.admin(port).ping()));
        return pongs.every((pong) => pong === 'PONG');
      },
      10_000,
      'every node to answer PING',
    );
    // Distinct config epochs and the slots first (as redis-cli does), then one handshake from the
    // first node to the others; gossip spreads the rest.
    await Promise.all(ports.map((port, i) => this.admin(port).call('CLUSTER', 'SET-CONFIG-EPOCH', String(i + 1))));
    await Promise.all(
      ports.map((port, i) => this.admin(port).call('CLUSTER', 'ADDSLOTSRANGE', SLOT_RANGES[i][0], SLOT_RANGES[i][1])),
    );
    await Promise.all(ports.slice(1).map((port) => this.admin(ports[0]).call('CLUSTER', 'MEET', HOST, port)));
    const expected = ports
      .map((port, i) => `${port}:${SLOT_RANGES[i][0]}-${SLOT_RANGES[i][1]}`)
      .sort()
      .join(' ');
    await until(
      async () => {
        for (const port of ports) {
          const info = String(await this.admin(port).call('CLUSTER', 'INFO'));
          if (!info.includes('cluster_state:ok')) return false;
          if (describeMasters(String(await this.admin(port).call('CLUSTER', 'NODES'))) !== expected) return false;
        }
        return true;
      },
      15_000,
      'cluster_state:ok and the same 3 masters and slots on every node',
    );
    // The benchmark computes slots itself (to spread keys evenly): check it agrees with Redis.
    for (const key of ['u:0', 'raw:c:hot', `u:{${slotTag(12_345)}}:7`]) {
      const slot = Number(await this.admin(ports[0]).call('CLUSTER', 'KEYSLOT', key));
      if (slot !== keySlot(key)) throw new Error(`keySlot("${key}") = ${keySlot(key)}, Redis says ${slot}`);
    }
  }
}

/** `port:first-last` of each master that serves slots, as one node's CLUSTER NODES says, sorted. */
function describeMasters(nodes: string): string {
  return nodes
    .trim()
    .split('\n')
    .map((line) => line.trim().split(' '))
    .filter(([, address, flags]) => address && flags?.includes('master') && !/fail|handshake|noaddr/.test(flags))
    .filter((fields) => fields.length > 8)
    .map(([, address, , , , , , , ...slots]) => `${address.split('@')[0].split(':').pop()}:${slots.join(',')}`)
    .sort()
    .join(' ');
}

/** The hash slot of `key` (CRC16 of the key, or of its first non-empty `{hash tag}`, mod 16384), as ioredis computes it. */
export function keySlot(key: string): number {
  return calculateSlot(key);
}

let tags: string[] | undefined;

/** A short hash tag (base-36 digits) whose slot is `slot`; the table is built on first use (a few ms). */
export function slotTag(slot: number): string {
  if (!tags) {
    const table = new Array<string>(HASH_SLOTS);
    let missing = HASH_SLOTS;
    for (let n = 0; missing > 0; n += 1) {
      const tag = n.toString(36);
      const at = calculateSlot(tag);
      if (table[at] === undefined) {
        table[at] = tag;
        missing -= 1;
      }
    }
    tags = table;
  }
  return tags[slot];
}

/**
 * The key of loop `worker` of `workers` in an uncontended Cluster cell: its hash tag puts it at an
 * evenly spaced slot, so that the loops spread evenly over the masters (64 loops: 21, 22 and 21)
 * and land in the same slots whatever prefix each contender adds (the tag decides the slot).
 */
export function spreadKey(worker: number, workers: number): string {
  const slot = Math.floor(((worker + 0.5) * HASH_SLOTS) / workers);
  return `u:{${slotTag(slot)}}:${worker}`;
}
