package herd

import (
	"math"
	"sync/atomic"
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

// at is now as of t, a time read with a monotonic reading: no clock read.
func (k *clock) at(t time.Time) int64 { return k.wall + int64(t.Sub(k.mono)) }

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

// coarseClock is the clock of the hit path: while reads come, a goroutine
// stores the time once per resolution and a read costs one atomic load. Its
// bound is ahead of the precise clock by up to the resolution, and behind it
// only while the goroutine is starved of CPU. The goroutine runs only while
// the clock is read: after a tick with no read it stops, and the next read
// takes the precise time and starts it again, so an idle cache wakes no one
// (and a testing/synctest bubble can end once its readers have). The zero
// resolution reads the precise clock every time.
type coarseClock struct {
	precise *clock
	res     time.Duration
	// now is the time of the last tick, or 0 while no goroutine ticks.
	now atomic.Int64
	// read is set by a read since the last tick.
	read atomic.Bool
	// ticking is held by the one goroutine that ticks.
	ticking atomic.Bool
	stop    chan struct{} // closed by Close
}

// bound returns a time no earlier than now, unless the ticking goroutine
// is starved of CPU for longer than the resolution: the last tick's time
// plus the resolution, or the precise time when no goroutine ticks.
func (k *coarseClock) bound() int64 {
	if t := k.now.Load(); t != 0 {
		if !k.read.Load() {
			k.read.Store(true)
		}
		return t + int64(k.res)
	}
	t := k.precise.now()
	if k.res > 0 && k.ticking.CompareAndSwap(false, true) {
		k.read.Store(true)
		k.now.Store(t)
		go k.tick()
	}
	return t
}

func (k *coarseClock) tick() {
	t := time.NewTicker(k.res)
	defer t.Stop()
	defer k.ticking.Store(false)
	defer k.now.Store(0)
	for {
		select {
		case <-k.stop:
			return
		case <-t.C:
		}
		if !k.read.Swap(false) {
			return
		}
		k.now.Store(k.precise.now())
	}
}

// coarseResolution is the resolution of the hit path's clock without
// [Options.PreciseClock]: a thousandth of the shortest duration an entry is
// judged by, between 1ms and 50ms, or 0 (the precise clock) when that
// duration is under 100ms.
func coarseResolution(durations ...time.Duration) time.Duration {
	shortest := time.Duration(math.MaxInt64)
	for _, d := range durations {
		if d > 0 {
			shortest = min(shortest, d)
		}
	}
	if shortest < 100*time.Millisecond {
		return 0
	}
	return min(max(shortest/1000, time.Millisecond), 50*time.Millisecond)
}
