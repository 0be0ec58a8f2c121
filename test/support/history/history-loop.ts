/**
 * What both history workers (../workers/history.worker.ts, ./family.worker.ts) do around their
 * calls: start the Nest app, report 'ready', run `loops` loops of calls between 'go' and 'stop',
 * send the events up in batches, record the event loop's own stalls, close, and send the rest.
 */
import { type INestApplicationContext, Logger, type Type } from '@nestjs/common';
import { NestFactory } from '@nestjs/core';
import type { Redis } from 'ioredis';
import { LockService } from 'nestjs-dislock';
import { fromParent, runWorker, toParent } from '../workers/protocol';
import { clock, type HistoryEvent, PAUSE_MS, TICK_MS } from './history';

const sleep = (ms: number): Promise<void> => new Promise((resolve) => setTimeout(resolve, ms));

/** Calls started inside a critical section and not awaited there (re-entries left running). */
const leftRunning = new Set<Promise<void>>();

/** A call left running (it must not reject): the worker waits for it, 1.1 s at most, before it closes. */
export function leaveRunning(call: Promise<void>): void {
  leftRunning.add(call);
  void call.finally(() => leftRunning.delete(call));
}

export interface HistoryLoop<A> {
  /** The app's module, and the provider that makes the decorated calls. */
  readonly module: Type<unknown>;
  readonly actor: Type<A>;
  readonly worker: number;
  readonly loops: number;
  readonly random: () => number;
  /** Where `record` puts events until they are sent up. */
  readonly pending: HistoryEvent[];
  /** The fenced resource's client, if the worker has one: closed at the end. */
  readonly fence?: Redis;
  readonly lifetime: { finish(): void };
  /** One call of a loop. */
  oneCall(actor: A, locks: LockService): Promise<void>;
  /** Once the app is up, before 'ready' (to listen for lock events, or watch its store). */
  onReady?(locks: LockService, app: INestApplicationContext): void;
  /** After the app has closed (a client the worker created, which the module does not close). */
  afterClose?(): void;
}

export function runHistoryLoop<A>(loop: HistoryLoop<A>): void {
  const { pending } = loop;
  // A rejection nobody handled would end the worker and lose its history: record it as the error it is.
  process.on('unhandledRejection', (reason: unknown) => {
    const error = reason instanceof Error ? (reason.stack ?? reason.message) : String(reason);
    pending.push({ kind: 'error', worker: loop.worker, at: clock(), error: `unhandled rejection: ${error}` });
  });
  runWorker(async () => {
    Logger.overrideLogger(['error']);
    const app = await NestFactory.createApplicationContext(loop.module, { logger: ['error'] });
    const actor = app.get(loop.actor);
    const locks = app.get(LockService);
    loop.onReady?.(locks, app);
    await toParent({ type: 'ready' });
    await fromParent('go');
    const flusher = setInterval(() => {
      if (pending.length > 0) void toParent({ type: 'history', events: pending.splice(0) });
    }, 200);
    let stopping = false;
    void fromParent('stop').then(() => (stopping = true));
    // A tick later than it should be means the event loop stood still that long (GC, a busy CPU):
    // the library's own timers were just as late then.
    let lastTick = clock();
    const ticker = setInterval(() => {
      const at = clock();
      const due = lastTick + TICK_MS;
      if (at - due > PAUSE_MS) pending.push({ kind: 'pause', worker: loop.worker, from: due, to: at });
      lastTick = at;
    }, TICK_MS);
    await Promise.all(
      Array.from({ length: loop.loops }, async () => {
        while (!stopping) {
          await loop.oneCall(actor, locks);
          await sleep(loop.random() * 20);
        }
      }),
    );
    // Re-entries left running finish (their work is at most 600 ms, and 400 ms of sync work): the
    // app closes once they have, or after 1.1 s, as it did after a fixed 1.1 s.
    await Promise.race([Promise.all(leftRunning), sleep(1_100)]);
    clearInterval(flusher);
    clearInterval(ticker);
    await app.close();
    loop.afterClose?.();
    loop.fence?.disconnect();
    await toParent({ type: 'history-done', events: pending.splice(0) });
    loop.lifetime.finish();
  });
}
