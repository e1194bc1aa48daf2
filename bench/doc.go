// Package bench compares herd's batch reads with sturdyc, otter, a
// hand-rolled singleflight cache and herd's own Get in a loop; see
// README.md.
package bench
