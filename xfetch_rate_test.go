//go:build !race

package herd_test

import (
	"testing"
	"time"
)

// The XFetch check of TestXFetchRefreshesBeforeExpiry at 100 times its read
// rate (100 readers at 1kHz, 100,000 reads per second) over 20 periods: a
// value's refresh instant is drawn once, so the loads per period stay the
// same. It reads 20 million times, so it runs outside the race suite.
func TestXFetchRefreshesBeforeExpiryAtHighRate(t *testing.T) {
	const periods = 20
	r := runXFetchAt(t, 1, periods, 100, time.Millisecond)
	checkXFetch(t, r, periods)
}
