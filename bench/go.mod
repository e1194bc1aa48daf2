module github.com/herdcache/herd/bench

go 1.26.0

require (
	github.com/herdcache/herd v0.2.0
	github.com/maypok86/otter/v2 v2.4.0
	github.com/viccon/sturdyc v1.1.5
	golang.org/x/sync v0.25.0
)

require github.com/cespare/xxhash/v2 v2.3.0 // indirect

replace github.com/herdcache/herd => ../
