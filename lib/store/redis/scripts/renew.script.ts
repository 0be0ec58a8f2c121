import { RAISE_UNLESS_WRONGTYPE_LUA, SERVER_MS_LUA, SETTLE_SHARED_LUA } from './line.lua';
import { LuaScript } from './lua-script';

/**
 * renew: extend the leases of locks their callers still own, many in one call. Never creates a key.
 *
 * KEYS[i]      a lock hash (all in one hash slot when the server is a Cluster)
 * ARGV[2i-1]   the owner id expected in KEYS[i]
 * ARGV[2i]     the lease in ms for KEYS[i]; negative: set the lease to exactly -ARGV[2i] ms, shorter
 *              or longer than it is (a hold that ends before `lockAtLeastFor` leaves the key to
 *              expire at that moment); 0: only check that the owner still holds it (a fixed lease,
 *              verified but never extended), changing nothing
 *
 * Returns one number per key, in order: 1 when renewed (its lease is at least ARGV[2i] afterwards,
 * never shortened; or exactly -ARGV[2i]) or, for a check, still held; 0 when the key is gone, holds
 * another owner, or is not a hash.
 *
 * Out of memory (maxmemory reached under `noeviction`): Redis refuses a script's commands that may
 * allocate (HSET) until the script has written something, so a shared hold's renewal sets the
 * key's expiry (PEXPIRE, which Redis allows then) before its own field, as an exclusive one does:
 * a renewal is not refused for want of memory, whatever else is in its batch.
 *
 * A shared hold (a reader's, a permit's; see SETTLE_SHARED_LUA) keeps its lease in its own field,
 * set the same way; one whose lease has ended is dropped and answers 0 (its place may be taken).
 *
 * A lock granted by a release to the head of its line (value 0, see line.lua.ts) is taken up by
 * its first renewal: the value becomes 1, so that a later attempt from the head's line cannot
 * take it up a second time, and the hold gets its description (time and token), as every hold has.
 */
/**
 * A write that allocates nothing (the key's expiry set to what it is), so that Redis lets the
 * script's next write through when memory is full (see above). Expects `key` as a local.
 */
const TOUCH_LUA = `
local left = redis.call('pttl', key)
if left > 0 then redis.call('pexpire', key, left) end
`;

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
      if lease ~= 0 then redis.call('hdel', key, owner, '=' .. owner) end
      renewed[i] = 0
    elseif lease == 0 then
      renewed[i] = 1
    elseif lease < 0 then
      ${TOUCH_LUA}
      redis.call('hset', key, owner, ms - lease)
      ${SETTLE_SHARED_LUA}
      renewed[i] = 1
    else
      if redis.call('pttl', key) < lease then redis.call('pexpire', key, lease) end
      if ms + lease > ends then
        ${TOUCH_LUA}
        redis.call('hset', key, owner, ms + lease)
      end
      renewed[i] = 1
    end
  elseif held and lease == 0 then
    renewed[i] = 1
  elseif held then
    if lease < 0 then
      redis.call('pexpire', key, -lease)
    elseif redis.call('pttl', key) < lease then
      redis.call('pexpire', key, lease)
    end
    if held == '0' then
      -- with its description, as every hold has one (the release's count relies on it, see
      -- WAITING_MARK): the grant's token is its field's suffix
      ms = ms or ${SERVER_MS_LUA}
      local described = string.format('%.0f', ms) .. '|' .. (string.match(owner, ':(%d+)$') or '') .. '|'
      ${TOUCH_LUA}
      redis.call('hset', key, owner, 1, '=' .. owner, described)
    end
    renewed[i] = 1
  else
    renewed[i] = 0
  end
end
return renewed
`,
);
