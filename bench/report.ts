import { BASELINE, baselineId } from './plan';
import type { CellSpec, Metrics, Scenario } from './support/protocol';

/** One cell over all its repeats. */
export interface Outcome {
  readonly spec: CellSpec;
  /** One entry per successful repeat. */
  readonly runs: Metrics[];
  /** Why the other repeats failed. */
  readonly failures: string[];
  /** Field by field, over `runs`. */
  readonly median: Metrics;
}

export interface Meta {
  readonly label: string;
  readonly profile: string;
  readonly startedAt: string;
  readonly durationS: number;
  readonly repeats: number;
  readonly cpuModel: string;
  readonly cores: number;
  readonly memoryGb: number;
  readonly os: string;
  readonly node: string;
  readonly redis: string;
  /** The cluster group's Redis Cluster, when the run had one. */
  readonly cluster?: string;
  readonly nestjsDislock: string;
  readonly gitCommit: string;
  readonly gitDirty: string;
  readonly timing: Record<Scenario, { warmupMs: number; measureMs: number }>;
  /** 1-minute load average when the run started and ended: other work on the machine skews everything. */
  readonly loadAtStart: number;
  readonly loadAtEnd: number;
}

export interface Table {
  readonly title: string;
  readonly notes: readonly string[];
  readonly header: readonly string[];
  readonly rows: readonly (readonly string[])[];
}

export function fmt(value: number | undefined, digits?: number): string {
  if (value === undefined || !Number.isFinite(value)) return '-';
  const abs = Math.abs(value);
  const places = digits ?? (abs >= 100 ? 0 : abs >= 10 ? 1 : 2);
  return value.toLocaleString('en-US', { minimumFractionDigits: places, maximumFractionDigits: places });
}

function ratio(value: number | undefined, base: number | undefined): string {
  if (value === undefined || base === undefined || !Number.isFinite(value) || !Number.isFinite(base) || base === 0) {
    return '-';
  }
  return `${(value / base).toFixed(2)}x`;
}

/** Range of `metric` over the repeats, in % of its median: how far apart the repeats were. */
function spread(outcome: Outcome, metric: string): string {
  const values = outcome.runs.map((run) => run[metric]).filter((value) => Number.isFinite(value));
  const middle = outcome.median[metric];
  if (values.length < 2 || !middle) return '-';
  return `${Math.round((100 * (Math.max(...values) - Math.min(...values))) / Math.abs(middle))}%`;
}

function byId(outcomes: readonly Outcome[]): Map<string, Outcome> {
  return new Map(outcomes.map((outcome) => [outcome.spec.id, outcome]));
}

function failedNote(outcome: Outcome): string {
  return outcome.runs.length === 0
    ? ' (FAILED)'
    : outcome.failures.length > 0
      ? ` (${outcome.failures.length} failed)`
      : '';
}

/** The cluster group's tables: the single-server table's columns, then the slot spread and redirections. */
function clusterColumns(m: Metrics): string[] {
  return [fmt(m.busiestMasterPct, 0), fmt(m.redirections, 0)];
}

const CLUSTER_HEADER = ['busiest master %', 'MOVED/ASK'];

const CLUSTER_NOTE =
  'busiest master: its share of the Redis calls (INFO commandstats summed over the 3 masters; 33% = even). MOVED/ASK: redirections the masters answered in the window (INFO errorstats).';

/** One row of an uncontended table: throughput, latency and cost, with ratios to the cell's baseline. */
function cyclesRow(outcome: Outcome, index: Map<string, Outcome>): string[] {
  const m = outcome.median;
  const base = index.get(baselineId(outcome.spec))?.median;
  return [
    outcome.spec.contender + failedNote(outcome),
    String(outcome.spec.workers),
    fmt(m.cyclesPerSec),
    spread(outcome, 'cyclesPerSec'),
    ratio(m.cyclesPerSec, base?.cyclesPerSec),
    fmt(m.p50Us),
    fmt(m.p99Us),
    fmt(m.cpuUsPerCycle),
    ratio(m.cpuUsPerCycle, base?.cpuUsPerCycle),
    fmt(m.roundTripsPerCycle),
    fmt(m.redisCallsPerCycle),
    fmt((m.failures ?? 0) + (m.errors ?? 0), 0),
  ];
}

function uncontendedTable(outcomes: readonly Outcome[], index: Map<string, Outcome>, cluster = false): Table {
  const rows = outcomes.map((outcome) => [
    ...cyclesRow(outcome, index),
    ...(cluster ? clusterColumns(outcome.median) : []),
  ]);
  return {
    title: cluster
      ? 'Cluster, uncontended: acquire + release on distinct keys, Redis Cluster of 3 masters'
      : 'Uncontended: acquire + release on distinct keys',
    notes: cluster
      ? [
          'One process, an ioredis `Cluster` client; `conc` loops at once, each on its own key, the keys hash-tagged to evenly spaced slots (64 loops: 21, 22 and 21 per master; 1 loop: the middle master). Ratios: to raw on the same Cluster (EVALSHA SET NX PX + EVALSHA compare-and-delete, scripts loaded on every master) at the same concurrency.',
          'dislock: `DisLockModule.forRoot({ redis: cluster })`, `expire: 10000` (service: lock()+release(); decorator: @DisLock method).',
          'CPU = Node process CPU per cycle; round trips = commands the client sent on its node connections (redirections included); Redis calls = INFO commandstats deltas summed over the masters, commands inside Lua scripts included.',
          CLUSTER_NOTE,
        ]
      : [
          'One process; `conc` loops at once, each on its own key. Ratios: to the raw ioredis ceiling (EVALSHA SET NX PX + EVALSHA compare-and-delete) at the same concurrency.',
          'Fixed 10 s lease everywhere: dislock `expire: 10000`, redlock (5 beta) and sesame-redlock (@sesamecare-oss/redlock, its maintained fork) `retryCount: 0`, redis-semaphore `lockTimeout: 10000, refreshInterval: 0` (refresh disabled).',
          'CPU = Node process CPU (user+sys) per cycle; round trips = commands sent by the client; Redis calls = INFO commandstats delta, commands inside Lua scripts included.',
        ],
    header: [
      'contender',
      'conc',
      'cycles/s',
      'spread',
      'x raw',
      'p50 us',
      'p99 us',
      'CPU us/cycle',
      'CPU x raw',
      'round trips/cycle',
      'Redis calls/cycle',
      'fail',
      ...(cluster ? CLUSTER_HEADER : []),
    ],
    rows,
  };
}

function contendedTable(outcomes: readonly Outcome[], index: Map<string, Outcome>, cluster = false): Table {
  const rows = outcomes.map((outcome) => {
    const m = outcome.median;
    const base = index.get(baselineId(outcome.spec))?.median;
    return [
      outcome.spec.contender + failedNote(outcome),
      `${outcome.spec.processes}x${outcome.spec.workers}`,
      String(outcome.spec.thinkMs),
      fmt(m.csPerSec),
      spread(outcome, 'csPerSec'),
      ratio(m.csPerSec, base?.csPerSec),
      fmt(m.handoverP50Ms),
      fmt(m.handoverP99Ms),
      fmt(m.retakenPct, 0),
      fmt(m.longestWaitMs),
      fmt(m.jain, 3),
      fmt(m.redisCallsPerCs, 1),
      fmt(m.roundTripsPerCs, 1),
      fmt(m.nodeCpuUsPerCs),
      fmt(m.failures, 0),
      fmt((m.overlaps ?? 0) + (m.errors ?? 0), 0),
      ...(cluster ? clusterColumns(m) : []),
    ];
  });
  return {
    title: cluster
      ? 'Cluster, contended: 16 workers on one key, 1 ms hold, Redis Cluster of 3 masters'
      : 'Contended: 16 workers on one key, 1 ms hold',
    notes: cluster
      ? [
          'Layout: processes x workers per process, each process with its own ioredis `Cluster` client. think: ms a worker pauses after its release. Ratios: to raw on the same Cluster (SET NX PX, poll every 1 ms, EVALSHA compare-and-delete) of the same layout and think time.',
          'handover, re-taken, longest wait, Jain: as on the single server. dislock: `DisLockModule.forRoot({ redis: cluster })`, `expire: 10000, waitTime: 10000` (waiters listen with sharded pub/sub on the master of the key). fail: waits that ran out; bad: overlaps + errors (must be 0).',
          'One key: every call goes to the master of its slot, and busiest master shows it (about 100%).',
          CLUSTER_NOTE,
        ]
      : [
          'Layout: processes x workers per process. think: ms a worker pauses after its release. Ratios: to the raw poll-every-1-ms baseline of the same layout and think time.',
          'handover: from the end of one critical section (release about to be sent) to the start of the next one, by anyone. re-taken: share of handovers to the worker that just released. longest wait: longest time one worker waited for one turn. Jain: fairness of per-worker counts (1 = equal).',
          'dislock: `expire: 10000, waitTime: 10000` (service: lock()+release(); decorator: @DisLock method). redlock (5 beta) and sesame-redlock (@sesamecare-oss/redlock): defaults (retryCount 10, retryDelay 200 +-100 ms). redis-semaphore: defaults (retryInterval 10 ms). fail: waits that ran out (then retried); bad: overlapping critical sections + errors (must be 0).',
        ],
    header: [
      'contender',
      'layout',
      'think',
      'CS/s',
      'spread',
      'x poll',
      'handover p50 ms',
      'handover p99 ms',
      're-taken %',
      'longest wait ms',
      'Jain',
      'Redis calls/CS',
      'round trips/CS',
      'CPU us/CS',
      'fail',
      'bad',
      ...(cluster ? CLUSTER_HEADER : []),
    ],
    rows,
  };
}

function renewalTable(outcomes: readonly Outcome[], index: Map<string, Outcome>): Table {
  const rows = outcomes.map((outcome) => {
    const m = outcome.median;
    const base = index.get(baselineId(outcome.spec))?.median;
    return [
      outcome.spec.contender + failedNote(outcome),
      fmt(outcome.spec.locks, 0),
      fmt(m.redisCallsPerSec),
      ratio(m.redisCallsPerSec, base?.redisCallsPerSec),
      fmt(m.roundTripsPerSec),
      ratio(m.roundTripsPerSec, base?.roundTripsPerSec),
      fmt(m.redisCpuPct, 1),
      fmt(m.nodeCpuPct, 1),
      spread(outcome, 'nodeCpuPct'),
      ratio(m.nodeCpuPct, base?.nodeCpuPct),
      fmt(m.rssMb, 0),
      fmt(m.eldP99Ms, 1),
      `${fmt(m.alive, 0)}/${fmt(outcome.spec.locks, 0)}`,
      fmt(m.lost, 0),
      fmt(m.acquireMs, 0),
    ];
  });
  return {
    title: 'Renewal: locks held under the watchdog',
    notes: [
      'One process takes N locks, then holds them for the window. Ratios: to redis-semaphore with the same N.',
      'dislock: `lockWatchdogTimeout: 3000`, no expire (renewed every 1000 ms). dislock-fixed: `expire: 15000`, checked (never extended) every 5000 ms, so twice per lock in a 10 s window. redis-semaphore Mutex: `lockTimeout: 3000`, default refreshInterval = 0.8 x 3000 = 2400 ms.',
      'Redis calls/s include commands inside scripts; round trips/s = commands sent by the client. Redis CPU and Node CPU in % of one core. RSS: peak. ELD: event-loop delay p99 (monitorEventLoopDelay at 1 ms resolution, minus the resolution: how late a 1 ms timer ran). alive: keys with PTTL > 0 at the end. acquire: time to take all N (256 at once).',
    ],
    header: [
      'contender',
      'locks',
      'Redis calls/s',
      'x sem',
      'round trips/s',
      'x sem',
      'Redis CPU %',
      'Node CPU %',
      'spread',
      'x sem',
      'RSS MB',
      'ELD p99 ms',
      'alive',
      'lost',
      'acquire ms',
    ],
    rows,
  };
}

function httpTable(outcomes: readonly Outcome[], index: Map<string, Outcome>): Table {
  const plain = index.get('http/no-lock')?.median;
  const service = index.get(`http/${BASELINE.http}`)?.median;
  const rows = outcomes.map((outcome) => {
    const m = outcome.median;
    return [
      outcome.spec.contender + failedNote(outcome),
      fmt(m.reqPerSec),
      spread(outcome, 'reqPerSec'),
      ratio(m.reqPerSec, plain?.reqPerSec),
      ratio(m.reqPerSec, service?.reqPerSec),
      fmt(m.latencyP50Ms),
      fmt(m.latencyP99Ms),
      ratio(m.latencyP99Ms, service?.latencyP99Ms),
      fmt(m.serverCpuUsPerReq),
      fmt((m.non2xx ?? 0) + (m.errors ?? 0), 0),
    ];
  });
  return {
    title: 'HTTP: Nest (express), 10 connections, a new lock key per request',
    notes: [
      'GET /no-lock: the trivial work alone; /dislock-decorator: a service method with `@DisLock({ key: "h:{0}", expire: 10000 })`; /dislock-service: `LockService.withLock` around the same work. autocannon in a separate process.',
      'x svc: decorator (and the others) against LockService-direct.',
    ],
    header: [
      'endpoint',
      'req/s',
      'spread',
      'x no-lock',
      'x svc',
      'p50 ms',
      'p99 ms',
      'p99 x svc',
      'server CPU us/req',
      'non-2xx',
    ],
    rows,
  };
}

export function tables(outcomes: readonly Outcome[]): Table[] {
  const index = byId(outcomes);
  const of = (scenario: Scenario, cluster = false): Outcome[] =>
    outcomes.filter((outcome) => outcome.spec.scenario === scenario && (outcome.spec.group === 'cluster') === cluster);
  const result: Table[] = [];
  if (of('uncontended').length > 0) result.push(uncontendedTable(of('uncontended'), index));
  if (of('contended').length > 0) result.push(contendedTable(of('contended'), index));
  if (of('renewal').length > 0) result.push(renewalTable(of('renewal'), index));
  if (of('http').length > 0) result.push(httpTable(of('http'), index));
  if (of('uncontended', true).length > 0) result.push(uncontendedTable(of('uncontended', true), index, true));
  if (of('contended', true).length > 0) result.push(contendedTable(of('contended', true), index, true));
  if (of('family').length > 0) result.push(...familyTables(of('family'), index));
  return result;
}

/** The family group's contended cases (semaphore, read-write): one row per cell. */
function familyTurnsTable(
  outcomes: readonly Outcome[],
  index: Map<string, Outcome>,
  rw: boolean,
): Pick<Table, 'header' | 'rows'> {
  const rows = outcomes.map((outcome) => {
    const m = outcome.median;
    const base = index.get(baselineId(outcome.spec))?.median;
    return [
      outcome.spec.contender + failedNote(outcome),
      `${outcome.spec.processes}x${outcome.spec.workers}`,
      String(outcome.spec.holdMs),
      fmt(m.opsPerSec),
      spread(outcome, 'opsPerSec'),
      ratio(m.opsPerSec, base?.opsPerSec),
      ...(rw
        ? [fmt(m.readWaitP50Ms), fmt(m.readWaitP99Ms), fmt(m.writeWaitP50Ms), fmt(m.writeWaitP99Ms)]
        : [fmt(m.waitP50Ms), fmt(m.waitP99Ms), ratio(m.waitP99Ms, base?.waitP99Ms)]),
      fmt(m.longestWaitMs),
      fmt(m.jain, 3),
      fmt(m.maxHolders, 0),
      fmt(m.meanHolders),
      fmt(m.redisCallsPerOp, 1),
      fmt(m.roundTripsPerOp, 1),
      fmt(m.cpuUsPerOp),
      fmt(m.failures, 0),
      fmt(m.violations, 0),
      fmt(m.errors, 0),
    ];
  });
  const header = [
    'contender',
    'layout',
    'hold',
    rw ? 'ops/s' : 'acq/s',
    'spread',
    rw ? 'x mutex' : 'x sem',
    ...(rw
      ? ['read wait p50 ms', 'read wait p99 ms', 'write wait p50 ms', 'write wait p99 ms']
      : ['acquire p50 ms', 'acquire p99 ms', 'p99 x sem']),
    'longest wait ms',
    'Jain',
    'max holders',
    'mean holders',
    'Redis calls/op',
    'round trips/op',
    'CPU us/op',
    'fail',
    'violations',
    'errors',
  ];
  return { header, rows };
}

/** The family group's uncontended cases (semaphore, multi-lock), as the uncontended table. */
function familyCyclesTable(
  outcomes: readonly Outcome[],
  index: Map<string, Outcome>,
  baseLabel: string,
): Pick<Table, 'header' | 'rows'> {
  const rows = outcomes.map((outcome) => cyclesRow(outcome, index));
  const header = [
    'contender',
    'conc',
    'cycles/s',
    'spread',
    `x ${baseLabel}`,
    'p50 us',
    'p99 us',
    'CPU us/cycle',
    `CPU x ${baseLabel}`,
    'round trips/cycle',
    'Redis calls/cycle',
    'fail',
  ];
  return { header, rows };
}

const FAMILY_OPS_NOTE =
  'acquire / wait: from wanting the lock to holding it. Jain: fairness of per-worker counts (1 = equal). max holders: most critical sections open at once (over the whole cell, warm-up included); mean holders: critical-section time / window. violations: acquisitions into more holders than the lock allows, from a sweep over every critical section timestamped on the machine-wide clock (each inside its real hold, so an overlap seen is a real one); must be 0. fail: waits that ran out (then retried).';

function familyTables(outcomes: readonly Outcome[], index: Map<string, Outcome>): Table[] {
  const of = (family: string): Outcome[] => outcomes.filter((outcome) => outcome.spec.family === family);
  const result: Table[] = [];
  if (of('semaphore').length > 0) {
    result.push({
      title: 'Family, semaphore: permits 4, 16 workers on one name',
      notes: [
        'Layout: processes x workers per process; no pause between turns; hold: ms of the critical section (0: none at all, 2: a timer await). Ratios: to redis-semaphore `Semaphore` (limit 4) of the same layout and hold.',
        'dislock: `lock(name, { permits: 4, expire: 10000, waitTime: 10000 })` then `release()`. redis-semaphore: `new Semaphore(client, key, 4)` per acquisition, defaults (lockTimeout 10 s, acquireTimeout 10 s, retryInterval 10 ms: it polls). max holders: 4 at most.',
        FAMILY_OPS_NOTE,
      ],
      ...familyTurnsTable(of('semaphore'), index, false),
    });
  }
  if (of('semaphore-uncontended').length > 0) {
    result.push({
      title: 'Family, semaphore uncontended: acquire + release, permits 4, distinct names',
      notes: [
        'One process; `conc` loops at once, each on its own name. Ratios: to redis-semaphore `Semaphore` (limit 4) at the same concurrency.',
        'Fixed 10 s lease: dislock `lock(name, { permits: 4, expire: 10000 })`; redis-semaphore `lockTimeout: 10000, refreshInterval: 0` (refresh disabled).',
        'CPU = Node process CPU per cycle; round trips = commands sent by the client; Redis calls = INFO commandstats delta, commands inside Lua scripts included.',
      ],
      ...familyCyclesTable(of('semaphore-uncontended'), index, 'sem'),
    });
  }
  if (of('rw').length > 0) {
    result.push({
      title: 'Family, read-write: 90% reads, 10% writes, 16 workers on one name',
      notes: [
        "Each worker's every 10th turn is a write (staggered over the workers). dislock-rw: `lock(name, { mode: 'read' | 'write', expire: 10000, waitTime: 10000 })`; dislock-mutex (the baseline): `lock(name, { expire: 10000, waitTime: 10000 })` for every turn, read or write. Ratios: to dislock-mutex of the same layout and hold.",
        'max holders: readers together (dislock-rw); 1 for the mutex. violations: a writer overlapping anyone (dislock-rw), any two overlapping (mutex).',
        FAMILY_OPS_NOTE,
      ],
      ...familyTurnsTable(of('rw'), index, true),
    });
  }
  if (of('multi').length > 0) {
    result.push({
      title: 'Family, multi-lock of 2 names, uncontended',
      notes: [
        'One process; `conc` loops at once, each on its own pair of names. dislock-multi: `lock([a, b], { expire: 10000 })`, one handle, one `release()`. dislock-two-locks (the baseline): `lock(a)`, `lock(b)`, then release b, release a. Ratios: to dislock-two-locks at the same concurrency.',
      ],
      ...familyCyclesTable(of('multi'), index, '2 locks'),
    });
  }
  return result;
}

const NUMERIC = /^[-\d.,]+(x|%|\/[\d,]+)?$/;

export function renderText(table: Table): string {
  const all = [table.header, ...table.rows];
  const widths = table.header.map((_, i) => Math.max(...all.map((row) => row[i].length)));
  const line = (row: readonly string[]): string =>
    row
      .map((cell, i) =>
        i > 0 && (NUMERIC.test(cell) || cell === '-') ? cell.padStart(widths[i]) : cell.padEnd(widths[i]),
      )
      .join('  ')
      .trimEnd();
  return [`== ${table.title}`, line(table.header), ...table.rows.map(line)].join('\n');
}

export function renderMarkdown(allTables: readonly Table[], meta: Meta): string {
  const out: string[] = [
    `# nestjs-dislock benchmark: ${meta.label}`,
    '',
    `${meta.startedAt}, profile \`${meta.profile}\`, ${meta.repeats} repeat(s) per cell, medians shown; took ${Math.round(meta.durationS)} s.`,
    '',
    '| machine | |',
    '| --- | --- |',
    `| CPU | ${meta.cpuModel}, ${meta.cores} cores |`,
    `| memory | ${meta.memoryGb} GB |`,
    `| OS | ${meta.os} |`,
    `| Node.js | ${meta.node} |`,
    `| redis-server | ${meta.redis} (own instance on loopback, no persistence) |`,
    ...(meta.cluster ? [`| Redis Cluster | ${meta.cluster} (own, loopback, no persistence) |`] : []),
    `| load average | ${meta.loadAtStart.toFixed(2)} at start, ${meta.loadAtEnd.toFixed(2)} at end${meta.loadAtStart > meta.cores / 2 || meta.loadAtEnd > meta.cores / 2 ? ' (**busy machine: other work skewed these numbers**)' : ''} |`,
    `| nestjs-dislock | ${meta.nestjsDislock}, commit ${meta.gitCommit}${meta.gitDirty ? ` (uncommitted changes in ${meta.gitDirty})` : ''} |`,
    '',
    `Every cell runs in fresh child processes: warm-up, then a fixed measuring window (${Object.entries(meta.timing)
      .map(([group, t]) => `${group} ${t.warmupMs} + ${t.measureMs} ms`)
      .join(', ')}). Redis and every Node process share the same ${meta.cores} cores.`,
    '`spread`: (max - min) / median of that column over the repeats. `-`: not measured, or one repeat only.',
    '',
  ];
  for (const table of allTables) {
    out.push(`## ${table.title}`, '');
    for (const note of table.notes) out.push(`- ${note}`);
    out.push('');
    out.push(`| ${table.header.join(' | ')} |`);
    out.push(`| ${table.header.map((_, i) => (i === 0 ? '---' : '---:')).join(' | ')} |`);
    for (const row of table.rows) out.push(`| ${row.join(' | ')} |`);
    out.push('');
  }
  return out.join('\n');
}

function escapeXml(text: string): string {
  return text.replace(/[<>&"]/g, (c) => ({ '<': '&lt;', '>': '&gt;', '&': '&amp;', '"': '&quot;' })[c] ?? c);
}

interface Bar {
  readonly label: string;
  readonly value: number;
  readonly baseline: boolean;
}

/** Horizontal bars of ratios to each cell's baseline, one panel per group; plain SVG, no dependencies. */
export function renderSvg(outcomes: readonly Outcome[], meta: Meta): string {
  const index = byId(outcomes);
  const panels: { title: string; bars: Bar[] }[] = [];
  const add = (
    group: string,
    title: string,
    metric: string,
    label: (spec: CellSpec) => string,
    scenario?: Scenario,
  ): void => {
    const bars = outcomes
      .filter((outcome) => outcome.spec.group === group && (!scenario || outcome.spec.scenario === scenario))
      .map((outcome) => {
        const base = index.get(baselineId(outcome.spec))?.median[metric];
        const value = outcome.median[metric];
        return {
          label: label(outcome.spec),
          value: base && Number.isFinite(value) ? value / base : NaN,
          baseline: baselineId(outcome.spec) === outcome.spec.id,
        };
      });
    if (bars.length > 0) panels.push({ title, bars });
  };
  add(
    'uncontended',
    'Uncontended cycles/s, x raw ioredis ceiling',
    'cyclesPerSec',
    (s) => `${s.contender} c${s.workers}`,
  );
  add(
    'contended',
    'Contended critical sections/s, x poll-every-1-ms',
    'csPerSec',
    (s) => `${s.contender} ${s.processes}x${s.workers} think ${s.thinkMs}`,
  );
  add('renewal', 'Renewal round trips/s, x redis-semaphore (lower is cheaper)', 'roundTripsPerSec', (s) => {
    return `${s.contender} ${s.locks}`;
  });
  add('http', 'HTTP req/s, x LockService.withLock', 'reqPerSec', (s) => s.contender);
  add(
    'cluster',
    'Cluster (3 masters) uncontended cycles/s, x raw on the Cluster',
    'cyclesPerSec',
    (s) => `${s.contender} c${s.workers}`,
    'uncontended',
  );
  add(
    'cluster',
    'Cluster (3 masters) contended critical sections/s, x poll-every-1-ms on the Cluster',
    'csPerSec',
    (s) => `${s.contender} ${s.processes}x${s.workers} think ${s.thinkMs}`,
    'contended',
  );
  add('family', 'Lock family acquisitions/s, x closest peer', 'opsPerSec', (s) => {
    return `${s.contender} ${s.id.split('/').slice(2).join(' ')}`;
  });

  const width = 900;
  const labelWidth = 300;
  const barHeight = 14;
  const gap = 4;
  const chartWidth = width - labelWidth - 80;
  const parts: string[] = [];
  let y = 30;
  parts.push(
    `<text x="10" y="20" font-size="14" font-weight="bold">${escapeXml(`nestjs-dislock benchmark: ${meta.label} (${meta.startedAt.slice(0, 10)}, ${meta.cpuModel.trim()}, ${meta.cores} cores)`)}</text>`,
  );
  for (const panel of panels) {
    y += 24;
    parts.push(`<text x="10" y="${y}" font-size="13" font-weight="bold">${escapeXml(panel.title)}</text>`);
    y += 8;
    const max = Math.max(1, ...panel.bars.map((bar) => (Number.isFinite(bar.value) ? bar.value : 0)));
    const x1 = labelWidth + chartWidth / max;
    const top = y;
    for (const bar of panel.bars) {
      const w = Number.isFinite(bar.value) ? (chartWidth * bar.value) / max : 0;
      const colour = bar.baseline ? '#9e9e9e' : bar.label.startsWith('dislock') ? '#1565c0' : '#ef6c00';
      parts.push(
        `<text x="${labelWidth - 6}" y="${y + barHeight - 3}" font-size="11" text-anchor="end">${escapeXml(bar.label)}</text>`,
        `<rect x="${labelWidth}" y="${y}" width="${w.toFixed(1)}" height="${barHeight}" fill="${colour}"/>`,
        `<text x="${(labelWidth + w + 4).toFixed(1)}" y="${y + barHeight - 3}" font-size="11">${Number.isFinite(bar.value) ? `${bar.value.toFixed(2)}x` : 'n/a'}</text>`,
      );
      y += barHeight + gap;
    }
    parts.push(
      `<line x1="${x1.toFixed(1)}" y1="${top - 2}" x2="${x1.toFixed(1)}" y2="${y}" stroke="#000" stroke-dasharray="3,3"/>`,
    );
  }
  const height = y + 20;
  return [
    `<svg xmlns="http://www.w3.org/2000/svg" width="${width}" height="${height}" viewBox="0 0 ${width} ${height}" font-family="sans-serif">`,
    `<rect width="100%" height="100%" fill="#fff"/>`,
    ...parts,
    '</svg>',
    '',
  ].join('\n');
}
