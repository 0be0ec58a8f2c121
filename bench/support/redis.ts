import { type ChildProcess, spawn, spawnSync } from 'node:child_process';
import { mkdtempSync, rmSync } from 'node:fs';
import { createServer } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { Redis } from 'ioredis';
import { hr, sleep } from './clock';

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

export async function ready(client: Redis, timeoutMs = 10_000): Promise<void> {
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

/** What `INFO commandstats` and `INFO cpu` said at one moment. */
export interface InfoSnapshot {
  readonly at: number;
  readonly calls: Record<string, number>;
  readonly usec: Record<string, number>;
  /** used_cpu_sys + used_cpu_user, in ms. */
  readonly cpuMs: number;
}

export interface InfoDelta {
  readonly ms: number;
  /** Every command executed, including those run inside Lua scripts (Redis counts both). */
  readonly totalCalls: number;
  readonly calls: Record<string, number>;
  readonly redisCpuMs: number;
}

/** Commands of the benchmark's own bookkeeping, left out of the deltas. */
const BOOKKEEPING = new Set(['info', 'flushall', 'config', 'client', 'ping', 'quit', 'hello', 'select']);

function parseInfo(text: string): Record<string, string> {
  const fields: Record<string, string> = {};
  for (const line of text.split('\r\n')) {
    const colon = line.indexOf(':');
    if (colon > 0 && !line.startsWith('#')) fields[line.slice(0, colon)] = line.slice(colon + 1);
  }
  return fields;
}

export async function infoSnapshot(admin: Redis): Promise<InfoSnapshot> {
  const at = hr();
  const [stats, cpu] = await Promise.all([admin.info('commandstats'), admin.info('cpu')]);
  const calls: Record<string, number> = {};
  const usec: Record<string, number> = {};
  for (const [field, value] of Object.entries(parseInfo(stats))) {
    if (!field.startsWith('cmdstat_')) continue;
    const command = field.slice('cmdstat_'.length);
    calls[command] = Number(/calls=(\d+)/.exec(value)?.[1] ?? 0);
    usec[command] = Number(/usec=(\d+)/.exec(value)?.[1] ?? 0);
  }
  const cpuFields = parseInfo(cpu);
  const cpuMs = (Number(cpuFields.used_cpu_sys) + Number(cpuFields.used_cpu_user)) * 1000;
  return { at, calls, usec, cpuMs };
}

export function infoDelta(from: InfoSnapshot, to: InfoSnapshot): InfoDelta {
  const calls: Record<string, number> = {};
  let totalCalls = 0;
  for (const [command, count] of Object.entries(to.calls)) {
    if (BOOKKEEPING.has(command.split('|')[0])) continue;
    const delta = count - (from.calls[command] ?? 0);
    if (delta > 0) {
      calls[command] = delta;
      totalCalls += delta;
    }
  }
  return { ms: to.at - from.at, totalCalls, calls, redisCpuMs: to.cpuMs - from.cpuMs };
}

export async function redisVersion(admin: Redis): Promise<string> {
  return parseInfo(await admin.info('server')).redis_version ?? 'unknown';
}

/** Per-command counts of a delta divided by `per`, as `redis.<command>` metrics (for the JSON file). */
export function perCommand(delta: InfoDelta | undefined, per: number): Record<string, number> {
  if (!delta || per <= 0) return {};
  return Object.fromEntries(Object.entries(delta.calls).map(([command, calls]) => [`redis.${command}`, calls / per]));
}
