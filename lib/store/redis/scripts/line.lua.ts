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
 */
export const NEXT_TOKEN_LUA = `
local token = tonumber(now[1]) * 1000000 + tonumber(now[2])
local last = tonumber(redis.call('get', fence))
if last and last >= token then token = last + 1 end
redis.call('set', fence, string.format('%.0f', token))
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
 * leaves the line. The head's process learns it from `message:head:second:token` and holds the
 * lock from then on, with no round trip of its own; its first renewal takes the grant up (the
 * value becomes 1) and sets the lease it asked for. A head that died holds the lock up for only
 * `grant` ms: the second in line, named in the announcement, looks once that has passed.
 * Nobody in the line: `message:::`, and every local waiter looks.
 */
export const GRANT_LUA = `
local head, second, granted = '', '', ''
local first = waiting and redis.call('zrange', line, 0, 1) or {}
if first[1] then
  head, second = first[1], first[2] or ''
  local now = redis.call('time')
  ${NEXT_TOKEN_LUA}
  granted = string.format('%.0f', token)
  redis.call('hset', key, head .. ':' .. granted, 0)
  redis.call('pexpire', key, grant)
  redis.call('zrem', line, head)
  redis.call('zrem', deadlines, head)
end
local announcement = message .. ':' .. head .. ':' .. second .. ':' .. granted
if sharded ~= '1' or type(redis.pcall('spublish', key, announcement)) ~= 'number' then
  redis.call('publish', key, announcement)
end
`;

/**
 * Whether the lock hash `key` holds a grant to `waiter` that nobody has taken up yet (see
 * GRANT_LUA); sets `grant_field` to its field (`<waiter>:<token>`), or false. Expects `key` and
 * `waiter` as locals.
 */
export const FIND_GRANT_LUA = `
local grant_field = false
local fields = redis.pcall('hgetall', key)
${RAISE_UNLESS_WRONGTYPE_LUA('fields')}
if fields and #fields == 2 and fields[2] == '0'
  and string.sub(fields[1], 1, #waiter + 1) == waiter .. ':' then
  grant_field = fields[1]
end
`;
