import type { Redis } from 'ioredis';
import type { LuaScript } from '../../lib/store/redis/scripts/lua-script';
import type { RedisServer } from './redis-server';

/** A MONITOR line's arguments. */
export type Line = string[];

export const isCall = (args: Line, script: LuaScript): boolean =>
  (args[0]?.toLowerCase() === 'evalsha' && args[1] === script.sha) ||
  (args[0]?.toLowerCase() === 'eval' && args[1] === script.source);

/** The KEYS of an EVAL/EVALSHA line. */
export const keysOf = (args: Line): string[] => args.slice(3, 3 + Number(args[2]));

export const calls = (lines: readonly Line[], script: LuaScript, key?: string): Line[] =>
  lines.filter((args) => isCall(args, script) && (key === undefined || keysOf(args).includes(key)));

/** Every command Redis runs, in order (MONITOR on a connection of its own). */
export class Monitor {
  readonly lines: Line[] = [];
  private readonly watchers = new Set<(args: Line) => void>();
  private marks = 0;

  private constructor(
    private readonly base: Redis,
    private readonly conn: Redis,
    private readonly probe: Redis,
  ) {
    conn.on('monitor', (_time: string, args: string[]) => {
      this.lines.push(args);
      for (const watcher of this.watchers) watcher(args);
    });
  }

  static async start(server: RedisServer, probe: Redis): Promise<Monitor> {
    const base = server.client();
    const conn = await base.monitor();
    const monitor = new Monitor(base, conn, probe);
    await monitor.sync();
    return monitor;
  }

  /** Index just past every command Redis had run when this was called (an ECHO marker comes back). */
  async sync(): Promise<number> {
    const mark = `sync-${(this.marks += 1)}`;
    const seen = this.next((args) => args[0]?.toLowerCase() === 'echo' && args[1] === mark);
    await this.probe.echo(mark);
    await seen;
    return this.lines.findIndex((args) => args[0]?.toLowerCase() === 'echo' && args[1] === mark) + 1;
  }

  /** Resolves at the next command (from now on) that `match` accepts. */
  next(match: (args: Line) => boolean): Promise<Line> {
    return new Promise((resolve) => {
      const watcher = (args: Line): void => {
        if (!match(args)) return;
        this.watchers.delete(watcher);
        resolve(args);
      };
      this.watchers.add(watcher);
    });
  }

  since(index: number): Line[] {
    return this.lines.slice(index);
  }

  /** The commands from `index` up to now (synced first, so none still on its way is missed). */
  async window(index: number): Promise<Line[]> {
    const end = await this.sync();
    return this.lines.slice(index, end - 1);
  }

  stop(): void {
    this.watchers.clear();
    this.conn.disconnect();
    this.base.disconnect();
  }
}
