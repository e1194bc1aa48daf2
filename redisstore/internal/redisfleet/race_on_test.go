//go:build race

package redisfleet_test

// raceOn reports whether the race detector is on: it slows the client
// down about threefold, so the largest batches shrink under it.
const raceOn = true
