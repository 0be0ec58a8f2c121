import { FAMILY_BASELINE, familyCells } from './scenarios/family';
import type { CellSpec, ContenderId, Group, Scenario } from './support/protocol';

export interface Timing {
  readonly warmupMs: number;
  readonly measureMs: number;
}

export interface Profile {
  readonly name: 'full' | 'quick';
  readonly repeats: number;
  /** Per scenario (the cluster group's cells take the windows of their scenario). */
  readonly timing: Record<Scenario, Timing>;
}

export const FULL: Profile = {
  name: 'full',
  repeats: 3,
  timing: {
    uncontended: { warmupMs: 1_000, measureMs: 3_000 },
    contended: { warmupMs: 1_000, measureMs: 3_000 },
    // The warm-up of a renewal cell is taking the locks; the window is how long they are held.
    renewal: { warmupMs: 0, measureMs: 10_000 },
    // autocannon runs whole seconds.
    http: { warmupMs: 1_000, measureMs: 4_000 },
    family: { warmupMs: 1_000, measureMs: 3_000 },
  },
};

export const QUICK: Profile = {
  name: 'quick',
  repeats: 1,
  timing: {
    uncontended: { warmupMs: 300, measureMs: 1_000 },
    contended: { warmupMs: 300, measureMs: 1_500 },
    renewal: { warmupMs: 0, measureMs: 3_000 },
    http: { warmupMs: 1_000, measureMs: 2_000 },
    family: { warmupMs: 300, measureMs: 1_500 },
  },
};

/**
 * The baseline each cell's ratios are taken against (same group, scenario and parameters); the
 * family group's depends on the case (FAMILY_BASELINE).
 */
export const BASELINE: Record<Exclude<Scenario, 'family'>, ContenderId> = {
  uncontended: 'raw',
  contended: 'raw-poll-1ms',
  renewal: 'redis-semaphore',
  http: 'dislock-service',
};

export const UNCONTENDED_CONCURRENCY = [1, 64] as const;
export const CONTENDED_WORKERS = 16;
export const CONTENDED_HOLD_MS = 1;
export const CONTENDED_THINK_MS = [0, 2] as const;
/** [processes, workers per process] */
export const CONTENDED_LAYOUTS = [
  [1, 16],
  [4, 4],
  [16, 1],
] as const;
export const RENEWAL_LOCKS = [1_000, 10_000] as const;
export const HTTP_CONNECTIONS = 10;
/** The cluster group: the same scenarios on a 3-master Redis Cluster, against raw on that Cluster. */
export const CLUSTER_UNCONTENDED: readonly ContenderId[] = ['raw', 'dislock-service', 'dislock-decorator'];
export const CLUSTER_CONTENDED: readonly ContenderId[] = ['raw-poll-1ms', 'dislock-service'];
export const CLUSTER_CONTENDED_LAYOUT = [4, 4] as const;

const LOCKERS: readonly ContenderId[] = [
  'dislock-service',
  'dislock-decorator',
  'redlock',
  'sesame-redlock',
  'redis-semaphore',
];

function cell(group: Group, contender: ContenderId, name: string, timing: Timing, rest: Partial<CellSpec>): CellSpec {
  return {
    id: `${group}/${contender}${name ? `/${name}` : ''}`,
    group,
    scenario: group === 'cluster' ? 'uncontended' : group, // the cluster group's cells name theirs in `rest`
    contender,
    processes: 1,
    workers: 1,
    holdMs: 0,
    thinkMs: 0,
    locks: 0,
    ...timing,
    ...rest,
  };
}

/** Every cell of the matrix, in the order they run within one repeat (the baseline first in each block). */
export function plan(profile: Profile): CellSpec[] {
  const cells: CellSpec[] = [];
  const { timing } = profile;
  for (const concurrency of UNCONTENDED_CONCURRENCY) {
    for (const contender of ['raw', ...LOCKERS] as const) {
      cells.push(cell('uncontended', contender, `c${concurrency}`, timing.uncontended, { workers: concurrency }));
    }
  }
  for (const [processes, workers] of CONTENDED_LAYOUTS) {
    for (const thinkMs of CONTENDED_THINK_MS) {
      for (const contender of ['raw-poll-1ms', ...LOCKERS] as const) {
        cells.push(
          cell('contended', contender, `${processes}x${workers}/think${thinkMs}`, timing.contended, {
            processes,
            workers,
            holdMs: CONTENDED_HOLD_MS,
            thinkMs,
          }),
        );
      }
    }
  }
  for (const locks of RENEWAL_LOCKS) {
    for (const contender of ['redis-semaphore', 'dislock-service', 'dislock-fixed'] as const) {
      cells.push(cell('renewal', contender, String(locks), timing.renewal, { locks }));
    }
  }
  for (const contender of ['no-lock', 'dislock-service', 'dislock-decorator'] as const) {
    cells.push(cell('http', contender, '', timing.http, { workers: HTTP_CONNECTIONS }));
  }
  for (const concurrency of UNCONTENDED_CONCURRENCY) {
    for (const contender of CLUSTER_UNCONTENDED) {
      cells.push(
        cell('cluster', contender, `c${concurrency}`, timing.uncontended, {
          scenario: 'uncontended',
          workers: concurrency,
        }),
      );
    }
  }
  const [processes, workers] = CLUSTER_CONTENDED_LAYOUT;
  for (const thinkMs of CONTENDED_THINK_MS) {
    for (const contender of CLUSTER_CONTENDED) {
      cells.push(
        cell('cluster', contender, `${processes}x${workers}/think${thinkMs}`, timing.contended, {
          scenario: 'contended',
          processes,
          workers,
          holdMs: CONTENDED_HOLD_MS,
          thinkMs,
        }),
      );
    }
  }
  cells.push(...familyCells(timing.family));
  return cells;
}

/** The id of the baseline cell for `spec` (itself when it is the baseline). */
export function baselineId(spec: CellSpec): string {
  const base = spec.scenario === 'family' ? FAMILY_BASELINE[spec.family ?? 'semaphore'] : BASELINE[spec.scenario];
  return spec.id.replace(`${spec.group}/${spec.contender}`, `${spec.group}/${base}`);
}
