/**
 * Self time per function and per file of a `--cpu-prof` profile (a `.cpuprofile`), and total time
 * (self + callees) of this library's functions, in % of the busy samples, top first. `--skip-ms`
 * leaves out the first milliseconds (start-up, warm-up):
 *
 *   node -r ./test/support/ts-register.js bench/profile-summary.ts /tmp/prof/CPU.*.cpuprofile [--top 40] [--skip-ms 1500]
 *
 * With `--heap`, the files are sampling heap profiles (`profile-uncontended.ts --heap-profile`):
 * bytes allocated per function (self) and per file, in bytes per cycle with `--cycles`.
 */
import { readFileSync } from 'node:fs';
import { parseArgs } from 'node:util';

interface ProfileNode {
  readonly id: number;
  readonly callFrame: { readonly functionName: string; readonly url: string; readonly lineNumber: number };
  readonly children?: readonly number[];
}

/** Whether a frame is this library's own code (lib/ through ts-register, or the built dist/). */
function isLibrary(url: string): boolean {
  return /\/(lib|dist)\/(core|decorator|module|service|store)\//.test(url) && !url.includes('node_modules');
}

interface CpuProfile {
  readonly nodes: readonly ProfileNode[];
  readonly samples: readonly number[];
  readonly timeDeltas: readonly number[];
}

function shortUrl(url: string): string {
  const modules = url.lastIndexOf('node_modules/');
  if (modules !== -1) return url.slice(modules + 'node_modules/'.length);
  const lib = url.lastIndexOf('/lib/');
  if (lib !== -1 && !url.startsWith('node:')) return url.slice(lib + 1);
  const bench = url.lastIndexOf('/bench/');
  if (bench !== -1) return url.slice(bench + 1);
  return url;
}

/** Cycles of the profiled window, when given: times are then also shown in µs per cycle. */
let cycles = 0;

/** A node of a sampling heap profile. */
interface HeapNode {
  readonly callFrame: ProfileNode['callFrame'];
  readonly selfSize: number;
  readonly children: readonly HeapNode[];
}

function heapSummary(file: string, count: number): void {
  const { head } = JSON.parse(readFileSync(file, 'utf8')) as { head: HeapNode };
  const byFunction = new Map<string, number>();
  const byFile = new Map<string, number>();
  let all = 0;
  const visit = (node: HeapNode): void => {
    const { functionName, url, lineNumber } = node.callFrame;
    if (node.selfSize > 0) {
      all += node.selfSize;
      const name = `${functionName || '(anonymous)'} ${url ? `${shortUrl(url)}:${lineNumber + 1}` : ''}`.trim();
      byFunction.set(name, (byFunction.get(name) ?? 0) + node.selfSize);
      const fileName = url ? shortUrl(url) : functionName;
      byFile.set(fileName, (byFile.get(fileName) ?? 0) + node.selfSize);
    }
    node.children.forEach(visit);
  };
  visit(head);
  const rows = (totals: Map<string, number>, n: number): string[] =>
    [...totals.entries()]
      .sort((a, b) => b[1] - a[1])
      .slice(0, n)
      .map(([name, bytes]) => {
        const perCycle = cycles > 0 ? `${(bytes / cycles).toFixed(0).padStart(6)} B  ` : '';
        return `${((100 * bytes) / all).toFixed(1).padStart(5)} %  ${perCycle}${name}`;
      });
  const perCycle = cycles > 0 ? ` (${(all / cycles).toFixed(0)} B per cycle)` : '';
  console.log(`\n${file}: ${(all / 1e6).toFixed(1)} MB allocated${perCycle}`);
  console.log('-- allocated by function (self)');
  for (const line of rows(byFunction, count)) console.log(line);
  console.log('-- allocated by file');
  for (const line of rows(byFile, Math.ceil(count / 2))) console.log(line);
}

function top(totals: Map<string, number>, all: number, count: number): string[] {
  return [...totals.entries()]
    .sort((a, b) => b[1] - a[1])
    .slice(0, count)
    .map(([name, us]) => {
      const perCycle = cycles > 0 ? `${(us / cycles).toFixed(2).padStart(6)} µs  ` : '';
      return `${((100 * us) / all).toFixed(1).padStart(5)} %  ${perCycle}${name}`;
    });
}

function main(): void {
  const { values, positionals } = parseArgs({
    allowPositionals: true,
    options: {
      top: { type: 'string', default: '40' },
      'skip-ms': { type: 'string', default: '0' },
      cycles: { type: 'string' },
      heap: { type: 'boolean', default: false },
    },
  });
  const count = Number(values.top);
  cycles = Number(values.cycles ?? 0);
  if (values.heap) {
    for (const file of positionals) heapSummary(file, count);
    return;
  }
  for (const file of positionals) {
    const profile = JSON.parse(readFileSync(file, 'utf8')) as CpuProfile;
    const byId = new Map(profile.nodes.map((node) => [node.id, node]));
    const parent = new Map<number, number>();
    for (const node of profile.nodes) for (const child of node.children ?? []) parent.set(child, node.id);
    const skipUs = Number(values['skip-ms']) * 1000;
    const self = new Map<number, number>();
    let elapsed = 0;
    profile.samples.forEach((id, i) => {
      elapsed += profile.timeDeltas[i] ?? 0;
      if (elapsed >= skipUs) self.set(id, (self.get(id) ?? 0) + (profile.timeDeltas[i] ?? 0));
    });
    const total = new Map<string, number>();
    const byFunction = new Map<string, number>();
    const byFile = new Map<string, number>();
    let all = 0;
    let idle = 0;
    for (const [id, us] of self) {
      const { functionName, url, lineNumber } = (byId.get(id) as ProfileNode).callFrame;
      if (functionName === '(idle)') {
        idle += us;
        continue;
      }
      all += us;
      const where = url ? `${shortUrl(url)}:${lineNumber + 1}` : '';
      const name = `${functionName || '(anonymous)'} ${where}`.trim();
      byFunction.set(name, (byFunction.get(name) ?? 0) + us);
      const fileName = url ? shortUrl(url) : functionName;
      byFile.set(fileName, (byFile.get(fileName) ?? 0) + us);
      const seen = new Set<string>();
      for (let at: number | undefined = id; at !== undefined; at = parent.get(at)) {
        const frame = (byId.get(at) as ProfileNode).callFrame;
        if (!isLibrary(frame.url)) continue;
        const key = `${frame.functionName || '(anonymous)'} ${shortUrl(frame.url)}:${frame.lineNumber + 1}`;
        if (seen.has(key)) continue;
        seen.add(key);
        total.set(key, (total.get(key) ?? 0) + us);
      }
    }
    const perCycle = cycles > 0 ? ` (${(all / cycles).toFixed(1)} µs per cycle)` : '';
    console.log(`\n${file}: ${(all / 1000).toFixed(0)} ms busy${perCycle}, ${(idle / 1000).toFixed(0)} ms idle`);
    console.log('-- self time by function');
    for (const line of top(byFunction, all, count)) console.log(line);
    console.log('-- self time by file');
    for (const line of top(byFile, all, Math.ceil(count / 2))) console.log(line);
    console.log("-- total time (self + callees) of the library's functions");
    for (const line of top(total, all, count)) console.log(line);
  }
}

main();
