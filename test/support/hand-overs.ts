import type { LockEventType, LockHandle, LockService } from 'nestjs-dislock';
import type { LuaScript } from '../../lib/store/redis/scripts/lua-script';
import { type CommandMatcher, isScript } from './fault-proxy';
import { calls, type Line } from './monitor';

/**
 * What the hand-over tests share: finding hand-overs among the commands Redis saw (an acquire
 * script sent with the finished holder's owner id as ARGV[10]), and callers that wait.
 */

/** The ARGV of an EVALSHA/EVAL argv (a MONITOR line or a proxied command). */
export const argvOf = (args: readonly string[]): string[] => args.slice(3 + Number(args[2]));

/** A proxied command that is a hand-over by `script` (acquire or acquire-shared). */
export const isHandOverBy =
  (script: LuaScript): CommandMatcher =>
  (argv) =>
    isScript(script)(argv) && argvOf(argv).length === 10;

/** The hand-overs of `key` by `script` among MONITOR `lines`: their ARGV (the holder's owner id is the last). */
export const handOversIn = (lines: readonly Line[], key: string, script: LuaScript): string[][] =>
  calls(lines, script, key)
    .map(argvOf)
    .filter((argv) => argv.length === 10);

/** Resolves at `locks`' next event of `type` for lock `name`. */
export function nextEvent(locks: LockService, type: LockEventType, name: string): Promise<void> {
  return new Promise((resolve) => {
    const off = locks.on(type, (event) => {
      if (event.name !== name) return;
      off();
      resolve();
    });
  });
}

/**
 * Starts a waiting `lock` call (waiting up to `waitMs`) and resolves once it waits (its first
 * attempt found the lock busy); its rejection, if any, is left to whoever awaits `got`.
 */
export async function startWaiting(
  locks: LockService,
  name: string,
  options: Record<string, unknown>,
  waitMs: number,
): Promise<{ got: Promise<LockHandle> }> {
  const waiting = nextEvent(locks, 'waiting', name);
  const got = locks.lock(name, { waitTime: waitMs, ...options });
  got.catch(() => undefined);
  await waiting;
  return { got };
}
