-- TagVersion: a tag's version, kept for ARGV[1] ms more; a tag without one
-- gets the server's clock less that keep, in Unix microseconds.
-- KEYS[1] tag version, ARGV[1] keep (ms)
local cur = redis.call('GET', KEYS[1])
if cur then
  local n = string.match(cur, '^%d+$') and tonumber(cur)
  if not n then
    return redis.error_reply('HERD tag version key ' .. KEYS[1] .. ' holds ' .. string.format('%q', cur) .. ', not a version')
  end
  redis.call('PEXPIRE', KEYS[1], ARGV[1])
  return n
end
local t = redis.call('TIME')
local n = math.max(tonumber(t[1]) * 1000000 + tonumber(t[2]) - tonumber(ARGV[1]) * 1000, 0)
redis.call('SET', KEYS[1], string.format('%.0f', n), 'PX', ARGV[1])
return n
