package herd

import (
	"math"
	"testing"
	"testing/synctest"
	"time"
)

func TestAddTimeSaturates(t *testing.T) {
	for _, tc := range []struct {
		t    int64
		d    time.Duration
		want int64
	}{
		{0, time.Second, int64(time.Second)},
		{math.MaxInt64 - 1, 1, math.MaxInt64},
		{math.MaxInt64 - 1, 2, math.MaxInt64},
		{math.MaxInt64, math.MaxInt64, math.MaxInt64},
		{time.Now().UnixNano(), math.MaxInt64, math.MaxInt64},
		{math.MinInt64 + 1, -2, math.MinInt64},
		{math.MinInt64, math.MinInt64, math.MinInt64},
		{5, -3, 2},
	} {
		if got := addTime(tc.t, tc.d); got != tc.want {
			t.Errorf("addTime(%d, %d) = %d, want %d", tc.t, int64(tc.d), got, tc.want)
		}
	}
}

func TestCoarseClock(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const res = time.Millisecond
		precise := newClock()
		k := coarseClock{precise: &precise, res: res, stop: make(chan struct{})}
		if got, want := k.bound(), precise.now(); got != want {
			t.Fatalf("first read %d, want the precise %d", got, want)
		}
		if !k.ticking.Load() {
			t.Fatal("a read did not start the ticking goroutine")
		}
		last := int64(0)
		for range 500 {
			time.Sleep(res / 10)
			got, want := k.bound(), precise.now()
			if ahead := got - want; ahead < 0 || ahead > int64(res) {
				t.Fatalf("bound is %v ahead of the precise clock, want within [0, %v]", time.Duration(ahead), res)
			}
			if got < last {
				t.Fatalf("read %d after %d: the clock went back", got, last)
			}
			last = got
		}
		// A tick with no read stops the goroutine; the next read is precise
		// and starts it again.
		time.Sleep(3 * res)
		synctest.Wait()
		if k.ticking.Load() || k.now.Load() != 0 {
			t.Fatal("the goroutine still ticks after ticks with no read")
		}
		if got, want := k.bound(), precise.now(); got != want || !k.ticking.Load() {
			t.Fatalf("read after idling %d (ticking %v), want the precise %d and ticking", got, k.ticking.Load(), want)
		}
		close(k.stop)
		synctest.Wait()
		if k.ticking.Load() {
			t.Fatal("the goroutine ticks after stop")
		}
	})
}

func TestCoarseClockZeroResolution(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		precise := newClock()
		k := coarseClock{precise: &precise, stop: make(chan struct{})}
		for range 3 {
			if got, want := k.bound(), precise.now(); got != want {
				t.Fatalf("read %d, want the precise %d", got, want)
			}
			time.Sleep(time.Millisecond)
		}
		if k.ticking.Load() {
			t.Fatal("a zero resolution started a goroutine")
		}
	})
}

func TestCoarseResolution(t *testing.T) {
	for _, tc := range []struct {
		ds   []time.Duration
		want time.Duration
	}{
		{[]time.Duration{time.Minute}, 50 * time.Millisecond},
		{[]time.Duration{time.Minute, time.Second}, time.Millisecond},
		{[]time.Duration{10 * time.Second, 0, 0}, 10 * time.Millisecond},
		{[]time.Duration{time.Second, 0, 5 * time.Second}, time.Millisecond},
		{[]time.Duration{100 * time.Millisecond}, time.Millisecond},
		{[]time.Duration{time.Hour, 99 * time.Millisecond}, 0},
		{[]time.Duration{50 * time.Millisecond}, 0},
		{[]time.Duration{24 * time.Hour}, 50 * time.Millisecond},
	} {
		if got := coarseResolution(tc.ds...); got != tc.want {
			t.Errorf("coarseResolution(%v) = %v, want %v", tc.ds, got, tc.want)
		}
	}
}
