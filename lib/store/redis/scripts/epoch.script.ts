import { LuaScript } from './lua-script';

/**
 * epoch: the marker of a data set, so that a process holding locks notices when Redis has lost
 * them behind its back (a restart without persistence, FLUSHALL): the marker goes with them.
 *
 * KEYS[1]  the marker (a string, no expiry), in the hash slot of a lock the caller holds
 * ARGV[1]  a fresh random value, set when there is no marker
 *
 * Returns the marker's value: one the caller has not seen before means the data set changed since
 * it last looked (another process may have set the new marker first). Safe to run twice: the second
 * copy finds the marker the first one set.
 */
export const EPOCH_SCRIPT = new LuaScript(
  'epoch',
  `
local value = redis.call('get', KEYS[1])
if value then return value end
redis.call('set', KEYS[1], ARGV[1])
return ARGV[1]
`,
);
