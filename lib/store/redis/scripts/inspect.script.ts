import { LuaScript } from './lua-script';

/**
 * inspect: what an operator asks of one lock, read in one go. Changes nothing.
 *
 * KEYS[1]  the lock hash (its holds, and their descriptions: see DESCRIPTION_MARK)
 * KEYS[2]  its line of waiters (see acquire.script.ts)
 *
 * Returns {type of KEYS[1], pttl of KEYS[1], HGETALL KEYS[1] (or {} when not a hash), waiters in
 * the line, the server's time in ms}.
 */
export const INSPECT_SCRIPT = new LuaScript(
  'inspect',
  `
local kind = redis.call('type', KEYS[1]).ok
local holders = kind == 'hash' and redis.call('hgetall', KEYS[1]) or {}
local clock = redis.call('time')
local ms = tonumber(clock[1]) * 1000 + math.floor(tonumber(clock[2]) / 1000)
return {kind, redis.call('pttl', KEYS[1]), holders, redis.call('zcard', KEYS[2]), string.format('%.0f', ms)}
`,
);
