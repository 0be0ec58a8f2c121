/**
 * Lock-family history worker: like ../workers/history.worker.ts, a Nest app whose loops take locks
 * at random while the parent injects faults into its connection to Redis, but over the whole lock
 * family and every public way to take a lock. Each call picks, from the seeded PRNG:
 *
 * - what: a plain lock, a write or a read lock of a read-write name, a permit of a semaphore, or
 *   a multi-lock of two names;
 * - how: `@DisLock` on a method declared to return a Promise, an Observable (which the caller now
 *   and then unsubscribes from before its lock came: a cancelled acquisition), or neither (a
 *   Promise that is also an Observable); `withLock`; `tryLock` or `lock`, then `release()`;
 * - the lease: a fixed 250 ms, a renewed 300 ms, or the module's default renewed 30 s; whether to
 *   wait (800 ms, sometimes 3 s); sometimes `lockAtLeastFor`;
 * - and whether the critical section begins with 0-400 ms of synchronous work (a busy loop: the
 *   event loop does not run) before its first await.
 *
 * The connection to Redis is the run's draw (./history-client.ts): one Redis or a Cluster, with
 * the run's `operationTimeout`, and ioredis's `commandTimeout` and `enableAutoPipelining`. Re-entries
 * from inside take the same hold again (a writer sometimes as a reader, a multi-lock one of its parts
 * or the whole set). Each critical section does one fenced write per lock it holds to a separate
 * Redis the faults never touch, and is reported to the parent with the kind of each hold (see
 * ./history.ts): a multi-lock as one exclusive hold per part. Calls that did not wait and found the
 * lock busy, and every release that freed a lock (the library's 'released' event), are recorded too.
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
  type LockStore,
  RedisUnavailableError,
} from 'nestjs-dislock';
import { Observable } from 'rxjs';
import { DISLOCK_STORE } from '../../../lib/options/dislock.internal-constants';
import { boundLifetime, workerConfig } from '../workers/protocol';
import { type HistoryClientConfig, historyConnection } from './history-client';
import { leaveRunning, runHistoryLoop } from './history-loop';
import {
  type CallKind,
  clock,
  type HistoryEvent,
  type HoldMode,
  type LockOp,
  type LockPath,
  prng,
  type UnknownCause,
} from './history';

export interface FamilyWorkerConfig {
  /** This worker's number (0-based). */
  worker: number;
  /** The lock Redis (or Cluster), through this worker's fault proxies, with the run's client options. */
  client: HistoryClientConfig;
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
  /** Share of critical sections that begin with 0-400 ms of synchronous work. */
  syncShare: number;
  /** Critical sections mostly 1 ms long (the density of a Cluster run) instead of mostly up to 40 ms. */
  dense: boolean;
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
  ['mutex', 0.22],
  ['write', 0.16],
  ['read', 0.2],
  ['permit', 0.26],
  ['multi', 0.16],
];

/**
 * Leases: a fixed 250 ms (often outlived), a renewed 300 ms, or the module's default (a renewed
 * 30 s, which no pause in this history can end: see LONG_LEASE_MS in ./history.ts).
 */
type LeaseKind = 'fixed' | 'short' | 'long';
const LEASES: Readonly<Record<LeaseKind, { options: LockOptions; ms: number; renewed: boolean; label: string }>> = {
  fixed: { options: { expire: 250 }, ms: 250, renewed: false, label: 'expire 250' },
  short: { options: { lockWatchdogTimeout: 300 }, ms: 300, renewed: true, label: 'watchdog 300' },
  long: { options: {}, ms: 30_000, renewed: true, label: 'watchdog 30000' },
};
const WAITS = [0, 800, 3_000] as const;
type Wait = (typeof WAITS)[number];
/** A locked method's `lockAtLeastFor` (its options are fixed when the class is defined). */
const DECORATOR_MINIMUM: Readonly<Record<LeaseKind, number>> = { fixed: 200, short: 1_200, long: 2_000 };

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
const connection = historyConnection(config.client);
const pending: HistoryEvent[] = [];
const record = (event: HistoryEvent): void => void pending.push(event);

/** What a call asks for, and how its holds are recorded. */
interface Kind {
  readonly op: LockOp;
  readonly mode: HoldMode;
  readonly permits?: number;
}

/** How a call's holds were taken, for their records. */
interface Taken {
  readonly kind: Kind;
  readonly lease: LeaseKind;
  readonly lockAtLeastFor?: number;
  readonly call: CallKind;
}

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

/** Keep the event loop busy for `ms` (synchronous work: parsing, crypto). */
function busyFor(ms: number): void {
  const until = performance.now() + ms;
  while (performance.now() < until) {
    // the event loop does not run
  }
}

/** How long a critical section's own work lasts: mostly short, sometimes past a fixed lease or across renewals. */
function workMs(): number {
  const roll = random();
  if (config.dense) return roll < 0.85 ? 1 : roll < 0.95 ? 1 + random() * 40 : 100 + random() * 200;
  return roll < 0.85 ? random() * 40 : roll < 0.95 ? 100 + random() * 200 : 300 + random() * 300;
}

/**
 * One critical section over `parts` (one lock, or a multi-lock's): maybe synchronous work first
 * (outer sections only), a fenced write per part and a random amount of work; reports one hold per
 * part, each told by its own signal.
 */
async function criticalSection(
  taken: Taken,
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
    return watch;
  });
  const syncMs = !nested && random() < config.syncShare ? random() * 400 : 0;
  if (syncMs > 0) {
    // The ticker sees a pause only from its next tick on: the checker gets this one exactly.
    const from = clock();
    busyFor(syncMs);
    record({ kind: 'pause', worker: config.worker, from, to: clock() });
  }
  for (const watch of watches) watch.toldBeforeWrite = watch.part.signal.aborted;
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
  await sleep(workMs());
  await work();
  const end = clock();
  const lease = LEASES[taken.lease];
  for (const watch of watches) {
    watch.part.signal.removeEventListener('abort', watch.onAbort);
    record({
      kind: 'hold',
      worker: config.worker,
      name: watch.part.name,
      owner: watch.part.owner,
      token: watch.part.fencingToken,
      mode: taken.kind.mode,
      permits: taken.kind.permits,
      op: taken.kind.op,
      lease: lease.label,
      leaseMs: lease.ms,
      renewed: lease.renewed,
      lockAtLeastFor: taken.lockAtLeastFor,
      syncMs: syncMs > 0 ? syncMs : undefined,
      call: taken.call,
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
async function maybeReenter(locks: LockService, taken: Taken, parts: readonly LockHandle[]): Promise<void> {
  const roll = random();
  if (roll >= 0.25) return;
  let again: Kind = taken.kind;
  let names = parts.map((part) => part.name);
  if (taken.kind.mode === 'exclusive' && random() < 0.4) {
    // A writer (or a multi-lock, for one of its parts) may take the read lock inside its hold.
    again = { op: 'read', mode: 'read' };
    names = [pick(names)];
  } else if (taken.kind.op === 'multi' && random() < 0.5) {
    again = { op: 'mutex', mode: 'exclusive' };
    names = [pick(names)];
  }
  const outers = new Map(parts.map((part) => [part.name, part.owner]));
  const calledAt = clock();
  const body = async (inner: LockHandle): Promise<void> => {
    // Re-entered, the hold is the outer's; a re-entry that found the outer gone took a fresh hold
    // (with the module's default lease).
    const innerParts = partsOf(inner);
    const reentered = innerParts.every((part) => outers.get(part.name) === part.owner);
    const fresh: Taken = { kind: again, lease: 'long', call: 'withLock' };
    await criticalSection(reentered ? taken : fresh, innerParts, 'withLock', true, undefined, calledAt, async () => {});
  };
  const nested =
    names.length === 1
      ? locks.withLock(names[0], body, kindOptions(again))
      : locks.withLock(names, body, kindOptions(again));
  // A re-entry that found the outer gone competes as a newcomer: it may take a hold of its own.
  const settled = nested.catch((error: unknown) => failed(error, names, calledAt, false, again, 'long'));
  if (roll < 0.15) await settled;
  else leaveRunning(settled);
}

/** Why a call failed with Redis unavailable: its store's timeout, ioredis's commandTimeout, or the connection. */
function causeOf(error: RedisUnavailableError): UnknownCause {
  const cause: unknown = error.cause;
  if (cause instanceof Error && /command timed out/i.test(cause.message)) return 'command-timeout';
  if (cause instanceof Error && cause.name === 'StoreTimeoutError') return 'timeout';
  return 'unavailable';
}

/**
 * A call failed: busy is recorded by the caller; Redis unavailable means its acquisition may have
 * taken the lock all the same (the library gives it back); anything else is reported as an error.
 */
function failed(
  error: unknown,
  names: readonly string[],
  from: number,
  waits: boolean,
  kind: Kind,
  lease: LeaseKind,
): void {
  if (error instanceof LockNotAcquiredError) return;
  if (error instanceof RedisUnavailableError) {
    const cause = causeOf(error);
    const to = clock();
    const { mode, permits } = kind;
    const multi = names.length > 1;
    const leaseMs = LEASES[lease].ms;
    for (const name of names) {
      record({ kind: 'unknown', worker: config.worker, name, from, to, cause, waits, mode, permits, multi, leaseMs });
    }
    return;
  }
  if (error instanceof Error && error.message.includes('shutting down')) return;
  record({
    kind: 'error',
    worker: config.worker,
    at: clock(),
    error: error instanceof Error ? (error.stack ?? error.message) : String(error),
  });
}

/** Where a locked method's critical section reports that it began (a cancelled call's did not). */
interface Started {
  started: boolean;
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
  async inside(
    taken: Taken,
    names: readonly string[],
    calledAt: number,
    waitedFrom: number | undefined,
  ): Promise<void> {
    const parts = names.flatMap((name) => this.locks.current(name) ?? []);
    await criticalSection(taken, parts, 'decorator', false, waitedFrom, calledAt, () =>
      maybeReenter(this.locks, taken, parts),
    );
  }
}

/** A locked method: its lock is `a` (and `b`, for a multi-lock). */
type LockedArgs = [a: string, b: string, calledAt: number, waitedFrom: number | undefined, started: Started];
type PromiseMethod = (this: Actor, ...args: LockedArgs) => Promise<void>;
type ObservableMethod = (this: Actor, ...args: LockedArgs) => Observable<void>;
type Returns = 'promise' | 'observable' | 'either';

const methodName = (kind: Kind, lease: LeaseKind, wait: Wait, minimum: boolean, returns: Returns): string =>
  `${kind.op}${kind.permits ?? ''}:${lease}:${wait}:${minimum ? 'min' : ''}:${returns}`;

// `@DisLock` takes its options when the class is defined: one locked method of Actor for every
// kind, lease, wait, minimum and return type the loops may pick (the same as writing each out by
// hand; an Observable's return type is the metadata the compiler would record for it).
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
  for (const lease of ['fixed', 'short', 'long'] as const) {
    for (const wait of WAITS) {
      for (const minimum of [false, true]) {
        for (const returns of ['promise', 'observable', 'either'] as const) {
          const options: DisLockOptions = {
            key: kind.op === 'multi' ? ['{0}', '{1}'] : '{0}',
            ...LEASES[lease].options,
            ...(wait > 0 ? { waitTime: wait } : {}),
            ...(minimum ? { lockAtLeastFor: DECORATOR_MINIMUM[lease] } : {}),
            ...kindOptions(kind),
          };
          const names = (a: string, b: string): string[] => (kind.op === 'multi' ? [a, b] : [a]);
          const call: CallKind = returns;
          const taken: Taken = { kind, lease, call, lockAtLeastFor: minimum ? DECORATOR_MINIMUM[lease] : undefined };
          const name = methodName(kind, lease, wait, minimum, returns);
          if (returns === 'observable') {
            const method: ObservableMethod = function (this: Actor, a, b, calledAt, waitedFrom, started) {
              return new Observable<void>((subscriber) => {
                started.started = true;
                this.inside(taken, names(a, b), calledAt, waitedFrom).then(
                  () => subscriber.complete(),
                  (error: unknown) => subscriber.error(error),
                );
              });
            };
            Reflect.defineMetadata('design:returntype', Observable, Actor.prototype, name);
            const descriptor: TypedPropertyDescriptor<ObservableMethod> = {
              value: method,
              writable: true,
              configurable: true,
            };
            DisLock(options)(Actor.prototype, name, descriptor);
            Object.defineProperty(Actor.prototype, name, descriptor);
            continue;
          }
          // 'promise': an async function; 'either': a plain function returning a Promise, with no
          // return type recorded (a Promise that is also an Observable comes back).
          const method: PromiseMethod =
            returns === 'promise'
              ? async function (this: Actor, a, b, calledAt, waitedFrom, started) {
                  started.started = true;
                  await this.inside(taken, names(a, b), calledAt, waitedFrom);
                }
              : function (this: Actor, a, b, calledAt, waitedFrom, started) {
                  started.started = true;
                  return this.inside(taken, names(a, b), calledAt, waitedFrom);
                };
          const descriptor: TypedPropertyDescriptor<PromiseMethod> = {
            value: method,
            writable: true,
            configurable: true,
          };
          DisLock(options)(Actor.prototype, name, descriptor);
          Object.defineProperty(Actor.prototype, name, descriptor);
        }
      }
    }
  }
}

/** What the next call takes, and how. */
interface Draw {
  readonly kind: Kind;
  readonly names: string[];
  readonly lease: LeaseKind;
  readonly wait: Wait;
}

function nextCall(): Draw {
  let roll = random();
  const op = OPS.find(([, weight]) => (roll -= weight) < 0)?.[0] ?? 'read';
  const leaseRoll = random();
  const lease: LeaseKind = leaseRoll < 0.35 ? 'fixed' : leaseRoll < 0.7 ? 'short' : 'long';
  const waitRoll = random();
  const wait: Wait = waitRoll < 0.45 ? 0 : waitRoll < 0.88 ? 800 : 3_000;
  const base = { lease, wait };
  switch (op) {
    case 'mutex':
      return { ...base, kind: { op, mode: 'exclusive' }, names: [pick(allNames)] };
    case 'write':
      return { ...base, kind: { op, mode: 'exclusive' }, names: [pick(config.rwNames)] };
    case 'read':
      return { ...base, kind: { op, mode: 'read' }, names: [pick(config.rwNames)] };
    case 'permit': {
      const semaphore = pick(config.semaphores);
      const permits = semaphore.permits + (random() < 0.1 ? 1 : 0);
      return { ...base, kind: { op, mode: 'permit', permits }, names: [semaphore.name] };
    }
    case 'multi': {
      const first = pick(allNames);
      const second = pick(allNames.filter((name) => name !== first));
      return { ...base, kind: { op, mode: 'exclusive' }, names: [first, second].sort() };
    }
  }
}

/**
 * Only an explicit release() that answered true is recorded as one (the wake-up rule judges
 * those): a locked method or withLock call also settles after its release, but cannot say whether
 * that release freed the lock. The library's 'released' event says it for every release ('freed').
 */
async function releaseAndRecord(handle: LockHandle): Promise<void> {
  if (!(await handle.release())) return;
  const at = clock();
  for (const part of partsOf(handle)) {
    record({ kind: 'release', worker: config.worker, name: part.name, owner: part.owner, at });
  }
}

/** Subscribe to a locked method's Observable; maybe unsubscribe before its lock came (a cancelled call). */
function subscribeMaybeCancel(observable: Observable<void>, started: Started, draw: Draw, from: number): Promise<void> {
  // Non-waiting: within its one round trip; waiting: somewhere in its wait.
  const cancelAfter = random() < 0.4 ? (draw.wait === 0 ? random() * 3 : random() * draw.wait * 0.7) : undefined;
  return new Promise<void>((resolve, reject) => {
    const subscription = observable.subscribe({ complete: resolve, error: reject });
    if (cancelAfter === undefined) return;
    setTimeout(() => {
      if (started.started || subscription.closed) return;
      subscription.unsubscribe();
      const to = clock();
      for (const name of draw.names) {
        const { mode, permits } = draw.kind;
        const waits = draw.wait > 0;
        const leaseMs = LEASES[draw.lease].ms;
        const multi = draw.names.length > 1;
        const cause = 'cancelled';
        record({ kind: 'unknown', worker: config.worker, name, from, to, cause, waits, mode, permits, multi, leaseMs });
      }
      resolve();
    }, cancelAfter);
  });
}

async function oneCall(actor: Actor, locks: LockService): Promise<void> {
  const draw = nextCall();
  const { names, kind, wait } = draw;
  const multi = names.length > 1;
  const roll = random();
  const path: 'promise' | 'observable' | 'either' | 'withLock' | 'tryLock' | 'lock' =
    roll < 0.14
      ? 'promise'
      : roll < 0.26
        ? 'observable'
        : roll < 0.31
          ? 'either'
          : roll < 0.56
            ? 'withLock'
            : roll < 0.8
              ? 'tryLock'
              : 'lock';
  // A minimum hold now and then: more often, and longer, for multi-locks, whose failures must give
  // their parts back at once (finding 7 of issue 20 kept them ~5 s).
  const withMinimum = random() < (multi ? 0.3 : 0.08);
  const lease = LEASES[draw.lease];
  const minimum = !withMinimum
    ? undefined
    : draw.lease === 'fixed'
      ? Math.round(50 + random() * 200)
      : Math.round(multi ? 300 + random() * 3_700 : 100 + random() * 1_900);
  const from = clock();
  const waitedFrom = wait > 0 ? from : undefined;
  /** Busy past its wait: a multi-lock may have held its first parts meanwhile; a single call holds nothing. */
  const gaveUp = (): void => {
    const at = clock();
    if (multi) {
      for (const name of names) {
        const waits = wait > 0;
        record({
          kind: 'unknown',
          worker: config.worker,
          name,
          from,
          to: at,
          cause: 'multi',
          waits,
          mode: 'exclusive',
          multi: true,
          leaseMs: lease.ms,
        });
      }
    } else if (wait > 0) {
      record({
        kind: 'give-up',
        worker: config.worker,
        name: names[0],
        mode: kind.mode,
        permits: kind.permits,
        waitedFrom: from,
        at,
      });
    } else {
      record({
        kind: 'busy',
        worker: config.worker,
        name: names[0],
        mode: kind.mode,
        permits: kind.permits,
        calledAt: from,
        at,
      });
    }
  };
  try {
    if (path === 'promise' || path === 'observable' || path === 'either') {
      const name = methodName(kind, draw.lease, wait, withMinimum, path);
      const started: Started = { started: false };
      const args: LockedArgs = [names[0], names[1] ?? '', from, waitedFrom, started];
      if (path === 'observable') {
        const method = (actor as unknown as Record<string, ObservableMethod>)[name];
        await subscribeMaybeCancel(method.apply(actor, args), started, draw, from);
      } else {
        const method = (actor as unknown as Record<string, PromiseMethod>)[name];
        await method.apply(actor, args);
      }
      return;
    }
    const taken: Taken = {
      kind,
      lease: draw.lease,
      call: path,
      lockAtLeastFor: minimum,
    };
    const options: LockOptions = {
      ...lease.options,
      waitTime: wait,
      ...(minimum === undefined ? {} : { lockAtLeastFor: minimum }),
      ...kindOptions(kind),
    };
    if (path === 'withLock') {
      // Half the time the callback releases the lock itself at its end (withLock's own release is
      // then a no-op), so that the wake-up rule can judge that release too.
      const releasesItself = random() < 0.5;
      const body = async (handle: LockHandle): Promise<void> => {
        const parts = partsOf(handle);
        await criticalSection(taken, parts, 'withLock', false, waitedFrom, from, () =>
          maybeReenter(locks, taken, parts),
        );
        if (releasesItself) await releaseAndRecord(handle);
      };
      await (multi ? locks.withLock(names, body, options) : locks.withLock(names[0], body, options));
      return;
    }
    let handle: LockHandle | null;
    if (path === 'lock') handle = multi ? await locks.lock(names, options) : await locks.lock(names[0], options);
    else handle = multi ? await locks.tryLock(names, options) : await locks.tryLock(names[0], options);
    if (!handle) return gaveUp();
    const parts = partsOf(handle);
    await criticalSection(taken, parts, 'lock', false, waitedFrom, from, async () => {});
    await releaseAndRecord(handle);
  } catch (error) {
    if (error instanceof LockNotAcquiredError) return gaveUp();
    failed(error, names, from, wait > 0, kind, draw.lease);
  }
}

@Module({
  imports: [
    DisLockModule.forRoot({
      redis: connection.redis,
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
  onReady: (locks, app) => {
    locks.on('released', (event) =>
      record({ kind: 'freed', worker: config.worker, name: event.name, owner: event.owner, at: clock() }),
    );
    // Every release the store is asked for (a release or a give-back), for rule 6: the real store,
    // watched, not replaced.
    const store = app.get<LockStore>(DISLOCK_STORE);
    const release = store.release.bind(store);
    store.release = (key, owner) => {
      record({ kind: 'release-sent', worker: config.worker, owner, at: clock() });
      return release(key, owner);
    };
  },
  afterClose: () => connection.client?.disconnect(),
});
