/**
 * A scheduled job in three processes (cron-job.worker.ts) on one Redis: clocks skewed by ±100 ms,
 * and the instance running the job SIGKILLed in the middle of it. Each tick must run exactly once.
 */
import { sharedClient, sharedRedisUrl, sleep, uniquePrefix } from './support/shared-redis';
import type { CronWorkerConfig } from './support/workers/protocol';
import { WorkerSet } from './support/workers/worker-process';

const PERIOD = 1_000;

describe('a scheduled job in three processes', () => {
  const redis = sharedClient();
  const workers = new WorkerSet();

  afterEach(async () => {
    await workers.killAll();
  });

  afterAll(async () => {
    await redis.quit();
  });

  it('runs each tick exactly once with skewed clocks, and on another instance after the running one is killed mid-job', async () => {
    const prefix = uniquePrefix('cron-procs');
    const runsKey = `${prefix}runs`;
    const base: Omit<CronWorkerConfig, 'instance' | 'skewMs'> = {
      redis: sharedRedisUrl(),
      keyPrefix: prefix,
      periodMs: PERIOD,
      jobMs: 200,
      // Longer than the clocks are apart (200 ms), so the late ones find the tick taken.
      lockAtLeastFor: 600,
      // lockAtMostFor: a killed runner holds the tick no longer than this, well before the next.
      expire: 600,
      deadlineMs: 30_000,
    };
    const skews = [0, 100, -100];
    const procs = skews.map((skewMs, i) => workers.start('cron-job', { ...base, instance: `i${i}`, skewMs }));
    await Promise.all(procs.map((proc) => proc.next('ready', 20_000)));
    for (const proc of procs) proc.send({ type: 'go' });

    const runs = async (): Promise<string[]> => redis.lrange(runsKey, 0, -1);
    const until = async (check: (entries: string[]) => boolean, ms: number): Promise<string[]> => {
      const end = Date.now() + ms;
      for (;;) {
        const entries = await runs();
        if (check(entries)) return entries;
        if (Date.now() > end) throw new Error(`timed out; runs so far: ${entries.join(' ')}`);
        await sleep(5);
      }
    };
    // Three ticks, then kill whoever starts the next one, a few ms into its 200 ms job.
    const before = await until((entries) => entries.length >= 3, 10_000);
    const started = await until((entries) => entries.length > before.length, 5 * PERIOD);
    const [killedTick, killedInstance] = started[before.length].split(':');
    await procs[Number(killedInstance.slice(1))].kill();
    await until((entries) => entries.some((e) => Number(e.split(':')[0]) >= Number(killedTick) + 3), 5 * PERIOD);
    await workers.killAll();

    const byTick = new Map<number, string[]>();
    for (const entry of await runs()) {
      const [tick, instance] = entry.split(':');
      byTick.set(Number(tick), [...(byTick.get(Number(tick)) ?? []), instance]);
    }
    const ticks = [...byTick.keys()].sort((a, b) => a - b);
    // No tick twice, and none missed between the first and the last.
    expect([...byTick.values()].filter((instances) => instances.length > 1)).toEqual([]);
    expect(ticks).toEqual(Array.from({ length: ticks.length }, (_, i) => ticks[0] + i));
    // The tick after the kill ran, once, on a live instance.
    expect(byTick.get(Number(killedTick))).toEqual([killedInstance]);
    const next = byTick.get(Number(killedTick) + 1) ?? [];
    expect(next).toHaveLength(1);
    expect(next[0]).not.toBe(killedInstance);
  }, 40_000);
});
