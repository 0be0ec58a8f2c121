import { HAND_ON_LUA } from './line.lua';
import { LuaScript } from './lua-script';

/**
 * force-unlock: an operator frees a lock whoever holds it. Every hold is dropped (their holders
 * learn it at their next renewal, which finds them gone), their descriptions too, and the lock
 * goes to the head of its line, or is announced free, as a release does.
 *
 * KEYS[1]  the lock hash
 * KEYS[2]  the fencing counter of its hash slot
 * KEYS[3]  the lock's line, KEYS[4] its deadlines, KEYS[5] its info hash
 * ARGV[1]  the message to announce with, ARGV[2] '1' on a Cluster, ARGV[3] the grant's ms (see release)
 *
 * Returns {fields, descriptions}: the fields the lock hash had (owner, value: the holders removed;
 * {} when it was free) and, for each holder, its description from the info hash ('' when none; a
 * grant not yet taken up is described by its waiter's). A key of another type is left alone.
 */
export const FORCE_UNLOCK_SCRIPT = new LuaScript(
  'force-unlock',
  `
local key, fence, line, deadlines = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local message, sharded, grant = ARGV[1], ARGV[2], tonumber(ARGV[3])
if redis.call('type', key).ok ~= 'hash' then return {{}, {}} end
local removed, described = redis.call('hgetall', key), {}
redis.call('del', key)
for i = 1, #removed, 2 do
  local owner = removed[i]
  local waiter = string.match(owner, '^([^:]+):')
  described[#described + 1] = redis.call('hget', KEYS[5], owner) or (waiter and redis.call('hget', KEYS[5], waiter)) or ''
  redis.call('hdel', KEYS[5], owner)
end
${HAND_ON_LUA}
return {removed, described}
`,
);
