-- Extend: push the lease's expiry if the token still holds it, and keep the
-- fence key at least as long, so that the holder can still write.
-- KEYS[1] lease, KEYS[2] fence
-- ARGV[1] token, ARGV[2] ttl (ms), ARGV[3] least fence ttl (ms)
-- Returns 1 if it extended, else 0.
if redis.call('GET', KEYS[1]) == ARGV[1] then
  keep(KEYS[2], ARGV[3])
  return redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return 0
