/**
 * Ratios of `profile-uncontended.ts` modes measured in turn, one fresh process each, round after
 * round: on a shared machine whose load moves from one second to the next, interleaved rounds and
 * their medians say more than one run of each mode. Prints every round (with the load average),
 * then the median cycles/s and CPU µs per cycle of each mode, and the median of the per-round
 * ratios of each mode to the first one.
 *
 *   node -r ./test/support/ts-register.js bench/ratio-uncontended.ts \
 *     --modes lock,decorator --rounds 7 --seconds 3 [--node /path/to/node] [-- --fake-redis ...]
 *
 * A mode may carry flags of its own after a `+`: `lock+--async-hooks`. Arguments after `--` go to
 * every run. `--node` picks the Node binary (default: this one), e.g. a Node 24 from
 * `npx -y -p node@24 node -p process.execPath`.
 */
import { execFileSync } from 'node:child_process';
import { loadavg } from 'node:os';
import { join, sep } from 'node:path';
import { parseArgs } from 'node:util';
import { median } from './support/stats';

interface Run {
  readonly cyclesPerSecond: number;
  readonly cpuUs: number;
}

/** The repository: this file runs from bench/ (ts-register) or from bench/dist/ (built). */
const ROOT = join(__dirname, __dirname.endsWith(`${sep}dist`) ? '../..' : '..');

function measure(node: string, mode: string, seconds: string, common: readonly string[]): Run {
  const [name = '', ...own] = mode.split('+');
  const output = execFileSync(
    node,
    [
      '-r',
      join(ROOT, 'test/support/ts-register.js'),
      join(ROOT, 'bench/profile-uncontended.ts'),
      '--mode',
      name,
      '--seconds',
      seconds,
      ...own,
      ...common,
    ],
    { cwd: ROOT, encoding: 'utf8', stdio: ['ignore', 'pipe', 'inherit'] },
  );
  const match = /: (\d+) cycles\/s, ([\d.]+) µs CPU per cycle/.exec(output);
  if (!match) throw new Error(`${mode}: no result in ${JSON.stringify(output.slice(-300))}`);
  return { cyclesPerSecond: Number(match[1]), cpuUs: Number(match[2]) };
}

function main(): void {
  const { values, positionals } = parseArgs({
    allowPositionals: true,
    options: {
      modes: { type: 'string', default: 'lock,decorator' },
      rounds: { type: 'string', default: '5' },
      seconds: { type: 'string', default: '3' },
      node: { type: 'string', default: process.execPath },
    },
  });
  const modes = values.modes.split(',');
  const node = values.node;
  const version = execFileSync(node, ['--version'], { encoding: 'utf8' }).trim();
  const runs: Run[][] = modes.map(() => []);
  const ratios: number[][] = modes.map(() => []);
  console.log(
    `node ${version}, ${values.rounds} rounds of ${values.seconds} s: ${modes.join(', ')} ${positionals.join(' ')}`,
  );
  for (let round = 1; round <= Number(values.rounds); round += 1) {
    const row = modes.map((mode) => measure(node, mode, values.seconds, positionals));
    const base = row[0].cyclesPerSecond;
    const cells = row.map((run, i) => {
      runs[i].push(run);
      ratios[i].push(run.cyclesPerSecond / base);
      return `${modes[i]} ${run.cyclesPerSecond} /s ${run.cpuUs.toFixed(1)} µs (${(run.cyclesPerSecond / base).toFixed(2)}x)`;
    });
    console.log(`round ${round}: ${cells.join(' | ')} | load ${loadavg()[0].toFixed(2)}`);
  }
  console.log(`medians (ratio: median of the rounds' ratios to ${modes[0]}):`);
  modes.forEach((mode, i) => {
    console.log(
      `  ${mode}: ${Math.round(median(runs[i].map((run) => run.cyclesPerSecond)))} cycles/s, ` +
        `${median(runs[i].map((run) => run.cpuUs)).toFixed(1)} µs CPU per cycle, ` +
        `ratio ${median(ratios[i]).toFixed(2)}x`,
    );
  });
}

main();
