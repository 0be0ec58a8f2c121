/**
 * Races and leaks found by an adversarial review: each test in the first block guards against one
 * bug that was fixed (the comment above it says what went wrong); the last block pins down subtle
 * guarantees that held all along.
 */
import { getEventListeners, getMaxListeners } from 'node:events';
import { setFlagsFromString } from 'node:v8';
import { runInNewContext } from 'node:vm';
import { Injectable, Logger } from '@nestjs/common';
import type { Redis } from 'ioredis';
import { DisLock, DisLockError, type LockHandle, LockNotAcquiredError, LockService } from 'nestjs-dislock';
import { createTestApp, type TestApp } from './support/app';
import { eventually, sharedClient, sleep } from './support/shared-redis';
import { gate, lostReason, settle } from './support/async';
import { holdsOf } from './support/lock-hash';

setFlagsFromString('--expose-gc');
const collectGarbage = runInNewContext('gc') as () => void;

/** A thenable as some libraries hand out: `then` registers the callbacks and returns nothing. */
function bareThenable<T>(value: T, ms: number): PromiseLike<T> {
  return {
    then(onFulfilled) {
      setTimeout(() => void onFulfilled?.(value), ms);
      return undefined as never;
    },
  };
}

@Injectable()
class Reviewed {
  constructor(readonly locks: LockService) {}

  @DisLock('thenable:{0}')
  thenable(_id: number): PromiseLike<string> {
    return bareThenable('from thenable', 30);
  }

  @DisLock('busy:{0}')
  async busy(_id: number): Promise<string> {
    return 'ran';
  }

  @DisLock({ key: 'slow:{0}', lockWatchdogTimeout: 5_000 })
  async slow(_id: number, until: Promise<void>): Promise<string> {
    await until;
    return 'slow done';
  }
}

/** A polling job that schedules its next run from inside its lock. */
@Injectable()
class Poller {
  first: WeakRef<LockHandle> | undefined;

  constructor(readonly locks: LockService) {}

  @DisLock('poll')
  async poll(left: number, done: (keep: NodeJS.Timeout) => void): Promise<void> {
    this.first ??= new WeakRef(this.locks.current() as LockHandle);
    if (left === 0) {
      done(setTimeout(() => undefined, 1_000)); // the next run, still pending
      return;
    }
    setTimeout(() => void this.poll(left - 1, done), 10);
  }
}

describe('races and leaks', () => {
  let redis: Redis;
  const warn = vi.spyOn(Logger.prototype, 'warn').mockImplementation(() => undefined);

  beforeAll(() => {
    redis = sharedClient();
  });

  afterAll(() => {
    redis.disconnect();
    warn.mockRestore();
  });

  // BUG (lock.service.ts:244-247 + 184-186): an acquisition whose reply arrives after
  // beforeApplicationShutdown gives its lock back with a release sent *after* the module's client
  // was QUIT (onApplicationShutdown runs before the reply is processed). ioredis rejects that
  // release ("Connection is closed"), the `.catch(() => undefined)` swallows it, and the key stays
  // in Redis for a whole lease (30 s by default) though nobody holds it: other instances get 409
  // until it expires.
  it('an acquisition in flight at app.close() leaves no key behind', async () => {
    const t = await createTestApp([], { lockWatchdogTimeout: 5_000 });
    const name = 'in-flight';
    const key = `${t.prefix}${name}`;
    try {
      // Load the scripts first, so the in-flight EVALSHA is not answered NOSCRIPT.
      await (await t.locks.lock('warm-up')).release();
      const pending = settle(t.locks.tryLock(name));
      await t.close();
      await pending; // null, or a handle if it landed before shutdown began (then shutdown freed it)
      expect(await redis.exists(key)).toBe(0); // actual: 1, PTTL ~5000, owned by nobody
    } finally {
      await redis.del(key);
    }
  });

  // BUG (lock.service.ts:244-248, 260-264, 67, 103): during shutdown an acquisition that was in
  // flight (or waiting) resolves `null`, which `lock()` and `@DisLock` turn into
  // LockNotAcquiredError "held by another owner" (409) although the lock is free and the real cause
  // is the shutdown; an acquisition started a moment later gets the shutdown DisLockError instead.
  it('a decorated call whose acquisition lands during shutdown does not report a busy lock', async () => {
    const t = await createTestApp([Reviewed]);
    const key = `${t.prefix}busy:1`;
    try {
      await (await t.locks.lock('warm-up')).release();
      const pending = settle(t.get(Reviewed).busy(1));
      await t.close();
      const outcome = await pending;
      // Had it landed before shutdown began, the method would have run; it lands after QUIT here.
      const error = outcome.ok ? new DisLockError('ran before shutdown') : outcome.error;
      expect(error).toBeInstanceOf(DisLockError);
      expect(error).not.toBeInstanceOf(LockNotAcquiredError); // actual: LockNotAcquiredError (409)
    } finally {
      await redis.del(key);
    }
  });

  // BUG (dislock.interceptor.ts:40): a method returning a thenable goes through rxjs `from()`, whose
  // fromPromise calls `result.then(...).then(null, reportUnhandledError)`. A thenable whose `then`
  // returns nothing (legal for `await`, common in hand-written or older libraries) makes the
  // second `.then` throw a TypeError inside subscribe: the call rejects at once with
  // "Cannot read properties of undefined (reading 'then')", the lock is released while the work
  // is still running, and its value is dropped. `await thenable` yields the value.
  it('a method returning a bare thenable resolves with its value', async () => {
    const t = await createTestApp([Reviewed]);
    try {
      await expect(t.get(Reviewed).thenable(1)).resolves.toBe('from thenable');
      expect(await redis.exists(`${t.prefix}thenable:1`)).toBe(0);
    } finally {
      await t.close();
    }
  });

  // BUG (lock.service.ts:238-243; the reply's `count` is never read): a reentrant acquisition treats any `{1, count}` reply as a
  // re-entry, but the acquire script *creates* the key when it is gone (reply {1, 1}). When the
  // outer's key vanished (expired during an event-loop stall, evicted, failover, DEL) before the
  // watchdog noticed, the nested call silently re-creates it with count 1 while the service counts
  // 2 holds, and the outer is not marked lost. The nested release then DELs the key ('released')
  // and the outer keeps running "locked" with a quiet signal until the next renewal, while another
  // instance may already hold the lock. `result.count` is never checked.
  it('a reentrant acquisition that finds the outer key gone marks the outer lost', async () => {
    const t = await createTestApp();
    const name = 'vanished';
    const key = `${t.prefix}${name}`;
    try {
      await t.locks.withLock(
        name,
        async (outer) => {
          await redis.del(key); // the outer's key is gone; its watchdog renews only every ~1.6 s
          const inner = await t.locks.tryLock(name);
          expect(inner).not.toBeNull();
          expect(lostReason(outer.signal.reason)).toBe('not-owner'); // actual: not aborted
          await inner?.release();
        },
        { lockWatchdogTimeout: 5_000 },
      );
    } finally {
      await redis.del(key);
      await t.close();
    }
  });

  // BUG (lock.service.ts:261, Node 20): every failed or waiting decorated acquisition creates
  // `AbortSignal.any([cancel, this.shuttingDown.signal])` (even with waitTime 0: `stop` is built
  // before the `remaining <= 0` check). On Node 20.20 each call adds a WeakRef to the long-lived
  // shutdown signal's kDependantSignals set that is never removed: memory grows with every 409 for
  // the life of the process (500k calls: ~30 MB, measured). Any fix that does not combine a
  // long-lived signal into AbortSignal.any per call passes this test.
  it('contended decorated calls do not feed AbortSignal.any with the long-lived shutdown signal', async () => {
    const t = await createTestApp([Reviewed]);
    const any = vi.spyOn(AbortSignal, 'any');
    try {
      const holder = await t.locks.lock('busy:7');
      for (let i = 0; i < 20; i += 1) {
        await expect(t.get(Reviewed).busy(7)).rejects.toBeInstanceOf(LockNotAcquiredError);
      }
      await holder.release();
      const sources = any.mock.calls.flatMap(([signals]) => [...signals]);
      const reused = sources.filter((signal, index) => sources.indexOf(signal) !== index);
      expect(reused).toHaveLength(0); // actual: the shutdown signal, 19 times
    } finally {
      any.mockRestore();
      await t.close();
    }
  });

  // BUG (lock-scope.ts:20-22): every scope link keeps a pointer to the link that was current when
  // it was created, released or not. A locked method that schedules its own next run from inside
  // the lock (`setTimeout(() => this.poll(), ...)`, a common polling pattern) runs each call in the
  // previous call's async context, so the chain grows by one link (handle, HeldLock,
  // AbortController, options) per run for as long as the process lives, and `find()` / `current()`
  // walk all of it: memory and CPU grow with time. Released links can never match again and should
  // be skipped when a new link is created.
  it('a self-rescheduling locked method does not keep every past lock reachable', async () => {
    const t = await createTestApp([Poller]);
    const poller = t.get(Poller);
    try {
      const keep = await new Promise<NodeJS.Timeout>((resolve) => void poller.poll(20, resolve));
      try {
        // The latest run's context is still alive (its timer is pending); the first run is long over.
        await sleep(20);
        collectGarbage();
        await sleep(0);
        collectGarbage();
        expect(poller.first?.deref()).toBeUndefined(); // actual: the first run's handle, via 20 links
      } finally {
        clearTimeout(keep);
      }
    } finally {
      await t.close();
    }
  });

  // BUG (service/wait-line.ts + store/redis-lock.store.ts:85): LockService waiters (no cancel
  // signal) all add an 'abort' listener to the one long-lived shutdown signal; with more than 10
  // concurrent waiters Node prints "MaxListenersExceededWarning: Possible EventTarget memory leak
  // detected. 11 abort listeners added to [AbortSignal]" (a false alarm, but it lands in
  // production logs). Checked through public node:events APIs on every signal the library listens to.
  it('many concurrent waiters stay within the max listeners of any AbortSignal', async () => {
    const t = await createTestApp();
    const add = vi.spyOn(EventTarget.prototype, 'addEventListener');
    try {
      const holder = await t.locks.lock('crowded');
      const waiters = Array.from({ length: 12 }, () => t.locks.tryLock('crowded', { waitTime: 200 }));
      await sleep(50); // all 12 are waiting now
      const crowded = [...new Set(add.mock.contexts as EventTarget[])]
        .map((target) => ({ listeners: getEventListeners(target, 'abort').length, max: getMaxListeners(target) }))
        .filter(({ listeners, max }) => max > 0 && listeners > max);
      expect(await Promise.all(waiters)).toEqual(Array.from({ length: 12 }, () => null));
      await holder.release();
      expect(crowded).toEqual([]); // actual: [{ listeners: 12, max: 10 }]
    } finally {
      add.mockRestore();
      await t.close();
    }
  });
});

describe('subtle guarantees', () => {
  let t: TestApp;
  let redis: Redis;

  beforeAll(async () => {
    redis = sharedClient();
    t = await createTestApp([Reviewed]);
  });

  afterAll(async () => {
    await t.close();
    redis.disconnect();
  });

  it('an outer hold released before its nested hold leaves the lock held and renewed until the nested one goes', async () => {
    const name = 'outer-first';
    const key = `${t.prefix}${name}`;
    let inner: LockHandle | null = null;
    let outerHandle: LockHandle | undefined;
    await t.locks.withLock(
      name,
      async (outer) => {
        outerHandle = outer;
        inner = await t.locks.tryLock(name);
      },
      { lockWatchdogTimeout: 300 },
    );
    // The outer's release only dropped its hold: the nested one keeps the key, still renewed.
    expect(await holdsOf(redis, key)).toEqual({ [outerHandle?.owner ?? '']: '1' });
    await sleep(500);
    expect(await redis.exists(key)).toBe(1);
    expect(outerHandle?.signal.aborted).toBe(false);
    expect(await (inner as LockHandle | null)?.release()).toBe(true);
    expect(await redis.exists(key)).toBe(0);
  });

  it('a release racing a renewal in flight never leaves the key behind', async () => {
    // Lease 90 ms, renewed every 30 ms: releasing at ~30 ms sends the release while a renewal is
    // on its way or just answered. Both go over one connection, so Redis runs the renewal first;
    // the answer must not re-arm the watchdog, and the renewal script never re-creates the key.
    for (let i = 0; i < 8; i += 1) {
      const name = `race-${i}`;
      const handle = await t.locks.lock(name, { lockWatchdogTimeout: 90 });
      await sleep(28 + (i % 4) * 2);
      await handle.release();
      expect(await redis.exists(`${t.prefix}${name}`)).toBe(0);
      await sleep(70);
      expect(await redis.exists(`${t.prefix}${name}`)).toBe(0);
    }
  });

  it('a decorated Promise settles only after its key is gone, also when a gate opens it late', async () => {
    const until = gate();
    const call = t.get(Reviewed).slow(1, until.promise);
    const key = `${t.prefix}slow:1`;
    expect(await eventually(async () => (await redis.exists(key)) === 1)).toBe(true);
    until.open();
    const value = await call;
    expect(value).toBe('slow done');
    expect(await redis.exists(key)).toBe(0);
  });
});
