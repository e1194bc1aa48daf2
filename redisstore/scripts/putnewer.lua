-- PutNewer: the write step of a write-back split into one-key steps (while
-- the key's slot migrates), once the fence key has been read as fence:
-- store the envelope under fence unless the stored value carries a fence
-- at least as new, and announce the change.
-- KEYS[1] value
-- ARGV[1] fence (decimal), ARGV[2] ttl (ms), ARGV[3] envelope,
-- ARGV[4] channel, ARGV[5] key
-- Returns 1 if it stored, else 0.
local v = redis.call('GET', KEYS[1])
if v and soft(v) and u64(v, FENCE) >= tonumber(ARGV[1]) then
  return 0
end
store(KEYS[1], ARGV[3], ARGV[1], ARGV[2], ARGV[4], ARGV[5])
return 1
