import { LuaScript } from './lua-script';

/**
 * renew: extend the lease of a lock the caller still owns. Never creates a key.
 *
 * KEYS[1]  the lock hash
 * ARGV[1]  owner id
 * ARGV[2]  lease in ms
 *
 * Returns 1 when renewed (the lease is at least ARGV[2] afterwards, never shortened), 0 when the
 * key is gone, holds another owner, or is not a hash.
 */
export const RENEW_SCRIPT = new LuaScript(
  'renew',
  `
local key, owner, lease = KEYS[1], ARGV[1], tonumber(ARGV[2])
if redis.call('type', KEYS[1]).ok ~= 'hash' or redis.call('hexists', key, owner) == 0 then
  return 0
end
if redis.call('pttl', key) < lease then
  redis.call('pexpire', key, lease)
end
return 1
`,
);
