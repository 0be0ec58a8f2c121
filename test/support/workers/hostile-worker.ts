/**
 * Child process of test/hostile-input.e2e-spec.ts, for what only a process of its own can show:
 * unhandled rejections (kept out of the test runner's process), a CA trusted through
 * NODE_EXTRA_CA_CERTS (read once at process start), and a process that exits by itself after
 * `app.close()`.
 *
 *   node -r ./test/support/ts-register.js test/support/workers/hostile-worker.ts '<json config>'
 *
 * Reports on stdout, one JSON object per line prefixed with `@@`; never calls process.exit.
 */
import 'reflect-metadata';
import { report, reportExit } from './child-report';
import { type LoggerService, Module } from '@nestjs/common';
import type { RedisOptions } from 'ioredis';
import { NestFactory } from '@nestjs/core';
import {
  DisLockError,
  DisLockModule,
  type DisLockModuleOptions,
  LockService,
  RedisUnavailableError,
} from 'nestjs-dislock';

export type HostileWorkerConfig =
  /** Acquire against a Redis that refuses the password; report the errors, close. */
  | {
      mode: 'wrong-password';
      redis: DisLockModuleOptions['redis'];
      operationTimeout: number;
      keyPrefix: string;
      /** Try once more after this long, when the client's reconnect back-off has grown. */
      lateAfterMs?: number;
      /** A fixed reconnect delay (ioredis `retryStrategy`), for `redis` given as options. */
      retryDelayMs?: number;
    }
  /** Take a lock, report it, wait for "release" on stdin, release it, close. */
  | { mode: 'hold'; redis: DisLockModuleOptions['redis']; operationTimeout: number; keyPrefix: string };

export interface ErrorReport {
  ctor: string;
  isDisLockError: boolean;
  isRedisUnavailable: boolean;
  operation?: string;
  statusCode?: number;
  message: string;
  cause: string;
  ms: number;
}

const config = JSON.parse(process.argv[2] ?? '{}') as HostileWorkerConfig;

reportExit();

const logs: string[] = [];
const logger: LoggerService = {
  log: (message: unknown) => void logs.push(`log ${String(message)}`),
  warn: (message: unknown) => void logs.push(`warn ${String(message)}`),
  error: (message: unknown) => void logs.push(`error ${String(message)}`),
};

function describeError(error: unknown, ms: number): ErrorReport {
  const e = error as Partial<RedisUnavailableError> & { cause?: unknown };
  return {
    ctor: (error as object)?.constructor?.name ?? typeof error,
    isDisLockError: error instanceof DisLockError,
    isRedisUnavailable: error instanceof RedisUnavailableError,
    operation: e.operation,
    statusCode: e.statusCode,
    message: String(e.message),
    cause: e.cause instanceof Error ? e.cause.message : String(e.cause),
    ms,
  };
}

async function attempt(run: () => Promise<unknown>): Promise<ErrorReport | 'ok'> {
  const started = performance.now();
  try {
    await run();
    return 'ok';
  } catch (error) {
    return describeError(error, performance.now() - started);
  }
}

function line(): Promise<string> {
  return new Promise((resolve) => {
    let buffer = '';
    const onData = (chunk: Buffer): void => {
      buffer += chunk.toString();
      const end = buffer.indexOf('\n');
      if (end === -1) return;
      process.stdin.off('data', onData);
      process.stdin.destroy(); // nothing else to read: let the process end on its own
      resolve(buffer.slice(0, end));
    };
    process.stdin.on('data', onData);
  });
}

async function main(): Promise<void> {
  const retryDelayMs = config.mode === 'wrong-password' ? config.retryDelayMs : undefined;
  const redis =
    retryDelayMs !== undefined && typeof config.redis === 'object'
      ? { ...(config.redis as RedisOptions), retryStrategy: () => retryDelayMs }
      : config.redis;

  @Module({
    imports: [
      DisLockModule.forRoot({
        redis,
        keyPrefix: config.keyPrefix,
        operationTimeout: config.operationTimeout,
      }),
    ],
  })
  class WorkerModule {}

  const app = await NestFactory.createApplicationContext(WorkerModule, { logger });
  const locks = app.get(LockService);

  if (config.mode === 'wrong-password') {
    const lock = await attempt(() => locks.lock('auth'));
    const tryLock = await attempt(() => locks.tryLock('auth', { waitTime: 300 }));
    const withLock = await attempt(() => locks.withLock('auth', () => 'ran'));
    const results = [lock, tryLock, withLock];
    if (config.lateAfterMs !== undefined) {
      await new Promise((resolve) => setTimeout(resolve, config.lateAfterMs));
      results.push(await attempt(() => locks.lock('auth')));
    }
    const closeStarted = performance.now();
    await app.close();
    report('closed', { results, closeMs: performance.now() - closeStarted, logs });
    return;
  }

  const handle = await locks.lock('over-tls', { lockWatchdogTimeout: 5_000 });
  report('held', { key: handle.key, owner: handle.owner });
  const command = await line();
  const released = command === 'release' ? await handle.release() : false;
  await app.close();
  report('closed', { released, logs });
}

main().catch((error: unknown) => {
  report('failed', { error: error instanceof Error ? (error.stack ?? error.message) : String(error) });
  process.exitCode = 1;
});
