-- StaleOlder: the value step of a MarkStale split into one-key steps
-- (while the key's slot migrates), once the fence key has advanced to
-- fence: unless the stored value carries a fence at least as new, make its
-- soft expiry the server's clock if that is earlier and its fence field
-- fence, its TTL unchanged; announce the change in any case.
-- KEYS[1] value
-- ARGV[1] fence (decimal), ARGV[2] channel, ARGV[3] key
-- Returns the value's TTL (ms) if it marked it, else 0: the fence key is
-- then kept that long, and the margin, in a step of its own.
local v = redis.call('GET', KEYS[1])
local left = 0
if v then
  local s = soft(v)
  if s and u64(v, FENCE) < tonumber(ARGV[1]) then
    local now = nowms()
    if s > now then
      redis.call('SETRANGE', KEYS[1], SOFT, be64(now))
    end
    redis.call('SETRANGE', KEYS[1], FENCE, be64(tonumber(ARGV[1])))
    left = math.max(redis.call('PTTL', KEYS[1]), 0)
  end
end
publish(ARGV[2], 'c' .. ARGV[1] .. ':' .. ARGV[3])
return left
