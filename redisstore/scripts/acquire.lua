-- Acquire: a fresh value, else the lease and a new fence, else how long the
-- current lease has left.
-- KEYS[1] value, KEYS[2] lease, KEYS[3] fence
-- ARGV[1] token, ARGV[2] lease ttl (ms), ARGV[3] after (Unix ms, >= 0),
-- ARGV[4] least fence ttl (ms), ARGV[5] '1' to be given the stored value
-- that was not fresh (AcquireMany's Stale), '0' otherwise (Acquire),
-- ARGV[6] channel, ARGV[7] origin, ARGV[8] key: a lease taken is announced
-- as 'l' .. lease ttl (ms) .. ':' .. origin .. key
-- Returns {1, envelope} | {2, fence} | {3, lease ms left}; with ARGV[5]
-- '1' and a value stored, {2, fence, value} | {3, lease ms left, value}.
local v = redis.call('GET', KEYS[1])
if v then
  local s = soft(v)
  if s and s > nowms() and s > tonumber(ARGV[3]) then
    return {1, v}
  end
end
local function reply(kind, n)
  if v and ARGV[5] == '1' then
    return {kind, n, v}
  end
  return {kind, n}
end
local left = redis.call('PTTL', KEYS[2])
if left ~= -2 then
  if left < 1 then
    left = 1 -- held without an expiry, or expiring this millisecond
  end
  return reply(3, left)
end
local fence, err = advance(KEYS[3], ARGV[4])
if not fence then
  return redis.error_reply(err)
end
redis.call('SET', KEYS[2], ARGV[1], 'PX', ARGV[2])
publish(ARGV[6], 'l' .. ARGV[2] .. ':' .. ARGV[7] .. ARGV[8])
return reply(2, fence)
