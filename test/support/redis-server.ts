import { type ChildProcess, spawn } from 'node:child_process';
import { mkdtempSync, rmSync } from 'node:fs';
import { connect, createServer } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { Redis } from 'ioredis';

/** A port the OS just handed out, so no two instances collide. */
export async function freePort(): Promise<number> {
  return new Promise((resolve, reject) => {
    const server = createServer();
    server.unref();
    server.on('error', reject);
    server.listen(0, '127.0.0.1', () => {
      const address = server.address();
      server.close(() =>
        typeof address === 'object' && address ? resolve(address.port) : reject(new Error('no port')),
      );
    });
  });
}

async function waitUntil(check: () => Promise<boolean>, timeoutMs: number, what: string): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  while (Date.now() < deadline) {
    if (await check().catch(() => false)) return;
    await new Promise((r) => setTimeout(r, 20));
  }
  throw new Error(`Timed out after ${timeoutMs} ms waiting for ${what}`);
}

/** PING over a raw socket (no client library, so nothing lingers after it): true on +PONG. */
function ping(port: number, password?: string): Promise<boolean> {
  return new Promise((resolve) => {
    const socket = connect({ port, host: '127.0.0.1' });
    let reply = '';
    const done = (ok: boolean): void => {
      socket.destroy();
      resolve(ok);
    };
    socket.setTimeout(1_000, () => done(false));
    socket.on('error', () => done(false));
    socket.on('connect', () => socket.write(`${password ? `AUTH ${password}\r\n` : ''}PING\r\n`));
    socket.on('data', (chunk) => {
      reply += chunk.toString();
      if (reply.includes('+PONG')) done(true);
      else if (reply.includes('-')) done(false);
    });
  });
}

/**
 * A real `redis-server` owned by a test: on a free port, persisting nothing, in its own temp dir.
 * It can be stopped, started again on the same port, paused (SIGSTOP) and resumed.
 */
export class RedisServer {
  private process: ChildProcess | undefined;
  private readonly dir = mkdtempSync(join(tmpdir(), 'dislock-redis-'));

  private constructor(
    readonly port: number,
    private readonly extraArgs: readonly string[],
    private readonly password?: string,
  ) {}

  static async start(options: { password?: string; args?: string[] } = {}): Promise<RedisServer> {
    const server = new RedisServer(await freePort(), options.args ?? [], options.password);
    await server.startProcess();
    return server;
  }

  get url(): string {
    return `redis://127.0.0.1:${this.port}`;
  }

  /** A plain client for assertions on what Redis holds. */
  client(): Redis {
    const client = new Redis({ port: this.port, host: '127.0.0.1', password: this.password, maxRetriesPerRequest: 1 });
    client.on('error', () => undefined);
    return client;
  }

  async startProcess(): Promise<void> {
    const args = [
      '--port',
      String(this.port),
      '--bind',
      '127.0.0.1',
      '--save',
      '',
      '--appendonly',
      'no',
      '--dir',
      this.dir,
      '--logfile',
      '',
      '--loglevel',
      'warning',
      ...(this.password ? ['--requirepass', this.password] : []),
      ...this.extraArgs,
    ];
    const child = spawn('redis-server', args, { stdio: 'ignore' });
    this.process = child;
    child.on('error', () => undefined);
    await waitUntil(() => ping(this.port, this.password), 10_000, `redis-server on port ${this.port}`);
  }

  /**
   * Kill the server (SIGKILL) and wait until its port is closed. A paused server is resumed first,
   * unless `asPaused`: then it dies without answering what it had received meanwhile.
   */
  async stop(options: { asPaused?: boolean } = {}): Promise<void> {
    const child = this.process;
    this.process = undefined;
    if (!child || child.exitCode !== null || child.signalCode !== null) return;
    const exited = new Promise<void>((resolve) => child.once('exit', () => resolve()));
    if (!options.asPaused) child.kill('SIGCONT');
    child.kill('SIGKILL');
    await exited;
  }

  /** Freeze the process (SIGSTOP): connections stay open, nothing answers. */
  pause(): void {
    this.process?.kill('SIGSTOP');
  }

  resume(): void {
    this.process?.kill('SIGCONT');
  }

  async dispose(): Promise<void> {
    await this.stop();
    rmSync(this.dir, { recursive: true, force: true });
  }
}
