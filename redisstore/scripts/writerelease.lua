-- WriteRelease: store the envelope if the fence is still current (keeping
-- the fence key at least as long as the value), then drop the lease if the
-- token still holds it and announce the key's completion.
-- KEYS[1] value, KEYS[2] fence, KEYS[3] lease
-- ARGV[1] fence (decimal), ARGV[2] ttl (ms), ARGV[3] envelope, ARGV[4] channel,
-- ARGV[5] key, ARGV[6] token, ARGV[7] origin, ARGV[8] least fence ttl (ms)
-- Returns 1 if it stored, 0 if the fence is stale.
local wrote = 0
if (redis.call('GET', KEYS[2]) or '0') == ARGV[1] then
  store(KEYS[1], ARGV[3], ARGV[1], ARGV[2], ARGV[4], ARGV[5])
  keep(KEYS[2], ARGV[8])
  wrote = 1
end
if redis.call('GET', KEYS[3]) == ARGV[6] then
  redis.call('DEL', KEYS[3])
end
redis.call('PUBLISH', ARGV[4], 'd' .. ARGV[7] .. ARGV[5])
return wrote
