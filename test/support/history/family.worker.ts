/**
 * Lock-family history worker: like ../workers/history.worker.ts, a Nest app whose loops take locks
 * at random while the parent injects faults into its connection to Redis, but over the whole lock
 * family. Each call picks, from the seeded PRNG, a plain lock, a write lock or a read lock of a
 * read-write name, a permit of a semaphore, or a multi-lock of two names; then a way to take it
 * (`@DisLock`, `withLock`, `tryLock` + `release()`), a fixed or a renewed lease, and whether to
 * wait. Re-entries from inside take the same hold again (a writer sometimes as a reader, a
 * multi-lock one of its parts or the whole set). Each critical section does one fenced write per
 * lock it holds to a separate Redis the faults never touch, and is reported to the parent with the
 * kind of each hold (see ./history.ts): a multi-lock as one exclusive hold per part.
 *
 * Messages are those of the history worker: 'ready', then 'go' and 'stop'; events go up in
 * 'history' batches, and 'history-done' comes last, after the app has closed.
 */
import 'reflect-metadata';
import { Injectable, Module } from '@nestjs/common';
import { Redis } from 'ioredis';
import {
  DisLock,
  DisLockModule,
  type DisLockOptions,
  type LockHandle,
  LockNotAcquiredError,
  type LockOptions,
  LockService,
  RedisUnavailableError,
} from 'nestjs-dislock';
import { boundLifetime, workerConfig } from '../workers/protocol';
import { runHistoryLoop } from './history-loop';
import { clock, type HistoryEvent, type HoldMode, type LockOp, type LockPath, prng } from './history';

export interface FamilyWorkerConfig {
  /** This worker's number (0-based). */
  worker: number;
  /** The lock Redis, through this worker's fault proxy. */
  redis: string;
  /** The fenced resource: a Redis no fault touches. */
  fence: string;
  keyPrefix: string;
  /** Read-write locks: taken for reading, for writing, plainly, and in multi-locks. */
  rwNames: string[];
  /**
   * Semaphores: taken with their `permits` (now and then with one more: a caller with a higher
   * bound is admitted while fewer holders than its own bound hold), plainly, and in multi-locks.
   */
  semaphores: { name: string; permits: number }[];
  seed: number;
  operationTimeout: number;
  /** Concurrent loops in this process (so that it has local waiting lines of mixed kinds too). */
  loops: number;
  deadlineMs: number;
}

const config = workerConfig<FamilyWorkerConfig>();
const lifetime = boundLifetime(config.deadlineMs);
const random = prng(config.seed);
const pick = <T>(items: readonly T[]): T => items[Math.floor(random() * items.length)];
const sleep = (ms: number): Promise<void> => new Promise((resolve) => setTimeout(resolve, ms));
const allNames = [...config.rwNames, ...config.semaphores.map((s) => s.name)];

/** How often each kind of call is made. */
const OPS: readonly (readonly [LockOp, number])[] = [
  ['mutex', 0.12],
  ['write', 0.14],
  ['read', 0.28],
  ['permit', 0.34],
  ['multi', 0.12],
];

/** Leases as the history worker takes them: a fixed 250 ms (often outlived), or a renewed one. */
const FIXED = { expire: 250 } as const;
const RENEWED = { lockWatchdogTimeout: 300 } as const;
const WAIT_MS = 800;

/**
 * Accept `token` for `name` unless a larger one was accepted before: {1} accepted, {0, last}
 * refused by `last`.
 */
const FENCED_WRITE = `
local last = tonumber(redis.call('get', KEYS[1]) or '-1')
local token = tonumber(ARGV[1])
if token < last then return {0, redis.call('get', KEYS[1])} end
redis.call('set', KEYS[1], ARGV[1])
return {1}
`;

const fence = new Redis(config.fence, { maxRetriesPerRequest: 1 });
fence.on('error', () => undefined);
const pending: HistoryEvent[] = [];
const record = (event: HistoryEvent): void => void pending.push(event);

/** What a call asks for, and how its holds are recorded. */
interface Kind {
  readonly op: LockOp;
  readonly mode: HoldMode;
  readonly permits?: number;
  /** The lease, for the records (a re-entry has its outer's). */
  readonly lease?: string;
}

const leaseOf = (fixed: boolean): string =>
  fixed ? `expire ${FIXED.expire}` : `watchdog ${RENEWED.lockWatchdogTimeout}`;

/** The options that take `kind` (besides the lease and the wait). */
function kindOptions(kind: Kind): LockOptions {
  if (kind.op === 'read') return { mode: 'read' };
  if (kind.op === 'write') return { mode: 'write' };
  if (kind.op === 'permit') return { permits: kind.permits };
  return {};
}

/** The locks one handle holds: its own, or a multi-lock's parts. */
const partsOf = (handle: LockHandle): readonly LockHandle[] =>
  (handle as LockHandle & { readonly locks?: readonly LockHandle[] }).locks ?? [handle];

/** One part's side of a critical section: when it was told, and its fenced write. */
interface PartWatch {
  readonly part: LockHandle;
  lostAt?: number;
  toldBeforeWrite: boolean;
  write: 'accepted' | 'refused' | 'failed';
  refusedBy?: number;
  readonly onAbort: () => void;
}

/**
 * One critical section over `parts` (one lock, or a multi-lock's): a fenced write per part and a
 * random amount of work; reports one hold per part, each told by its own signal.
 */
async function criticalSection(
  kind: Kind,
  parts: readonly LockHandle[],
  path: LockPath,
  nested: boolean,
  waitedFrom: number | undefined,
  calledAt: number,
  work: () => Promise<void>,
): Promise<void> {
  const start = clock();
  const watches = parts.map((part) => {
    const watch: PartWatch = {
      part,
      toldBeforeWrite: false,
      write: 'failed',
      onAbort: () => void (watch.lostAt ??= clock()),
    };
    // Already lost when the critical section began (a multi-lock's part can be): told at `start`.
    if (part.signal.aborted) watch.lostAt = start;
    else part.signal.addEventListener('abort', watch.onAbort, { once: true });
    watch.toldBeforeWrite = part.signal.aborted;
    return watch;
  });
  await Promise.all(
    watches.map(async (watch) => {
      try {
        const reply = (await fence.eval(FENCED_WRITE, 1, `fence:${watch.part.name}`, watch.part.fencingToken)) as [
          number,
          string?,
        ];
        watch.write = reply[0] === 1 ? 'accepted' : 'refused';
        if (reply[1] !== undefined) watch.refusedBy = Number(reply[1]);
      } catch {
        // the fence Redis is not faulted; a failure here says nothing about the lock
      }
    }),
  );
  // Mostly short; sometimes past a fixed lease (250 ms) or across several renewals.
  const roll = random();
  await sleep(roll < 0.85 ? random() * 40 : roll < 0.95 ? 100 + random() * 200 : 300 + random() * 300);
  await work();
  const end = clock();
  for (const watch of watches) {
    watch.part.signal.removeEventListener('abort', watch.onAbort);
    record({
      kind: 'hold',
      worker: config.worker,
      name: watch.part.name,
      owner: watch.part.owner,
      token: watch.part.fencingToken,
      mode: kind.mode,
      permits: kind.permits,
      op: kind.op,
      lease: kind.lease,
      start,
      end,
      lostAt: watch.lostAt,
      waitedFrom,
      calledAt,
      path,
      nested,
      write: watch.write,
      refusedBy: watch.refusedBy,
      toldBeforeWrite: watch.toldBeforeWrite,
    });
  }
}

/** Sometimes take the hold again from inside: awaited, or started and left running. */
async function maybeReenter(locks: LockService, kind: Kind, parts: readonly LockHandle[]): Promise<void> {
  const roll = random();
  if (roll >= 0.25) return;
  let again: Kind = kind;
  let names = parts.map((part) => part.name);
  if (kind.mode === 'exclusive' && random() < 0.4) {
    // A writer (or a multi-lock, for one of its parts) may take the read lock inside its hold.
    again = { op: 'read', mode: 'read', lease: 'default' };
    names = [pick(names)];
  } else if (kind.op === 'multi' && random() < 0.5) {
    again = { op: 'mutex', mode: 'exclusive', lease: 'default' };
    names = [pick(names)];
  }
  const outers = new Map(parts.map((part) => [part.name, part.owner]));
  const calledAt = clock();
  const body = async (inner: LockHandle): Promise<void> => {
    // Re-entered, the hold is the outer's; a re-entry that found the outer gone took a fresh hold.
    const innerParts = partsOf(inner);
    const reentered = innerParts.every((part) => outers.get(part.name) === part.owner);
    await criticalSection(reentered ? kind : again, innerParts, 'withLock', true, undefined, calledAt, async () => {});
  };
  const nested =
    names.length === 1
      ? locks.withLock(names[0], body, kindOptions(again))
      : locks.withLock(names, body, kindOptions(again));
  const settled = nested.catch(expected);
  if (roll < 0.15) await settled;
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

@Injectable()
class Actor {
  constructor(readonly locks: LockService) {}

  /**
   * The body of every locked method below: the current locks are the ones to report. A lock lost
   * before the body ran (a multi-lock's part whose fixed lease ended while the next part was waited
   * for, say) is no longer current: told before its critical section began, it holds nothing and
   * has no record (rule 1 would not count it).
   */
  async inside(kind: Kind, names: readonly string[], calledAt: number, waitedFrom: number | undefined): Promise<void> {
    const parts = names.flatMap((name) => this.locks.current(name) ?? []);
    await criticalSection(kind, parts, 'decorator', false, waitedFrom, calledAt, () =>
      maybeReenter(this.locks, kind, parts),
    );
  }
}

/** A locked method: its lock is `a` (and `b`, for a multi-lock). */
type LockedMethod = (
  this: Actor,
  a: string,
  b: string,
  calledAt: number,
  waitedFrom: number | undefined,
) => Promise<void>;

const methodName = (kind: Kind, fixed: boolean, waits: boolean): string =>
  `${kind.op}${kind.permits ?? ''}:${fixed ? 'fixed' : 'renewed'}:${waits ? 'waiting' : 'once'}`;

// `@DisLock` takes its options when the class is defined: one locked method of Actor for every
// kind, lease and wait the loops may pick (the same as writing each out by hand).
const kinds: Kind[] = [
  { op: 'mutex', mode: 'exclusive' },
  { op: 'write', mode: 'exclusive' },
  { op: 'read', mode: 'read' },
  { op: 'multi', mode: 'exclusive' },
  ...[...new Set(config.semaphores.flatMap((s) => [s.permits, s.permits + 1]))].map((permits): Kind => ({
    op: 'permit',
    mode: 'permit',
    permits,
  })),
];
for (const kind of kinds) {
  for (const fixed of [true, false]) {
    for (const waits of [true, false]) {
      const options: DisLockOptions = {
        key: kind.op === 'multi' ? ['{0}', '{1}'] : '{0}',
        ...(fixed ? FIXED : RENEWED),
        ...(waits ? { waitTime: WAIT_MS } : {}),
        ...kindOptions(kind),
      };
      const names = (a: string, b: string): string[] => (kind.op === 'multi' ? [a, b] : [a]);
      const leased: Kind = { ...kind, lease: leaseOf(fixed) };
      const method: LockedMethod = async function (this: Actor, a, b, calledAt, waitedFrom) {
        await this.inside(leased, names(a, b), calledAt, waitedFrom);
      };
      const descriptor: TypedPropertyDescriptor<LockedMethod> = { value: method, writable: true, configurable: true };
      DisLock(options)(Actor.prototype, methodName(kind, fixed, waits), descriptor);
      Object.defineProperty(Actor.prototype, methodName(kind, fixed, waits), descriptor);
    }
  }
}

/** Pick what the next call takes. */
function nextCall(): { kind: Kind; names: string[] } {
  let roll = random();
  const op = OPS.find(([, weight]) => (roll -= weight) < 0)?.[0] ?? 'read';
  switch (op) {
    case 'mutex':
      return { kind: { op, mode: 'exclusive' }, names: [pick(allNames)] };
    case 'write':
      return { kind: { op, mode: 'exclusive' }, names: [pick(config.rwNames)] };
    case 'read':
      return { kind: { op, mode: 'read' }, names: [pick(config.rwNames)] };
    case 'permit': {
      const semaphore = pick(config.semaphores);
      const permits = semaphore.permits + (random() < 0.1 ? 1 : 0);
      return { kind: { op, mode: 'permit', permits }, names: [semaphore.name] };
    }
    case 'multi': {
      const first = pick(allNames);
      const second = pick(allNames.filter((name) => name !== first));
      return { kind: { op, mode: 'exclusive' }, names: [first, second].sort() };
    }
  }
}

/**
 * Only an explicit release() that answered true is recorded as one: a locked method or withLock
 * call also settles after its release, but cannot say whether that release freed the lock or
 * failed (logged, not thrown) and left the key to expire, which announces nothing.
 */
async function releaseAndRecord(handle: LockHandle): Promise<void> {
  if (!(await handle.release())) return;
  const at = clock();
  for (const part of partsOf(handle)) {
    record({ kind: 'release', worker: config.worker, name: part.name, owner: part.owner, at });
  }
}

async function oneCall(actor: Actor, locks: LockService): Promise<void> {
  const call = nextCall();
  const { names } = call;
  const waits = random() < 0.5;
  const fixed = random() < 0.5;
  const kind: Kind = { ...call.kind, lease: leaseOf(fixed) };
  const options: LockOptions = { ...(fixed ? FIXED : RENEWED), waitTime: waits ? WAIT_MS : 0, ...kindOptions(kind) };
  const roll = random();
  const path = roll < 0.3 ? 'decorator' : roll < 0.6 ? 'withLock' : 'lock';
  const from = clock();
  const waitedFrom = waits ? from : undefined;
  const multi = names.length > 1;
  /** A multi-lock call that failed may have held its first parts meanwhile; a single one, nothing. */
  const gaveUp = (): void => {
    const at = clock();
    if (multi) for (const name of names) record({ kind: 'unknown', worker: config.worker, name, from, to: at });
    else if (waits) {
      record({
        kind: 'give-up',
        worker: config.worker,
        name: names[0],
        mode: kind.mode,
        permits: kind.permits,
        waitedFrom: from,
        at,
      });
    }
  };
  try {
    if (path === 'decorator') {
      const method = (actor as unknown as Record<string, LockedMethod>)[methodName(kind, fixed, waits)];
      await method.call(actor, names[0], names[1] ?? '', from, waitedFrom);
      return;
    }
    if (path === 'withLock') {
      // Half the time the callback releases the lock itself at its end (withLock's own release is
      // then a no-op), so that the wake-up rule can judge that release too.
      const releasesItself = random() < 0.5;
      const body = async (handle: LockHandle): Promise<void> => {
        const parts = partsOf(handle);
        await criticalSection(kind, parts, 'withLock', false, waitedFrom, from, () => maybeReenter(locks, kind, parts));
        if (releasesItself) await releaseAndRecord(handle);
      };
      await (multi ? locks.withLock(names, body, options) : locks.withLock(names[0], body, options));
      return;
    }
    const handle = multi ? await locks.tryLock(names, options) : await locks.tryLock(names[0], options);
    if (!handle) return gaveUp();
    const parts = partsOf(handle);
    await criticalSection(kind, parts, 'lock', false, waitedFrom, from, async () => {});
    await releaseAndRecord(handle);
  } catch (error) {
    if (error instanceof LockNotAcquiredError) return gaveUp();
    // Its acquisition may have taken the lock all the same: held until given back or expired.
    if (error instanceof RedisUnavailableError) {
      const to = clock() + RENEWED.lockWatchdogTimeout;
      for (const name of names) record({ kind: 'unknown', worker: config.worker, name, from, to });
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
class FamilyModule {}

runHistoryLoop({
  module: FamilyModule,
  actor: Actor,
  worker: config.worker,
  loops: config.loops,
  random,
  pending,
  fence,
  lifetime,
  oneCall,
});
