import { HAND_ON_LUA, SHARED_DROPPED_LUA, WAITING_MARK } from './line.lua';
import { LuaScript } from './lua-script';

/**
 * force-unlock: an operator frees a lock from the holds it found there (read first, by the
 * inspect script). Each named hold still in the lock hash is dropped (its holder learns it at its
 * next renewal, which finds it gone), with its description; once no hold is left, the lock goes to
 * the head of its line, or is announced free (even with nobody in the line: it is rare, and a
 * waiter that keeps no place, a Redlock one, hears it at once). A shared hold dropped while others
 * remain is announced as a release of one is.
 *
 * KEYS[1]  the lock hash
 * KEYS[2]  the fencing counter of its hash slot
 * KEYS[3]  the lock's line, KEYS[4] its deadlines
 * KEYS[5]  on a Cluster, the slot's guard: never written (see `slotGuardFor`)
 * ARGV[1]  the message to announce with, ARGV[2] '1' on a Cluster, ARGV[3] the grant's ms (see release)
 * ARGV[4..] the owners (hash fields) to drop: the holds the operator's read found
 *
 * Returns the owners it dropped ({} when none of them held any more).
 *
 * Safe to run twice: it only ever drops the holds it is named, and owner ids are never used
 * again, so a re-sent copy finds them gone and changes nothing. In particular it cannot drop the
 * hold of the waiter that its first run handed the lock to (which a script dropping whatever it
 * finds would do, and then hand the lock to a third owner while the second is inside).
 */
export const FORCE_UNLOCK_SCRIPT = new LuaScript(
  'force-unlock',
  `
local key, fence, line, deadlines = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local message, sharded, grant = ARGV[1], ARGV[2], tonumber(ARGV[3])
if redis.call('type', key).ok ~= 'hash' then return {} end
local dropped, shared = {}, false
for i = 4, #ARGV do
  local owner = ARGV[i]
  local value = redis.call('hget', key, owner)
  if value then
    if tonumber(value) > 1 then shared = true end
    redis.call('hdel', key, owner, '=' .. owner, '${WAITING_MARK}' .. owner)
    dropped[#dropped + 1] = owner
  end
end
if #dropped == 0 then return dropped end
if shared then
  ${SHARED_DROPPED_LUA('dropped', 'true')}
end
redis.call('del', key)
${HAND_ON_LUA('true')}
return dropped
`,
);
