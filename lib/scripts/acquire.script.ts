import { LuaScript } from './lua-script';

/**
 * acquire: take a free lock, or re-enter one the caller already owns.
 *
 * KEYS[1]  the lock hash
 * ARGV[1]  owner id
 * ARGV[2]  lease in ms
 *
 * Returns {1, holdCount} when taken or re-entered (a re-entry never shortens the lease), and
 * {0, pttl} when another owner holds it (pttl -1: the key has no expiry; a key of another type
 * counts as held by someone else).
 */
export const ACQUIRE_SCRIPT = new LuaScript(
  'acquire',
  `
local key, owner, lease = KEYS[1], ARGV[1], tonumber(ARGV[2])
if redis.call('exists', key) == 0 then
  redis.call('hset', key, owner, 1)
  redis.call('pexpire', key, lease)
  return {1, 1}
end
if redis.call('type', key).ok == 'hash' and redis.call('hexists', key, owner) == 1 then
  local count = redis.call('hincrby', key, owner, 1)
  if redis.call('pttl', key) < lease then
    redis.call('pexpire', key, lease)
  end
  return {1, count}
end
return {0, redis.call('pttl', key)}
`,
);
