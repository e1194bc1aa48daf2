-- MarkStale: advance the fence and make the stored value stale in place: its
-- soft expiry becomes the server's clock if that is earlier and its fence
-- field the new fence, its TTL unchanged; keep the fence key as long as the
-- value and announce the change.
-- KEYS[1] value, KEYS[2] fence
-- ARGV[1] channel, ARGV[2] key, ARGV[3] least fence ttl (ms),
-- ARGV[4] fence margin beyond the value's ttl (ms)
-- Returns the new fence.
local fence, err = advance(KEYS[2], ARGV[3])
if not fence then
  return redis.error_reply(err)
end
local v = redis.call('GET', KEYS[1])
if v then
  local s = soft(v)
  if s then
    local now = nowms()
    if s > now then
      redis.call('SETRANGE', KEYS[1], SOFT, be64(now))
    end
    redis.call('SETRANGE', KEYS[1], FENCE, be64(fence))
    local left = redis.call('PTTL', KEYS[1])
    if left > 0 then
      keep(KEYS[2], left + tonumber(ARGV[4]))
    end
  end
end
publish(ARGV[1], 'c' .. string.format('%.0f', fence) .. ':' .. ARGV[2])
return fence
