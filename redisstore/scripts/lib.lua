-- Shared by every script. Go prepends the envelope layout as Lua constants:
-- VERSION (format version), SOFT and FENCE (0-based byte offsets of the soft
-- expiry and the fence), HEADER (header size) and MAXFENCE (2^53 - 1).
--
-- Notices on the pub/sub channel, robust to any key bytes:
--   'c' .. fence .. ':' .. key   a change (write, set, invalidate) under fence
--   'd' .. origin .. key         a completion (lease released or given up),
--                                origin being the releasing Remote's id, 16
--                                hex digits

-- be64 encodes n, an integer in [0, 2^53), as 8 big-endian bytes. Lua numbers
-- are doubles, exact in that range.
local function be64(n)
  local b = {}
  for i = 8, 1, -1 do
    b[i] = n % 256
    n = (n - b[i]) / 256
  end
  return string.char(b[1], b[2], b[3], b[4], b[5], b[6], b[7], b[8])
end

-- soft returns the soft expiry (Unix ms) of the envelope v, or nil when v
-- has no whole header of a known version or the expiry is negative.
local function soft(v)
  if #v < HEADER or string.byte(v, 1) ~= VERSION then
    return nil
  end
  if string.byte(v, SOFT + 1) >= 128 then
    return nil -- the sign bit of an int64
  end
  local s = 0
  for i = SOFT + 1, SOFT + 8 do
    s = s * 256 + string.byte(v, i)
  end
  return s
end

-- nowms returns the server's clock in Unix milliseconds.
local function nowms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

-- advance increments the fence key f and returns the new fence, or nil and
-- an error message, changing nothing, when it cannot advance.
local function advance(f)
  local cur = redis.call('GET', f)
  local n = tonumber(cur or '0')
  if n == nil then
    return nil, 'fence key ' .. f .. ' holds ' .. string.format('%q', cur) .. ', not a fence'
  end
  if n >= MAXFENCE then
    return nil, 'fence ' .. string.format('%.0f', n) .. ' cannot advance (fences stay below 2^53)'
  end
  return redis.call('INCR', f)
end

-- store sets the value key v to the envelope env under fence for ttl
-- milliseconds, its fence field rewritten, and announces the change on ch
-- for key. fence is the decimal text of the fence.
local function store(v, env, fence, ttl, ch, key)
  redis.call('SET', v, env, 'PX', ttl)
  redis.call('SETRANGE', v, FENCE, be64(tonumber(fence)))
  redis.call('PUBLISH', ch, 'c' .. fence .. ':' .. key)
end
