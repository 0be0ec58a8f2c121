/**
 * Replica-acknowledged acquisitions (`replicas: { min, timeout, onShortfall }`) on a master and a
 * replica of the test's own (test/support/sentinel.ts, `ReplicatedPair`: no sentinels, the replica
 * follows the master through a link the test can cut, and is promoted by hand with
 * `REPLICAOF NO ONE`, which replays a failover in milliseconds).
 *
 * The last part is the hole replica acknowledgement closes: a lock taken on a master whose
 * replica does not have it yet, then a failover, then a second caller takes the same lock on the
 * promoted replica. 50 trials with the option and 50 without; the rates are printed.
 */
import { Logger } from '@nestjs/common';
import type { Redis } from 'ioredis';
import {
  type DisLockModuleOptions,
  type LockHandle,
  RedisUnavailableError,
  ReplicationNotConfirmedError,
} from 'nestjs-dislock';
import { createTestApp, type TestApp } from './support/app';
import { settle } from './support/async';
import { ReplicatedPair } from './support/sentinel';
import { uniquePrefix } from './support/shared-redis';
import { holdsOf } from './support/lock-hash';

const TRIALS = 50;

const warnings: string[] = [];
const warn = vi.spyOn(Logger.prototype, 'warn').mockImplementation((message: unknown) => {
  warnings.push(String(message));
});

describe('replica-acknowledged acquisitions', () => {
  let pair: ReplicatedPair;
  let master: Redis;
  let replica: Redis;
  const apps: TestApp[] = [];
  let seq = 0;
  const fresh = (label = 'lock'): string => `${label}-${(seq += 1)}`;

  /** An app on one node of the pair (by index, so it stays on that node across promotions). */
  async function appOn(node: 0 | 1, options: Partial<DisLockModuleOptions> = {}): Promise<TestApp> {
    const t = await createTestApp([], { keyPrefix: uniquePrefix('ack'), ...options, redis: pair.nodes[node].url });
    apps.push(t);
    return t;
  }

  beforeAll(async () => {
    pair = await ReplicatedPair.start();
    master = pair.clientOf(pair.nodes[0]);
    replica = pair.clientOf(pair.nodes[1]);
  }, 30_000);

  afterEach(async () => {
    if (pair.link.isCut) await pair.restoreReplication();
  });

  afterAll(async () => {
    for (const t of apps.splice(0)) await t.close();
    await pair?.dispose();
    warn.mockRestore();
  });

  it('(a) with a healthy replica, every acquisition is on the replica as soon as it resolves', async () => {
    const t = await appOn(0, { replicas: { min: 1, timeout: 50 } });
    const times: number[] = [];
    for (let i = 0; i < 20; i++) {
      const name = fresh('healthy');
      const started = performance.now();
      const handle = await t.locks.lock(name, { lockWatchdogTimeout: 5_000 });
      times.push(performance.now() - started);
      // No polling: WAIT said the replica has it, so it must be there now.
      expect(await holdsOf(replica, handle.key)).toEqual({ [handle.owner]: '1' });
      expect(await holdsOf(master, handle.key)).toEqual({ [handle.owner]: '1' });
      expect(await handle.release()).toBe(true);
    }
    times.sort((x, y) => x - y);
    console.log(
      `[replica-ack] acquire with a healthy replica: median ${times[10].toFixed(1)} ms, max ${times[19].toFixed(1)} ms`,
    );
  });

  it('(b) with replication cut, lock() rejects with ReplicationNotConfirmedError in about the timeout, and gives the lock back', async () => {
    const t = await appOn(0, { replicas: { min: 1, timeout: 50 } });
    pair.cutReplication();
    const name = fresh('cut');
    const outcome = await settle(t.locks.lock(name, { lockWatchdogTimeout: 5_000 }));
    expect(outcome.ok).toBe(false);
    const error = (outcome as { error: unknown }).error;
    expect(error).toBeInstanceOf(ReplicationNotConfirmedError);
    expect(error).toBeInstanceOf(RedisUnavailableError); // 503 over HTTP, like any Redis failure
    expect(error).toMatchObject({ lockName: name, confirmed: 0, required: 1, timeoutMs: 50, statusCode: 503 });
    console.log(`[replica-ack] cut replication: lock() rejected after ${outcome.ms.toFixed(0)} ms (timeout 50)`);
    expect(outcome.ms).toBeGreaterThanOrEqual(45);
    expect(outcome.ms).toBeLessThan(50 + 250); // the timeout and a round trip, with room for a busy machine
    expect(await master.exists(t.prefix + name)).toBe(0); // given back
    expect(await replica.exists(t.prefix + name)).toBe(0);

    // withLock never runs its function without a confirmed lock either.
    const fn = vi.fn();
    await expect(t.locks.withLock(name, fn)).rejects.toBeInstanceOf(ReplicationNotConfirmedError);
    expect(fn).not.toHaveBeenCalled();
    expect(await master.exists(t.prefix + name)).toBe(0);

    // Once replication flows again, the same lock is granted and replicated.
    await pair.restoreReplication();
    const handle = await t.locks.lock(name);
    expect(await holdsOf(replica, handle.key)).toEqual({ [handle.owner]: '1' });
    await handle.release();
  });

  it("(c) onShortfall: 'warn' gives the lock and logs a warning", async () => {
    const t = await appOn(0, { replicas: { min: 1, timeout: 50, onShortfall: 'warn' } });
    pair.cutReplication();
    const name = fresh('warn');
    const before = warnings.length;
    const outcome = await settle(t.locks.lock(name, { lockWatchdogTimeout: 5_000 }));
    expect(outcome.ok).toBe(true);
    const handle = (outcome as { value: LockHandle }).value;
    expect(outcome.ms).toBeLessThan(50 + 250);
    expect(await holdsOf(master, handle.key)).toEqual({ [handle.owner]: '1' });
    expect(await replica.exists(handle.key)).toBe(0);
    expect(warnings.slice(before).some((message) => message.includes(handle.key))).toBe(true);
    expect(handle.signal.aborted).toBe(false);
    expect(await handle.release()).toBe(true);
  });

  describe('(d) the failover hole', () => {
    interface HoleResult {
      /** Trials in which the first app's acquisition on the master resolved (it believes it holds the lock). */
      firstHeld: number;
      /** ... of which the replica had the key before the failover. */
      firstOnReplica: number;
      /** Trials in which the second app also got the lock, on the promoted replica, while the first held it. */
      secondHolders: number;
      /** Trials in which the first acquisition was refused (ReplicationNotConfirmedError). */
      refused: number;
    }

    /**
     * `TRIALS` times: (cut replication), app A acquires on the master, the master is abandoned and
     * the replica promoted, app B tries the same lock on it. Then everything is put back: both
     * released, the promoted node follows the master again (full resync), FLUSHALL.
     */
    async function trials(withAck: boolean, cut: boolean): Promise<HoleResult> {
      const keyPrefix = uniquePrefix('hole');
      const a = await appOn(0, withAck ? { keyPrefix, replicas: { min: 1, timeout: 50 } } : { keyPrefix });
      const b = await appOn(1, { keyPrefix });
      const result: HoleResult = { firstHeld: 0, firstOnReplica: 0, secondHolders: 0, refused: 0 };
      for (let i = 0; i < TRIALS; i++) {
        const name = `hole-${withAck ? 'ack' : 'plain'}-${cut ? 'cut' : 'live'}-${i}`;
        if (cut) pair.cutReplication();
        const first = await settle(a.locks.lock(name, { expire: 10_000 }));
        if (!first.ok) {
          expect(first.error).toBeInstanceOf(ReplicationNotConfirmedError);
          result.refused += 1;
        }
        await pair.promote(); // the master is gone; nobody talks to it any more in this trial
        if (first.ok) {
          result.firstHeld += 1;
          // What the promoted replica has: after REPLICAOF NO ONE nothing more arrives from the master.
          if ((await replica.exists(keyPrefix + name)) === 1) result.firstOnReplica += 1;
        }
        const second = await b.locks.tryLock(name, { expire: 10_000 });
        if (first.ok && second) result.secondHolders += 1;
        if (second) await second.release();
        await pair.reattach();
        if (first.ok) await first.value.release().catch(() => undefined);
        await master.flushall();
      }
      return result;
    }

    // Redis notices a finished BGSAVE (the full resync of every re-attach) and a timed-out WAIT
    // on its cron, 10 times a second by default: at 100 a trial takes about 30 ms instead of 200.
    beforeAll(async () => {
      for (const client of [master, replica]) await client.config('SET', 'hz', '100');
    });

    const rates: string[] = [];
    afterAll(async () => {
      for (const client of [master, replica]) await client.config('SET', 'hz', '10');
      for (const line of rates) console.log(line);
    });

    it(`with replicas { min: 1, timeout: 50 } and replication cut: 0 second holders in ${TRIALS} trials`, async () => {
      const r = await trials(true, true);
      rates.push(`[replica-ack] cut, with acknowledgement: ${JSON.stringify(r)}`);
      expect(r.secondHolders).toBe(0);
      expect(r.firstOnReplica).toBe(r.firstHeld); // whatever succeeded was on the replica
      expect(r.refused).toBe(TRIALS);
    }, 60_000);

    it(`without it and replication cut: a second holder (the hole is real), rate printed`, async () => {
      const r = await trials(false, true);
      rates.push(
        `[replica-ack] cut, without acknowledgement: ${JSON.stringify(r)}; ` +
          `second holder in ${r.secondHolders} of ${TRIALS} trials (${((100 * r.secondHolders) / TRIALS).toFixed(0)} %)`,
      );
      expect(r.secondHolders).toBeGreaterThan(0);
      expect(r.firstOnReplica).toBe(0);
    }, 60_000);

    it(`with acknowledgement and live replication, the master lost right after each grant: 0 second holders`, async () => {
      const r = await trials(true, false);
      rates.push(`[replica-ack] live, with acknowledgement: ${JSON.stringify(r)}`);
      expect(r.secondHolders).toBe(0);
      expect(r.firstOnReplica).toBe(r.firstHeld);
    }, 60_000);

    it(`without it and live replication, the master lost right after each grant: rate printed`, async () => {
      const r = await trials(false, false);
      rates.push(
        `[replica-ack] live, without acknowledgement: ${JSON.stringify(r)}; ` +
          `second holder in ${r.secondHolders} of ${TRIALS} trials (${((100 * r.secondHolders) / TRIALS).toFixed(0)} %)`,
      );
      expect(r.secondHolders).toBe(TRIALS - r.firstOnReplica);
    }, 60_000);
  });
});
