import {
  DROP_LAPSED_LUA,
  FOREIGN_KEY_LUA,
  HANDED_OVER_MARK,
  HOLD_LUA,
  LINE_HEAD_LUA,
  NEXT_TOKEN_LUA,
  PUBLISH_LUA,
  TAKE_PLACE_LUA,
  WAITING_MARK,
} from './line.lua';
import { LuaScript } from './lua-script';

/**
 * acquire-shared: take a shared hold (a reader of a read-write lock, or one of a semaphore's
 * permits) for a new owner and issue its fencing token; or, for a caller that waits, take (or keep)
 * its place in the lock's line. The hash holds either one exclusive hold or shared holds, each
 * valued with the end of its own lease (see SETTLE_SHARED_LUA in line.lua.ts).
 *
 * KEYS[1]  the lock hash
 * KEYS[2]  the fencing counter of KEYS[1]'s hash slot
 * KEYS[3]  the lock's line, KEYS[4] its deadlines (see acquire.script.ts)
 * ARGV[1]  owner id: fresh for every attempt
 * ARGV[2]  lease in ms
 * ARGV[3]  waiter id ('' for a caller that does not wait)
 * ARGV[4]  ms a place is kept without being renewed by another attempt
 * ARGV[5]  '1' on a Cluster: announce with SPUBLISH (see release.script.ts)
 * ARGV[6]  the message to announce with (the store's id), see below
 * ARGV[7]  the most shared holds the caller allows at once: a semaphore's permits; 0, no bound
 *          (readers)
 * ARGV[8]  what to describe the holder with, as in acquire.script.ts
 * KEYS[5]  on a Cluster, the slot's guard: never written (see `slotGuardFor`)
 * ARGV[9]  ms a head named to look has to do so before its place lapses (see HEAD_TURN_LUA)
 * ARGV[10] sent only for a local hand-over: the owner id of a live shared hold of the same
 *          application that hands its place to this attempt instead of releasing it (see below)
 *
 * Returns {1, token} when taken; {0, pttl} when an exclusive hold (a writer) has the key, pttl its
 * remaining lease (a key of another type fails the script, see acquire.script.ts); {0, ms} when ARGV[7] shared holds have it, ms until
 * the first of their leases ends; {0, -3, turn} when it could be taken but other waiters are ahead
 * in its line: a newcomer never jumps the line, so a writer that waits is not overtaken by readers
 * that come after it. `turn` is the ms until the head's place lapses unless it looks again.
 *
 * Each holder's lease is its own: a holder that died stops counting once its lease has ended
 * (its field is dropped by the next script that looks), without freeing anyone else's.
 *
 * A waiter whose line was granted an exclusive hold (see GRANT_LUA) takes the grant up, as a
 * shared hold. A waiter that takes a hold leaves the line; if others wait behind it and a hold is
 * still free, it announces so, naming the new head of the line (`message:head:second:`, see
 * GRANT_LUA): that one looks at once.
 *
 * Changing the bound for a name that has holders is defined by each attempt: it is taken while
 * fewer holds than the attempt's own bound are live, so a lower bound admits nobody new until
 * enough holders have gone, and a higher one admits more at once.
 *
 * A local hand-over (ARGV[10], `from`; the caller sends it for a semaphore's permits): while
 * `from` holds a live shared hold and the other live holds leave room under this attempt's own
 * bound, `from`'s hold and description are replaced by the new owner's (its description begun with
 * HANDED_OVER_MARK), with a fresh token and the new owner's own lease, and the answer is
 * {1, token, 1}. The number of holds never changes in that step, so nobody else is let in or kept
 * out by it; who waits in the line is the caller's business, as in acquire.script.ts. A waiter
 * whose place leaves the line that way passes the turn on, as one that takes a hold does: with a
 * permit still free, the next in line is named to look. When `from` holds nothing live, or its hold cannot pass under this attempt's
 * bound, the attempt is an ordinary one (and `from` keeps its hold).
 *
 * The uncontended path (nobody holds it, nobody waits: one EXISTS answers both) reads the clock,
 * issues the token and writes the hold: 5 commands, as acquire.script.ts's.
 *
 * Safe to run twice: a re-sent copy finds its own owner id already holding, and answers "taken"
 * again with a new token, as the acquire script does; a re-sent hand-over answers {1, token, 2}
 * when its first run handed over (the hold's description says so), {1, token, 3} when it did not.
 */
export const ACQUIRE_SHARED_SCRIPT = new LuaScript(
  'acquire-shared',
  `
local key, fence, owner, waiter = KEYS[1], KEYS[2], ARGV[1], ARGV[3]
local line, deadlines = KEYS[3], KEYS[4]
local lease, limit, grant, from = tonumber(ARGV[2]), tonumber(ARGV[7]), tonumber(ARGV[9]), ARGV[10]
local now = redis.call('time')
local ms = tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000)
${TAKE_PLACE_LUA}
${HOLD_LUA(8)}
local function busy(ttl, turn)
  if waiter ~= '' then take_place() end
  return {0, ttl, turn}
end
if redis.call('exists', key, line) == 0 then
  -- nobody holds it, nobody waits: the uncontended path (no hold to read, no line to look at)
  ${NEXT_TOKEN_LUA}
  hold(owner, ms + lease, string.format('%.0f', token))
  redis.call('pexpire', key, lease)
  return {1, token}
end
-- pcall: a key of another type is someone else's (FOREIGN_KEY_LUA)
local holders = redis.pcall('hgetall', key)
${FOREIGN_KEY_LUA('holders')}
local live, soonest, latest, lapsed, granted, again, passing = 0, math.huge, 0, {}, false, false, false
for i = 1, #holders, 2 do
  local field, ends = holders[i], tonumber(holders[i + 1])
  if string.sub(field, 1, 1) == '=' then
    -- a holder's description (see DESCRIPTION_MARK), not a hold
  elseif ends == 0 and waiter ~= '' and string.sub(field, 1, #waiter + 1) == waiter .. ':' then
    granted = field
  elseif ends <= 1 then
    -- an exclusive hold (or a grant): a waiter marks it, so that its release hands on (WAITING_MARK)
    if waiter ~= '' then redis.call('hset', key, '${WAITING_MARK}' .. field, 1) end
    return busy(redis.call('pttl', key))
  elseif ends <= ms then
    lapsed[#lapsed + 1] = field
    lapsed[#lapsed + 1] = '=' .. field
  elseif field == from then
    -- the hold handed over (ARGV[10]): not counted, it gives its place to this one
    passing = true
    if ends < soonest then soonest = ends end
    if ends > latest then latest = ends end
  else
    -- a copy of this very call, re-sent after a lost reply, took it already
    if field == owner then again = true else live = live + 1 end
    if ends < soonest then soonest = ends end
    if ends > latest then latest = ends end
  end
end
-- a re-sent copy: whether its first run was handed a hold, from its description (see HOLD_LUA)
local handed = again and from and string.sub(redis.call('hget', key, '=' .. owner) or '', 1, 1) == '${HANDED_OVER_MARK}'
-- a local hand-over: \`from\`'s hold gives its place to this one, the number of holds unchanged
local handing = passing and not again and not granted and (limit == 0 or live < limit)
-- not handed over: \`from\` keeps its hold, which counts as any other
if passing and not handing then live = live + 1 end
if not again and not granted and not handing then
  if limit > 0 and live >= limit then return busy(soonest - ms) end
  if redis.call('exists', line) == 1 then
    ${DROP_LAPSED_LUA}
    local head = redis.call('zrange', line, 0, 0)[1]
    if head and head ~= waiter then return busy(-3, tonumber(redis.call('zscore', deadlines, head)) - ms) end
  end
end
-- the token first: a foreign counter fails the script before anything is written
${NEXT_TOKEN_LUA}
if #lapsed > 0 then redis.call('hdel', key, unpack(lapsed)) end
if granted then redis.call('hdel', key, granted, '${WAITING_MARK}' .. granted) end
if handing then redis.call('hdel', key, from, '=' .. from) end
local ends = ms + lease
hold(owner, ends, string.format('%.0f', token), false, handing or handed)
if ends > latest then redis.call('pexpire', key, lease) end
local left = waiter ~= '' and redis.call('zrem', line, waiter) == 1
if left then redis.call('zrem', deadlines, waiter) end
-- A waiter that took a hold (from the head of the line, or by taking up a grant, which had
-- already taken it out of the line) leaves room behind it: the next in line looks at once. One
-- handed a hold passes the turn on only if its place left the line just now.
if waiter ~= '' and (left or not handing) and (limit == 0 or live + 1 < limit) and redis.call('exists', line) == 1 then
  ${LINE_HEAD_LUA}
  local message, sharded = ARGV[6] .. ':' .. head .. ':' .. second .. ':', ARGV[5]
  ${PUBLISH_LUA('message')}
end
if handing then return {1, token, 1} end
if again and from then return {1, token, handed and 2 or 3} end
return {1, token}
`,
);
