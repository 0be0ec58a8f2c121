import { hostname } from 'node:os';
import { Injectable, Logger } from '@nestjs/common';
import type { Redis } from 'ioredis';
import { DisLock, type LockHandle, LockService } from 'nestjs-dislock';
import { createTestApp, type TestApp } from './support/app';
import { abortReason, gate, lostReason, settle } from './support/async';
import { eventually, sharedClient, sleep } from './support/shared-redis';
import { holdsOf } from './support/lock-hash';

@Injectable()
class Jobs {
  constructor(private readonly locks: LockService) {}

  @DisLock({ key: 'job:{0}', lockWatchdogTimeout: 600 })
  async run(_id: string, hold: Promise<void>): Promise<LockHandle | undefined> {
    const current = this.locks.current();
    await hold;
    return current;
  }
}

describe('LockService.inspect and forceUnlock on a real Redis', () => {
  let a: TestApp;
  let b: TestApp;
  let redis: Redis;
  let seq = 0;
  const fresh = (): string => `inspect-${(seq += 1)}`;
  const warn = vi.spyOn(Logger.prototype, 'warn').mockImplementation(() => undefined);

  beforeAll(async () => {
    redis = sharedClient();
    a = await createTestApp([Jobs], { appName: 'billing' });
    b = await createTestApp([Jobs], { keyPrefix: a.prefix, appName: 'reports' });
  });

  afterAll(async () => {
    await a.close();
    await b.close();
    redis.disconnect();
    warn.mockRestore();
  });

  it('a free lock: not held, nobody, nobody waiting', async () => {
    const name = fresh();
    expect(await b.locks.inspect(name)).toEqual({ name, key: a.prefix + name, held: false, holders: [], waiting: 0 });
  });

  it('names who holds it, from where, since when, with which token; its own holder counts its holds', async () => {
    const hold = gate();
    const before = Date.now();
    const running = a.get(Jobs).run('7', hold.promise);
    await eventually(async () => (await redis.exists(a.prefix + 'job:7')) === 1);
    await sleep(20);
    const seen = await b.locks.inspect('job:7');
    expect(seen.held).toBe(true);
    expect(seen.holders).toHaveLength(1);
    const [holder] = seen.holders;
    expect(holder).toMatchObject({
      kind: 'exclusive',
      granted: false,
      host: hostname(),
      pid: process.pid,
      app: 'billing',
      label: 'job:{0}',
      caller: 'Jobs.run',
      mine: false,
    });
    expect(holder.holds).toBeUndefined();
    expect(holder.ttl).toBeGreaterThan(0);
    expect(holder.ttl).toBeLessThanOrEqual(600);
    expect(holder.since?.getTime()).toBeGreaterThanOrEqual(before - 50);
    expect(holder.since?.getTime()).toBeLessThanOrEqual(Date.now());
    expect(Object.keys(await holdsOf(redis, a.prefix + 'job:7'))).toEqual([holder.owner]);
    const mine = await a.locks.inspect('job:7');
    expect(mine.holders[0]).toMatchObject({ owner: holder.owner, mine: true, holds: 1 });
    hold.open();
    const handle = await running;
    expect(holder.fencingToken).toBe(handle?.fencingToken);
    expect((await b.locks.inspect('job:7')).held).toBe(false);
  });

  it('re-entries show in the holder count of the application that holds it; readers are listed each with its lease', async () => {
    const name = fresh();
    await a.locks.withLock(name, async () => {
      await a.locks.withLock(name, async () => {
        expect((await a.locks.inspect(name)).holders[0]).toMatchObject({ mine: true, holds: 2 });
      });
    });
    const readers = [
      await a.locks.lock(name, { mode: 'read', lockWatchdogTimeout: 1_000, label: 'catalog' }),
      await b.locks.lock(name, { mode: 'read', lockWatchdogTimeout: 5_000 }),
    ];
    const seen = await b.locks.inspect(name);
    expect(seen.holders.map((h) => [h.kind, h.app, h.label, h.mine]).sort()).toEqual(
      [
        ['shared', 'billing', 'catalog', false],
        ['shared', 'reports', undefined, true],
      ].sort(),
    );
    const ttls = Object.fromEntries(seen.holders.map((h) => [h.app, h.ttl]));
    expect(ttls.billing).toBeLessThanOrEqual(1_000);
    expect(ttls.reports).toBeGreaterThan(4_000);
    for (const reader of readers) await reader.release();
  });

  it('counts the processes waiting in line', async () => {
    const name = fresh();
    const held = await a.locks.lock(name);
    const waiting = settle(b.locks.lock(name, { waitTime: 3_000 }));
    await eventually(async () => (await a.locks.inspect(name)).waiting === 1);
    expect((await a.locks.inspect(name)).waiting).toBe(1);
    await held.release();
    await ((await waiting) as { value: LockHandle }).value.release();
  });

  it('forceUnlock frees a stuck lock, logs who it removed, wakes the waiter; the holder learns at its next renewal', async () => {
    const name = fresh();
    const stuck = await a.locks.lock(name, { lockWatchdogTimeout: 600, label: 'stuck-job' });
    const waiting = settle(a.locks.lock(name, { waitTime: 5_000 })); // from the holder's own app: a fresh caller
    const otherWaiting = settle(b.locks.lock(name, { waitTime: 5_000 }));
    await sleep(50);
    warn.mockClear();
    const removed = await b.locks.forceUnlock(name);
    expect(removed).toHaveLength(1);
    expect(removed[0]).toMatchObject({ owner: stuck.owner, app: 'billing', label: 'stuck-job', mine: false });
    const logged = warn.mock.calls.map(([message]) => String(message)).join('\n');
    expect(logged).toContain(
      `Lock "${name}" force-unlocked: removed owner ${stuck.owner} (billing on ${hostname()}:${process.pid}, stuck-job)`,
    );
    expect(lostReason(await abortReason(stuck.signal, 1_000))).toBe('not-owner');
    // The waiters were woken by the force-unlock: one gets the lock at once, the other after it.
    const first = await Promise.race([waiting, otherWaiting]);
    expect(first.ok).toBe(true);
    expect(first.ms).toBeLessThan(1_000);
    await (first as { value: LockHandle }).value.release();
    const second = (await Promise.all([waiting, otherWaiting])).find((result) => result !== first);
    expect(second?.ok).toBe(true);
    await (second as { value: LockHandle }).value.release();
    expect(await stuck.release()).toBe(false);
    expect(await b.locks.forceUnlock(name)).toEqual([]);
    expect(String(warn.mock.calls.at(-1)?.[0])).toContain('it was free');
  });
});
