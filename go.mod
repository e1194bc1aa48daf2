module github.com/herdcache/herd

go 1.26.0

require (
	github.com/google/go-cmp v0.7.0
	github.com/maypok86/otter/v2 v2.4.0
	golang.org/x/sync v0.25.0
)
