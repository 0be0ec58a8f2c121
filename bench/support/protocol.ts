/** What the orchestrator (run.ts) and each cell's child processes (cell.ts) say to each other. */

/** What a cell's processes do (scenarios/*.ts). */
export type Scenario = 'uncontended' | 'contended' | 'renewal' | 'http' | 'family';

/** A block of the matrix (`--only`): one per scenario on the single server, and `cluster`. */
export type Group = Scenario | 'cluster';

export const GROUPS: readonly Group[] = ['uncontended', 'contended', 'renewal', 'http', 'cluster', 'family'];

export type ContenderId =
  | 'raw'
  | 'raw-poll-1ms'
  | 'dislock-service'
  | 'dislock-decorator'
  // the renewal group: fixed leases, checked (never extended) on the renewal schedule
  | 'dislock-fixed'
  | 'redlock'
  // @sesamecare-oss/redlock, the maintained fork of redlock
  | 'sesame-redlock'
  | 'redis-semaphore'
  | 'no-lock'
  // the family group (in it, 'redis-semaphore' is that package's `Semaphore`): contenders/family.ts
  | 'dislock-semaphore'
  | 'dislock-rw'
  | 'dislock-mutex'
  | 'dislock-multi'
  | 'dislock-two-locks';

/**
 * The family group's cases: a semaphore (contended, and uncontended), a read-mostly read-write lock,
 * a multi-lock of 2 keys (uncontended). See scenarios/family.ts.
 */
export type FamilyCase = 'semaphore' | 'semaphore-uncontended' | 'rw' | 'multi';

/** One cell of the matrix: one contender under one set of parameters, run in fresh processes. */
export interface CellSpec {
  /** Stable name, e.g. `contended/dislock-service/4x4/think0`. */
  readonly id: string;
  readonly group: Group;
  /** The scenario it runs: the group itself, or uncontended / contended in the `cluster` group. */
  readonly scenario: Scenario;
  readonly contender: ContenderId;
  /** Child processes running the cell at the same time (4 for the 4 x 4 variant, else 1). */
  readonly processes: number;
  /** Concurrent loops per process (uncontended: concurrency; contended: workers; http: connections). */
  readonly workers: number;
  /** contended: critical section length (a real await). */
  readonly holdMs: number;
  /** contended: pause between a worker's release and its next attempt. */
  readonly thinkMs: number;
  /** renewal: locks held at once. */
  readonly locks: number;
  /** family: which case of the lock family the cell measures. */
  readonly family?: FamilyCase;
  readonly warmupMs: number;
  /** The measuring window (renewal: how long the locks are held). */
  readonly measureMs: number;
}

/** Where a cell connects: the run's own redis-server, or its own Redis Cluster (every master a seed). */
export type RedisTarget =
  | { readonly kind: 'server'; readonly url: string }
  | { readonly kind: 'cluster'; readonly seeds: readonly { readonly host: string; readonly port: number }[] };

export type ParentMessage =
  | { readonly type: 'setup'; readonly spec: CellSpec; readonly rank: number; readonly redis: RedisTarget }
  /** `t0`: the `hr()` time at which the warm-up starts, the same for every process of the cell. */
  | { readonly type: 'go'; readonly t0: number };

export type ChildMessage =
  | { readonly type: 'ready' }
  | { readonly type: 'result'; readonly part: unknown }
  | { readonly type: 'failed'; readonly error: string };

/** A flat set of numbers per run; medians over repeats are taken field by field. */
export type Metrics = Record<string, number>;
