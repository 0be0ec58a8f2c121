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

/**
 * The Lua shared by release and leave: announce that a lock is free, naming the head of its line.
 *
 * Expects `key` (the lock, also the channel), `line`, `deadlines` (see acquire.script.ts),
 * `message` (the releasing store's id and sequence), `sharded` ('1': SPUBLISH) and `grant` (ms the
 * head has to come and take the lock before its place lapses) as locals. Drops lapsed places,
 * shortens the head's place to `grant`, and publishes `message:head:second` (empty names when
 * nobody waits in the line): the head's process tries at once, the second's once the head's
 * grant has passed (in case the head is gone), nobody else.
 */
export const ANNOUNCE_LUA = `
local head, second = '', ''
if redis.call('exists', line) == 1 then
  local now = redis.call('time')
  local ms = tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000)
  ${DROP_LAPSED_LUA}
  local first = redis.call('zrange', line, 0, 1)
  head, second = first[1] or '', first[2] or ''
  if head ~= '' then
    local until_ms = ms + grant
    if tonumber(redis.call('zscore', deadlines, head)) > until_ms then
      redis.call('zadd', deadlines, until_ms, head)
    end
  end
end
local announcement = message .. ':' .. head .. ':' .. second
if sharded ~= '1' or type(redis.pcall('spublish', key, announcement)) ~= 'number' then
  redis.call('publish', key, announcement)
end
`;
