/**
 * The randomized history check for longer than CI runs it, with random seeds:
 *
 *   npm run stress -- --faults [--minutes N] [--topology both|single|cluster] [--seed S] [--workers W]
 *                     [--round-seconds R] [--plain] [--echo]
 *
 * Runs rounds of R seconds (default 30) until N minutes (default 5) have passed, each with its own
 * seed (S, S+1, ... when given, random otherwise). `--topology both` (the default) alternates one
 * Redis and a 3-master Cluster round by round; `single` or `cluster` runs only that one. Each round
 * draws its client options from its seed (operationTimeout 50 ms-5 s, ioredis's commandTimeout
 * sometimes, auto-pipelining on or off, how much synchronous work), and its workers take the whole
 * lock family every public way (see test/support/history/family.worker.ts) while an operator
 * force-unlocks now and then. In about a quarter of its fault stretches (at most 3 a round) Redis
 * forgets its locks: the lock Redis restarted without persistence or flushed (FLUSHALL; on a Cluster
 * one master, restarted from its own nodes.conf), and the checker's rule 5 wants every holder it took
 * a lock from told within a second of Redis being back; on a Cluster the slots of 1-3 names move to
 * another master and back in about half of them, sometimes stopped mid-way. `--plain` runs the plain worker instead (plain locks, default client
 * options, one Redis). Prints a summary line per round (the draws, and counts that show them:
 * forceUnlocks, cancelled Observables, ioredis command timeouts, holds that began with synchronous
 * work), a total per topology, and exits 1 at the first round with a violation, printing the
 * violations and the command that replays its seed. `--family` is accepted for old replay lines
 * (the lock family is the default now).
 */
import { randomInt } from 'node:crypto';
import { parseArgs } from 'node:util';
import { type HistoryRun, runHistory, type Topology } from '../support/history/run-history';
import { draws, lossesOf, migrationsOf } from '../support/history/history';

const usage =
  'usage: npm run stress -- --faults [--minutes N] [--topology both|single|cluster] [--seed S] [--workers W] ' +
  '[--round-seconds R] [--plain] [--echo]';

function positive(name: string, value: string | undefined, fallback: number): number {
  if (value === undefined) return fallback;
  const n = Number(value);
  if (!Number.isFinite(n) || n <= 0) throw new Error(`--${name} must be a positive number, got '${value}'\n${usage}`);
  return n;
}

interface Totals {
  rounds: number;
  holds: number;
  faults: number;
  forceUnlocks: number;
  cancelled: number;
  commandTimeouts: number;
  syncWork: number;
  restarts: number;
  flushes: number;
  migrations: number;
  midway: number;
}

const emptyTotals = (): Totals => ({
  rounds: 0,
  holds: 0,
  faults: 0,
  forceUnlocks: 0,
  cancelled: 0,
  commandTimeouts: 0,
  syncWork: 0,
  restarts: 0,
  flushes: 0,
  migrations: 0,
  midway: 0,
});

function add(totals: Totals, run: HistoryRun): void {
  const drawn = draws(run.events);
  totals.rounds += 1;
  totals.holds += run.events.filter((e) => e.kind === 'hold').length;
  totals.faults += run.faults.filter((f) => !f.forgot && !f.migrated).length;
  totals.forceUnlocks += drawn.forceUnlocks;
  totals.cancelled += drawn.cancelledObservables;
  totals.commandTimeouts += drawn.commandTimeouts;
  totals.syncWork += drawn.syncWorkHolds;
  const losses = lossesOf(run.faults);
  totals.restarts += losses.filter((l) => l.kind === 'restart').length;
  totals.flushes += losses.filter((l) => l.kind === 'flushall').length;
  const legs = migrationsOf(run.faults);
  totals.migrations += legs.filter((m) => !m.back).length;
  totals.midway += legs.filter((m) => m.stalledMs > 0).length;
}

const describeTotals = (topology: string, t: Totals): string =>
  `${topology}: ${t.rounds} rounds, ${t.holds} holds, ${t.faults} faults, ${t.forceUnlocks} forceUnlocks, ` +
  `${t.cancelled} cancelled Observables, ${t.commandTimeouts} ioredis command timeouts, ${t.syncWork} holds after sync work, ` +
  `Redis restarted without persistence ${t.restarts} times and flushed ${t.flushes} times` +
  (t.migrations > 0
    ? `, slots of names migrated and back ${t.migrations} times (${t.midway} moves stopped mid-way)`
    : '');

export async function faultHistory(argv: string[]): Promise<number> {
  const { values } = parseArgs({
    args: argv,
    options: {
      faults: { type: 'boolean' },
      minutes: { type: 'string' },
      topology: { type: 'string' },
      seed: { type: 'string' },
      workers: { type: 'string' },
      'round-seconds': { type: 'string' },
      plain: { type: 'boolean' },
      family: { type: 'boolean' },
      echo: { type: 'boolean' },
      help: { type: 'boolean' },
    },
  });
  if (values.help) {
    console.log(usage);
    return 0;
  }
  const plain = values.plain ?? false;
  const which = values.topology ?? (plain ? 'single' : 'both');
  if (which !== 'both' && which !== 'single' && which !== 'cluster') {
    throw new Error(`--topology must be both, single or cluster, got '${which}'\n${usage}`);
  }
  if (plain && which !== 'single') throw new Error(`--plain runs on one Redis only\n${usage}`);
  const topologies: Topology[] = which === 'both' ? ['single', 'cluster'] : [which];
  const until = Date.now() + positive('minutes', values.minutes, 5) * 60_000;
  const roundMs = positive('round-seconds', values['round-seconds'], 30) * 1_000;
  const workers = Math.round(positive('workers', values.workers, 3));
  let seed = values.seed === undefined ? randomInt(1, 2 ** 31 - 1) : Math.round(positive('seed', values.seed, 1));
  const totals = new Map<Topology, Totals>(topologies.map((t) => [t, emptyTotals()]));
  for (let round = 0; Date.now() < until; round += 1) {
    const topology = topologies[round % topologies.length];
    const started = Date.now();
    const run = await runHistory({
      seed,
      workers,
      durationMs: roundMs,
      topology,
      plain,
      echo: values.echo ?? false,
    });
    add(totals.get(topology) as Totals, run);
    const took = ((Date.now() - started) / 1_000).toFixed(0);
    console.log(`seed ${seed} (${took} s): ${run.summary}; ${run.violations.length} violations`);
    if (run.violations.length > 0) {
      for (const v of run.violations) console.error(`VIOLATION (${v.rule}): ${v.text}`);
      console.error(
        `replay: npm run stress -- --faults${plain ? ' --plain' : ''} --topology ${topology} --seed ${seed} ` +
          `--minutes 1 --round-seconds ${roundMs / 1_000}`,
      );
      return 1;
    }
    seed = (seed % (2 ** 31 - 2)) + 1;
  }
  for (const [topology, t] of totals) console.log(describeTotals(topology, t));
  console.log('OK: no violation.');
  return 0;
}
