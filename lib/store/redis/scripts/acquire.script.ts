import { ANNOUNCE_LUA, DROP_LAPSED_LUA } from './announce.lua';
import { LuaScript } from './lua-script';

/**
 * acquire: take a free lock for a new owner and issue its fencing token; or, for a caller that
 * waits, take (or keep) its place in the lock's line.
 *
 * KEYS[1]  the lock hash
 * KEYS[2]  the fencing counter of KEYS[1]'s hash slot (a string: the last token issued there)
 * KEYS[3]  the lock's line: a sorted set of waiter ids by arrival (server time in µs)
 * KEYS[4]  the line's deadlines: a sorted set of waiter ids by the ms their place lapses
 * ARGV[1]  owner id: fresh for every attempt, so no other caller ever sends it
 * ARGV[2]  lease in ms
 * ARGV[3]  waiter id ('' for a caller that does not wait): one per waiting line of a process
 * ARGV[4]  ms a place is kept without being renewed by another attempt
 * ARGV[5]  '1' on a Cluster: announce with SPUBLISH (see release.script.ts)
 * ARGV[6]  the message to announce with (the store's id), see below
 * ARGV[7]  ms the head of the line has to take a free lock before its place lapses
 *
 * Returns {1, token} when taken, {0, pttl} when another owner holds it (pttl -1: the key has no
 * expiry; a key of another type counts as held by someone else), and {0, -3} when it is free but
 * other waiters are ahead in its line: a newcomer never jumps the line.
 *
 * The line exists only while someone waits: a waiter's place lapses ARGV[4] ms after its last
 * attempt (a waiter that died or gave up leaves by itself), lapsed places are dropped before the
 * head is read, and both line keys expire with the last place. A waiter that takes the lock
 * leaves the line; when it was the head, it says so on the lock's channel (`taken::<waiter>`), so
 * that the waiter after it, which was told to look in case the head is gone, need not.
 *
 * A free lock whose head has not come (it died, or missed its turn: nothing announced a lease
 * that ran out, or the head after one that lapsed) is announced again, once, by the first attempt
 * that finds it so: the head's place is cut to ARGV[7] ms and head and second are named, as a
 * release does (announce.lua.ts), so that a dead head holds a free lock up for ARGV[7] ms, not
 * for the rest of its place.
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
local key, owner, waiter = KEYS[1], ARGV[1], ARGV[3]
local line, deadlines = KEYS[3], KEYS[4]
local free = redis.call('exists', key) == 0
local now = redis.call('time')
local function take_place()
  local ms = tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000)
  local keep = tonumber(ARGV[4])
  if not redis.call('zscore', line, waiter) then
    redis.call('zadd', line, tonumber(now[1]) * 1000000 + tonumber(now[2]), waiter)
  end
  redis.call('zadd', deadlines, ms + keep, waiter)
  for _, k in ipairs({line, deadlines}) do
    if redis.call('pttl', k) < keep then redis.call('pexpire', k, keep) end
  end
end
-- pcall: a key of another type answers WRONGTYPE, which means held by someone else
if not free and redis.pcall('hexists', key, owner) ~= 1 then
  if waiter ~= '' then take_place() end
  return {0, redis.call('pttl', key)}
end
if free and redis.call('exists', line) == 1 then
  local ms = tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000)
  ${DROP_LAPSED_LUA}
  local head = redis.call('zrange', line, 0, 0)[1]
  if head and head ~= waiter then
    if waiter ~= '' then take_place() end
    if tonumber(redis.call('zscore', deadlines, head)) > ms + tonumber(ARGV[7]) then
      do
        local message, sharded, grant = ARGV[6], ARGV[5], tonumber(ARGV[7])
        ${ANNOUNCE_LUA}
      end
    end
    return {0, -3}
  end
  if head then
    redis.call('zrem', line, waiter)
    redis.call('zrem', deadlines, waiter)
    if redis.call('exists', line) == 1 then
      local taken = 'taken::' .. waiter
      if ARGV[5] ~= '1' or type(redis.pcall('spublish', key, taken)) ~= 'number' then
        redis.call('publish', key, taken)
      end
    end
  end
end
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
