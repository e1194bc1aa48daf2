-- Extend: push the lease's expiry if the token still holds it.
-- KEYS[1] lease
-- ARGV[1] token, ARGV[2] ttl (ms)
-- Returns 1 if it extended, else 0.
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return 0
