/**
 * Parent side of the child processes of hostile-input and hygiene tests: runs a TypeScript worker
 * through test/support/ts-register.js, collects its `@@{json}` report lines, and tells when it exits
 * on its own. Every child still running when the test process ends is killed.
 */
import { type ChildProcess, spawn } from 'node:child_process';
import { join, resolve } from 'node:path';

const root = resolve(__dirname, '..', '..', '..');
const register = join(root, 'test', 'support', 'ts-register.js');

const running = new Set<ChildProcess>();
process.once('exit', () => {
  for (const child of running) child.kill('SIGKILL');
});

export interface Report {
  readonly event: string;
  readonly [field: string]: unknown;
}

export interface ChildExit {
  readonly code: number | null;
  readonly signal: NodeJS.Signals | null;
  /** `performance.now()` when the process exited. */
  readonly at: number;
}

export class WorkerChild {
  readonly child: ChildProcess;
  readonly exited: Promise<ChildExit>;
  private readonly reports: Report[] = [];
  private readonly waiting = new Set<() => void>();
  private output = '';
  private exit: ChildExit | undefined;

  constructor(
    worker: string,
    config: object,
    options: { env?: NodeJS.ProcessEnv; nodeArgs?: string[]; stdin?: boolean } = {},
  ) {
    const script = join(__dirname, worker);
    this.child = spawn(
      process.execPath,
      [...(options.nodeArgs ?? []), '-r', register, script, JSON.stringify(config)],
      {
        cwd: root,
        env: { ...process.env, ...options.env },
        stdio: [options.stdin ? 'pipe' : 'ignore', 'pipe', 'pipe'],
      },
    );
    running.add(this.child);
    let pending = '';
    this.child.stdout?.on('data', (chunk: Buffer) => {
      this.output = (this.output + chunk.toString()).slice(-20_000);
      pending += chunk.toString();
      let end: number;
      while ((end = pending.indexOf('\n')) !== -1) {
        const text = pending.slice(0, end);
        pending = pending.slice(end + 1);
        if (text.startsWith('@@')) this.reports.push(JSON.parse(text.slice(2)) as Report);
      }
      this.notify();
    });
    this.child.stderr?.on('data', (chunk: Buffer) => {
      this.output = (this.output + chunk.toString()).slice(-20_000);
    });
    this.exited = new Promise((resolveExit) => {
      const done = (code: number | null, signal: NodeJS.Signals | null): void => {
        running.delete(this.child);
        this.exit ??= { code, signal, at: performance.now() };
        resolveExit(this.exit);
        this.notify();
      };
      this.child.once('exit', done);
      this.child.once('error', (error) => {
        this.output += `\nspawn error: ${error.message}`;
        done(null, null);
      });
    });
  }

  /** The first report of `event`; rejects (with the child's output) if it exits or times out first. */
  async next(event: string, timeoutMs: number): Promise<Report> {
    const deadline = performance.now() + timeoutMs;
    for (;;) {
      const found = this.reports.find((r) => r.event === event);
      if (found) return found;
      const failed = this.reports.find((r) => r.event === 'failed');
      if (failed || this.exit || performance.now() >= deadline) {
        throw new Error(
          `worker: no "${event}" report (${failed ? 'worker failed' : this.exit ? `exited ${JSON.stringify(this.exit)}` : `timed out after ${timeoutMs} ms`})\n${this.output}`,
        );
      }
      await new Promise<void>((wake) => {
        const timer = setTimeout(wake, Math.max(1, deadline - performance.now()));
        this.waiting.add(() => {
          clearTimeout(timer);
          wake();
        });
      });
    }
  }

  /** Resolves with the exit if the process ends within `ms`, `undefined` otherwise. */
  async exitWithin(ms: number): Promise<ChildExit | undefined> {
    let timer: NodeJS.Timeout | undefined;
    try {
      return await Promise.race([
        this.exited,
        new Promise<undefined>((resolveLater) => (timer = setTimeout(() => resolveLater(undefined), ms))),
      ]);
    } finally {
      clearTimeout(timer);
    }
  }

  /**
   * Expect the child to end by itself within 2 s of `closedAt` (nothing keeps it alive once its app
   * is closed), with exit code 0 and nothing unhandled.
   */
  async expectCleanExit(closedAt: number): Promise<void> {
    const exit = await this.exitWithin(2_000);
    expect(exit).toBeDefined();
    expect((exit?.at ?? Infinity) - closedAt).toBeLessThan(2_000);
    expect(exit?.code).toBe(0);
    expect((await this.next('exit', 100)).unhandled).toEqual([]);
  }

  send(line: string): void {
    this.child.stdin?.write(`${line}\n`);
  }

  /** What the child wrote (the last 20 kB), for failure messages. */
  get log(): string {
    return this.output;
  }

  async kill(): Promise<void> {
    if (!this.exit) this.child.kill('SIGKILL');
    await this.exited;
  }

  private notify(): void {
    for (const wake of this.waiting) wake();
    this.waiting.clear();
  }
}
