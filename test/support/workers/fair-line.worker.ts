/**
 * Fair-line worker: a Nest app with DisLockModule whose parent tells it, over IPC, to wait for a
 * lock, hold it, release it, give up, spin on `tryLock` without waiting, or churn on a `@DisLock`
 * method from several loops at once. Every event is timestamped with `Date.now()` (the parent runs
 * on the same machine and clock). Used by test/fair-line.e2e-spec.ts, one test after another:
 * 'init' starts the app for a test (its Redis and key prefix), 'reset' closes it.
 *
 * Inside every critical section the worker raises a holders gauge on the `data` Redis (a server
 * that is never stopped), so that the parent can see two holders at once, whichever processes.
 */
import 'reflect-metadata';
import { type INestApplicationContext, Injectable, Module } from '@nestjs/common';
import { NestFactory } from '@nestjs/core';
import { Redis } from 'ioredis';
import { DisLock, DisLockModule, type LockHandle, LockNotAcquiredError, LockService } from 'nestjs-dislock';
import {
  fairDataKeys,
  type FairChildMessage,
  type FairLineInit,
  type FairLineWorkerConfig,
  type FairParentMessage,
} from './fair-line-protocol';
import { boundLifetime, ENTER_GAUGE_SCRIPT, runWorker, workerConfig } from './protocol';

const config = workerConfig<FairLineWorkerConfig>();
const lifetime = boundLifetime(config.deadlineMs);
const sleep = (ms: number): Promise<void> => new Promise((resolve) => setTimeout(resolve, ms));

const data = new Redis(config.data, { maxRetriesPerRequest: 1 });
data.on('error', () => undefined);

/** The current test's setup and data keys (set by 'init'). */
let setup: FairLineInit = { redis: '', keyPrefix: '', name: '' };
let keys = fairDataKeys('');

function send(message: FairChildMessage): void {
  if (process.connected) process.send?.(message);
}

/** Enter the critical section: raise the holders gauge; returns how many hold it now (must be 1). */
async function enter(id: string): Promise<number> {
  const holders = Number(await data.eval(ENTER_GAUGE_SCRIPT, 2, keys.holders, keys.maxHolders));
  await data.rpush(keys.history, `${process.pid}:${id}`);
  return holders;
}

const exit = (): Promise<number> => data.decr(keys.holders);

@Injectable()
class Churner {
  acquired = 0;

  constructor(private readonly locks: LockService) {}

  /** A non-atomic increment (GET, 1 ms, SET) of the shared counter under the lock. */
  @DisLock({ key: '{0}', waitTime: 10_000, expire: 2_000 })
  async increment(name: string): Promise<number> {
    if (!this.locks.current(name)) throw new Error('no current lock inside the @DisLock method');
    const holders = await enter('churn');
    try {
      const value = Number((await data.get(keys.counter)) ?? '0');
      await sleep(1);
      await data.set(keys.counter, String(value + 1));
      this.acquired += 1;
    } finally {
      await exit();
    }
    return holders;
  }
}

function appModule(init: FairLineInit) {
  @Module({
    imports: [DisLockModule.forRoot({ redis: init.redis, keyPrefix: init.keyPrefix })],
    providers: [Churner],
  })
  class FairLineModule {}
  return FairLineModule;
}

/** One test's app and what runs in it. */
class Session {
  readonly releases = new Map<string, () => void>();
  readonly aborts = new Map<string, AbortController>();
  readonly spins = new Map<string, { stop: boolean }>();
  readonly locks: LockService;
  readonly churner: Churner;

  constructor(readonly app: INestApplicationContext) {
    this.locks = app.get(LockService);
    this.churner = app.get(Churner);
  }

  /** Hold `handle` as told, with the gauge up. */
  async hold(id: string, handle: LockHandle, holdMs: number | undefined, errors: number): Promise<void> {
    const holders = await enter(id);
    send({ type: 'granted', id, at: Date.now(), owner: handle.owner, token: handle.fencingToken, holders, errors });
    if (holdMs === undefined) await new Promise<void>((resolve) => this.releases.set(id, resolve));
    else await sleep(holdMs);
    await exit();
  }

  async lock(message: Extract<FairParentMessage, { type: 'lock' }>): Promise<void> {
    const { id, waitTime, expire } = message;
    const controller = new AbortController();
    this.aborts.set(id, controller);
    const until = Date.now() + waitTime;
    let errors = 0;
    send({ type: 'waiting', id, at: Date.now() });
    for (;;) {
      const left = Math.max(0, until - Date.now());
      try {
        if (message.via === 'withLock') {
          await this.locks.withLock(setup.name, (handle) => this.hold(id, handle, message.holdMs, errors), {
            waitTime: left,
            expire,
            signal: controller.signal,
          });
          send({ type: 'released', id, at: Date.now(), ok: true });
        } else {
          const handle = await this.locks.lock(setup.name, { waitTime: left, expire, signal: controller.signal });
          await this.hold(id, handle, message.holdMs, errors);
          const ok = await handle.release();
          send({ type: 'released', id, at: Date.now(), ok });
        }
        return;
      } catch (error) {
        const at = Date.now();
        if (controller.signal.aborted) return send({ type: 'gave-up', id, at, how: 'aborted' });
        if (error instanceof LockNotAcquiredError) return send({ type: 'gave-up', id, at, how: 'not-acquired' });
        errors += 1;
        if (!message.retryOnError || at >= until) {
          return send({ type: 'gave-up', id, at, how: 'error', error: String(error) });
        }
        await sleep(20);
      }
    }
  }

  async try(id: string): Promise<void> {
    const handle = await this.locks.tryLock(setup.name, { expire: 2_000 });
    send({ type: 'tried', id, at: Date.now(), got: handle !== null });
    await handle?.release();
  }

  async spin(id: string, everyMs: number): Promise<void> {
    const state = { stop: false };
    this.spins.set(id, state);
    const got: { at: number; releasedAt: number }[] = [];
    let attempts = 0;
    while (!state.stop) {
      attempts += 1;
      const handle = await this.locks.tryLock(setup.name, { expire: 2_000 }).catch(() => null);
      if (handle) {
        const at = Date.now();
        await enter(`spin-${id}`);
        await sleep(1);
        await exit();
        await handle.release();
        got.push({ at, releasedAt: Date.now() });
      }
      await sleep(everyMs);
    }
    send({ type: 'spun', id, attempts, got });
  }

  async churn(loops: number, durationMs: number): Promise<void> {
    const until = Date.now() + durationMs;
    let conflicts = 0;
    let maxHolders = 0;
    const errors: string[] = [];
    await Promise.all(
      Array.from({ length: loops }, async () => {
        while (Date.now() < until) {
          try {
            maxHolders = Math.max(maxHolders, await this.churner.increment(setup.name));
          } catch (error) {
            if (error instanceof LockNotAcquiredError) conflicts += 1;
            else errors.push(String(error));
          }
        }
      }),
    );
    send({ type: 'churned', acquired: this.churner.acquired, conflicts, errors, maxHolders });
  }

  /** End everything still running (holds are let go, spins stopped) and close the app. */
  async close(): Promise<void> {
    for (const spin of this.spins.values()) spin.stop = true;
    for (const release of this.releases.values()) release();
    for (const controller of this.aborts.values()) controller.abort(new Error('reset'));
    await this.app.close();
  }
}

runWorker(async () => {
  await data.ping();
  let session: Session | undefined;
  /** Messages are handled one at a time in order: an 'init' is done before the next command runs. */
  let queue: Promise<void> = Promise.resolve();
  const fail = (error: unknown): void => {
    send({ type: 'failed', error: error instanceof Error ? (error.stack ?? error.message) : String(error) });
  };
  const current = (): Session => {
    if (!session) throw new Error('no session: send init first');
    return session;
  };

  const handle = async (message: FairParentMessage): Promise<void> => {
    switch (message.type) {
      case 'init': {
        await session?.close();
        setup = { redis: message.redis, keyPrefix: message.keyPrefix, name: message.name };
        keys = fairDataKeys(message.keyPrefix);
        const app = await NestFactory.createApplicationContext(appModule(setup), { logger: ['error'] });
        session = new Session(app);
        send({ type: 'ready', pid: process.pid });
        break;
      }
      case 'reset': {
        const closing = session;
        session = undefined;
        await closing?.close();
        send({ type: 'reset-done' });
        break;
      }
      case 'lock':
        current().lock(message).catch(fail);
        break;
      case 'release':
        current().releases.get(message.id)?.();
        current().releases.delete(message.id);
        break;
      case 'abort':
        current().aborts.get(message.id)?.abort(new Error('aborted by the parent'));
        break;
      case 'try':
        current().try(message.id).catch(fail);
        break;
      case 'spin':
        current().spin(message.id, message.everyMs).catch(fail);
        break;
      case 'stop-spin': {
        const state = current().spins.get(message.id);
        if (state) state.stop = true;
        break;
      }
      case 'churn':
        current().churn(message.loops, message.durationMs).catch(fail);
        break;
    }
  };
  process.on('message', (message: FairParentMessage) => {
    queue = queue.then(() => handle(message)).catch(fail);
  });
  // The parent disconnects (or dies) when it is done: close and end.
  await new Promise<void>((resolve) => process.once('disconnect', () => resolve()));
  await session?.close().catch(() => undefined);
  data.disconnect();
  lifetime.finish();
});
