-- Shared by every script. Go prepends the envelope layout as Lua constants:
-- VERSION (format version), FLAGS, SOFT, HARD, DELTA and FENCE (0-based byte
-- offsets of the fields), HEADER (header size), KNOWNFLAGS1 (one above the
-- largest value of the known flag bits, a power of two), MAXEXPIRY (the
-- latest expiry, Unix ms), MAXFENCE (2^53 - 1) and NOTICEVALUE (the longest
-- envelope a change notice carries, NoticeValueMax).
--
-- Notices on the pub/sub channel, robust to any key bytes:
--   'c' .. fence .. ':' .. key   a change (write, set, mark stale) under fence
--   'v' .. fence .. ':' .. #key .. ':' .. key .. envelope
--                                a change that stored envelope (at most
--                                NOTICEVALUE bytes, its fence field set)
--                                under fence; #key in decimal
--   'x' .. fence .. ':' .. key   a deletion (invalidate) under fence
--   'd' .. origin .. key         a completion (lease released or given up),
--                                origin being the releasing Remote's id, 16
--                                hex digits
--   'l' .. ms .. ':' .. origin .. key
--                                a lease taken (acquire) for ms by origin
-- The batch scripts announce nothing: Go publishes one batch notice for the
-- whole call (see redisstore.go).
--
-- A key's notices go to the channel Go passes, through publish: the
-- classic channel (<prefix>events), or on a Cluster a shard channel
-- (<prefix>events{<tag>}, the only names with a '{') that Go chose on the
-- key's master (see shard.go).

-- publish sends msg on ch: with SPUBLISH when ch is a shard channel, and
-- with PUBLISH on the classic channel, the part of ch before its '{', when
-- ch is not one or Redis refused the SPUBLISH (the shard channel's slot is
-- not on this node: the caller's slot map was out of date).
local function publish(ch, msg)
  local brace = string.find(ch, '{', 1, true)
  if brace then
    local res = redis.pcall('SPUBLISH', ch, msg)
    if type(res) ~= 'table' or not res.err then
      return
    end
    ch = string.sub(ch, 1, brace - 1)
  end
  redis.call('PUBLISH', ch, msg)
end

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

-- u64 reads the 8 big-endian bytes of v at 0-based offset off as a Lua
-- number: exact below 2^53, and above it a double no smaller than 2^53.
local function u64(v, off)
  local n = 0
  for i = off + 1, off + 8 do
    n = n * 256 + string.byte(v, i)
  end
  return n
end

-- uvarint reads the uvarint of v at 1-based position i, as Go's
-- binary.Uvarint does, in its shortest encoding only; it returns the value
-- (exact below 2^53) and the position after it, or nil.
local function uvarint(v, i)
  local n, mul = 0, 1
  for k = 0, 9 do
    local b = string.byte(v, i + k)
    if not b or (k == 9 and b > 1) then
      return nil
    end
    n = n + (b % 128) * mul
    if b < 128 then
      if k > 0 and b == 0 then
        return nil -- not the shortest encoding
      end
      return n, i + k + 1
    end
    mul = mul * 128
  end
  return nil
end

-- tagsok reports whether the tags section of the tagged envelope v is one
-- that Go's envelope.Decode accepts: since, a count in [1, MAXTAGS], and
-- that many tags of at most MAXTAGLEN bytes within v.
local function tagsok(v)
  local _, i = uvarint(v, HEADER + 1)
  if not i then
    return false
  end
  local count
  count, i = uvarint(v, i)
  if not count or count < 1 or count > MAXTAGS then
    return false
  end
  for _ = 1, count do
    local len
    len, i = uvarint(v, i)
    if not len or len > MAXTAGLEN or i + len - 1 > #v then
      return false
    end
    i = i + len
  end
  return true
end

-- soft returns the soft expiry (Unix ms) of the envelope v, or nil when v is
-- not an envelope that Go's envelope.Decode accepts: a short or unknown
-- header, unknown flag bits, an expiry that is negative, out of order or
-- past MAXEXPIRY, a negative delta, or a fence above MAXFENCE. Such a value
-- counts as absent, so it is reloaded under the fence.
local function soft(v)
  if #v < HEADER or string.byte(v, 1) ~= VERSION then
    return nil
  end
  local flags = string.byte(v, FLAGS + 1)
  if flags % KNOWNFLAGS1 ~= flags then
    return nil -- a bit at or above KNOWNFLAGS1 is set
  end
  for _, off in ipairs({SOFT, HARD, DELTA}) do
    if string.byte(v, off + 1) >= 128 then
      return nil -- the sign bit of an int64
    end
  end
  local s, h = u64(v, SOFT), u64(v, HARD)
  if h < s or h > MAXEXPIRY or u64(v, FENCE) > MAXFENCE then
    return nil
  end
  if math.floor(flags / TAGGED) % 2 == 1 and not tagsok(v) then
    return nil
  end
  return s
end

-- nowms returns the server's clock in Unix milliseconds.
local function nowms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

-- keep gives the fence key f a TTL of at least ms milliseconds (a decimal
-- string): it sets one when f has none (a key written before fence keys
-- expired) or a shorter one, and never shortens a longer one. A missing f
-- stays missing: it reads as fence 0.
local function keep(f, ms)
  local left = redis.call('PTTL', f)
  if left == -1 or (left >= 0 and left < tonumber(ms)) then
    redis.call('PEXPIRE', f, ms)
  end
end

-- advance sets the fence key f to a new fence, max(old + 1, the server's
-- clock in Unix microseconds), below 2^53, with a TTL of at least ms
-- milliseconds (a decimal string) that keeps any longer one, and returns
-- it; or it returns nil and an error message, changing nothing, when f holds
-- no fence or its fence cannot advance. A missing f reads as fence 0, so a
-- fence key that expired or was evicted restarts at the clock, above every
-- fence it gave out as long as the clock has not gone back by more than the
-- fence key's TTL.
local function advance(f, ms)
  local cur = redis.call('GET', f)
  local n = 0
  if cur then
    n = string.match(cur, '^%d+$') and tonumber(cur)
    if not n then
      return nil, 'HERD fence key ' .. f .. ' holds ' .. string.format('%q', cur) .. ', not a fence'
    end
  end
  if n >= MAXFENCE then
    return nil, 'HERD fence ' .. string.format('%.0f', n) .. ' cannot advance (fences stay below 2^53)'
  end
  local t = redis.call('TIME')
  local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
  n = math.max(n + 1, math.min(now, MAXFENCE))
  local px = tonumber(ms)
  local left = redis.call('PTTL', f)
  if left > px then
    px = left
  end
  -- '%.0f': a Lua number converted to a string may take exponent form.
  redis.call('SET', f, string.format('%.0f', n), 'PX', string.format('%.0f', px))
  return n
end

-- put sets the value key v to the envelope env under fence for ttl
-- milliseconds, its fence field rewritten. fence is the decimal text of the
-- fence.
local function put(v, env, fence, ttl)
  redis.call('SET', v, env, 'PX', ttl)
  redis.call('SETRANGE', v, FENCE, be64(tonumber(fence)))
end

-- tryput does what put does, but when Redis refuses the SET (OOM: a full
-- Redis under noeviction refuses a script's first write that takes memory)
-- it returns the error message instead of ending the script, having
-- changed nothing; it returns nil once it has stored.
local function tryput(v, env, fence, ttl)
  local res = redis.pcall('SET', v, env, 'PX', ttl)
  if type(res) == 'table' and res.err then
    return res.err
  end
  redis.call('SETRANGE', v, FENCE, be64(tonumber(fence)))
  return nil
end

-- announce publishes on ch the change of key that stored the envelope env
-- under fence (decimal text): a notice that carries env, its fence field
-- set to fence, when env is at most NOTICEVALUE bytes, and otherwise a
-- plain change notice.
local function announce(ch, key, env, fence)
  if #env <= NOTICEVALUE then
    publish(ch, 'v' .. fence .. ':' .. string.format('%d', #key) .. ':' .. key ..
      string.sub(env, 1, FENCE) .. be64(tonumber(fence)) .. string.sub(env, FENCE + 9))
  else
    publish(ch, 'c' .. fence .. ':' .. key)
  end
end

-- store does what put does and announces the change on ch for key.
local function store(v, env, fence, ttl, ch, key)
  put(v, env, fence, ttl)
  announce(ch, key, env, fence)
end
