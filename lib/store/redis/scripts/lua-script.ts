import { createHash } from 'node:crypto';
import type { Cluster, Redis } from 'ioredis';
import { ForeignKeyError } from '../../store-errors';
import { FOREIGN_FENCE_ERROR, FOREIGN_KEY_ERROR } from './line.lua';

/**
 * The code Redis refused a command with (`NOSCRIPT`, `TRYAGAIN`, `MOVED`...): the error's first
 * word, or, when a Cluster client gave up after following its redirections ("Too many Cluster
 * redirections. Last error: ..."), that of the last answer it had (`redirected`). Undefined for
 * anything else.
 */
export function refusalOf(reply: unknown): { code: string; redirected: boolean } | undefined {
  if (!(reply instanceof Error)) return undefined;
  const match = /^(Too many Cluster redirections\. Last error: (?:ReplyError: )?)?([A-Z]+)(?: |$)/.exec(reply.message);
  return match ? { code: match[2], redirected: match[1] !== undefined } : undefined;
}

/**
 * Whether `reply` says the server has not loaded the script: NOSCRIPT itself, or a Cluster client
 * giving up on a command whose last answer was NOSCRIPT (the redirections a migrating slot's
 * TRYAGAIN used up left none for it: the new owner of the slot had not loaded the script).
 */
export const isNoScript = (reply: unknown): boolean => refusalOf(reply)?.code === 'NOSCRIPT';

/** `<FOREIGN_KEY_ERROR or FOREIGN_FENCE_ERROR> <type> <key>`, as the scripts spell it. */
const FOREIGN_REPLY = new RegExp(`^(${FOREIGN_KEY_ERROR}|${FOREIGN_FENCE_ERROR}) (\\S+) (.*)$`, 's');

/**
 * The key of another type a script refused to treat as a lock's (FOREIGN_KEY_ERROR,
 * FOREIGN_FENCE_ERROR in line.lua.ts), as a `ForeignKeyError`; undefined for any other error.
 */
export function foreignKeyOf(error: unknown): ForeignKeyError | undefined {
  if (!(error instanceof Error)) return undefined;
  const match = FOREIGN_REPLY.exec(error.message);
  if (!match) return undefined;
  return new ForeignKeyError(match[3], match[1] === FOREIGN_KEY_ERROR ? 'lock' : 'fence', match[2], error);
}

/** The two commands a script needs; a Redis or Cluster client qualifies. */
export type ScriptClient = Pick<Redis | Cluster, 'evalsha' | 'eval'>;

/**
 * A Lua script run by EVALSHA, falling back to EVAL (which also loads it) when the server
 * answers NOSCRIPT: after a restart, a SCRIPT FLUSH, or on a node that has not seen it yet.
 * Every script here names all its keys, and they share one hash slot, so Cluster routes it.
 */
export class LuaScript {
  readonly sha: string;

  constructor(
    readonly name: string,
    readonly source: string,
  ) {
    this.sha = createHash('sha1').update(source).digest('hex');
  }

  async run(client: ScriptClient, keys: readonly string[], args: readonly (string | number)[]): Promise<unknown> {
    try {
      return await client.evalsha(this.sha, keys.length, ...keys, ...args);
    } catch (error) {
      if (!isNoScript(error)) throw error;
      return client.eval(this.source, keys.length, ...keys, ...args);
    }
  }
}
