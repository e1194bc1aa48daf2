-- Release: drop the lease if the token still holds it, and in any case
-- announce the key's completion.
-- KEYS[1] lease
-- ARGV[1] token, ARGV[2] channel, ARGV[3] origin, ARGV[4] key
-- Returns 1 if it dropped the lease, else 0.
local dropped = 0
if redis.call('GET', KEYS[1]) == ARGV[1] then
  dropped = redis.call('DEL', KEYS[1])
end
publish(ARGV[2], 'd' .. ARGV[3] .. ARGV[4])
return dropped
