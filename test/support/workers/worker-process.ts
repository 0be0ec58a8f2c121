/**
 * Parent side of the worker processes: start one, wait for its messages, kill it.
 *
 * ```ts
 * const workers = new WorkerSet();
 * const holder = workers.start('holder', config); // node -r ts-register.js holder.worker.ts '<json>'
 * const { owner } = await holder.next('locked', 10_000);
 * await holder.kill(); // SIGKILL, resolves once the process is gone
 * await workers.killAll(); // in afterEach: nothing outlives the test
 * ```
 */
import { type ChildProcess, spawn } from 'node:child_process';
import { join, resolve } from 'node:path';
import type { ChildMessage, ParentMessage } from './protocol';

const root = resolve(__dirname, '..', '..', '..');
const register = join(root, 'test', 'support', 'ts-register.js');

/** Every worker still running, so that none outlives its parent even if a test forgets one. */
const running = new Set<WorkerProcess>();
process.once('exit', () => {
  for (const worker of running) worker.child.kill('SIGKILL');
});

export interface Exit {
  code: number | null;
  signal: NodeJS.Signals | null;
}

type MessageOf<T extends ChildMessage['type']> = Extract<ChildMessage, { type: T }>;

const TAIL = 8_000;

export class WorkerProcess {
  readonly child: ChildProcess;
  /** Resolves when the process has exited (never rejects). */
  readonly exited: Promise<Exit>;
  private exit: Exit | undefined;
  private readonly inbox: ChildMessage[] = [];
  private readonly listeners = new Set<() => void>();
  /** The last few kB of the worker's stdout and stderr, for error messages. */
  private output = '';

  constructor(
    readonly worker: string,
    config: object,
    options: { echo?: boolean } = {},
  ) {
    const script = join(__dirname, `${worker}.worker.ts`);
    this.child = spawn(process.execPath, ['-r', register, script, JSON.stringify(config)], {
      cwd: root,
      stdio: ['ignore', 'pipe', 'pipe', 'ipc'],
    });
    running.add(this);
    const keep = (chunk: Buffer): void => {
      this.output = (this.output + chunk.toString()).slice(-TAIL);
      if (options.echo) process.stderr.write(chunk);
    };
    this.child.stdout?.on('data', keep);
    this.child.stderr?.on('data', keep);
    this.child.on('message', (message: ChildMessage) => {
      this.inbox.push(message);
      this.notify();
    });
    this.exited = new Promise((resolveExit) => {
      this.child.once('exit', (code, signal) => {
        running.delete(this);
        this.exit = { code, signal };
        resolveExit(this.exit);
        this.notify();
      });
      this.child.once('error', (error) => {
        this.output += `\nspawn error: ${error.message}`;
        running.delete(this);
        this.exit ??= { code: null, signal: null };
        resolveExit(this.exit);
        this.notify();
      });
    });
  }

  get pid(): number | undefined {
    return this.child.pid;
  }

  get alive(): boolean {
    return this.exit === undefined;
  }

  /**
   * The next message of `type` (taken out of the inbox). Rejects, with the worker's output, if the
   * worker reports a failure, exits first, or sends nothing of the kind within `timeoutMs`.
   */
  async next<T extends ChildMessage['type']>(type: T, timeoutMs: number): Promise<MessageOf<T>> {
    const deadline = performance.now() + timeoutMs;
    for (;;) {
      const failed = this.inbox.find((m) => m.type === 'failed');
      if (failed && type !== 'failed') throw this.error(`failed: ${failed.error}`);
      const index = this.inbox.findIndex((m) => m.type === type);
      if (index >= 0) return this.inbox.splice(index, 1)[0] as MessageOf<T>;
      if (this.exit) throw this.error(`exited (${this.exit.signal ?? this.exit.code}) before sending '${type}'`);
      const left = deadline - performance.now();
      if (left <= 0) throw this.error(`sent no '${type}' within ${timeoutMs} ms`);
      await this.change(left);
    }
  }

  /** Every message of `type` received so far, taken out of the inbox (none: an empty list). */
  drain<T extends ChildMessage['type']>(type: T): MessageOf<T>[] {
    const taken: MessageOf<T>[] = [];
    for (let i = 0; i < this.inbox.length;) {
      if (this.inbox[i].type === type) taken.push(this.inbox.splice(i, 1)[0] as MessageOf<T>);
      else i += 1;
    }
    return taken;
  }

  send(message: ParentMessage): void {
    if (this.child.connected) this.child.send(message);
  }

  /** The exit of the process, or a rejection if it has not exited within `timeoutMs`. */
  async exitWithin(timeoutMs: number): Promise<Exit> {
    let timer: NodeJS.Timeout | undefined;
    const late = new Promise<never>((_, reject) => {
      timer = setTimeout(() => reject(this.error(`did not exit within ${timeoutMs} ms`)), timeoutMs);
    });
    try {
      return await Promise.race([this.exited, late]);
    } finally {
      clearTimeout(timer);
    }
  }

  /** Send `signal` (SIGKILL by default) unless the process has exited; resolves once it has. */
  async kill(signal: NodeJS.Signals = 'SIGKILL'): Promise<Exit> {
    if (this.alive) this.child.kill(signal);
    return this.exited;
  }

  /** The worker's recent output, for diagnostics. */
  get recentOutput(): string {
    return this.output;
  }

  private error(what: string): Error {
    return new Error(`${this.worker} worker (pid ${this.pid}) ${what}\n--- its output ---\n${this.output}`);
  }

  private notify(): void {
    for (const listener of this.listeners) listener();
  }

  /** Resolves on the next message or exit, or after `ms`. */
  private change(ms: number): Promise<void> {
    return new Promise((resolveChange) => {
      const done = (): void => {
        clearTimeout(timer);
        this.listeners.delete(done);
        resolveChange();
      };
      const timer = setTimeout(done, ms);
      this.listeners.add(done);
    });
  }
}

/** The workers one test (or script) started, so that they can all be killed at the end. */
export class WorkerSet {
  private readonly workers: WorkerProcess[] = [];

  start(worker: string, config: object, options?: { echo?: boolean }): WorkerProcess {
    const started = new WorkerProcess(worker, config, options);
    this.workers.push(started);
    return started;
  }

  /** SIGKILL every worker still running and wait until all are gone. */
  async killAll(): Promise<void> {
    await Promise.all(this.workers.splice(0).map((worker) => worker.kill()));
  }
}
