/**
 * The lock family across processes: semaphores (`permits`), read-write locks (`mode`) and
 * multi-locks (an array of names), under churn from several worker processes at once
 * (test/support/workers/family-churn.worker.ts, each its own Nest app with DisLockModule), on a
 * redis-server this file starts itself. Every critical section records itself in Redis, atomically
 * with a look at the lock's hash (see family-churn-protocol.ts): the holder gauges and their
 * high-water marks, the fencing tokens in the order they were entered, and any broken rule.
 * Then holders are SIGKILLed mid-hold: only their own lease can end their hold.
 *
 * The hold and gap lengths come from a seed, printed at the start (DISLOCK_FAMILY_SEED=<n> repeats
 * them; the interleaving across processes still varies from run to run).
 */
import { randomBytes } from 'node:crypto';
import type { Redis } from 'ioredis';
import { lineKeysFor } from '../lib/store/redis/fence-key';
import { RedisServer } from './support/redis-server';
import { sleep } from './support/shared-redis';
import {
  type ChurnLoop,
  DECORATED,
  type FamilyChildMessage,
  familyDataKeys,
  type FamilyLock,
  type FamilyParentMessage,
  type FamilyWorkerConfig,
  type LoopReport,
} from './support/workers/family-churn-protocol';
import { WorkerInbox } from './support/workers/worker-inbox';
import { type WorkerProcess, WorkerSet } from './support/workers/worker-process';
import { holdsOf } from './support/lock-hash';

/** Starting workers (node + Nest + ioredis) takes ~0.5-1 s of CPU each; several at once on 2 busy cores, more. */
const START_TIMEOUT = 25_000;
const PREFIX = 'dislock-test:family:';
const SEED = Number(process.env.DISLOCK_FAMILY_SEED ?? Math.floor(Math.random() * 2 ** 31));

type Of<T extends FamilyChildMessage['type']> = Extract<FamilyChildMessage, { type: T }>;

/** One worker process, with a typed inbox of its messages. */
class Member extends WorkerInbox<FamilyChildMessage, FamilyParentMessage> {
  constructor(proc: WorkerProcess) {
    super(proc, 'family worker');
  }

  /** Take `lock` and hold it until `release(id)`: the 'held' message. */
  async hold(id: string, lock: FamilyLock, timeoutMs = 10_000): Promise<Of<'held'>> {
    this.send({ type: 'hold', id, lock, via: 'lock' });
    return this.next('held', id, timeoutMs);
  }

  async release(id: string): Promise<Of<'released'>> {
    this.send({ type: 'release', id });
    return this.next('released', id);
  }
}

const sum = (xs: readonly number[]): number => xs.reduce((a, b) => a + b, 0);

/** The first place where `tokens` does not strictly increase, for the failure message; undefined when it does. */
function disorder(tokens: readonly number[]): string | undefined {
  const i = tokens.findIndex((token, j) => j > 0 && token <= tokens[j - 1]);
  return i < 0 ? undefined : `#${i - 1}: ${tokens[i - 1]}, #${i}: ${tokens[i]} (of ${tokens.length})`;
}

const duplicates = (tokens: readonly number[]): number[] =>
  [...new Set(tokens.filter((token, i) => tokens.indexOf(token) !== i))].slice(0, 10);

describe('the lock family across processes: semaphores, read-write locks, multi-locks', () => {
  const workers = new WorkerSet();
  const pool: Member[] = [];
  let server: RedisServer;
  let redis: Redis;
  /** This test's lock names get this suffix; its records live under `dataPrefix`. */
  let id: string;
  let dataPrefix: string;

  beforeAll(async () => {
    console.info(`lock family: seed ${SEED} (DISLOCK_FAMILY_SEED=${SEED} repeats the hold and gap lengths)`);
    server = await RedisServer.start();
    redis = server.client();
    await members(4);
  }, START_TIMEOUT + 10_000);

  beforeEach(() => {
    id = randomBytes(3).toString('hex');
    dataPrefix = `dislock-test:family-data:${id}:`;
  });

  afterEach(async () => {
    // Live workers let go of whatever they still hold and wait for the next test; any that cannot is killed.
    await Promise.all(
      pool.map(async (member) => {
        if (!member.alive) return;
        member.send({ type: 'release-all' });
        try {
          await member.next('idle', undefined, 10_000);
          member.clear();
        } catch {
          await member.proc.kill();
        }
      }),
    );
  }, 20_000);

  afterAll(async () => {
    await workers.killAll();
    redis?.disconnect();
    await server?.dispose();
  });

  /** `count` live workers, ready: those already started first (starting one costs ~1 s of CPU). */
  async function members(count: number): Promise<Member[]> {
    for (let i = pool.length - 1; i >= 0; i -= 1) if (!pool[i].alive) pool.splice(i, 1);
    const started: Member[] = [];
    while (pool.length < count) {
      const config: FamilyWorkerConfig = { redis: server.url, keyPrefix: PREFIX, deadlineMs: 120_000 };
      const member = new Member(workers.start('family-churn', config));
      pool.push(member);
      started.push(member);
    }
    const readies = await Promise.all(started.map((member) => member.next('ready', undefined, START_TIMEOUT)));
    readies.forEach((ready, i) => (started[i].pid = ready.pid));
    return pool.slice(0, count);
  }

  const name = (label: string): string => `${label}-${id}`;
  const keyOf = (lockName: string): string => `${PREFIX}${lockName}`;

  /** Each worker runs its loops for `durationMs`: every loop's report, per worker. */
  async function churn(
    assignment: readonly { member: Member; loops: ChurnLoop[] }[],
    durationMs: number,
  ): Promise<LoopReport[][]> {
    for (const [i, { member, loops }] of assignment.entries()) {
      member.send({ type: 'churn', id: `churn-${i}`, dataPrefix, durationMs, seed: SEED + 1_000 * i, loops });
    }
    return Promise.all(
      assignment.map(({ member }, i) => member.next('churned', `churn-${i}`, durationMs + 20_000).then((m) => m.loops)),
    );
  }

  /** What the critical sections recorded: the broken rules, and per name its gauge and tokens in the order entered. */
  async function records(names: readonly string[]) {
    const keys = familyDataKeys(dataPrefix);
    const violations = await redis.lrange(keys.violations, 0, -1);
    const byName = new Map<string, { gauge: Record<string, number>; tokens: number[] }>();
    for (const lockName of names) {
      const gauge = Object.fromEntries(
        Object.entries(await redis.hgetall(keys.gauge(lockName))).map(([field, value]) => [field, Number(value)]),
      );
      const tokens = (await redis.lrange(keys.tokens(lockName), 0, -1)).map(Number);
      byName.set(lockName, { gauge, tokens });
    }
    return { violations, of: (lockName: string) => byName.get(lockName) as NonNullable<ReturnType<typeof byName.get>> };
  }

  /** Nothing went wrong in any loop: no errors, no lost holds, every release freed its hold. */
  function expectCleanLoops(reports: readonly LoopReport[][]): void {
    const all = reports.flat();
    expect(all.flatMap((r) => r.errors)).toEqual([]);
    expect(all.map((r) => r.lost)).toEqual(all.map(() => 0));
    expect(all.map((r) => r.releasedFalse)).toEqual(all.map(() => 0));
  }

  /** The server's clock, in ms, and ours when it was read. */
  async function serverNow(): Promise<{ ms: number; local: number }> {
    const before = Date.now();
    const [seconds, micros] = await redis.time();
    const local = (before + Date.now()) / 2;
    return { ms: Number(seconds) * 1000 + Math.floor(Number(micros) / 1000), local };
  }

  /** Poll `check` every few ms; resolves when it first holds. */
  async function until(check: () => Promise<boolean>, what: string, timeoutMs = 5_000): Promise<void> {
    const deadline = Date.now() + timeoutMs;
    while (!(await check())) {
      if (Date.now() > deadline) throw new Error(`timed out after ${timeoutMs} ms waiting for ${what}`);
      await sleep(3);
    }
  }

  it('semaphore, 3 permits: 4 processes x 3 loops for 3 s never have more than 3 holders, do have 3, and every attempt is served', async () => {
    const sem = name('sem');
    const PERMITS = 3;
    const member = await members(4);
    const loop = (via: ChurnLoop['via']): ChurnLoop => ({
      kind: 'permit',
      names: [sem],
      permits: PERMITS,
      lease: DECORATED.lease,
      waitTime: DECORATED.waitTime,
      via,
      holdMs: [2, 12],
      gapMs: [0, 3],
    });
    const reports = await churn(
      member.map((m) => ({ member: m, loops: [loop('lock'), loop('withLock'), loop('decorator')] })),
      3_000,
    );
    const { violations, of } = await records([sem]);
    const { gauge, tokens } = of(sem);
    const acquired = reports.map((loops) => sum(loops.map((r) => r.acquired)));
    console.info(
      `semaphore: acquisitions per process ${acquired.join(', ')}; at most ${gauge.maxShared} holders at once`,
    );

    expect(violations).toEqual([]);
    expectCleanLoops(reports);
    // Every attempt (waitTime 3 s against holds of a few ms) got a permit...
    expect(reports.flat().map((r) => r.notAcquired)).toEqual(reports.flat().map(() => 0));
    expect(Math.min(...acquired)).toBeGreaterThan(10);
    // ... never more than 3 holders at once, and 3 at once (the permits are shared, not serialized).
    expect(gauge.maxShared).toBe(PERMITS);
    expect(gauge.maxExclusive ?? 0).toBe(0);
    expect([gauge.shared, gauge.exclusive]).toEqual([0, 0]);
    // One token per hold, each its own.
    expect(tokens).toHaveLength(sum(acquired));
    expect(gauge.entered).toBe(sum(acquired));
    expect(duplicates(tokens)).toEqual([]);
    // Every permit was given back: nothing is left of the semaphore.
    expect(await redis.exists(keyOf(sem))).toBe(0);
  }, 40_000);

  it('read-write: readers overlap, a writer never shares the lock, and every writer (waitTime 3 s) gets in through a steady stream of readers', async () => {
    const rw = name('rw');
    const member = await members(4);
    const DURATION = 3_500;
    const reader = (via: ChurnLoop['via']): ChurnLoop => ({
      kind: 'read',
      names: [rw],
      lease: DECORATED.lease,
      waitTime: DECORATED.waitTime,
      via,
      holdMs: [5, 20],
      gapMs: [0, 2],
    });
    /** Writers wait (`waitTime` 3 s), from 0.8 s on: once the readers are a steady stream. */
    const writer = (via: ChurnLoop['via'], kind: 'write' | 'mutex' = 'write'): ChurnLoop => ({
      kind,
      names: [rw],
      lease: DECORATED.lease,
      waitTime: DECORATED.waitTime,
      via,
      holdMs: [1, 3],
      gapMs: [60, 120],
      startAfterMs: 800,
    });
    /**
     * The control: a writer that does not wait its turn (tryLock, waitTime 0) every 10 ms while
     * only readers run (0.2-0.7 s). It gets in only when no reader holds the lock.
     */
    const impatient: ChurnLoop = {
      kind: 'write',
      names: [rw],
      lease: DECORATED.lease,
      waitTime: 0,
      via: 'tryLock',
      holdMs: [1, 1],
      gapMs: [10, 10],
      startAfterMs: 200,
      stopAfterMs: 700,
    };
    const readers = (): ChurnLoop[] => [reader('lock'), reader('withLock'), reader('decorator')];
    const reports = await churn(
      [
        { member: member[0], loops: [...readers(), impatient, writer('lock', 'mutex')] },
        { member: member[1], loops: [...readers(), writer('lock')] },
        { member: member[2], loops: [...readers(), writer('withLock')] },
        { member: member[3], loops: [...readers(), writer('decorator')] },
      ],
      DURATION,
    );
    const { violations, of } = await records([rw]);
    const { gauge, tokens } = of(rw);
    const control = reports[0][3];
    const writers = [reports[0][4], reports[1][3], reports[2][3], reports[3][3]];
    const readerReports = reports.flatMap((loops) => loops.slice(0, 3));
    const waits = writers.flatMap((r) => r.waitsMs).sort((a, b) => a - b);
    console.info(
      `read-write: ${sum(readerReports.map((r) => r.acquired))} reads (up to ${gauge.maxShared} at once), ` +
        `${sum(writers.map((r) => r.acquired))} writes (waits: median ${waits[waits.length >> 1]} ms, max ${waits.at(-1)} ms); ` +
        `impatient writer got in ${control.acquired} of ${control.acquired + control.notAcquired} times`,
    );

    expect(violations).toEqual([]);
    expectCleanLoops(reports);
    // The readers were a steady stream: a writer that does not wait in line almost never found the lock free.
    expect(control.acquired + control.notAcquired).toBeGreaterThanOrEqual(20);
    expect(control.acquired).toBeLessThanOrEqual(0.1 * (control.acquired + control.notAcquired));
    // Yet every waiting writer got in within its waitTime (3 s), a plain lock of the name too, and
    // several times each: the waiting writer holds the later readers back.
    expect(writers.map((r) => r.notAcquired)).toEqual([0, 0, 0, 0]);
    for (const r of writers) expect(r.acquired).toBeGreaterThanOrEqual(3);
    // Readers were all served as well, and they did overlap (reads are not serialized)...
    expect(readerReports.map((r) => r.notAcquired)).toEqual(readerReports.map(() => 0));
    expect(gauge.maxShared).toBeGreaterThan(1);
    // ... while a writer was never with anyone (the violations list would say): one at a time.
    expect(gauge.maxExclusive).toBe(1);
    expect([gauge.shared, gauge.exclusive]).toEqual([0, 0]);
    // One token per hold of either kind, each its own (their order is checked as each one entered).
    const holds = sum(reports.flat().map((r) => r.acquired));
    expect(tokens).toHaveLength(holds);
    expect(gauge.entered).toBe(holds);
    expect(duplicates(tokens)).toEqual([]);
    expect(await redis.exists(keyOf(rw))).toBe(0);
  }, 40_000);

  it('read-write: a reader that waited in line behind a writer of its own process gets a shared hold, which other readers share', async () => {
    const rw = name('rw');
    const key = keyOf(rw);
    const [holder, mixed, otherWriter, otherReader] = await members(4);
    const [lineKey] = lineKeysFor(PREFIX, key, key);
    const write: FamilyLock = { kind: 'write', names: [rw], lease: 5_000, waitTime: 10_000 };
    const read: FamilyLock = { kind: 'read', names: [rw], lease: 5_000, waitTime: 10_000 };
    const inLine = (count: number): Promise<void> =>
      until(async () => (await redis.zcard(lineKey)) === count, `${count} in the line`);

    await holder.hold('h', write);
    // One process waits to write, then (while its writer still waits) to read: both wait in the
    // process's one line, whose place in Redis the writer took.
    mixed.send({ type: 'hold', id: 'w', via: 'lock', lock: write });
    await inLine(1);
    mixed.send({ type: 'hold', id: 'r', via: 'lock', lock: read });
    await sleep(100); // the reader joins the process's line (nothing in Redis shows it)
    otherWriter.send({ type: 'hold', id: 'w', via: 'lock', lock: write });
    await inLine(2);
    // The lock goes round: the holder, the mixed process's writer, the other writer; the reader
    // meanwhile waits in line again, under its process's place.
    await holder.release('h');
    await mixed.next('held', 'w');
    await mixed.release('w');
    await otherWriter.next('held', 'w');
    await inLine(1);
    expect(mixed.has('held', 'r')).toBe(false);
    await otherWriter.release('w');
    const reader = await mixed.next('held', 'r');

    // A read hold: its field holds the end of its own lease, not an exclusive hold's 1 (or 0)...
    const hash = await holdsOf(redis, key);
    const now = await serverNow();
    expect(Object.keys(hash)).toEqual([reader.owner]);
    expect(Number(hash[reader.owner])).toBeGreaterThan(now.ms);
    // ... and another process's reader shares it, at once.
    otherReader.send({ type: 'hold', id: 'r', via: 'tryLock', lock: { ...read, waitTime: 0 } });
    expect((await otherReader.next(['held', 'gave-up'], 'r')).type).toBe('held');
  }, 30_000);

  it('multi-lock: 4 processes locking overlapping sets in every order never deadlock; each name has one holder at a time, its tokens strictly increasing', async () => {
    const [a, b, c] = [name('a'), name('b'), name('c')];
    const member = await members(4);
    const multi = (names: string[], via: ChurnLoop['via']): ChurnLoop => ({
      kind: names.length === 1 ? 'mutex' : 'multi',
      names,
      lease: DECORATED.lease,
      waitTime: DECORATED.waitTime,
      via,
      holdMs: [1, 4],
      gapMs: [0, 3],
    });
    const assignment = [
      { member: member[0], loops: [multi([a, b], 'lock'), multi([b, a], 'withLock')] },
      { member: member[1], loops: [multi([b, a], 'decorator'), multi([c, b, a], 'lock')] },
      { member: member[2], loops: [multi([a, c, b], 'withLock'), multi([c, b], 'lock')] },
      { member: member[3], loops: [multi([c, a], 'decorator'), multi([b], 'lock'), multi([b, c, a], 'decorator')] },
    ];
    const reports = await churn(assignment, 2_500);
    const { violations, of } = await records([a, b, c]);
    const all = reports.flat();
    console.info(
      `multi-lock: acquisitions per loop ${reports.map((loops) => loops.map((r) => r.acquired).join('/')).join(', ')}; ` +
        `longest wait ${Math.max(...all.flatMap((r) => r.waitsMs))} ms`,
    );

    expect(violations).toEqual([]);
    expectCleanLoops(reports);
    // No deadlock: every attempt, in whatever order it named the locks, got all of them within its
    // waitTime (3 s), and every loop kept going.
    expect(all.map((r) => r.notAcquired)).toEqual(all.map(() => 0));
    for (const r of all) expect(r.acquired).toBeGreaterThanOrEqual(5);
    for (const lockName of [a, b, c]) {
      const { gauge, tokens } = of(lockName);
      expect(gauge.maxExclusive).toBe(1);
      expect(gauge.maxShared ?? 0).toBe(0);
      expect(gauge.exclusive).toBe(0);
      // Exclusive holds one after the other: the tokens, in the order they were entered, strictly increase.
      expect(disorder(tokens)).toBeUndefined();
      expect(tokens).toHaveLength(gauge.entered);
    }
    // Every hold of a name (alone or in a set) entered its critical section once, with a token of its own.
    const loops = assignment.flatMap(({ loops }) => loops);
    const holdsOf = (lockName: string): number =>
      sum(loops.map((loop, i) => (loop.names.includes(lockName) ? all[i].acquired : 0)));
    for (const lockName of [a, b, c]) expect(of(lockName).tokens).toHaveLength(holdsOf(lockName));
    expect(await redis.exists(keyOf(a), keyOf(b), keyOf(c))).toBe(0);
  }, 40_000);

  it.each([
    ['its first name', 0, 'mutex'],
    ['its middle name', 1, 'mutex'],
    ['its last name', 2, 'mutex'],
    ['its middle name, read-locked', 1, 'read'],
  ] as const)(
    'multi-lock that fails (another process holds %s): it holds none of its names afterwards',
    async (_, blocked, blockerKind) => {
      const names = [name('a'), name('b'), name('c')];
      const keys = names.map(keyOf);
      const [blocker, caller] = await members(2);
      const held = await blocker.hold('blocker', {
        kind: blockerKind,
        names: [names[blocked]],
        lease: 5_000,
        waitTime: 0,
      });
      const blockerHash = await holdsOf(redis, keys[blocked]);
      expect(Object.keys(blockerHash)).toEqual([held.owner]);
      const shuffled = [names[2], names[0], names[1]];
      const expectOnlyBlocker = async (): Promise<void> => {
        const hashes = await Promise.all(keys.map((key) => holdsOf(redis, key)));
        expect(hashes.map((hash, i) => (i === blocked ? Object.keys(hash) : hash))).toEqual(
          keys.map((_key, i) => (i === blocked ? [held.owner] : {})),
        );
        expect(await redis.exists(...keys.filter((_key, i) => i !== blocked))).toBe(0);
        // No place of the caller is left in any line either (a newcomer could not jump it).
        const lines = keys.map((key) => lineKeysFor(PREFIX, key, key)[0]);
        expect(await Promise.all(lines.map((line) => redis.zcard(line)))).toEqual([0, 0, 0]);
      };

      // Waiting 400 ms: refused once the wait is over, not before, and not much later.
      caller.send({
        type: 'hold',
        id: 'wait',
        via: 'lock',
        lock: { kind: 'multi', names: shuffled, lease: 5_000, waitTime: 400 },
      });
      const waited = await caller.next('gave-up', 'wait');
      expect(waited.how).toBe('not-acquired');
      expect(waited.at - waited.startedAt).toBeGreaterThanOrEqual(390);
      expect(waited.at - waited.startedAt).toBeLessThan(400 + 600);
      await expectOnlyBlocker();

      // Without waiting: refused at once, the same.
      caller.send({
        type: 'hold',
        id: 'try',
        via: 'tryLock',
        lock: { kind: 'multi', names: shuffled, lease: 5_000, waitTime: 0 },
      });
      expect((await caller.next('gave-up', 'try')).how).toBe('null');
      await expectOnlyBlocker();

      // Once the blocker lets go, nothing is in the way: all three at once, without waiting.
      expect((await blocker.release('blocker')).ok).toBe(true);
      const all = await caller.hold('all', { kind: 'multi', names: shuffled, lease: 5_000, waitTime: 0 });
      expect(all.parts.map((part) => part.key)).toEqual([...keys].sort());
      expect(all.token).toBe(Math.max(...all.parts.map((part) => part.token)));
      expect(await Promise.all(all.parts.map((part) => holdsOf(redis, part.key)))).toEqual(
        all.parts.map((part) => ({ [part.owner]: '1' })),
      );
      // The blocked name's token is above the blocker's.
      const blockedPart = all.parts.find((part) => part.key === keys[blocked]);
      expect(blockedPart?.token).toBeGreaterThan(held.token);
      expect((await caller.release('all')).ok).toBe(true);
      expect(await redis.exists(...keys)).toBe(0);
    },
    30_000,
  );

  describe("a holder SIGKILLed mid-hold: its own lease ends its hold, and no one else's", () => {
    const LEASE = 600;

    /** SIGKILL `victim` and read when its hold of `key` ends: `[earliest, latest]` on our clock. */
    async function kill(victim: Member, key: string, owner: string) {
      const killAt = Date.now();
      const exit = await victim.proc.kill();
      const exitAt = Date.now();
      expect(exit).toEqual({ code: null, signal: 'SIGKILL' });
      // Bytes the victim wrote just before dying (a renewal) still reach Redis; let them land.
      await sleep(20);
      const ends = Number(await redis.hget(key, owner));
      const now = await serverNow();
      expect(ends).toBeGreaterThan(now.ms);
      // The server's ms and ours may differ by a ms or two of rounding.
      const leaseEnd = now.local + (ends - now.ms);
      return { killAt, exitAt, leaseEnd };
    }

    it('a semaphore permit (3 permits, lease 600 ms): returns when its lease ends, while the live holders keep theirs', async () => {
      const sem = name('sem');
      const key = keyOf(sem);
      const [live1, live2, observer, victim] = await members(4);
      const permit: FamilyLock = { kind: 'permit', names: [sem], permits: 3, lease: LEASE, waitTime: 0 };
      const holds = await Promise.all([live1, live2, victim].map((m, i) => m.hold(`p${i}`, permit)));
      const owners = holds.map((h) => h.owner);
      const lockedAt = Math.max(...holds.map((h) => h.at));
      const [lineKey] = lineKeysFor(PREFIX, key, key);

      // The observer waits for a permit (all 3 are taken) in the line.
      observer.send({ type: 'hold', id: 'obs', via: 'lock', lock: { ...permit, waitTime: 10_000 } });
      await until(async () => (await redis.zcard(lineKey)) === 1, 'the observer in the line');
      // Every holder's own lease is renewed: all three still hold past their first lease.
      await sleep(Math.max(0, lockedAt + LEASE + 200 - Date.now()));
      const before = await holdsOf(redis, key);
      expect(Object.keys(before).sort()).toEqual([...owners].sort());
      expect(observer.has('held', 'obs')).toBe(false);

      const lease = await kill(victim, key, owners[2]);
      // Its last renewal left at most LEASE, at most one renewal interval (LEASE / 3) before the kill
      // (100 ms: a renewal tick late on a busy machine).
      expect(lease.leaseEnd).toBeLessThanOrEqual(lease.exitAt + LEASE + 10);
      expect(lease.leaseEnd).toBeGreaterThanOrEqual(lease.killAt + LEASE - LEASE / 3 - 100);

      const got = await observer.next('held', 'obs', 5_000);
      console.info(
        `semaphore: the dead holder's permit went to the observer ${got.at - lease.killAt} ms after the kill ` +
          `(its lease ended ${Math.round(lease.leaseEnd - lease.killAt)} ms after it)`,
      );
      // Not before the dead holder's lease ended, and soon after (the waiter sleeps until the
      // first lease ends, not the key's, which the live holders keep pushing out).
      expect(got.at).toBeGreaterThanOrEqual(lease.leaseEnd - 10);
      expect(got.at).toBeLessThanOrEqual(lease.leaseEnd + 250);
      // The two live holders kept their permits; the dead one's is the observer's now.
      const after = await holdsOf(redis, key);
      expect(Object.keys(after).sort()).toEqual([owners[0], owners[1], got.owner].sort());
      const now = await serverNow();
      for (const ends of Object.values(after)) expect(Number(ends)).toBeGreaterThan(now.ms);
      expect(await redis.zcard(lineKey)).toBe(0);
    }, 30_000);

    it('a reader alone (lease 600 ms): a waiting writer gets in when its lease ends; meanwhile later readers wait behind the writer', async () => {
      const rw = name('rw');
      const key = keyOf(rw);
      const [writer, lateReader, victim] = await members(3);
      const read: FamilyLock = { kind: 'read', names: [rw], lease: LEASE, waitTime: 0 };
      const held = await victim.hold('r', read);
      const [lineKey] = lineKeysFor(PREFIX, key, key);

      writer.send({
        type: 'hold',
        id: 'w',
        via: 'lock',
        lock: { kind: 'write', names: [rw], lease: 5_000, waitTime: 10_000 },
      });
      await until(async () => (await redis.zcard(lineKey)) === 1, 'the writer in the line');
      // Only a reader holds the lock, yet a later reader does not get in ahead of the waiting writer.
      lateReader.send({ type: 'hold', id: 'late', via: 'tryLock', lock: read });
      expect((await lateReader.next('gave-up', 'late')).how).toBe('null');
      // The reader's lease is renewed: still held past the first one.
      await sleep(Math.max(0, held.at + LEASE + 200 - Date.now()));
      expect(Object.keys(await holdsOf(redis, key))).toEqual([held.owner]);
      expect(writer.has('held', 'w')).toBe(false);

      const lease = await kill(victim, key, held.owner);
      expect(lease.leaseEnd).toBeLessThanOrEqual(lease.exitAt + LEASE + 10);
      expect(lease.leaseEnd).toBeGreaterThanOrEqual(lease.killAt + LEASE - LEASE / 3 - 100);
      const got = await writer.next('held', 'w', 5_000);
      console.info(
        `read-write: the writer got in ${got.at - lease.killAt} ms after the reader was killed ` +
          `(its lease ended ${Math.round(lease.leaseEnd - lease.killAt)} ms after it)`,
      );
      expect(got.at).toBeGreaterThanOrEqual(lease.leaseEnd - 10);
      expect(got.at).toBeLessThanOrEqual(lease.leaseEnd + 250);
      expect(got.token).toBeGreaterThan(held.token);
      expect(await holdsOf(redis, key)).toEqual({ [got.owner]: '1' });
    }, 30_000);

    it("one of two readers (lease 600 ms): the writer waits for the live reader, past the dead one's lease, and gets in when it releases", async () => {
      const rw = name('rw');
      const key = keyOf(rw);
      const [writer, liveReader, victim] = await members(3);
      const read: FamilyLock = { kind: 'read', names: [rw], lease: LEASE, waitTime: 0 };
      const [dead, live] = await Promise.all([victim.hold('r', read), liveReader.hold('r', read)]);
      const [lineKey] = lineKeysFor(PREFIX, key, key);
      writer.send({
        type: 'hold',
        id: 'w',
        via: 'lock',
        lock: { kind: 'write', names: [rw], lease: 5_000, waitTime: 10_000 },
      });
      await until(async () => (await redis.zcard(lineKey)) === 1, 'the writer in the line');

      const lease = await kill(victim, key, dead.owner);
      // Well past the dead reader's lease, the live one still holds (its own lease, renewed), and so
      // the writer still waits.
      await sleep(Math.max(0, lease.leaseEnd + 300 - Date.now()));
      const hash = await holdsOf(redis, key);
      const now = await serverNow();
      expect(Number(hash[live.owner])).toBeGreaterThan(now.ms);
      if (hash[dead.owner] !== undefined) expect(Number(hash[dead.owner])).toBeLessThanOrEqual(now.ms);
      expect(writer.has('held', 'w')).toBe(false);

      const released = await liveReader.release('r');
      expect(released.ok).toBe(true);
      const got = await writer.next('held', 'w', 5_000);
      console.info(`read-write: the writer got in ${got.at - released.at} ms after the live reader released`);
      expect(got.at).toBeGreaterThanOrEqual(released.at - 5);
      expect(got.at).toBeLessThanOrEqual(released.at + 250);
      expect(got.token).toBeGreaterThan(Math.max(dead.token, live.token));
      expect(await holdsOf(redis, key)).toEqual({ [got.owner]: '1' });
    }, 30_000);
  });
});
