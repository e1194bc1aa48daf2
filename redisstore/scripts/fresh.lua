-- Fresh: the first step of an acquisition split into one-key steps (while
-- the key's slot migrates): the stored envelope if it is fresh.
-- KEYS[1] value
-- ARGV[1] after (Unix ms, >= 0)
-- Returns the envelope if its soft expiry is later than both the server's
-- clock and after, else nil.
local v = redis.call('GET', KEYS[1])
if v then
  local s = soft(v)
  if s and s > nowms() and s > tonumber(ARGV[1]) then
    return v
  end
end
return false
