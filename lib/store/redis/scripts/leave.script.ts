import { DROP_LAPSED_NOW_LUA, FIND_GRANT_LUA, GRANT_LUA, LINE_HEAD_LUA, PUBLISH_LUA, SERVER_MS_LUA } from './line.lua';
import { LuaScript } from './lua-script';

/**
 * leave: a waiter gives up its place in a lock's line (it timed out, was aborted, or shut down).
 * A grant to it that it has not taken up is dropped. When the lock is then free and others still
 * wait, it goes to the new head at once, instead of after the place of the one who left lapses.
 * When the lock is held and the one who left headed the line, the new head is named to look (a
 * freed permit or read turn may have been announced to the one who left, see GRANT_LUA).
 *
 * KEYS[1]  the lock hash (the announcement's channel)
 * KEYS[2]  the fencing counter of its hash slot
 * KEYS[3]  the lock's line, KEYS[4] its deadlines (see acquire.script.ts)
 * ARGV[1]  waiter id
 * ARGV[2]  the message to announce with (the store's id and a sequence number)
 * ARGV[3]  '1' on a Cluster: SPUBLISH (see release.script.ts)
 * ARGV[4]  ms a grant to the new head lasts before it takes it up (see line.lua.ts)
 * KEYS[5]  on a Cluster, the slot's guard: never written (see `slotGuardFor`)
 *
 * Returns 1 when the lock was free and an announcement went out, 0 otherwise (also when the new
 * head of a held lock was named). Safe to run twice.
 */
export const LEAVE_SCRIPT = new LuaScript(
  'leave',
  `
local key, fence, line, deadlines, waiter = KEYS[1], KEYS[2], KEYS[3], KEYS[4], ARGV[1]
local message, sharded, grant = ARGV[2], ARGV[3], tonumber(ARGV[4])
local was_head = redis.call('zrange', line, 0, 0)[1] == waiter
redis.call('zrem', line, waiter)
redis.call('zrem', deadlines, waiter)
${FIND_GRANT_LUA}
local waiting = redis.call('exists', line) == 1
if grant_field then
  redis.call('del', key)
elseif not waiting then
  return 0
elseif redis.call('exists', key) == 1 then
  if was_head then
    local ms = ${SERVER_MS_LUA}
    ${LINE_HEAD_LUA}
    if head ~= '' then
      local announcement = message .. ':' .. head .. ':' .. second .. ':'
      ${PUBLISH_LUA('announcement')}
    end
  end
  return 0
end
if waiting then
  ${DROP_LAPSED_NOW_LUA}
end
${GRANT_LUA}
return 1
`,
);
