import { ANNOUNCE_LUA } from './announce.lua';
import { LuaScript } from './lua-script';

/**
 * leave: a waiter gives up its place in a lock's line (it timed out, was aborted, or shut down).
 * When the lock is free and others still wait, the new head is told at once, instead of waiting
 * for the place of the one who left to lapse.
 *
 * KEYS[1]  the lock hash (the announcement's channel)
 * KEYS[2]  the lock's line, KEYS[3] its deadlines (see acquire.script.ts)
 * ARGV[1]  waiter id
 * ARGV[2]  the message to announce with (the store's id and a sequence number)
 * ARGV[3]  '1' on a Cluster: SPUBLISH (see release.script.ts)
 * ARGV[4]  ms the new head has to take the lock before its place lapses
 *
 * Returns 1 when the lock was free and an announcement went out, 0 otherwise. Safe to run twice.
 */
export const LEAVE_SCRIPT = new LuaScript(
  'leave',
  `
local key, line, deadlines = KEYS[1], KEYS[2], KEYS[3]
local message, sharded, grant = ARGV[2], ARGV[3], tonumber(ARGV[4])
redis.call('zrem', line, ARGV[1])
redis.call('zrem', deadlines, ARGV[1])
if redis.call('exists', line) == 0 or redis.call('exists', key) == 1 then
  return 0
end
${ANNOUNCE_LUA}
return 1
`,
);
