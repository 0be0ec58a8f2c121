/**
 * History worker: a Nest app that takes locks on a few names at random, every way the library
 * offers (`@DisLock` with fixed or renewed leases, `withLock`, `lock()` + `release()`, re-entries
 * awaited or not, with and without `waitTime`), while the parent injects faults into its connection
 * to Redis. Each critical section does one fenced write to a separate Redis the faults never touch,
 * and is reported to the parent (see ../history/history.ts). With `lockless` the same work runs
 * without any lock: the control run, in which the checker must find overlaps.
 *
 * Messages: 'ready' once the app is up; then 'go' starts the loops and 'stop' ends them; events go
 * up in 'history' batches, and 'history-done' comes last, after the app has closed.
 */
import 'reflect-metadata';
import { Injectable, Module } from '@nestjs/common';
import { Redis } from 'ioredis';
import {
  DisLock,
  DisLockModule,
  type LockHandle,
  LockNotAcquiredError,
  LockService,
  RedisUnavailableError,
} from 'nestjs-dislock';
import { clock, type HistoryEvent, type LockPath, prng } from '../history/history';
import { leaveRunning, runHistoryLoop } from '../history/history-loop';
import { boundLifetime, workerConfig } from './protocol';

export interface HistoryWorkerConfig {
  /** This worker's number (0-based). */
  worker: number;
  /** The lock Redis, through this worker's fault proxy. */
  redis: string;
  /** The fenced resource: a Redis no fault touches. */
  fence: string;
  keyPrefix: string;
  names: string[];
  seed: number;
  operationTimeout: number;
  /** Concurrent loops in this process (so that it has local waiting lines too). */
  loops: number;
  lockless: boolean;
  deadlineMs: number;
}

const config = workerConfig<HistoryWorkerConfig>();
const lifetime = boundLifetime(config.deadlineMs);
const random = prng(config.seed);
const pick = <T>(items: readonly T[]): T => items[Math.floor(random() * items.length)];
const sleep = (ms: number): Promise<void> => new Promise((resolve) => setTimeout(resolve, ms));

/** Accept `token` for `name` if no larger one was accepted before; 1 accepted, 0 refused. */
const FENCED_WRITE = `
local last = tonumber(redis.call('get', KEYS[1]) or '-1')
local token = tonumber(ARGV[1])
if token < last then return 0 end
redis.call('set', KEYS[1], ARGV[1])
return 1
`;

const fence = new Redis(config.fence, { maxRetriesPerRequest: 1 });
fence.on('error', () => undefined);
const pending: HistoryEvent[] = [];
const record = (event: HistoryEvent): void => void pending.push(event);
let locklessToken = 0;

/** One critical section: the fenced write and a random amount of work; reports the hold. */
async function criticalSection(
  name: string,
  handle: Pick<LockHandle, 'owner' | 'fencingToken' | 'signal'>,
  path: LockPath,
  nested: boolean,
  waitedFrom: number | undefined,
  work: () => Promise<void>,
  calledAt?: number,
): Promise<void> {
  const start = clock();
  let lostAt: number | undefined;
  const onAbort = (): void => void (lostAt ??= clock());
  handle.signal.addEventListener('abort', onAbort, { once: true });
  if (handle.signal.aborted) onAbort();
  const toldBeforeWrite = handle.signal.aborted;
  let write: 'accepted' | 'refused' | 'failed' = 'failed';
  try {
    const accepted = await fence.eval(FENCED_WRITE, 1, `fence:${name}`, handle.fencingToken);
    write = accepted === 1 ? 'accepted' : 'refused';
  } catch {
    // the fence Redis is not faulted; a failure here says nothing about the lock
  }
  // Mostly short; sometimes past a fixed lease (250 ms) or across several renewals.
  const roll = random();
  await sleep(roll < 0.85 ? random() * 40 : roll < 0.95 ? 100 + random() * 200 : 300 + random() * 300);
  await work();
  const end = clock();
  handle.signal.removeEventListener('abort', onAbort);
  record({
    kind: 'hold',
    worker: config.worker,
    name,
    owner: handle.owner,
    token: handle.fencingToken,
    start,
    end,
    lostAt,
    waitedFrom,
    calledAt: calledAt ?? waitedFrom ?? start,
    path,
    nested,
    write,
    toldBeforeWrite,
  });
}

type Lease = { expire: number } | { lockWatchdogTimeout: number };

/** What a locked method tells its caller: whose hold it was, and whether it was lost. */
interface Outcome {
  readonly owner: string;
  readonly lost: boolean;
}

@Injectable()
class Actor {
  constructor(private readonly locks: LockService) {}

  @DisLock({ key: '{0}', expire: 250 })
  fixed(name: string, calledAt: number): Promise<Outcome> {
    return this.inside(name, 'decorator', undefined, calledAt);
  }

  @DisLock({ key: '{0}', lockWatchdogTimeout: 300 })
  renewed(name: string, calledAt: number): Promise<Outcome> {
    return this.inside(name, 'decorator', undefined, calledAt);
  }

  @DisLock({ key: '{0}', expire: 250, waitTime: 800 })
  fixedWaiting(name: string, waitedFrom: number): Promise<Outcome> {
    return this.inside(name, 'decorator', waitedFrom);
  }

  @DisLock({ key: '{0}', lockWatchdogTimeout: 300, waitTime: 800 })
  renewedWaiting(name: string, waitedFrom: number): Promise<Outcome> {
    return this.inside(name, 'decorator', waitedFrom);
  }

  /** The body of a locked method: the current lock is the one to report. */
  async inside(name: string, path: LockPath, waitedFrom: number | undefined, calledAt?: number): Promise<Outcome> {
    const handle = this.locks.current(name);
    if (!handle) throw new Error(`no current lock "${name}" inside its critical section`);
    await criticalSection(name, handle, path, false, waitedFrom, () => this.maybeReenter(name), calledAt);
    return { owner: handle.owner, lost: handle.signal.aborted };
  }

  /** Sometimes re-enter the same lock from inside: awaited, or started and left running. */
  async maybeReenter(name: string): Promise<void> {
    const roll = random();
    if (roll >= 0.25) return;
    const nested = this.locks.withLock(name, async (inner) => {
      await criticalSection(name, inner, 'withLock', true, undefined, async () => undefined);
    });
    const settled = nested.catch(expected);
    if (roll < 0.15) await settled;
    else leaveRunning(settled);
  }
}

/** Busy and Redis-unavailable are what faults produce; anything else is reported as an error. */
function expected(error: unknown): void {
  if (error instanceof LockNotAcquiredError || error instanceof RedisUnavailableError) return;
  if (error instanceof Error && error.message.includes('shutting down')) return;
  record({
    kind: 'error',
    worker: config.worker,
    at: clock(),
    error: error instanceof Error ? (error.stack ?? error.message) : String(error),
  });
}

async function oneCall(actor: Actor, locks: LockService): Promise<void> {
  const name = pick(config.names);
  if (config.lockless) {
    locklessToken += 1;
    const owner = `none-${config.worker}-${locklessToken}`;
    const signal = new AbortController().signal;
    await criticalSection(
      name,
      { owner, fencingToken: locklessToken, signal },
      'none',
      false,
      undefined,
      async () => undefined,
    );
    return;
  }
  const waits = random() < 0.5;
  const lease: Lease = random() < 0.5 ? { expire: 250 } : { lockWatchdogTimeout: 300 };
  const from = clock();
  const path = pick(['decorator', 'withLock', 'lock'] as const);
  let outcome: LockHandle | null | undefined;
  try {
    let done: Outcome | undefined;
    if (path === 'decorator') {
      const fixed = 'expire' in lease;
      if (waits) done = await (fixed ? actor.fixedWaiting(name, from) : actor.renewedWaiting(name, from));
      else done = await (fixed ? actor.fixed(name, from) : actor.renewed(name, from));
    } else if (path === 'withLock') {
      await locks.withLock(
        name,
        async (handle) => {
          outcome = handle;
          await criticalSection(
            name,
            handle,
            'withLock',
            false,
            waits ? from : undefined,
            () => actor.maybeReenter(name),
            from,
          );
        },
        { ...lease, waitTime: waits ? 800 : 0 },
      );
      if (outcome) done = { owner: outcome.owner, lost: outcome.signal.aborted };
    } else {
      outcome = await locks.tryLock(name, { ...lease, waitTime: waits ? 800 : 0 });
      if (outcome) {
        await criticalSection(name, outcome, 'lock', false, waits ? from : undefined, async () => undefined, from);
        if (await outcome.release()) done = { owner: outcome.owner, lost: false };
      } else if (waits) {
        record({ kind: 'give-up', worker: config.worker, name, waitedFrom: from, at: clock() });
      }
    }
    // Only an explicit release() that answered true is recorded as one: a locked method or
    // withLock call also settles after its release, but cannot say whether that release freed the
    // lock or failed (logged, not thrown) and left the key to expire, which announces nothing.
    if (done && !done.lost && path === 'lock') {
      record({ kind: 'release', worker: config.worker, name, owner: done.owner, at: clock() });
    }
  } catch (error) {
    if (error instanceof LockNotAcquiredError && waits) {
      record({ kind: 'give-up', worker: config.worker, name, waitedFrom: from, at: clock() });
      return;
    }
    // Its acquisition may have taken the lock all the same: held until given back or expired.
    if (error instanceof RedisUnavailableError) {
      record({ kind: 'unknown', worker: config.worker, name, from, to: clock(), waits });
    }
    expected(error);
  }
}

@Module({
  imports: [
    DisLockModule.forRoot({
      redis: config.redis,
      keyPrefix: config.keyPrefix,
      operationTimeout: config.operationTimeout,
      onLockLost: () => undefined, // losses are expected here; the records say when
    }),
  ],
  providers: [Actor],
})
class HistoryModule {}

runHistoryLoop({
  module: HistoryModule,
  actor: Actor,
  worker: config.worker,
  loops: config.loops,
  random,
  pending,
  fence,
  lifetime,
  oneCall,
});
