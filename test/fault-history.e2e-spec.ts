/**
 * The randomized history check (test/support/history/): three processes, each a Nest app behind
 * its own fault proxy, take locks every way the library offers while random faults hit their
 * connections; the checker then looks for two holders at once, fencing tokens out of order and
 * lost wake-ups. Fixed seeds here (a failure prints its seed: replay it with
 * `npm run stress -- --faults --seed N --minutes 1`); random ones in `npm run stress -- --faults`.
 */
import { runHistory } from './support/history/run-history';

/** Each seed runs this long, start-up and shutdown not counted (about 5 s more). */
const RUN_MS = 15_000;

describe('randomized lock history under network faults', () => {
  it.each([1, 2, 3])(
    'seed %i: no two holders, tokens in order, no lost wake-up',
    async (seed) => {
      const run = await runHistory({ seed, durationMs: RUN_MS });
      console.log(`seed ${seed}: ${run.summary}`);
      const holds = run.events.filter((e) => e.kind === 'hold');
      // A run that took no locks, or met no faults, would prove nothing.
      expect(holds.length).toBeGreaterThan(150);
      expect(run.faults.length).toBeGreaterThan(20);
      expect(holds.some((h) => h.kind === 'hold' && h.lostAt !== undefined)).toBe(true);
      expect(holds.some((h) => h.kind === 'hold' && h.waitedFrom !== undefined)).toBe(true);
      // Near a fault a hold can hide from the records (see history.ts), so the wake-up rule judges
      // only the releases far from every fault: few here; the run without faults below judges all.
      expect(run.violations.map((v) => `seed ${seed}, ${v.rule}: ${v.text}`)).toEqual([]);
    },
    90_000,
  );

  it('without faults, every rule holds with nothing excused: each release wakes a waiter within 100 ms', async () => {
    const run = await runHistory({ seed: 5, durationMs: 8_000, faults: false });
    console.log(`seed 5, no faults: ${run.summary}`);
    expect(run.quietReleases).toBeGreaterThan(50);
    expect(run.violations.map((v) => `seed 5, ${v.rule}: ${v.text}`)).toEqual([]);
  }, 60_000);

  it('the checker sees the overlaps of the same work done without a lock (the control run)', async () => {
    const run = await runHistory({ seed: 4, durationMs: 2_000, lockless: true, faults: false });
    expect(run.violations.some((v) => v.rule === 'overlap')).toBe(true);
  }, 60_000);
});
