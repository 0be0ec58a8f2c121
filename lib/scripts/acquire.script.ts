import { LuaScript } from './lua-script';

/**
 * acquire: take a free lock and issue its fencing token, or re-enter one the caller already owns.
 *
 * KEYS[1]  the lock hash
 * KEYS[2]  the fencing counter of KEYS[1]'s hash slot (a string: the last token issued there)
 * ARGV[1]  owner id
 * ARGV[2]  lease in ms (used only when the lock is taken, not on re-entry)
 * ARGV[3]  '1' to re-enter only: count up an existing hold of ARGV[1], never create the key
 *          (a re-entry leaves the lease alone: it belongs to the outermost acquisition)
 *
 * Returns {1, holdCount, token} when taken, {1, holdCount} when re-entered (the holder keeps the
 * token it got), and {0, pttl} otherwise: another owner holds it (pttl -1: the key has no expiry;
 * a key of another type counts as held by someone else), or, when re-entering, the caller's hold
 * is gone (pttl -2 if the key does not exist).
 *
 * The token is the server's clock in microseconds, or the slot's last token + 1 when that is not
 * smaller: it grows strictly with every acquisition in the slot, across releases and expiries, and
 * stays above tokens issued before a restart that lost the counter as long as the clock has moved
 * on. Redis >= 5 replicates the script's effects, so calling TIME before writing is allowed.
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
  local now = redis.call('time')
  local token = tonumber(now[1]) * 1000000 + tonumber(now[2])
  local last = tonumber(redis.call('get', KEYS[2]))
  if last and last >= token then token = last + 1 end
  redis.call('set', KEYS[2], string.format('%.0f', token))
  redis.call('hset', key, owner, 1)
  redis.call('pexpire', key, ARGV[2])
  return {1, 1, token}
end
return {0, redis.call('pttl', key)}
`,
);
