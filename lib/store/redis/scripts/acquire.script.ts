import { LuaScript } from './lua-script';

/**
 * acquire: take a free lock for a new owner and issue its fencing token.
 *
 * KEYS[1]  the lock hash
 * KEYS[2]  the fencing counter of KEYS[1]'s hash slot (a string: the last token issued there)
 * ARGV[1]  owner id: fresh for every attempt, so no other caller ever sends it
 * ARGV[2]  lease in ms
 *
 * Returns {1, token} when taken and {0, pttl} when another owner holds it (pttl -1: the key has
 * no expiry; a key of another type counts as held by someone else).
 *
 * Safe to run twice: a client that re-sends the command after a lost reply (ioredis does, by
 * default, when the connection drops) finds its own owner id already in the hash. That can only
 * be its own first run, so it answers "taken" again, with a new token: the first one never
 * reached the caller, and the new one is still larger than every token issued before it.
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
local free = redis.call('exists', key) == 0
-- pcall: a key of another type answers WRONGTYPE, which means held by someone else
if not free and redis.pcall('hexists', key, owner) ~= 1 then
  return {0, redis.call('pttl', key)}
end
local now = redis.call('time')
local token = tonumber(now[1]) * 1000000 + tonumber(now[2])
local last = tonumber(redis.call('get', KEYS[2]))
if last and last >= token then token = last + 1 end
redis.call('set', KEYS[2], string.format('%.0f', token))
if free then
  redis.call('hset', key, owner, 1)
  redis.call('pexpire', key, ARGV[2])
end
return {1, token}
`,
);
