/**
 * Lock-family worker: a Nest app with DisLockModule whose parent tells it, over IPC, to churn on
 * semaphores, read-write locks, plain locks and multi-locks from several loops at once, or to take
 * one lock and hold it until told to let go (so that the parent can SIGKILL it while it holds).
 * Used by test/lock-family-processes.e2e-spec.ts; see family-churn-protocol.ts for the messages and
 * for the records every critical section keeps on Redis (gauges, fencing tokens, violations).
 *
 * Every event is timestamped with `Date.now()` (the parent runs on the same machine and clock).
 */
import 'reflect-metadata';
import { Injectable, Module } from '@nestjs/common';
import { NestFactory } from '@nestjs/core';
import { Redis } from 'ioredis';
import { DisLock, DisLockModule, type LockHandle, LockNotAcquiredError, LockService } from 'nestjs-dislock';
import {
  type ChurnLoop,
  DECORATED,
  ENTER_LUA,
  EXIT_LUA,
  type FamilyChildMessage,
  familyDataKeys,
  type FamilyLock,
  type FamilyParentMessage,
  type FamilyWorkerConfig,
  type HeldInfo,
  holdKind,
  type LoopReport,
  seededRandom,
  TOKEN_ENTER_LUA,
  TOKEN_EXIT_LUA,
} from './family-churn-protocol';
import { boundLifetime, runWorker, workerConfig } from './protocol';

const config = workerConfig<FamilyWorkerConfig>();
const lifetime = boundLifetime(config.deadlineMs);
const sleep = (ms: number): Promise<void> => new Promise((resolve) => setTimeout(resolve, ms));

const data = new Redis(config.redis, { maxRetriesPerRequest: 1 });
data.on('error', () => undefined);

function send(message: FamilyChildMessage): void {
  if (process.connected) process.send?.(message);
}

/** A hold as the loops see it, whichever way it was taken: its parts (one for a single lock). */
interface Hold {
  token: number;
  owner: string;
  signal: AbortSignal;
  parts: readonly LockHandle[];
}

/** A multi-lock's handle lists its parts in `locks`; any other handle is its own only part. */
function holdOf(handle: LockHandle): Hold {
  const parts = (handle as LockHandle & { locks?: readonly LockHandle[] }).locks ?? [handle];
  return { token: handle.fencingToken, owner: handle.owner, signal: handle.signal, parts };
}

type Body = (hold: Hold) => Promise<void>;

const decorated = { waitTime: DECORATED.waitTime, lockWatchdogTimeout: DECORATED.lease };

/** The same holds through `@DisLock` (its options are fixed here: see DECORATED). */
@Injectable()
class Decorated {
  constructor(private readonly locks: LockService) {}

  @DisLock({ key: '{0}', permits: DECORATED.permits, ...decorated })
  async permit(name: string, body: Body): Promise<void> {
    await body(this.held([name]));
  }

  @DisLock({ key: '{0}', mode: 'read', ...decorated })
  async read(name: string, body: Body): Promise<void> {
    await body(this.held([name]));
  }

  @DisLock({ key: '{0}', mode: 'write', ...decorated })
  async write(name: string, body: Body): Promise<void> {
    await body(this.held([name]));
  }

  @DisLock({ key: '{0}', ...decorated })
  async mutex(name: string, body: Body): Promise<void> {
    await body(this.held([name]));
  }

  @DisLock({ key: ['{0}', '{1}'], ...decorated })
  async pair(a: string, b: string, body: Body): Promise<void> {
    await body(this.held([a, b]));
  }

  @DisLock({ key: ['{0}', '{1}', '{2}'], ...decorated })
  async triple(a: string, b: string, c: string, body: Body): Promise<void> {
    await body(this.held([a, b, c]));
  }

  /** Inside a decorated method: the call chain's hold of each name (the parts of a multi-lock). */
  private held(names: readonly string[]): Hold {
    const parts = [...names].sort().map((name) => {
      const handle = this.locks.current(name);
      if (!handle) throw new Error(`no current lock "${name}" inside the @DisLock method`);
      return handle;
    });
    if (parts.length === 1) return holdOf(parts[0]);
    return {
      token: Math.max(...parts.map((part) => part.fencingToken)),
      owner: parts[0].owner,
      signal: AbortSignal.any(parts.map((part) => part.signal)),
      parts,
    };
  }
}

@Module({
  imports: [DisLockModule.forRoot({ redis: config.redis, keyPrefix: config.keyPrefix })],
  providers: [Decorated],
})
class FamilyModule {}

function lockOptions(lock: FamilyLock) {
  const base = { waitTime: lock.waitTime, lockWatchdogTimeout: lock.lease };
  if (lock.kind === 'permit') return { ...base, permits: lock.permits };
  if (lock.kind === 'read' || lock.kind === 'write') return { ...base, mode: lock.kind };
  return base;
}

/** Whether `body` ran under the lock (false: not acquired; other failures throw). */
async function runHeld(
  locks: LockService,
  family: Decorated,
  lock: FamilyLock,
  via: ChurnLoop['via'],
  body: Body,
  report: LoopReport,
): Promise<boolean> {
  const options = lockOptions(lock);
  const [first, second, third] = lock.names;
  switch (via) {
    case 'lock':
    case 'tryLock': {
      let handle: LockHandle | null;
      if (lock.kind === 'multi') {
        handle = await (via === 'lock' ? locks.lock(lock.names, options) : locks.tryLock(lock.names, options));
      } else {
        handle = await (via === 'lock' ? locks.lock(first, options) : locks.tryLock(first, options));
      }
      if (!handle) return false;
      try {
        await body(holdOf(handle));
      } finally {
        if (!(await handle.release())) report.releasedFalse += 1;
      }
      return true;
    }
    case 'withLock':
      if (lock.kind === 'multi') await locks.withLock(lock.names, (handle) => body(holdOf(handle)), options);
      else await locks.withLock(first, (handle) => body(holdOf(handle)), options);
      return true;
    case 'decorator': {
      const expected = lock.waitTime === DECORATED.waitTime && lock.lease === DECORATED.lease;
      if (!expected || (lock.kind === 'permit' && lock.permits !== DECORATED.permits)) {
        throw new Error(`a decorated loop must ask for ${JSON.stringify(DECORATED)}: ${JSON.stringify(lock)}`);
      }
      if (lock.kind === 'multi' && lock.names.length === 2) await family.pair(first, second, body);
      else if (lock.kind === 'multi' && lock.names.length === 3) await family.triple(first, second, third, body);
      else if (lock.kind === 'multi') throw new Error('a decorated multi-lock takes 2 or 3 names');
      else await family[lock.kind](first, body);
      return true;
    }
  }
}

/** For each name, the largest token that had left its critical section: read before asking for the lock. */
async function exitedTokens(keys: ReturnType<typeof familyDataKeys>, names: readonly string[]) {
  const values = await Promise.all(names.map((name) => data.hget(keys.fence(name), 'maxExited')));
  return new Map(names.map((name, i) => [name, Number(values[i] ?? '0')]));
}

/** Enter the critical section of every part: gauges, the hash layout and the fencing tokens, checked in Redis. */
async function enter(
  keys: ReturnType<typeof familyDataKeys>,
  lock: FamilyLock,
  hold: Hold,
  before: Map<string, number>,
  label: string,
): Promise<void> {
  const kind = holdKind(lock.kind);
  const limit = lock.kind === 'permit' ? (lock.permits ?? 0) : 0;
  const problems: string[] = [];
  const names = [...new Set(lock.names)].sort();
  const partNames = hold.parts.map((part) => part.name);
  if (JSON.stringify(partNames) !== JSON.stringify(names)) {
    problems.push(`parts ${JSON.stringify(partNames)}, expected the names sorted: ${JSON.stringify(names)}`);
  }
  const largest = Math.max(...hold.parts.map((part) => part.fencingToken));
  if (hold.token !== largest) problems.push(`handle token ${hold.token}, the largest of its parts is ${largest}`);
  if (problems.length > 0) await data.rpush(keys.violations, `${label}: ${problems.join('; ')}`);
  for (const part of hold.parts) {
    const at = `${label} ${part.name}#${part.fencingToken}`;
    await data.eval(ENTER_LUA, 3, part.key, keys.gauge(part.name), keys.violations, kind, limit, part.owner, at);
    await data.eval(
      TOKEN_ENTER_LUA,
      3,
      keys.fence(part.name),
      keys.tokens(part.name),
      keys.violations,
      kind,
      part.fencingToken,
      before.get(part.name) ?? 0,
      at,
    );
  }
}

async function exit(keys: ReturnType<typeof familyDataKeys>, lock: FamilyLock, hold: Hold): Promise<void> {
  for (const part of hold.parts) {
    await data.eval(EXIT_LUA, 1, keys.gauge(part.name), holdKind(lock.kind));
    await data.eval(TOKEN_EXIT_LUA, 1, keys.fence(part.name), part.fencingToken);
  }
}

const KEEP = 20;

async function churnLoop(
  locks: LockService,
  family: Decorated,
  keys: ReturnType<typeof familyDataKeys>,
  loop: ChurnLoop,
  index: number,
  started: number,
  durationMs: number,
  random: () => number,
): Promise<LoopReport> {
  const report: LoopReport = {
    acquired: 0,
    notAcquired: 0,
    refusedAfterMs: [],
    errors: [],
    lost: 0,
    releasedFalse: 0,
    waitsMs: [],
  };
  const between = ([min, max]: [number, number]): number => min + random() * (max - min);
  const stopAt = started + (loop.stopAfterMs ?? durationMs);
  await sleep(started + (loop.startAfterMs ?? 0) - Date.now());
  while (Date.now() < stopAt) {
    const label = `pid ${process.pid} loop ${index} ${loop.kind}/${loop.via}`;
    const holdMs = between(loop.holdMs);
    const asked = Date.now();
    try {
      const before = await exitedTokens(keys, loop.names);
      const askedAt = Date.now();
      const ran = await runHeld(
        locks,
        family,
        loop,
        loop.via,
        async (hold) => {
          report.waitsMs.push(Date.now() - askedAt);
          await enter(keys, loop, hold, before, label);
          await sleep(holdMs);
          await exit(keys, loop, hold);
          if (hold.signal.aborted) report.lost += 1;
        },
        report,
      );
      if (ran) report.acquired += 1;
      else {
        report.notAcquired += 1;
        if (report.refusedAfterMs.length < KEEP) report.refusedAfterMs.push(Date.now() - asked);
      }
    } catch (error) {
      if (error instanceof LockNotAcquiredError) {
        report.notAcquired += 1;
        if (report.refusedAfterMs.length < KEEP) report.refusedAfterMs.push(Date.now() - asked);
      } else if (report.errors.length < KEEP) report.errors.push(String(error));
    }
    await sleep(between(loop.gapMs));
  }
  return report;
}

runWorker(async () => {
  const app = await NestFactory.createApplicationContext(FamilyModule, { logger: ['error', 'warn'] });
  const locks = app.get(LockService);
  const family = app.get(Decorated);
  await data.ping();

  const releases = new Map<string, () => void>();
  const running = new Set<Promise<unknown>>();
  const track = (task: Promise<unknown>): void => {
    const settled = task.catch((error: unknown) => {
      send({ type: 'failed', error: error instanceof Error ? (error.stack ?? error.message) : String(error) });
    });
    running.add(settled);
    void settled.finally(() => running.delete(settled));
  };

  async function hold(id: string, lock: FamilyLock, via: 'lock' | 'tryLock'): Promise<void> {
    const startedAt = Date.now();
    const report: LoopReport = {
      acquired: 0,
      notAcquired: 0,
      refusedAfterMs: [],
      errors: [],
      lost: 0,
      releasedFalse: 0,
      waitsMs: [],
    };
    try {
      const ran = await runHeld(
        locks,
        family,
        lock,
        via,
        async (held) => {
          const info: HeldInfo = {
            at: Date.now(),
            token: held.token,
            owner: held.owner,
            parts: held.parts.map((part) => ({ key: part.key, owner: part.owner, token: part.fencingToken })),
          };
          send({ type: 'held', id, ...info });
          await new Promise<void>((resolve) => releases.set(id, resolve));
          releases.delete(id);
        },
        report,
      );
      if (ran) send({ type: 'released', id, at: Date.now(), ok: report.releasedFalse === 0 });
      else send({ type: 'gave-up', id, at: Date.now(), startedAt, how: 'null' });
    } catch (error) {
      const how = error instanceof LockNotAcquiredError ? 'not-acquired' : 'error';
      send({ type: 'gave-up', id, at: Date.now(), startedAt, how, error: String(error) });
    }
  }

  async function churn(message: Extract<FamilyParentMessage, { type: 'churn' }>): Promise<void> {
    const keys = familyDataKeys(message.dataPrefix);
    const started = Date.now();
    const reports = await Promise.all(
      message.loops.map((loop, i) =>
        churnLoop(locks, family, keys, loop, i, started, message.durationMs, seededRandom(message.seed * 101 + i)),
      ),
    );
    send({ type: 'churned', id: message.id, loops: reports });
  }

  process.on('message', (message: FamilyParentMessage) => {
    switch (message.type) {
      case 'churn':
        track(churn(message));
        break;
      case 'hold':
        track(hold(message.id, message.lock, message.via));
        break;
      case 'release':
        releases.get(message.id)?.();
        break;
      case 'release-all':
        for (const release of releases.values()) release();
        void Promise.all(running).then(() => send({ type: 'idle' }));
        break;
    }
  });
  send({ type: 'ready', pid: process.pid });

  // The parent disconnects (or dies) when it is done: close and end.
  await new Promise<void>((resolve) => process.once('disconnect', () => resolve()));
  for (const release of releases.values()) release();
  await Promise.all(running);
  await app.close();
  data.disconnect();
  lifetime.finish();
});
