import { SHARED_OWNER_PREFIX } from '../../../core/owner-ids';
import { HAND_ON_LUA, RAISE_UNLESS_WRONGTYPE_LUA, SHARED_DROPPED_LUA, WAITING_MARK } from './line.lua';
import { LuaScript } from './lua-script';

/**
 * release: drop the caller's hold on its lock, hand the lock to the head of its line if anyone
 * waits there, and announce it. A shared hold (see SETTLE_SHARED_LUA) is dropped alone: the lock
 * is free once the last live one has gone, and a hold freed while others remain is announced.
 *
 * KEYS[1]  the lock hash; also the pub/sub channel that waiters for it listen on
 * KEYS[2]  the fencing counter of its hash slot
 * KEYS[3]  the lock's line, KEYS[4] its deadlines (see acquire.script.ts)
 * ARGV[1]  owner id
 * ARGV[2]  the message to publish when the key is deleted: the releasing store's id and the
 *          release's sequence number, so that it can tell its own announcements from others'
 * ARGV[3]  '1' on a Cluster: announce with SPUBLISH, in the key's shard, where its waiters listen;
 *          servers without sharded pub/sub (Redis < 7) fall back to PUBLISH
 * ARGV[4]  ms a grant to the head lasts before the head takes it up (see line.lua.ts)
 * ARGV[5]  '1': announce the release even when nobody is in the line (a Redlock node's store:
 *          Redlock's waiters keep no place in a line, and listen for every release)
 * KEYS[5]  on a Cluster, the slot's guard: never written (see `slotGuardFor`)
 *
 * Returns 0 when the caller does not hold the lock (nothing changed), {1, head, second, token}
 * when the key was deleted, or a shared hold dropped (and the release announced, if anyone waits): head and second
 * name the first two waiters in the line ('' when there are fewer); token is the fencing token of the grant to the
 * head ('' when nobody waits, or nobody is granted: a shared hold freed while others remain, or a
 * shared waiter at the head, which is named to look first).
 *
 * The uncontended path (an exclusive hold that nobody waits behind) is one HDEL: it checks the
 * owner and drops the hold with its description (and the key with its last fields), and its count
 * says that no waiting mark was there (see WAITING_MARK): nothing else is read, nothing announced.
 * Which kind of hold the owner has is in its id (SHARED_OWNER_PREFIX, see `OwnerIds`), not read from Redis.
 *
 * Idempotent: a re-sent copy finds the owner gone and changes nothing (it answers 0; the store
 * tells that apart from a lock lost before its release, see RedisLockStore.release). The hold
 * count of reentrant acquisitions lives in the process, so there is only ever one hold to drop.
 */
export const RELEASE_SCRIPT = new LuaScript(
  'release',
  `
local key, fence, line, deadlines, owner = KEYS[1], KEYS[2], KEYS[3], KEYS[4], ARGV[1]
local message, sharded, grant, always = ARGV[2], ARGV[3], tonumber(ARGV[4]), ARGV[5] == '1'
if string.sub(owner, 1, 1) ~= '${SHARED_OWNER_PREFIX}' then
  -- An exclusive hold: its field, its description and its waiting mark (WAITING_MARK) are all
  -- the hash holds, so the key goes with them. pcall: a key of another type answers WRONGTYPE,
  -- which means 'not ours' here, not a failure.
  local dropped = redis.pcall('hdel', key, owner, '=' .. owner, '${WAITING_MARK}' .. owner)
  ${RAISE_UNLESS_WRONGTYPE_LUA('dropped')}
  if not dropped or dropped == 0 then return 0 end
  -- the hold and its description: nobody waits
  if dropped == 2 and not always then return {1, '', '', ''} end
  -- someone waits (or the hold was written without its description: look all the same)
  redis.call('del', key)
else
  -- A shared hold: dropped alone; while others remain, they are settled, and a freed permit is
  -- announced to the head of the line (who looks at once) and the second (who looks once the
  -- head's turn has passed)
  local dropped = redis.pcall('hdel', key, owner, '=' .. owner)
  ${RAISE_UNLESS_WRONGTYPE_LUA('dropped')}
  if not dropped or dropped == 0 then return 0 end
  if not always and redis.call('exists', key, line) == 0 then return {1, '', '', ''} end
  if redis.call('exists', key) == 1 then
    ${SHARED_DROPPED_LUA("{1, head, second, ''}", 'always')}
  end
end
${HAND_ON_LUA('always')}
return {1, head, second, granted}
`,
);
