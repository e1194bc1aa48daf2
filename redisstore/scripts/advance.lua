-- Advance: the fence step of an acquisition split into one-key steps.
-- KEYS[1] fence
-- ARGV[1] least fence ttl (ms)
-- Returns the new fence.
local fence, err = advance(KEYS[1], ARGV[1])
if not fence then
  return redis.error_reply(err)
end
return fence
