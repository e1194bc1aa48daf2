-- A heartbeat on the notice channel, published unless another Remote
-- published one less than half a period ago.
-- KEYS[1]: the heartbeats' sequence; KEYS[2]: the gate, held for half a
-- period after each heartbeat.
-- ARGV[1]: the channel; ARGV[2]: half the period, ms; ARGV[3]: the
-- sequence key's TTL, ms.
-- Returns the heartbeat's sequence number, or 0 when the gate was held.
if not redis.call('SET', KEYS[2], '1', 'NX', 'PX', ARGV[2]) then
	return 0
end
local seq = redis.call('INCR', KEYS[1])
redis.call('PEXPIRE', KEYS[1], ARGV[3])
local t = redis.call('TIME')
local ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('PUBLISH', ARGV[1], string.format('h%d:%d', seq, ms))
return seq
