import { Injectable, Logger } from '@nestjs/common';
import type { Redis } from 'ioredis';
import { DisLock, type LockEvent, type LockEventType } from 'nestjs-dislock';
import { createTestApp, type TestApp } from './support/app';
import { abortReason } from './support/async';
import { RedisServer } from './support/redis-server';
import { eventually, sharedClient, sleep } from './support/shared-redis';

@Injectable()
class Jobs {
  @DisLock({ key: 'job:{0}', waitTime: 2_000 })
  async run(id: string): Promise<string> {
    await sleep(20);
    return id;
  }
}

const TYPES: LockEventType[] = ['acquired', 'waiting', 'busy', 'renewed', 'renewal-failed', 'lost', 'released'];

describe('lock events (LockService.on) on a real Redis', () => {
  let a: TestApp;
  let b: TestApp;
  let redis: Redis;
  const seen: LockEvent[] = [];
  const seenByB: LockEvent[] = [];
  const stops: (() => void)[] = [];
  const warn = vi.spyOn(Logger.prototype, 'warn').mockImplementation(() => undefined);
  const error = vi.spyOn(Logger.prototype, 'error').mockImplementation(() => undefined);
  let seq = 0;
  const fresh = (): string => `ev-${(seq += 1)}`;
  const of = (name: string, list: LockEvent[] = seen): string[] =>
    list.filter((event) => event.name === name).map((event) => event.type);

  beforeAll(async () => {
    redis = sharedClient();
    a = await createTestApp([Jobs]);
    b = await createTestApp([Jobs], { keyPrefix: a.prefix });
    for (const type of TYPES) {
      stops.push(a.locks.on(type, (event) => void seen.push(event)));
      stops.push(b.locks.on(type, (event) => void seenByB.push(event)));
    }
  });

  afterAll(async () => {
    for (const stop of stops) stop();
    await a.close();
    await b.close();
    redis.disconnect();
    warn.mockRestore();
    error.mockRestore();
  });

  it('acquired and released carry the lock, its owner, token, kind and times', async () => {
    const name = fresh();
    const handle = await a.locks.lock(name);
    await sleep(30);
    await handle.release();
    const [acquired, released] = seen.filter((event) => event.name === name) as [
      LockEvent<'acquired'>,
      LockEvent<'released'>,
    ];
    expect(acquired).toMatchObject({
      type: 'acquired',
      name,
      key: a.prefix + name,
      kind: 'exclusive',
      owner: handle.owner,
      fencingToken: handle.fencingToken,
      reentrant: false,
    });
    expect(acquired.waitedMs).toBeGreaterThanOrEqual(0);
    expect(acquired.waitedMs).toBeLessThan(500);
    expect(Math.abs(acquired.at - Date.now())).toBeLessThan(5_000);
    expect(released).toMatchObject({ type: 'released', name, owner: handle.owner, kind: 'exclusive' });
    expect(released.heldMs).toBeGreaterThanOrEqual(25);
  });

  it('a caller that waits: waiting, then acquired with the time it waited; one that gives up: busy', async () => {
    const name = fresh();
    const held = await a.locks.lock(name, { mode: 'write' });
    const waiting = b.locks.lock(name, { mode: 'read', waitTime: 3_000 });
    await eventually(() => of(name, seenByB).includes('waiting'));
    await sleep(100);
    await held.release();
    const reader = await waiting;
    const acquired = seenByB.find((e) => e.name === name && e.type === 'acquired') as LockEvent<'acquired'>;
    expect(acquired.kind).toBe('read');
    expect(acquired.waitedMs).toBeGreaterThanOrEqual(90);
    expect(of(name, seenByB)).toEqual(['waiting', 'acquired']);
    expect(await a.locks.tryLock(name, { waitTime: 150 })).toBeNull();
    const busy = seen.find((e) => e.name === name && e.type === 'busy') as LockEvent<'busy'>;
    expect(busy.kind).toBe('exclusive');
    expect(busy.waitedMs).toBeGreaterThanOrEqual(140);
    await reader.release();
  });

  it('renewed (with its lag), lost, and a re-entry', async () => {
    const name = fresh();
    // Renewed every 500 ms: a lease long enough that a loaded machine's late timer does not lose it.
    const watchdog = 1_500;
    await a.locks.withLock(
      name,
      async (outer) => {
        await a.locks.withLock(name, async () => undefined);
        // Three renewals, each waited for as it is announced.
        await eventually(() => of(name).filter((type) => type === 'renewed').length >= 3, 10_000);
        expect(outer.signal.aborted).toBe(false);
        await redis.del(a.prefix + name);
        await abortReason(outer.signal, 5_000);
      },
      { lockWatchdogTimeout: watchdog },
    );
    const events = seen.filter((e) => e.name === name);
    expect(events.map((e) => e.type).slice(0, 2)).toEqual(['acquired', 'acquired']);
    expect((events[1] as LockEvent<'acquired'>).reentrant).toBe(true);
    const renewed = events.filter((e): e is LockEvent<'renewed'> => e.type === 'renewed');
    expect(renewed.length).toBeGreaterThanOrEqual(3);
    // How late each renewal ran after it fell due: under the lease (else the lock was lost), and
    // for one of them at least, well under the renewal period (a lag counted from the acquisition
    // instead of the due time would be a period or more).
    for (const event of renewed) expect(event.lagMs).toBeGreaterThanOrEqual(0);
    for (const event of renewed) expect(event.lagMs).toBeLessThan(watchdog);
    expect(Math.min(...renewed.map((event) => event.lagMs))).toBeLessThan(watchdog / 3 / 2);
    expect(events.find((e) => e.type === 'lost')).toMatchObject({ reason: 'not-owner' });
    expect(events.some((e) => e.type === 'released')).toBe(false); // a lost lock is not released
  });

  it('renewal-failed while Redis does not answer (its own redis-server)', async () => {
    const server = await RedisServer.start();
    const t = await createTestApp([], { redis: server.url, operationTimeout: 200 });
    const failures: LockEvent<'renewal-failed'>[] = [];
    t.locks.on('renewal-failed', (event) => void failures.push(event));
    try {
      const held = await t.locks.lock('paused', { lockWatchdogTimeout: 900 });
      server.pause();
      await eventually(() => failures.length > 0, 2_000);
      server.resume();
      expect(failures[0]).toMatchObject({ type: 'renewal-failed', name: 'paused', owner: held.owner });
      expect(failures[0].error).toBeInstanceOf(Error);
      await held.release();
    } finally {
      server.resume();
      await t.close();
      await server.dispose();
    }
  });

  it('the decorator emits the same events; each application hears only its own', async () => {
    const before = seenByB.length;
    expect(await a.get(Jobs).run('7')).toBe('7');
    expect(of('job:7')).toEqual(['acquired', 'released']);
    expect(seenByB.slice(before).some((e) => e.name === 'job:7')).toBe(false);
  });

  it('with @opentelemetry/api installed but no SDK registered, nothing listens (telemetry costs nothing)', async () => {
    const plain = await createTestApp([], { keyPrefix: a.prefix });
    const events = (plain.locks as unknown as { events: { listens(type: LockEventType): boolean } }).events;
    try {
      expect(TYPES.filter((type) => events.listens(type))).toEqual([]);
    } finally {
      await plain.close();
    }
  });

  it('a listener that throws is logged and disturbs nothing; off() stops the listener', async () => {
    const off = a.locks.on('acquired', () => {
      throw new Error('listener broke');
    });
    const name = fresh();
    const handle = await a.locks.lock(name);
    expect(await handle.release()).toBe(true);
    expect(error.mock.calls.some(([message]) => String(message).includes('listener broke'))).toBe(true);
    off();
    const calls = error.mock.calls.length;
    await (await a.locks.lock(name)).release();
    expect(error.mock.calls.length).toBe(calls);
  });
});
