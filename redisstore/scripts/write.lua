-- Write: store the envelope only if the fence is still current, and keep the
-- fence key at least as long as the value.
-- KEYS[1] value, KEYS[2] fence
-- ARGV[1] fence (decimal), ARGV[2] ttl (ms), ARGV[3] envelope, ARGV[4] channel, ARGV[5] key,
-- ARGV[6] least fence ttl (ms)
-- Returns 1 if it stored, 0 if the fence is stale.
if (redis.call('GET', KEYS[2]) or '0') ~= ARGV[1] then
  return 0
end
store(KEYS[1], ARGV[3], ARGV[1], ARGV[2], ARGV[4], ARGV[5])
keep(KEYS[2], ARGV[6])
return 1
