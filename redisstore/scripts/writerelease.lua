-- WriteRelease: store the envelope if the fence is still current (keeping
-- the fence key at least as long as the value) and announce the change,
-- then drop the lease if the token still holds it and announce the key's
-- completion. A write that Redis refuses (OOM) changes nothing, and the
-- lease is dropped and the completion announced all the same: deleting a
-- key and publishing (PUBLISH, SPUBLISH) are allowed when Redis is full.
-- KEYS[1] value, KEYS[2] fence, KEYS[3] lease
-- ARGV[1] fence (decimal), ARGV[2] ttl (ms), ARGV[3] envelope, ARGV[4] channel,
-- ARGV[5] key, ARGV[6] token, ARGV[7] origin, ARGV[8] least fence ttl (ms)
-- Returns 1 if it stored, 0 if the fence is stale, or the error message of
-- the write that Redis refused (a string).
local wrote, refused = 0, nil
if (redis.call('GET', KEYS[2]) or '0') == ARGV[1] then
  refused = tryput(KEYS[1], ARGV[3], ARGV[1], ARGV[2])
  if not refused then
    announce(ARGV[4], ARGV[5], ARGV[3], ARGV[1])
    keep(KEYS[2], ARGV[8])
    wrote = 1
  end
end
if redis.call('GET', KEYS[3]) == ARGV[6] then
  redis.call('DEL', KEYS[3])
end
publish(ARGV[4], 'd' .. ARGV[7] .. ARGV[5])
if refused then
  return refused
end
return wrote
