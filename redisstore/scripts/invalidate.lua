-- Invalidate: advance the fence, delete the value, announce the change.
-- KEYS[1] value, KEYS[2] fence
-- ARGV[1] channel, ARGV[2] key, ARGV[3] least fence ttl (ms)
-- Returns the new fence.
local fence, err = advance(KEYS[2], ARGV[3])
if not fence then
  return redis.error_reply(err)
end
redis.call('DEL', KEYS[1])
publish(ARGV[1], 'x' .. string.format('%.0f', fence) .. ':' .. ARGV[2])
return fence
