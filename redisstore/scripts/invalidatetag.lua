-- InvalidateTag: advance a tag's version and announce it.
-- KEYS[1] tag version, ARGV[1] channel, ARGV[2] tag, ARGV[3] keep (ms)
-- Returns the new version: max(the last + 1, the server's clock in Unix
-- microseconds), below 2^53.
local cur = redis.call('GET', KEYS[1])
local n = 0
if cur then
  n = string.match(cur, '^%d+$') and tonumber(cur)
  if not n then
    return redis.error_reply('HERD tag version key ' .. KEYS[1] .. ' holds ' .. string.format('%q', cur) .. ', not a version')
  end
end
if n >= MAXFENCE then
  return redis.error_reply('HERD tag version ' .. string.format('%.0f', n) .. ' cannot advance (versions stay below 2^53)')
end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
n = math.max(n + 1, math.min(now, MAXFENCE))
local v = string.format('%.0f', n)
redis.call('SET', KEYS[1], v, 'PX', ARGV[3])
publish(ARGV[1], 't' .. v .. ':' .. ARGV[2])
return n
