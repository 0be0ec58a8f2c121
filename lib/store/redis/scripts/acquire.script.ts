import {
  DROP_LAPSED_LUA,
  FIND_GRANT_LUA,
  FOREIGN_KEY_LUA,
  GRANT_LUA,
  HANDED_OVER_MARK,
  HOLD_LUA,
  NEXT_TOKEN_LUA,
  TAKE_PLACE_LUA,
  WAITING_MARK,
} from './line.lua';
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
 * ARGV[6]  the message to announce a grant with (the store's id), see below
 * ARGV[7]  ms a grant to the head of the line lasts before the head takes it up (line.lua.ts)
 * ARGV[8]  what to describe the holder with, for `inspect` (its host, pid, application, caller),
 *          kept in the lock hash beside its hold (see DESCRIPTION_MARK); '' for nothing
 * KEYS[5]  on a Cluster, the slot's guard: never written (see `slotGuardFor`)
 * ARGV[9]  (read by acquire-shared only)
 * ARGV[10] sent only for a local hand-over: the owner id of an exclusive hold of the same
 *          application that hands the lock to this attempt instead of releasing it (see below)
 *
 * Returns {1, token} when taken, {0, pttl} when another owner holds it (pttl -1: the key has no
 * expiry), and {0, -3, turn} when it is free
 * but other waiters are ahead in its line: a newcomer never jumps the line. `turn` is how long the
 * head has to take it (the grant this attempt made it, or its turn to look): a head that died is
 * out of the way by then.
 *
 * The line exists only while someone waits: a waiter's place lapses ARGV[4] ms after its last
 * attempt (a waiter that died or gave up leaves by itself), lapsed places are dropped before the
 * head is read, and both line keys expire with the last place. A waiter that takes the lock
 * leaves the line.
 *
 * A release hands the lock to the head of the line (a grant, see line.lua.ts). An attempt by a
 * waiter that finds such a grant to itself not yet taken up (the announcement was missed or is
 * still on its way) takes it up under its own owner id, with the grant's token. A free lock with
 * others in the line (the holder's lease ran out: nothing announced it) is granted to the head by
 * the attempt that finds it so, as a release would have.
 *
 * The uncontended path (the lock free, its line empty: one EXISTS answers both) reads the clock,
 * issues the token and writes the hold: 5 commands. A key of another type at the lock's name fails
 * the script with FOREIGN_KEY_ERROR before anything is written (and one at its slot's fencing
 * counter with FOREIGN_FENCE_ERROR): it is someone else's key, not a lock held by another owner.
 *
 * A local hand-over (ARGV[10], `from`): a holder that has finished hands the lock to the next
 * waiter of its own process in one step instead of a release and an acquisition. While `from`
 * holds the lock, its hold, description and waiting mark are replaced by the new owner's (its
 * description begun with HANDED_OVER_MARK), with a fresh token and the new owner's lease, and the
 * answer is {1, token, 1}: the lock is never free
 * in between, so nobody else can take it then; who waits in the line is the caller's business (it
 * hands over only a bounded number of times in a row, see `HeldLock.handOversLeft`). The new
 * hold starts on this answer, as any hold does. When `from` holds nothing (its lease ran out, or
 * it was force-unlocked), the attempt is an ordinary one.
 *
 * Safe to run twice: a client that re-sends the command after a lost reply (ioredis does, by
 * default, when the connection drops) finds its own owner id already in the hash. That can only
 * be its own first run, so it answers "taken" again, with a new token: the first one never
 * reached the caller, and the new one is still larger than every token issued before it. A
 * re-sent hand-over answers {1, token, 2} when its first run handed over (the hold's description
 * says so), {1, token, 3} when `from` held nothing then and the first run took the lock as any
 * attempt does: a holder that had lost its lock is told so either way.
 */
export const ACQUIRE_SCRIPT = new LuaScript(
  'acquire',
  `
local key, fence, owner, waiter = KEYS[1], KEYS[2], ARGV[1], ARGV[3]
local line, deadlines = KEYS[3], KEYS[4]
local now = redis.call('time')
${HOLD_LUA(8)}
if redis.call('exists', key, line) == 0 then
  -- free, and nobody waits: the uncontended path
  ${NEXT_TOKEN_LUA}
  hold(owner, 1, string.format('%.0f', token))
  redis.call('pexpire', key, ARGV[2])
  return {1, token}
end
local from = ARGV[10]
if from then
  -- a local hand-over: pcall, a key of another type is someone else's (FOREIGN_KEY_LUA)
  local passing = redis.pcall('hget', key, from)
  ${FOREIGN_KEY_LUA('passing')}
  if passing == '1' then
    -- the token first: a foreign counter fails the script before anything is written
    ${NEXT_TOKEN_LUA}
    -- its hold, its description, and its waiting mark if it had one (3 fields), pass on at once
    local marked = redis.call('hdel', key, from, '=' .. from, '${WAITING_MARK}' .. from) == 3
    hold(owner, 1, string.format('%.0f', token), marked, true)
    redis.call('pexpire', key, ARGV[2])
    if waiter ~= '' and redis.call('zrem', line, waiter) == 1 then redis.call('zrem', deadlines, waiter) end
    return {1, token, 1}
  end
end
local free = redis.call('exists', key) == 0
${TAKE_PLACE_LUA}
local mine = not free and redis.pcall('hexists', key, owner)
${FOREIGN_KEY_LUA('mine')}
if not free and mine ~= 1 then
  if waiter ~= '' then
    ${FIND_GRANT_LUA}
    if grant_field then
      local granted = string.sub(grant_field, #waiter + 2)
      -- the grant's waiting mark, if it had one, passes to the hold (see WAITING_MARK)
      redis.call('hdel', key, grant_field, '${WAITING_MARK}' .. grant_field)
      hold(owner, 1, granted, marked)
      redis.call('pexpire', key, ARGV[2])
      return {1, tonumber(granted)}
    end
    take_place()
    -- the exclusive holder's release then knows that someone waits (see WAITING_MARK)
    if holder and not marked then redis.call('hset', key, '${WAITING_MARK}' .. holder, 1) end
  end
  return {0, redis.call('pttl', key)}
end
-- a re-sent copy of a hand-over: whether its first run handed over, from the hold's description
local again = from and not free and string.sub(redis.call('hget', key, '=' .. owner) or '', 1, 1)
local leaving = false
if free and redis.call('exists', line) == 1 then
  local ms = tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000)
  ${DROP_LAPSED_LUA}
  local head = redis.call('zrange', line, 0, 0)[1]
  if head and head ~= waiter then
    if waiter ~= '' then take_place() end
    local message, sharded, grant, waiting = ARGV[6], ARGV[5], tonumber(ARGV[7]), true
    ${GRANT_LUA}
    -- the head has grant ms at most to take it (its grant's lease, or its place's: HEAD_TURN_LUA)
    return {0, -3, grant}
  end
  leaving = head ~= nil
end
-- the token first: a foreign counter fails the script before anything is written
${NEXT_TOKEN_LUA}
if leaving then
  redis.call('zrem', line, waiter)
  redis.call('zrem', deadlines, waiter)
end
-- (others still in the line: the hold carries the waiting mark, see WAITING_MARK)
local waited = free and redis.call('exists', line) == 1
-- (not free: a re-sent copy of this call, see below; its description gets the new token)
hold(owner, 1, string.format('%.0f', token), waited, again == '${HANDED_OVER_MARK}')
if free then redis.call('pexpire', key, ARGV[2]) end
if again then return {1, token, again == '${HANDED_OVER_MARK}' and 2 or 3} end
return {1, token}
`,
);
