/**
 * Mutual exclusion across processes at a larger size than the test suite runs:
 *
 *   npm run stress -- --workers 16 --iterations 1000 [--wait-time 10000] [--expire 5000 | --watchdog 30000]
 *
 * (= node -r ./test/support/ts-register.js test/stress/mutual-exclusion.ts ...). Starts its own
 * redis-server on a free port, runs `workers` processes each doing `iterations` non-atomic
 * read-sleep-write increments inside `@DisLock` (see test/support/workers/counter.worker.ts),
 * prints one paragraph and exits 1 if mutual exclusion was violated. With `--wait-time 0` (the
 * default) a worker retries after each LockNotAcquiredError; otherwise every call waits up to that.
 * `--no-lock` runs the same workers without `@DisLock`: a check that the script does see a violation.
 * Not a vitest test (vitest only picks up *.spec.ts / *.e2e-spec.ts).
 *
 * `npm run stress -- --faults ...` runs the randomized history check under network faults instead
 * (see fault-history.ts); `npm run stress -- --cluster-overlap ...` mutual exclusion on a Redis
 * Cluster at high density (see cluster-overlap.ts); `npm run stress -- --reshard ...` locks raced
 * on a Cluster whose slots move back and forth, measured against issue 25 (see cluster-reshard.ts).
 */
import { parseArgs } from 'node:util';
import { RedisServer } from '../support/redis-server';
import { clusterOverlap } from './cluster-overlap';
import { clusterReshard } from './cluster-reshard';
import { faultHistory } from './fault-history';
import {
  describeRun,
  type MutualExclusionRun,
  runMutualExclusion,
  violations,
} from '../support/workers/mutual-exclusion';
import type { Lease } from '../support/workers/protocol';
import { WorkerSet } from '../support/workers/worker-process';

const usage =
  'usage: npm run stress -- [--workers N] [--iterations M] [--wait-time ms] [--expire ms | --watchdog ms] [--no-lock] [--echo]';

function positiveInt(name: string, value: string | undefined, fallback: number, min = 1): number {
  if (value === undefined) return fallback;
  const n = Number(value);
  if (!Number.isInteger(n) || n < min)
    throw new Error(`--${name} must be an integer >= ${min}, got '${value}'\n${usage}`);
  return n;
}

async function main(): Promise<number> {
  const { values } = parseArgs({
    options: {
      workers: { type: 'string' },
      iterations: { type: 'string' },
      'wait-time': { type: 'string' },
      expire: { type: 'string' },
      watchdog: { type: 'string' },
      echo: { type: 'boolean' },
      'no-lock': { type: 'boolean' },
      help: { type: 'boolean' },
    },
  });
  if (values.help) {
    console.log(usage);
    return 0;
  }
  if (values.expire !== undefined && values.watchdog !== undefined) throw new Error(`--expire or --watchdog\n${usage}`);
  const lease: Lease =
    values.expire !== undefined
      ? { expire: positiveInt('expire', values.expire, 0) }
      : { lockWatchdogTimeout: positiveInt('watchdog', values.watchdog, 30_000) };
  const workers = positiveInt('workers', values.workers, 16);
  const iterations = positiveInt('iterations', values.iterations, 1_000);

  const server = await RedisServer.start();
  const set = new WorkerSet();
  const stop = (): void => {
    void set.killAll().finally(() => void server.dispose().finally(() => process.exit(130)));
  };
  process.once('SIGINT', stop);
  process.once('SIGTERM', stop);
  try {
    const run: MutualExclusionRun = {
      redis: server.url,
      keyPrefix: 'stress:',
      workers,
      iterations,
      waitTime: positiveInt('wait-time', values['wait-time'], 0, 0),
      lease,
      locked: !values['no-lock'],
      // Starting a Nest app per process takes ~1 s of CPU; on 2 cores 16 of them take a while.
      startTimeoutMs: 30_000 + workers * 2_000,
      // About 4 ms per increment, all of them one after the other, with room to spare.
      runTimeoutMs: 60_000 + workers * iterations * 20,
      echo: values.echo ?? false,
    };
    console.log(`starting ${workers} workers on ${server.url} ...`);
    const result = await runMutualExclusion(run, set);
    console.log(describeRun(run, result));
    if (run.waitTime > 0 && result.conflicts > 0) {
      console.log(
        `note: ${result.conflicts} calls found the lock busy for all of waitTime ${run.waitTime} ms ` +
          '(a liveness/fairness matter, not a mutual-exclusion violation).',
      );
    }
    const found = violations(result);
    if (found.length > 0) {
      console.error(`VIOLATION: ${found.join('; ')}`);
      return 1;
    }
    console.log('OK: no violation.');
    return 0;
  } finally {
    await set.killAll();
    await server.dispose();
  }
}

const argv = process.argv.slice(2);
(argv.includes('--faults')
  ? faultHistory(argv)
  : argv.includes('--cluster-overlap')
    ? clusterOverlap(argv.filter((arg) => arg !== '--cluster-overlap'))
    : argv.includes('--reshard')
      ? clusterReshard(argv.filter((arg) => arg !== '--reshard'))
      : main()
).then(
  (code) => process.exit(code),
  (error: unknown) => {
    console.error(error instanceof Error ? error.message : error);
    process.exit(2);
  },
);
