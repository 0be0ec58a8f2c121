import { LuaScript } from './lua-script';

/**
 * release: drop one hold (or, forced, all holds) of the caller's lock.
 *
 * KEYS[1]  the lock hash
 * ARGV[1]  owner id
 * ARGV[2]  '1' to drop every hold at once (shutdown), '0' to drop one
 *
 * Returns 0 when the caller does not own the lock (nothing changed), 1 when the key was deleted,
 * 2 when the hold count went down and the lock is still held by the caller.
 */
export const RELEASE_SCRIPT = new LuaScript(
  'release',
  `
local key, owner = KEYS[1], ARGV[1]
if redis.call('type', key).ok ~= 'hash' or redis.call('hexists', key, owner) == 0 then
  return 0
end
if ARGV[2] ~= '1' and redis.call('hincrby', key, owner, -1) > 0 then
  return 2
end
redis.call('del', key)
return 1
`,
);
