import { RAISE_UNLESS_WRONGTYPE_LUA, SERVER_MS_LUA, SETTLE_SHARED_LUA } from './line.lua';
import { LuaScript } from './lua-script';

/**
 * renew: extend the leases of locks their callers still own, many in one call. Never creates a key.
 *
 * KEYS[i]      a lock hash (all in one hash slot when the server is a Cluster)
 * ARGV[2i-1]   the owner id expected in KEYS[i]
 * ARGV[2i]     the lease in ms for KEYS[i]; negative: set the lease to exactly -ARGV[2i] ms, shorter
 *              or longer than it is (a hold that ends before `lockAtLeastFor` leaves the key to
 *              expire at that moment)
 *
 * Returns one number per key, in order: 1 when renewed (its lease is at least ARGV[2i] afterwards,
 * never shortened; or exactly -ARGV[2i]), 0 when the key is gone, holds another owner, or is not a
 * hash.
 *
 * A shared hold (a reader's, a permit's; see SETTLE_SHARED_LUA) keeps its lease in its own field,
 * set the same way; one whose lease has ended is dropped and answers 0 (its place may be taken).
 *
 * A lock granted by a release to the head of its line (value 0, see line.lua.ts) is taken up by
 * its first renewal: the value becomes 1, so that a later attempt from the head's line cannot
 * take it up a second time.
 */
export const RENEW_SCRIPT = new LuaScript(
  'renew',
  `
local renewed, ms = {}, nil
for i, key in ipairs(KEYS) do
  local owner, lease = ARGV[2 * i - 1], tonumber(ARGV[2 * i])
  -- pcall: a key of another type answers WRONGTYPE, which means 'not ours' here
  local held = redis.pcall('hget', key, owner)
  ${RAISE_UNLESS_WRONGTYPE_LUA('held')}
  local ends = held and tonumber(held)
  if ends and ends > 1 then
    -- a shared hold: its own lease, in its field; the key lasts as long as the latest
    ms = ms or ${SERVER_MS_LUA}
    if ends <= ms then
      redis.call('hdel', key, owner)
      renewed[i] = 0
    elseif lease < 0 then
      redis.call('hset', key, owner, ms - lease)
      ${SETTLE_SHARED_LUA}
      renewed[i] = 1
    else
      if ms + lease > ends then redis.call('hset', key, owner, ms + lease) end
      if redis.call('pttl', key) < lease then redis.call('pexpire', key, lease) end
      renewed[i] = 1
    end
  elseif held then
    if held == '0' then redis.call('hset', key, owner, 1) end
    if lease < 0 then
      redis.call('pexpire', key, -lease)
    elseif redis.call('pttl', key) < lease then
      redis.call('pexpire', key, lease)
    end
    renewed[i] = 1
  else
    renewed[i] = 0
  end
end
return renewed
`,
);
