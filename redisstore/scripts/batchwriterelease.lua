-- WriteReleaseMany's write and release of one key, which announces nothing
-- (Go publishes one notice for the whole batch): store the envelope if the
-- fence is still current (keeping the fence key at least as long as the
-- value), then drop the lease if the token still holds it. A write that
-- Redis refuses (OOM) changes nothing, and the lease is dropped all the
-- same: deleting a key is allowed when Redis is full.
-- KEYS[1] value, KEYS[2] fence, KEYS[3] lease
-- ARGV[1] fence (decimal), ARGV[2] ttl (ms), ARGV[3] envelope, ARGV[4] token,
-- ARGV[5] least fence ttl (ms)
-- Returns {1, fence} if it stored, fence being the decimal text of the fence
-- it stored under; {0, fence} if the fence is stale, fence being the text
-- the fence key holds ('0' when it is missing); {2, message} if Redis
-- refused the write with that error message.
local wrote = 0
local cur = redis.call('GET', KEYS[2]) or '0'
if cur == ARGV[1] then
  local refused = tryput(KEYS[1], ARGV[3], ARGV[1], ARGV[2])
  if refused then
    wrote, cur = 2, refused
  else
    keep(KEYS[2], ARGV[5])
    wrote = 1
  end
end
if redis.call('GET', KEYS[3]) == ARGV[4] then
  redis.call('DEL', KEYS[3])
end
return {wrote, cur}
