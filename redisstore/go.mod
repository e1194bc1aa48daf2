module github.com/herdcache/herd/redisstore

go 1.26.0

require (
	github.com/google/go-cmp v0.7.0
	github.com/herdcache/herd v0.2.0
	github.com/maypok86/otter/v2 v2.4.0
	github.com/redis/go-redis/v9 v9.23.0
)

require (
	github.com/cespare/xxhash/v2 v2.3.0 // indirect
	go.uber.org/atomic v1.12.0 // indirect
	golang.org/x/sys v0.48.0 // indirect
)

replace github.com/herdcache/herd => ../
