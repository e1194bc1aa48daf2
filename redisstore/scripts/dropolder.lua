-- DropOlder: the value step of an Invalidate split into one-key steps
-- (while the key's slot migrates), once the fence key has advanced to
-- fence; also what a split write-back runs when it finds, re-reading the
-- fence key, that a change advanced it to fence meanwhile. It deletes the
-- stored value unless it carries a fence at least as new (a later change's
-- value) and announces the deletion under fence.
-- KEYS[1] value
-- ARGV[1] fence (decimal), ARGV[2] channel, ARGV[3] key
-- Returns 1 if it deleted a value, else 0.
local v = redis.call('GET', KEYS[1])
local dropped = 0
if v and not (soft(v) and u64(v, FENCE) >= tonumber(ARGV[1])) then
  redis.call('DEL', KEYS[1])
  dropped = 1
end
publish(ARGV[2], 'x' .. ARGV[1] .. ':' .. ARGV[3])
return dropped
