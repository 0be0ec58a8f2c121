/**
 * Stalled-holder worker (issue case 4b): takes a watchdog lock, writes to a fenced resource, tells
 * the parent ('locked'), and on 'stall' blocks its own event loop (no timer, no I/O callback runs)
 * for longer than the lease, as a long GC pause or a CPU-bound loop would. Right after the stall,
 * before anything else can run, it writes to the resource again with its old token, as a holder
 * that checked its signal just before the pause would. Then it waits for its signal to abort,
 * releases, and sends the parent a report of what it saw ('report').
 *
 *   node -r ./test/support/ts-register.js test/support/workers/fault-stalled-holder.ts '<json config>'
 */
import 'reflect-metadata';
import { existsSync } from 'node:fs';
import { Module } from '@nestjs/common';
import { NestFactory } from '@nestjs/core';
import { Redis } from 'ioredis';
import { DisLockModule, type LockLostEvent, LockLostError, LockService } from 'nestjs-dislock';
import {
  fencedWrite,
  type LostEventSummary,
  type StalledHolderCommand,
  type StalledHolderConfig,
  type StalledHolderMessage,
} from './fault-protocol';

const config = JSON.parse(process.argv[2] ?? '{}') as StalledHolderConfig;

const deadline = setTimeout(() => {
  console.error(`fault-stalled-holder ${process.pid}: still running after ${config.deadlineMs} ms, exiting`);
  process.exit(3);
}, config.deadlineMs);
deadline.unref();
const orphaned = (): void => process.exit(5); // the parent went away
process.once('disconnect', orphaned);

function send(message: StalledHolderMessage): Promise<void> {
  return new Promise((resolve, reject) => {
    if (!process.send) return reject(new Error('not started with an IPC channel'));
    process.send(message, undefined, {}, (error) => (error ? reject(error) : resolve()));
  });
}

function command(type: StalledHolderCommand['type']): Promise<void> {
  return new Promise((resolve) => {
    const onMessage = (message: StalledHolderCommand): void => {
      if (message?.type !== type) return;
      process.off('message', onMessage);
      resolve();
    };
    process.on('message', onMessage);
  });
}

/** Block the thread (the event loop with it) for at least `minMs`, then until `file` exists, at most `maxMs`. */
function stall(minMs: number, file: string, maxMs: number): number {
  const cell = new Int32Array(new SharedArrayBuffer(4));
  const started = performance.now();
  for (;;) {
    const elapsed = performance.now() - started;
    if (elapsed >= maxMs || (elapsed >= minMs && existsSync(file))) return elapsed;
    Atomics.wait(cell, 0, 0, 5); // sleeps without spinning the CPU; nothing else runs meanwhile
  }
}

function abortedWithin(signal: AbortSignal, ms: number): Promise<boolean> {
  if (signal.aborted) return Promise.resolve(true);
  return new Promise((resolve) => {
    const timer = setTimeout(() => resolve(false), ms);
    signal.addEventListener(
      'abort',
      () => {
        clearTimeout(timer);
        resolve(true);
      },
      { once: true },
    );
  });
}

const events: LostEventSummary[] = [];
let lockSignal: AbortSignal | undefined;

@Module({
  imports: [
    DisLockModule.forRoot({
      redis: config.redis,
      keyPrefix: config.keyPrefix,
      onLockLost: (event: LockLostEvent) => {
        events.push({
          name: event.name,
          key: event.key,
          owner: event.owner,
          fencingToken: event.fencingToken,
          reason: event.reason,
          errorIsSignalReason: lockSignal !== undefined && event.error === lockSignal.reason,
        });
      },
    }),
  ],
})
class StalledHolderModule {}

async function main(): Promise<void> {
  const app = await NestFactory.createApplicationContext(StalledHolderModule, { logger: ['error'] });
  const resource = new Redis(config.redis, { maxRetriesPerRequest: 1 });
  try {
    const locks = app.get(LockService);
    const handle = await locks.lock(config.name, { lockWatchdogTimeout: config.lockWatchdogTimeout });
    lockSignal = handle.signal;
    const firstWriteAccepted = await fencedWrite(resource, config.resource, handle.fencingToken, 'stalled-holder:1');
    const stallOrder = command('stall');
    await send({
      type: 'locked',
      key: handle.key,
      owner: handle.owner,
      token: handle.fencingToken,
      firstWriteAccepted,
    });
    await stallOrder;

    const stalledMs = stall(config.minStallMs, config.resumeFile, config.maxStallMs);
    // The loop resumes here: no timer has run yet, so the holder still believes it holds the lock.
    const abortedWhenWriting = handle.signal.aborted;
    const staleWrite = fencedWrite(resource, config.resource, handle.fencingToken, 'stalled-holder:2');
    const resumedAt = performance.now();
    const staleWriteAccepted = await staleWrite;

    const noticed = await abortedWithin(handle.signal, config.noticeWithinMs);
    const reason: unknown = handle.signal.reason;
    const lostReason = noticed && reason instanceof LockLostError ? reason.reason : null;
    const noticedAfterMs = noticed ? performance.now() - resumedAt : null;
    const released = await handle.release();
    await send({
      type: 'report',
      report: { stalledMs, abortedWhenWriting, staleWriteAccepted, lostReason, noticedAfterMs, events, released },
    });
  } finally {
    resource.disconnect();
    await app.close();
  }
  clearTimeout(deadline);
  process.off('disconnect', orphaned);
  if (process.connected) process.disconnect();
}

main().catch(async (error: unknown) => {
  const text = error instanceof Error ? (error.stack ?? error.message) : String(error);
  console.error(text);
  await send({ type: 'failed', error: text }).catch(() => undefined);
  process.exit(1);
});
