-- Set: advance the fence and store the envelope under the new fence.
-- KEYS[1] value, KEYS[2] fence
-- ARGV[1] ttl (ms), ARGV[2] envelope, ARGV[3] channel, ARGV[4] key,
-- ARGV[5] least fence ttl (ms)
-- Returns the new fence.
local fence, err = advance(KEYS[2], ARGV[5])
if not fence then
  return redis.error_reply(err)
end
store(KEYS[1], ARGV[2], string.format('%.0f', fence), ARGV[1], ARGV[3], ARGV[4])
return fence
