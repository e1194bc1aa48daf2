package herd

import (
	"math"
	"time"
)

func nowNano() int64 { return time.Now().UnixNano() }

// clock reads the time for entries: wall-clock Unix nanoseconds, advanced by
// the monotonic clock from when the cache was made, so that a read costs one
// monotonic clock read. It drifts from the wall clock only as far as the
// system clock is slewed or stepped while the process runs.
type clock struct {
	wall int64     // Unix nanoseconds at mono
	mono time.Time // carries a monotonic reading
}

func newClock() clock {
	t := time.Now()
	return clock{wall: t.UnixNano(), mono: t}
}

func (k *clock) now() int64 { return k.wall + int64(time.Since(k.mono)) }

// addTime returns the Unix nanoseconds d after t, saturating at the largest
// int64 instead of wrapping (and at the smallest for a negative d).
func addTime(t int64, d time.Duration) int64 {
	switch {
	case d > 0 && t > math.MaxInt64-int64(d):
		return math.MaxInt64
	case d < 0 && t < math.MinInt64-int64(d):
		return math.MinInt64
	}
	return t + int64(d)
}
