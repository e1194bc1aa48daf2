-- InvalidateAll: advance the generation of the whole keyspace and announce it.
-- KEYS[1] generation, ARGV[1] channel
-- Returns the new generation: max(the last + 1, the server's clock in Unix
-- microseconds), below 2^53.
local cur = redis.call('GET', KEYS[1])
local n = 0
if cur then
  n = string.match(cur, '^%d+$') and tonumber(cur)
  if not n then
    return redis.error_reply('HERD generation key ' .. KEYS[1] .. ' holds ' .. string.format('%q', cur) .. ', not a generation')
  end
end
if n >= MAXFENCE then
  return redis.error_reply('HERD generation ' .. string.format('%.0f', n) .. ' cannot advance (generations stay below 2^53)')
end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
n = math.max(n + 1, math.min(now, MAXFENCE))
local g = string.format('%.0f', n)
redis.call('SET', KEYS[1], g)
publish(ARGV[1], 'g' .. g)
return n
