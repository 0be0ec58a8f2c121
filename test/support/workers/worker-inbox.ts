import type { WorkerProcess } from './worker-process';

/** A worker's message: typed by `type`, perhaps about one request (`id`); `failed` ends the worker's run. */
export interface WorkerMessage {
  readonly type: string;
}

type Of<M extends WorkerMessage, T extends M['type']> = Extract<M, { type: T }>;

/**
 * One worker process, with a typed inbox of the messages it sent (`C`) and a typed way to send it
 * its own (`P`). A `failed` message from it fails whatever waits on the inbox.
 */
export class WorkerInbox<C extends WorkerMessage, P> {
  private readonly inbox: C[] = [];
  private readonly listeners = new Set<() => void>();
  pid = 0;

  constructor(
    readonly proc: WorkerProcess,
    /** Names the worker in errors: `fair-line worker`, `family worker`. */
    private readonly label: string,
  ) {
    proc.child.on('message', (message: C) => {
      this.inbox.push(message);
      this.notify();
    });
    void proc.exited.then(() => this.notify());
  }

  get alive(): boolean {
    return this.proc.alive;
  }

  send(message: P): void {
    if (this.proc.child.connected) this.proc.child.send(message as object);
  }

  /** The next message of `type` (or of any of the types listed), for `id` when given, taken out of the inbox. */
  async next<T extends C['type']>(type: T | readonly T[], id?: string, timeoutMs = 10_000): Promise<Of<C, T>> {
    const types: readonly string[] = typeof type === 'string' ? [type] : type;
    const named = `'${types.join("' or '")}'`;
    const deadline = Date.now() + timeoutMs;
    for (;;) {
      const failed = this.inbox.find((m) => m.type === 'failed');
      if (failed) throw this.error(`failed: ${(failed as WorkerMessage & { error?: string }).error}`);
      const index = this.inbox.findIndex(
        (m) => types.includes(m.type) && (id === undefined || ('id' in m && m.id === id)),
      );
      if (index >= 0) return this.inbox.splice(index, 1)[0] as Of<C, T>;
      if (!this.proc.alive) throw this.error(`exited before sending ${named}`);
      const left = deadline - Date.now();
      if (left <= 0) throw this.error(`sent no ${named}${id ? ` for ${id}` : ''} within ${timeoutMs} ms`);
      await new Promise<void>((resolve) => {
        const done = (): void => {
          clearTimeout(timer);
          this.listeners.delete(done);
          resolve();
        };
        const timer = setTimeout(done, left);
        this.listeners.add(done);
      });
    }
  }

  /** Whether a message of `type` for `id` has arrived (left in the inbox). */
  has(type: C['type'], id: string): boolean {
    return this.inbox.some((m) => m.type === type && 'id' in m && m.id === id);
  }

  /** Forget every message received so far. */
  clear(): void {
    this.inbox.length = 0;
  }

  protected error(what: string): Error {
    return new Error(`${this.label} (pid ${this.proc.pid}) ${what}\n--- its output ---\n${this.proc.recentOutput}`);
  }

  private notify(): void {
    for (const listener of [...this.listeners]) listener();
  }
}
