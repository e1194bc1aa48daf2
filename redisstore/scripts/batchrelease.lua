-- WriteReleaseMany's release of one key, which announces nothing (Go
-- publishes one notice for the whole batch): drop the lease if the token
-- still holds it.
-- KEYS[1] lease
-- ARGV[1] token
-- Returns 1 if it dropped the lease, else 0.
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
