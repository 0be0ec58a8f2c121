import { LuaScript } from './lua-script';

/**
 * release: drop one hold (or, forced, all holds) of the caller's lock, and announce a freed lock.
 *
 * KEYS[1]  the lock hash; also the pub/sub channel that waiters for it listen on
 * ARGV[1]  owner id
 * ARGV[2]  '1' to drop every hold at once (shutdown), '0' to drop one
 * ARGV[3]  the message to publish when the key is deleted: the releasing store's id, so that it
 *          can tell its own announcements (already handled locally) from other processes'
 * ARGV[4]  how many of the channel's subscribers are the releasing store's own (0 or 1)
 *
 * Returns 0 when the caller does not own the lock (nothing changed), 1 when the key was deleted
 * (and the release published), 2 when the hold count went down and the lock is still held, 3 when
 * the key was deleted and someone else was listening for it (other processes are waiting).
 */
export const RELEASE_SCRIPT = new LuaScript(
  'release',
  `
local key, owner = KEYS[1], ARGV[1]
-- pcall: a key of another type answers WRONGTYPE, which means 'not ours' here, not a failure
local holds = redis.pcall('hget', key, owner)
if type(holds) ~= 'string' then
  return 0
end
if ARGV[2] ~= '1' and tonumber(holds) > 1 then
  redis.call('hincrby', key, owner, -1)
  return 2
end
redis.call('del', key)
if redis.call('publish', key, ARGV[3]) > tonumber(ARGV[4]) then
  return 3
end
return 1
`,
);
