import { SERVER_MS_LUA } from './line.lua';
import { LuaScript } from './lua-script';

/**
 * check: whether an owner still holds its lock, for a reentrant acquisition. Reads only, so a
 * re-sent copy changes nothing: re-entries are counted in the process that holds the lock, never
 * in Redis, where a count moved twice by a re-sent command could free a lock still in use.
 *
 * KEYS[1]  the lock hash
 * ARGV[1]  owner id
 *
 * Returns {1, pttl} when ARGV[1] holds KEYS[1], {0, pttl} otherwise (pttl -2: no key). A shared
 * hold (see SETTLE_SHARED_LUA in line.lua.ts) holds until its own lease ends, and its pttl is
 * what is left of that lease.
 */
export const CHECK_SCRIPT = new LuaScript(
  'check',
  `
local key = KEYS[1]
if redis.call('type', key).ok == 'hash' and redis.call('hexists', key, ARGV[1]) == 1 then
  local ends = tonumber(redis.call('hget', key, ARGV[1]))
  if ends and ends <= 1 then return {1, redis.call('pttl', key)} end
  if ends then
    local left = ends - ${SERVER_MS_LUA}
    if left > 0 then return {1, left} end
  end
end
return {0, redis.call('pttl', key)}
`,
);
