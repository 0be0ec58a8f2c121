/**
 * The randomized history check for longer than CI runs it, with random seeds:
 *
 *   npm run stress -- --faults --minutes N [--seed S] [--workers W] [--round-seconds R] [--family] [--echo]
 *
 * Runs rounds of R seconds (default 30) until N minutes (default 5) have passed, each with its own
 * seed (S, S+1, ... when given, random otherwise), prints a summary line per round and exits 1 at
 * the first round with a violation, printing the violations and the seed that replays it. With
 * `--family` the workers take the whole lock family (read-write locks, semaphores, plain locks and
 * multi-locks; see test/support/history/family.worker.ts) instead of plain locks.
 */
import { randomInt } from 'node:crypto';
import { parseArgs } from 'node:util';
import { runHistory } from '../support/history/run-history';

const usage =
  'usage: npm run stress -- --faults [--minutes N] [--seed S] [--workers W] [--round-seconds R] [--family] [--echo]';

function positive(name: string, value: string | undefined, fallback: number): number {
  if (value === undefined) return fallback;
  const n = Number(value);
  if (!Number.isFinite(n) || n <= 0) throw new Error(`--${name} must be a positive number, got '${value}'\n${usage}`);
  return n;
}

export async function faultHistory(argv: string[]): Promise<number> {
  const { values } = parseArgs({
    args: argv,
    options: {
      faults: { type: 'boolean' },
      minutes: { type: 'string' },
      seed: { type: 'string' },
      workers: { type: 'string' },
      'round-seconds': { type: 'string' },
      family: { type: 'boolean' },
      echo: { type: 'boolean' },
      help: { type: 'boolean' },
    },
  });
  if (values.help) {
    console.log(usage);
    return 0;
  }
  const until = Date.now() + positive('minutes', values.minutes, 5) * 60_000;
  const roundMs = positive('round-seconds', values['round-seconds'], 30) * 1_000;
  const workers = Math.round(positive('workers', values.workers, 3));
  let seed = values.seed === undefined ? randomInt(1, 2 ** 31 - 1) : Math.round(positive('seed', values.seed, 1));
  const totals = { rounds: 0, holds: 0, faults: 0 };
  const family = values.family ?? false;
  while (Date.now() < until) {
    const run = await runHistory({ seed, workers, durationMs: roundMs, family, echo: values.echo ?? false });
    totals.rounds += 1;
    totals.holds += run.events.filter((e) => e.kind === 'hold').length;
    totals.faults += run.faults.length;
    console.log(`seed ${seed}: ${run.summary}; ${run.violations.length} violations`);
    if (run.violations.length > 0) {
      for (const v of run.violations) console.error(`VIOLATION (${v.rule}): ${v.text}`);
      console.error(
        `replay: npm run stress -- --faults${family ? ' --family' : ''} --seed ${seed} --minutes 1 --round-seconds ${roundMs / 1_000}`,
      );
      return 1;
    }
    seed = (seed % (2 ** 31 - 2)) + 1;
  }
  console.log(`OK: ${totals.rounds} rounds, ${totals.holds} holds, ${totals.faults} faults, no violation.`);
  return 0;
}
