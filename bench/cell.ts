/**
 * One process of one cell, started by run.ts with an IPC channel: `setup` -> (connect, build the
 * contender) -> `ready`; `go` -> warm-up, measuring window -> `result`; then it exits. It also
 * exits when the orchestrator goes away (the IPC channel closes), and after a hard time limit.
 */
import type { CellRun } from './scenarios/cell-run';
import { describeError } from './scenarios/cell-run';
import type { ChildMessage, ParentMessage, Scenario } from './support/protocol';
import { serverUrl } from './support/redis';

const HARD_LIMIT_MS = 10 * 60_000;

function send(message: ChildMessage): Promise<void> {
  return new Promise((resolve) => {
    if (!process.send || !process.connected) return resolve();
    process.send(message, undefined, {}, () => resolve());
  });
}

async function fail(error: unknown): Promise<never> {
  await send({ type: 'failed', error: error instanceof Error ? (error.stack ?? describeError(error)) : String(error) });
  process.exit(1);
}

let run: CellRun | undefined;

async function onMessage(message: ParentMessage): Promise<void> {
  if (message.type === 'setup') {
    const { spec, rank, redis } = message;
    // Uncontended and contended also run on the Cluster; renewal and http on the single server only.
    const scenarios: Record<Scenario, () => Promise<CellRun>> = {
      uncontended: async () => (await import('./scenarios/uncontended.js')).setupUncontended(spec, rank, redis),
      contended: async () => (await import('./scenarios/contended.js')).setupContended(spec, rank, redis),
      renewal: async () => (await import('./scenarios/renewal.js')).setupRenewal(spec, rank, serverUrl(redis)),
      http: async () => (await import('./scenarios/http.js')).setupHttp(spec, rank, serverUrl(redis)),
      family: async () => (await import('./scenarios/family.js')).setupFamily(spec, rank, redis),
    };
    run = await scenarios[spec.scenario]();
    await send({ type: 'ready' });
  } else if (message.type === 'go') {
    if (!run) throw new Error('"go" before "setup"');
    const part = await run.go(message.t0);
    await send({ type: 'result', part });
    await run.close();
    process.exit(0);
  }
}

if (!process.send) {
  console.error('bench/dist/cell.js is started by bench/dist/run.js (npm run bench), not by hand');
  process.exit(2);
}
process.on('message', (message: ParentMessage) => void onMessage(message).catch(fail));
process.on('disconnect', () => process.exit(3));
process.on('unhandledRejection', (error) => void fail(error));
process.on('uncaughtException', (error) => void fail(error));
setTimeout(() => void fail(new Error(`cell still running after ${HARD_LIMIT_MS} ms`)), HARD_LIMIT_MS).unref();
