import { LuaScript } from './lua-script';

/**
 * check: whether an owner still holds its lock, for a reentrant acquisition. Reads only, so a
 * re-sent copy changes nothing: re-entries are counted in the process that holds the lock, never
 * in Redis, where a count moved twice by a re-sent command could free a lock still in use.
 *
 * KEYS[1]  the lock hash
 * ARGV[1]  owner id
 *
 * Returns {1, pttl} when ARGV[1] holds KEYS[1], {0, pttl} otherwise (pttl -2: no key).
 */
export const CHECK_SCRIPT = new LuaScript(
  'check',
  `
local key = KEYS[1]
if redis.call('type', key).ok == 'hash' and redis.call('hexists', key, ARGV[1]) == 1 then
  return {1, redis.call('pttl', key)}
end
return {0, redis.call('pttl', key)}
`,
);
