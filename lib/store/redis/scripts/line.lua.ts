/**
 * Someone waits behind an exclusive hold: the field `=~<holder>` (a DESCRIPTION_MARK field, so
 * every script that reads holds skips it), valued 1, set by a waiter that takes its place in the
 * line of a lock held exclusively (or granted), by a grant made with others behind its head, and by
 * a hold taken from the line while others remain in it. It lets the release of an exclusive hold
 * learn from its one HDEL (the hold, its description and this mark: 3 fields, or 2 with nobody
 * waiting) whether anyone waits, instead of asking the line with one more command every time.
 * Named after its holder, so that a release by anyone else (a lock lost and released late, a
 * re-sent release) never drops another holder's mark. A mark that outlives the waiters behind it
 * (their places lapsed) only sends that release the longer way, which finds the line empty.
 * Shared holds carry no mark: their release always looks at the line.
 */
export const WAITING_MARK = '=~';

/**
 * After `redis.pcall` on a key that may hold another type: a WRONGTYPE error means "not a lock of
 * ours" (the caller goes on); any other error (an ACL refusal, say) fails the script with it, so
 * that it is not mistaken for that.
 */
export const RAISE_UNLESS_WRONGTYPE_LUA = (reply: string): string => `
if type(${reply}) == 'table' and ${reply}.err then
  if string.sub(${reply}.err, 1, 9) ~= 'WRONGTYPE' then return redis.error_reply(${reply}.err) end
  ${reply} = false
end
`;

/**
 * The first word of the error a script fails with when the fencing counter key of a lock's slot
 * holds another type than a string (followed by its type and the key): someone else's key sits at
 * the library's name.
 */
export const FOREIGN_FENCE_ERROR = 'DISLOCK_FOREIGN_FENCE';

/**
 * The first word of the error a script fails with when the key at a lock's name holds another
 * type than a hash (followed by its type and the key): someone else's key, not a lock held by
 * another owner, which no wait would ever see released.
 */
export const FOREIGN_KEY_ERROR = 'DISLOCK_FOREIGN_KEY';

/**
 * After `redis.pcall` of a hash command on the lock `key`: a WRONGTYPE error fails the script with
 * FOREIGN_KEY_ERROR (nothing written before it may be left half-done: use it before the first
 * write); any other error fails it as it came.
 */
export const FOREIGN_KEY_LUA = (reply: string): string => `
if type(${reply}) == 'table' and ${reply}.err then
  if string.sub(${reply}.err, 1, 9) == 'WRONGTYPE' then
    return redis.error_reply('${FOREIGN_KEY_ERROR} ' .. redis.call('type', key).ok .. ' ' .. key)
  end
  return redis.error_reply(${reply}.err)
end
`;

/** A Lua expression: the server's time in ms. */
export const SERVER_MS_LUA = `(function()
  local clock = redis.call('time')
  return tonumber(clock[1]) * 1000 + math.floor(tonumber(clock[2]) / 1000)
end)()`;

/**
 * Drops the places that have lapsed from a lock's line. Expects `line`, `deadlines` (see
 * acquire.script.ts) and `ms` (the server's time in ms) as locals.
 */
export const DROP_LAPSED_LUA = `
local lapsed = redis.call('zrangebyscore', deadlines, '-inf', ms)
if #lapsed > 0 then
  redis.call('zrem', line, unpack(lapsed))
  redis.call('zremrangebyscore', deadlines, '-inf', ms)
end
`;

/** DROP_LAPSED_LUA at the server's present time, for a script that has not read it yet. */
export const DROP_LAPSED_NOW_LUA = `
do
  local now = redis.call('time')
  local ms = tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000)
  ${DROP_LAPSED_LUA}
end
`;

/**
 * Issues the next fencing token of a hash slot into the local `token`. Expects `now` (the reply of
 * TIME) and `fence` (the slot's counter, a string holding the last token issued there) as locals.
 *
 * The token is the server's clock in microseconds, or the slot's last token + 1 when that is not
 * smaller: it grows strictly with every acquisition in the slot, across releases and expiries, and
 * stays above tokens issued before a restart that lost the counter as long as the clock has moved
 * on. Redis >= 5 replicates the script's effects, so calling TIME before writing is allowed.
 *
 * One command while the clock runs ahead of the counter (every uncontended acquisition): SET ... GET
 * writes the clock's token and reads the last one together; only a counter at or past the clock
 * (two tokens within one microsecond, a clock stepped back) costs a second SET. A counter that is
 * not a string (someone else's key) fails the script with FOREIGN_FENCE_ERROR.
 */
export const NEXT_TOKEN_LUA = `
local token = tonumber(now[1]) * 1000000 + tonumber(now[2])
local last = redis.pcall('set', fence, string.format('%.0f', token), 'GET')
if type(last) == 'table' and last.err then
  if string.sub(last.err, 1, 9) == 'WRONGTYPE' then
    return redis.error_reply('${FOREIGN_FENCE_ERROR} ' .. redis.call('type', fence).ok .. ' ' .. fence)
  end
  -- a server older than 6.2 (no SET ... GET): read, then write
  last = redis.call('get', fence)
  redis.call('set', fence, string.format('%.0f', token))
end
last = tonumber(last)
if last and last >= token then
  token = last + 1
  redis.call('set', fence, string.format('%.0f', token))
end
`;

/**
 * Publishes `announcement` on the lock's channel: SPUBLISH in its shard on a Cluster (`sharded`
 * '1'), PUBLISH otherwise or where the server has no sharded pub/sub (Redis < 7). Expects `key`
 * (the lock, also the channel) and `sharded` as locals.
 */
export const PUBLISH_LUA = (announcement: string): string => `
if sharded ~= '1' or type(redis.pcall('spublish', key, ${announcement})) ~= 'number' then
  redis.call('publish', key, ${announcement})
end
`;

/**
 * The head of the line (`head`, '' for none) has been named to look at once, not granted anything
 * (it waits for a shared hold, see GRANT_LUA): its place now lapses within `grant` ms unless its
 * attempt comes and renews it. A head that died then holds a free lock up no longer than a grant
 * to a dead writer does, instead of until its place would have lapsed (PLACE_MS). Expects `head`,
 * `deadlines`, `ms` (the server's time in ms) and `grant` as locals.
 */
export const HEAD_TURN_LUA = `
if head ~= '' and grant then
  local lapses = tonumber(redis.call('zscore', deadlines, head))
  if lapses and lapses > ms + grant then redis.call('zadd', deadlines, ms + grant, head) end
end
`;

/**
 * The Lua shared by release, leave and acquire: a lock is free; hand it to the head of its line,
 * and announce that.
 *
 * Expects `key` (the lock, also the channel), `fence` (its slot's fencing counter), `line`,
 * `deadlines` (see acquire.script.ts; lapsed places already dropped), `waiting` (whether the line
 * existed: no line, no lookup), `message` (the announcing store's id and sequence), `sharded`
 * ('1': SPUBLISH) and `grant` (ms the head has to take up the lock) as locals. Sets `head`,
 * `second` and `granted`.
 *
 * With someone in the line, the lock is granted to its head: the hash gets the field
 * `<head>:<token>` (the head's owner id for this grant, unique because the token is) with the
 * value 0 (granted, not yet taken up), a lease of `grant` ms and a fresh fencing token; the head
 * leaves the line. The head's process learns it from `message:head:second:token` (or from the
 * release's own reply) and its next attempt takes the grant up (see acquire.script.ts): the hold
 * starts on that attempt's answer, with the attempt's own lease; nobody holds a lock on a grant
 * alone. A head that died holds the lock up for only `grant` ms: the second in line, named in the
 * announcement, looks once that has passed.
 * A shared waiter at the head (a reader or a semaphore's: its waiting line's id starts with 's', see
 * `WaitLine.newSeat`) is granted nothing, since it takes a shared hold: `message:head:second:`
 * (no token) wakes its process alone, to look at once, and the second in line later, in case the
 * head has left the line; the head's place lapses within `grant` ms unless it looks
 * (HEAD_TURN_LUA), so a head that died holds the lock up no longer than a dead writer's grant.
 * The other waiters sleep on. A line whose places have all lapsed: `message:::`, and everyone
 * looks. No line at all: nothing is announced (nobody waits: a waiter keeps its place by looking
 * at least every `lineRefreshMs`, well within the place's PLACE_MS, so one whose place lapsed has
 * stalled that long and looks again on its own), and the uncontended release costs no PUBLISH.
 */
export const GRANT_LUA = `
local head, second, granted = '', '', ''
local first = waiting and redis.call('zrange', line, 0, 1) or {}
if first[1] then head, second = first[1], first[2] or '' end
if head ~= '' and string.sub(head, 1, 1) ~= 's' then
  local now = redis.call('time')
  ${NEXT_TOKEN_LUA}
  granted = string.format('%.0f', token)
  -- The key was deleted or never existed: the grant is its only hold (see FIND_GRANT_LUA); with
  -- others behind the head, it carries the waiting mark (see WAITING_MARK).
  if second ~= '' then
    redis.call('hset', key, head .. ':' .. granted, 0, '${WAITING_MARK}' .. head .. ':' .. granted, 1)
  else
    redis.call('hset', key, head .. ':' .. granted, 0)
  end
  redis.call('pexpire', key, grant)
  redis.call('zrem', line, head)
  redis.call('zrem', deadlines, head)
elseif head ~= '' then
  local ms = ${SERVER_MS_LUA}
  ${HEAD_TURN_LUA}
end
if waiting then
  local announcement = message .. ':' .. head .. ':' .. second .. ':' .. granted
  ${PUBLISH_LUA('announcement')}
end
`;

/**
 * Sets `head` and `second` to the first two places of the lock's line after dropping the lapsed
 * ones ('' where there are fewer), for an announcement that names who looks first (see GRANT_LUA);
 * the head's place then lapses within `grant` ms unless it looks (HEAD_TURN_LUA). Sets `queued`:
 * whether the line exists. Expects `line`, `deadlines`, `ms` (the server's time in ms) and `grant`
 * as locals.
 */
export const LINE_HEAD_LUA = `
local head, second, queued = '', '', redis.call('exists', line) == 1
if queued then
  ${DROP_LAPSED_LUA}
  local first = redis.call('zrange', line, 0, 1)
  head, second = first[1] or '', first[2] or ''
  ${HEAD_TURN_LUA}
end
`;

/**
 * Shared holds were just dropped from `key`: settle the others (SETTLE_SHARED_LUA); while some
 * remain, announce the room left to the head of the line (who looks at once) and the second (who
 * looks once the head's turn has passed), if there is a line (or `always`, a Lua expression, is
 * true), and return `result`. Expects SETTLE_SHARED_LUA's and
 * LINE_HEAD_LUA's locals but `ms`, which it sets.
 */
export const SHARED_DROPPED_LUA = (result: string, always = 'false'): string => `
local ms = ${SERVER_MS_LUA}
${SETTLE_SHARED_LUA}
if live > 0 then
  ${LINE_HEAD_LUA}
  if queued or ${always} then
    local announcement = message .. ':' .. head .. ':' .. second .. ':'
    ${PUBLISH_LUA('announcement')}
  end
  return ${result}
end
`;

/**
 * The lock `key` has just been freed: drop the lapsed places of its line, then hand it to the head
 * (GRANT_LUA), or announce it free: only if there is a line, or `always` (a Lua expression) is
 * true. Expects GRANT_LUA's locals but `waiting`, which it sets.
 */
export const HAND_ON_LUA = (always = 'false'): string => `
local waiting = ${always} or redis.call('exists', line) == 1
if waiting then
  ${DROP_LAPSED_NOW_LUA}
end
${GRANT_LUA}
`;

/**
 * Reads the lock hash `key` for an attempt that found it held by another owner: sets `holder` to
 * its exclusive hold's field (a hold valued `1`, or a grant not taken up yet, `0`; false when the
 * hash has shared holds, or is not a hash), `marked` to whether that hold carries the waiting mark
 * (see WAITING_MARK), and `grant_field` to the holder's field when it is a grant to `waiter`
 * (`<waiter>:<token>`, see GRANT_LUA), else false. Expects `key` and `waiter` as locals.
 */
export const FIND_GRANT_LUA = `
local grant_field, holder, marked = false, false, false
local fields = redis.pcall('hgetall', key)
${RAISE_UNLESS_WRONGTYPE_LUA('fields')}
if fields then
  local holds, marks, value = 0, {}, nil
  for i = 1, #fields, 2 do
    local field = fields[i]
    if string.sub(field, 1, 2) == '${WAITING_MARK}' then
      marks[string.sub(field, 3)] = true
    elseif string.sub(field, 1, 1) ~= '=' then
      holds = holds + 1
      holder, value = field, fields[i + 1]
    end
  end
  if holds ~= 1 or tonumber(value) > 1 then holder = false end
  marked = holder and marks[holder] or false
  if holder and value == '0' and string.sub(holder, 1, #waiter + 1) == waiter .. ':' then
    grant_field = holder
  end
end
`;

/**
 * Defines `take_place()`: the waiter `waiter` takes (or keeps) its place in the lock's line, which
 * lapses ARGV[4] ms from now unless another attempt renews it. Expects `line`, `deadlines`,
 * `waiter` and `now` (the reply of TIME) as locals.
 */
export const TAKE_PLACE_LUA = `
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
`;

/**
 * A lock hash holds either one exclusive hold (its field's value `1`, or `0` for a grant not yet
 * taken up) or any number of shared holds (readers, a semaphore's permits), each valued with the
 * end of its own lease in the server's ms; the key's PTTL is the latest of those ends.
 *
 * SETTLE_SHARED_LUA drops the shared holds of `key` whose lease has ended, sets the key's PTTL to
 * the latest end left, and deletes the key when no hold is left. Expects `key` and `ms` (the
 * server's time in ms) as locals; sets `live` (the holds left).
 */
export const SETTLE_SHARED_LUA = `
local live, latest, lapsed = 0, 0, {}
local holders = redis.call('hgetall', key)
for i = 1, #holders, 2 do
  local field = holders[i]
  if string.sub(field, 1, 1) ~= '=' then
    local ends = tonumber(holders[i + 1])
    if ends <= 1 then
      live, latest = live + 1, math.huge
    elseif ends <= ms then
      lapsed[#lapsed + 1] = field
      lapsed[#lapsed + 1] = '=' .. field
    else
      live = live + 1
      if ends > latest then latest = ends end
    end
  end
end
if #lapsed > 0 then redis.call('hdel', key, unpack(lapsed)) end
if live == 0 then
  redis.call('del', key)
elseif latest ~= math.huge then
  redis.call('pexpire', key, latest - ms)
end
`;

/**
 * A holder's description for `inspect` lives in the lock hash itself, beside its hold: the field
 * `=<owner>` (no owner or waiter id starts with `=`), valued `<since ms>|<fencing token>|<what the
 * caller sent>`. It goes with the hold: deleted with the key, dropped with a shared hold, and it
 * never outlives the lock by its own expiry. Every script that reads a hash's holds skips these.
 */
export const DESCRIPTION_MARK = '=';

/**
 * The first character of the description of a hold that came by a local hand-over (see the
 * acquire script's ARGV[10]), so that a re-sent copy of that hand-over can tell it from an
 * ordinary acquisition by its first run.
 */
export const HANDED_OVER_MARK = '>';

/**
 * Defines `hold(owner, value, token, waited, handed)`: set the owner's hold in the lock hash `key`
 * to `value` (1 for an exclusive hold, the end of its lease in ms for a shared one), its
 * description (see DESCRIPTION_MARK: what the caller sent in ARGV[infoArg], recorded with `token`;
 * with nothing sent, only the time and token; begun with HANDED_OVER_MARK when `handed`) and, when
 * `waited`, the waiting mark (WAITING_MARK): one HSET. Every hold has its description, so that the
 * release of an exclusive one drops exactly 2 fields when nobody waits. Expects `key` and `now`
 * (the script's reply of TIME) as locals.
 */
export const HOLD_LUA = (infoArg: number): string => `
local function hold(owner, value, token, waited, handed)
  local since = tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000)
  local described = (handed and '${HANDED_OVER_MARK}' or '') .. string.format('%.0f', since) .. '|' .. token .. '|' .. (ARGV[${infoArg}] or '')
  if waited then
    redis.call('hset', key, owner, value, '=' .. owner, described, '${WAITING_MARK}' .. owner, 1)
  else
    redis.call('hset', key, owner, value, '=' .. owner, described)
  end
end
`;
