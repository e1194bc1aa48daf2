-- Keep: the last step of a write-back split into one-key steps: keep the
-- fence key at least as long as the value written.
-- KEYS[1] fence
-- ARGV[1] least fence ttl (ms)
keep(KEYS[1], ARGV[1])
return 1
