import { createHash } from 'node:crypto';
import type { Cluster, Redis } from 'ioredis';

/** The two commands a script needs; a Redis or Cluster client qualifies. */
export type ScriptClient = Pick<Redis | Cluster, 'evalsha' | 'eval'>;

/**
 * A Lua script run by EVALSHA, falling back to EVAL (which also loads it) when the server
 * answers NOSCRIPT: after a restart, a SCRIPT FLUSH, or on a node that has not seen it yet.
 * Every script here takes exactly one key, so Cluster routes it by that key's slot.
 */
export class LuaScript {
  readonly sha: string;

  constructor(
    readonly name: string,
    readonly source: string,
  ) {
    this.sha = createHash('sha1').update(source).digest('hex');
  }

  async run(client: ScriptClient, key: string, args: readonly (string | number)[]): Promise<unknown> {
    try {
      return await client.evalsha(this.sha, 1, key, ...args);
    } catch (error) {
      if (!(error instanceof Error) || !error.message.startsWith('NOSCRIPT')) throw error;
      return client.eval(this.source, 1, key, ...args);
    }
  }
}
