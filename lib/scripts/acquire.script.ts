import { LuaScript } from './lua-script';

/**
 * acquire: take a free lock, or re-enter one the caller already owns.
 *
 * KEYS[1]  the lock hash
 * ARGV[1]  owner id
 * ARGV[2]  lease in ms (used only when the lock is taken, not on re-entry)
 * ARGV[3]  '1' to re-enter only: count up an existing hold of ARGV[1], never create the key
 *          (a re-entry leaves the lease alone: it belongs to the outermost acquisition)
 *
 * Returns {1, holdCount} when taken or re-entered, and {0, pttl} otherwise: another owner holds it
 * (pttl -1: the key has no expiry; a key of another type counts as held by someone else), or, when
 * re-entering, the caller's hold is gone (pttl -2 if the key does not exist).
 */
export const ACQUIRE_SCRIPT = new LuaScript(
  'acquire',
  `
local key, owner = KEYS[1], ARGV[1]
if ARGV[3] == '1' then
  if redis.call('type', key).ok == 'hash' and redis.call('hexists', key, owner) == 1 then
    return {1, redis.call('hincrby', key, owner, 1)}
  end
  return {0, redis.call('pttl', key)}
end
if redis.call('exists', key) == 0 then
  redis.call('hset', key, owner, 1)
  redis.call('pexpire', key, ARGV[2])
  return {1, 1}
end
return {0, redis.call('pttl', key)}
`,
);
