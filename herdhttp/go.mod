module github.com/herdcache/herd/herdhttp

go 1.26.0

require github.com/herdcache/herd v0.0.0-00010101000000-000000000000

require github.com/maypok86/otter/v2 v2.4.0 // indirect

replace github.com/herdcache/herd => ../
