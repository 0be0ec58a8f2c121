import { type ChildProcess, fork } from 'node:child_process';
import { join } from 'node:path';
import { hr, sleepUntil } from '../support/clock';
import { percentile, Samples } from '../support/stats';
import type { CellSpec, Metrics } from '../support/protocol';
import type { CellRun } from './cell-run';

interface ServerMessage {
  readonly type: string;
  readonly port?: number;
  readonly cpuUs?: number;
  readonly warnings?: number;
}

/** The server's next message of `type`, or an error if it exits or takes longer than `timeoutMs`. */
function nextMessage(server: ChildProcess, type: string, timeoutMs: number): Promise<ServerMessage> {
  return new Promise((resolve, reject) => {
    const onMessage = (message: ServerMessage): void => {
      if (message.type !== type) return;
      done();
      resolve(message);
    };
    const onExit = (code: number | null): void => {
      done();
      reject(new Error(`the HTTP server exited (code ${code}) while waiting for "${type}"`));
    };
    const timer = setTimeout(() => {
      done();
      reject(new Error(`the HTTP server sent no "${type}" within ${timeoutMs} ms`));
    }, timeoutMs);
    const done = (): void => {
      clearTimeout(timer);
      server.off('message', onMessage);
      server.off('exit', onExit);
    };
    server.on('message', onMessage);
    server.on('exit', onExit);
  });
}

async function serverCpu(server: ChildProcess): Promise<ServerMessage> {
  const answer = nextMessage(server, 'cpu', 5_000);
  server.send({ type: 'cpu' });
  return answer;
}

/**
 * A Nest HTTP server in a child process of its own, loaded by autocannon from this process (so the
 * load generator does not share the server's event loop). One endpoint per cell; every request
 * asks for a new id, so each locks a key nobody else holds.
 */
export async function setupHttp(spec: CellSpec, _rank: number, redisUrl: string): Promise<CellRun> {
  const server = fork(join(__dirname, 'http-server.js'), [], {
    env: { ...process.env, BENCH_REDIS_URL: redisUrl },
    stdio: ['ignore', 'inherit', 'inherit', 'ipc'],
  });
  const { port } = await nextMessage(server, 'listening', 20_000);
  const autocannon = (await import('autocannon')).default;
  let id = 0;
  /** autocannon's own histogram keeps whole milliseconds; the response events carry the exact time. */
  const load = async (seconds: number, latencies?: Samples): Promise<Awaited<ReturnType<typeof autocannon>>> => {
    const tracker = autocannon({
      url: `http://127.0.0.1:${port}`,
      connections: spec.workers,
      duration: seconds,
      timeout: 10,
      requests: [{ method: 'GET', setupRequest: (request) => ({ ...request, path: `/${spec.contender}?id=${++id}` }) }],
    });
    if (latencies) {
      tracker.on('response', (_client, statusCode, _bytes, ms) => {
        if (statusCode >= 200 && statusCode < 300) latencies.push(ms);
      });
    }
    return tracker;
  };
  return {
    async go(t0: number): Promise<Metrics> {
      await sleepUntil(t0);
      if (spec.warmupMs > 0) await load(Math.max(1, Math.round(spec.warmupMs / 1000)));
      const before = await serverCpu(server);
      const started = hr();
      const latencies = new Samples();
      const result = await load(Math.max(1, Math.round(spec.measureMs / 1000)), latencies);
      const seconds = (hr() - started) / 1000;
      const after = await serverCpu(server);
      const ok = result['2xx'];
      const sorted = latencies.sorted();
      return {
        reqPerSec: ok / seconds,
        latencyP50Ms: percentile(sorted, 50),
        latencyP99Ms: percentile(sorted, 99),
        latencyMeanMs: sorted.reduce((sum, ms) => sum + ms, 0) / Math.max(1, sorted.length),
        serverCpuUsPerReq: ((after.cpuUs ?? NaN) - (before.cpuUs ?? NaN)) / Math.max(1, ok),
        non2xx: result.non2xx,
        errors: result.errors + result.timeouts,
        warnings: after.warnings ?? 0,
      };
    },
    async close() {
      if (server.exitCode !== null || server.signalCode !== null) return;
      const exited = new Promise<void>((resolve) => server.once('exit', () => resolve()));
      server.send({ type: 'close' });
      const timer = setTimeout(() => server.kill('SIGKILL'), 5_000);
      await exited;
      clearTimeout(timer);
    },
  };
}

export function httpMetrics(parts: readonly Metrics[]): Metrics {
  return parts[0];
}
