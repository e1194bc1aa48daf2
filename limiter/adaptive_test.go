package limiter

import (
	"context"
	"errors"
	"math"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"
)

// fakeStore is a store whose latency follows
//
//	latency = base * mult * max(1, inflight/capacity)
//
// with inflight the calls in the store when a call starts, itself included:
// it serves up to capacity calls at its base latency and slows in proportion
// beyond, the way a database queues on its cores or disks. mult is 1 when it
// is healthy; the tests raise it to 5 for a while. With square set the
// factor is squared, max(1, inflight/capacity)², the way a database
// contending for its locks slows: past its capacity it serves fewer calls
// a second the more it holds.
type fakeStore struct {
	base     time.Duration
	capacity int
	square   bool

	mult     atomic.Int64
	inflight atomic.Int64
	peak     atomic.Int64 // the most calls in the store at once, reset by the test
	calls    atomic.Int64
}

func (s *fakeStore) call() {
	n := s.inflight.Add(1)
	for p := s.peak.Load(); n > p && !s.peak.CompareAndSwap(p, n); p = s.peak.Load() {
	}
	d := s.base * time.Duration(s.mult.Load())
	if int(n) > s.capacity {
		d = d * time.Duration(n) / time.Duration(s.capacity)
		if s.square {
			d = d * time.Duration(n) / time.Duration(s.capacity)
		}
	}
	time.Sleep(d) // the store's latency, on the bubble's fake clock
	s.inflight.Add(-1)
	s.calls.Add(1)
}

// drive runs workers callers that each loop Acquire, store call, Release
// until ctx ends, and returns a function that waits for them.
func drive(ctx context.Context, l *Limiter, s *fakeStore, workers int) (wait func()) {
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			for ctx.Err() == nil {
				if err := l.Acquire(ctx); err != nil {
					continue
				}
				s.call()
				l.Release()
			}
		})
	}
	return wg.Wait
}

// sample is the limiter and store seen at one instant.
type sample struct {
	at    time.Duration // since the start
	limit int
	calls int64 // store calls completed
}

// run drives a limiter of Options{Limit: 64, MinLimit: 2} with 100 callers
// over a store of base 10ms and capacity 16, whose latency is multiplied by
// 5 from slowAt to fastAt, and samples it every millisecond until end.
func run(t *testing.T, slowAt, fastAt, end time.Duration) (*fakeStore, []sample) {
	s := &fakeStore{base: 10 * time.Millisecond, capacity: 16}
	s.mult.Store(1)
	l := mustNew(t, Options{Limit: 64, MinLimit: 2})
	ctx, cancel := context.WithCancel(t.Context())
	wait := drive(ctx, l, s, 100)
	var out []sample
	for at := time.Duration(0); at < end; at += time.Millisecond {
		switch at {
		case slowAt:
			s.mult.Store(5)
		case fastAt:
			s.mult.Store(1)
		}
		time.Sleep(time.Millisecond)
		out = append(out, sample{at: at + time.Millisecond, limit: l.Limit(), calls: s.calls.Load()})
	}
	cancel()
	wait()
	return s, out
}

// between returns the samples in [from, to).
func between(all []sample, from, to time.Duration) []sample {
	var out []sample
	for _, x := range all {
		if x.at >= from && x.at < to {
			out = append(out, x)
		}
	}
	return out
}

// checkSteady checks the promise of a steady limit over a store of
// capacity 16: every sample within [8, 48] (0.5x to 3x capacity) and a
// mean within [16, maxMean].
func checkSteady(t *testing.T, what string, xs []sample, maxMean float64) {
	t.Helper()
	sum := 0
	for _, x := range xs {
		if x.limit < 8 || x.limit > 48 {
			t.Errorf("%s: at %v the limit is %d, want it within [8, 48]", what, x.at, x.limit)
			return
		}
		sum += x.limit
	}
	if mean := float64(sum) / float64(len(xs)); mean < 16 || mean > maxMean {
		t.Errorf("%s: mean limit %.1f, want it within [16, %.0f]", what, mean, maxMean)
	}
}

// The adaptive limit starts at its floor and climbs to the store's capacity
// (16) within 80 store calls, then holds near it, never below 0.5x or
// above 3x the capacity and 1x to 1.25x on average, though 100 callers want
// more and the ceiling is 64. (It settles where about √limit/4 calls wait
// inside the store: near 17.)
func TestAdaptiveConverges(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		_, xs := run(t, time.Hour, time.Hour, time.Second)
		reached := -1
		for _, x := range xs {
			if x.limit >= 16 {
				reached = int(x.calls)
				break
			}
		}
		if reached < 0 || reached > 80 {
			t.Errorf("the limit reached the capacity after %d store calls, want at most 80", reached)
		}
		checkSteady(t, "after 200ms", between(xs, 200*time.Millisecond, time.Second), 20)
	})
}

// Four limiters sharing a store that slows as the square of its calls past
// its capacity (32) hold it near its capacity: from the first second on,
// in the two seconds after it, the store completes at least 94% of the
// calls it completes at its capacity (6,400), and the calls in it average
// within [30, 34.5]. Moving all the way to their targets, each seeing
// twice the excess of calls past the capacity, the limiters would swing
// around it: 91% and 35.0.
func TestAdaptiveFleetSquareStore(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := &fakeStore{base: 10 * time.Millisecond, capacity: 32, square: true}
		s.mult.Store(1)
		ctx, cancel := context.WithCancel(t.Context())
		var waits []func()
		for range 4 {
			waits = append(waits, drive(ctx, mustNew(t, Options{Limit: 32, MinLimit: 4}), s, 25))
		}
		time.Sleep(time.Second)
		from := s.calls.Load()
		var sum, n int64
		for range 2000 {
			time.Sleep(time.Millisecond)
			sum += s.inflight.Load()
			n++
		}
		done := s.calls.Load() - from
		cancel()
		for _, w := range waits {
			w()
		}
		if done < 6400*94/100 {
			t.Errorf("the store completed %d calls in 2s, want at least %d (94%% of its 6400 at capacity)", done, 6400*94/100)
		}
		if mean := float64(sum) / float64(n); mean < 30 || mean > 34.5 {
			t.Errorf("%.1f calls in the store on average, want within [30, 34.5] (capacity 32)", mean)
		}
	})
}

// When the store's base latency steps up 5x the limit backs off to half
// of what it was (rounded up) or less within 300ms; finding that the cut
// did not bring the latency down, it takes the slower latency for the
// no-load one and holds near the capacity again from 500ms after the step
// (a store slower by itself serves as many calls at once); when the
// latency steps back down, the limit is back near the capacity within
// 300ms and holds there as it did before the step. Near: every sample
// within [8, 48], the mean within [16, 20].
func TestAdaptiveBacksOffAndRecovers(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const slow, fast, end = time.Second, 2 * time.Second, 3 * time.Second
		_, xs := run(t, slow, fast, end)
		before := between(xs, slow-time.Millisecond, slow)[0].limit
		backedOff := false
		for _, x := range between(xs, slow, slow+300*time.Millisecond) {
			if 2*x.limit <= before+1 {
				backedOff = true
				break
			}
		}
		if !backedOff {
			t.Errorf("the limit did not fall from %d to %d or below within 300ms of the 5x step: %v", before, (before+1)/2, between(xs, slow, slow+300*time.Millisecond))
		}
		checkSteady(t, "from 500ms after the 5x step", between(xs, slow+500*time.Millisecond, fast), 20)
		checkSteady(t, "after recovery", between(xs, fast+300*time.Millisecond, end), 20)
	})
}

// When the store becomes 5x slower by itself and stays so, the limit backs
// off, then takes the slower latency as the store's no-load latency and
// climbs again rather than starving a store that is slow but not
// overloaded: in the 4th second after the step it holds near the capacity,
// as before it (every sample within [8, 48], the mean within [16, 20]).
func TestAdaptiveRelearnsSlowerStore(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		_, xs := run(t, time.Second, time.Hour, 5*time.Second)
		checkSteady(t, "in the 4th second of a store 5x slower", between(xs, 4*time.Second, 5*time.Second), 20)
	})
}

// settled returns an estimator past its first releases, at a no-load
// latency of d.
func settled(d float64) *estimator {
	e := newEstimator(2, 64)
	e.remember(d, firstReleases)
	return e
}

// The no-load latency is first the mean of the first firstReleases
// releases, whatever their windows, not the lowest of those windows' means.
func TestNoLoadFirstReleasesMean(t *testing.T) {
	e := newEstimator(4, 64)
	for _, w := range []struct {
		rtt float64
		n   int
	}{{90, 4}, {110, 6}, {100, 8}} {
		e.remember(w.rtt, w.n)
	}
	if want := (90.0*4 + 110*6 + 100*8) / 18; e.noLoad != want {
		t.Fatalf("noLoad = %v after windows of 90 (4 releases), 110 (6), 100 (8); want their mean, %v", e.noLoad, want)
	}
	for range 3 {
		e.remember(95, 8)
	}
	if e.noLoad != 95 {
		t.Errorf("noLoad = %v after three more windows of 95; want 95, the lowest median of three", e.noLoad)
	}
}

// One window made fast by the machine (its calls take a fifth of the time)
// does not set the no-load latency: it is the median of three windows.
func TestNoLoadIgnoresOneFastWindow(t *testing.T) {
	e := settled(100)
	for _, rtt := range []float64{100, 100, 20, 100, 100} {
		e.remember(rtt, 5)
	}
	if e.noLoad != 100 {
		t.Errorf("noLoad = %v after windows of 100, 100, 20, 100, 100; want 100", e.noLoad)
	}
	e.remember(20, 5)
	e.remember(20, 5)
	if e.noLoad != 20 {
		t.Errorf("noLoad = %v after two more windows of 20; want 20", e.noLoad)
	}
}

// A store that became slower by itself and then recovers gets its no-load
// latency back at the first window as fast as before: kept at the slow
// store's latency for the median's two windows more, it would let the limit
// run away on a store as fast as before.
func TestNoLoadBackAtFirstFastWindow(t *testing.T) {
	e := settled(100)
	for range 3 {
		e.remember(100, 5)
	}
	for range 8 {
		e.remember(500, 5)
	}
	if e.noLoad != 500 || e.before != 100 {
		t.Fatalf("noLoad = %v, before = %v after a step to 500; want the store relearned: 500 and 100", e.noLoad, e.before)
	}
	e.remember(120, 5)
	if e.noLoad != 100 || e.before != 0 {
		t.Errorf("noLoad = %v, before = %v after one window of 120; want 100 and 0", e.noLoad, e.before)
	}
}

// A store that became faster by itself while its relearned no-load latency
// was kept is found so at the first window that is faster by cutHelped,
// even while the calls the limit lets in keep its latency above twice the
// no-load latency of before: the old one returns, and the limit is cut to
// it. A store still slow is taken back to its slow latency, and the limit
// before the cut returns, when that cut does not help.
func TestNoLoadBackWhenStoreFaster(t *testing.T) {
	e := settled(100)
	for range 3 {
		e.remember(100, 5)
	}
	for range 8 {
		e.remember(500, 5)
	}
	e.remember(300, 5)
	if e.noLoad != 100 || e.before != 0 {
		t.Fatalf("noLoad = %v, before = %v after a window of 300 (below 500 by more than %v, above 2×100); want 100 and 0", e.noLoad, e.before, cutHelped)
	}

	e.limit, e.peak, e.probing = 16, 16, false
	e.update(480, 16)
	if e.limit != 8 || e.cutRTT != 480 {
		t.Fatalf("limit = %v, cutRTT = %v after a window of 480 over a no-load 100; want a cut to 8 from 16 at 480", e.limit, e.cutRTT)
	}
	e.update(470, 16)
	if e.noLoad != 470 || e.before != 100 || e.limit != 16 {
		t.Errorf("noLoad = %v, before = %v, limit = %v after the cut did not help; want 470, 100 and 16 back", e.noLoad, e.before, e.limit)
	}
}

// When the store is as fast as before it slowed, the limit of before
// returns at once, though the window that tells it, its calls served by the
// slow store, has a latency that alone would cut the limit.
func TestLimitBackWhenStoreFast(t *testing.T) {
	e := settled(100)
	e.limit, e.peak, e.probing = 16, 16, false
	e.update(480, 16)
	e.update(470, 16) // the cut did not help: the store is slower by itself
	if e.before != 100 || e.limitBefore != 16 {
		t.Fatalf("before = %v, limitBefore = %v after a cut that did not help; want 100 and 16", e.before, e.limitBefore)
	}
	e.limit = 6 // cut while the store was slow
	e.update(190, 6)
	if e.noLoad != 100 || e.before != 0 || e.limit != 16 {
		t.Errorf("noLoad = %v, before = %v, limit = %v after a window of 190 (within twice 100); want 100, 0 and the limit of before, 16", e.noLoad, e.before, e.limit)
	}
}

// Past the first cut, a latency within twice the no-load one moves the limit
// halfway to its target.
func TestLimitMovesHalfway(t *testing.T) {
	e := settled(100)
	e.limit, e.peak, e.probing = 16, 16, false
	e.update(125, 16)
	// target = 16 × 100/125 + queued(16) = 12.8 + 1
	if want := 16 + (13.8-16)/2; math.Abs(e.limit-want) > 1e-9 {
		t.Errorf("limit = %v after a window of 125 over a no-load 100; want %v, halfway to 13.8", e.limit, want)
	}
}

// A limit whose every slot is held counts its fraction among the calls in
// the store: at the latency that leaves queued(limit) of them waiting it
// holds, where counting the slots alone would lower it window after window.
func TestLimitFractionCounts(t *testing.T) {
	e := settled(100)
	e.limit, e.peak, e.probing = 8.6, 8, false
	rtt := 100 * 8.6 / (8.6 - queued(8.6))
	for range 20 {
		e.update(rtt, 8)
	}
	if math.Abs(e.limit-8.6) > 1e-6 {
		t.Errorf("limit = %v after 20 windows at %.2f, the latency of queued(8.6) calls waiting in 8.6; want 8.6", e.limit, rtt)
	}
}

// Latency is measured also when the limit is fixed: ShedLatency alone makes
// the limiter measure it, and the limit stays at Limit.
func TestFixedLimitMeasuresForShedding(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := &fakeStore{base: 10 * time.Millisecond, capacity: 16}
		s.mult.Store(1)
		l := mustNew(t, Options{Limit: 8, ShedLatency: time.Second})
		ctx, cancel := context.WithCancel(t.Context())
		wait := drive(ctx, l, s, 20)
		time.Sleep(100 * time.Millisecond)
		cancel()
		wait()
		st := l.Stats()
		if st.Latency != 10*time.Millisecond || st.NoLoadLatency != 10*time.Millisecond {
			t.Errorf("Latency, NoLoadLatency = %v, %v; want 10ms, 10ms", st.Latency, st.NoLoadLatency)
		}
		if l.Limit() != 8 {
			t.Errorf("Limit() = %d, want the fixed 8", l.Limit())
		}
	})
}

// Once the store's measured latency is above ShedLatency, Low-priority and
// background calls are shed with ReasonLatency, even with slots free, while
// a slot has been held longer than ShedLatency; Normal and High calls still
// get slots. Once the store holds no such slot, calls go in again, so that
// shedding does not outlive the slowness it measured.
func TestShedLatencyStore(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const limit = 8 // a window of a fixed limit is max(minWindow, 8) releases
		l := mustNew(t, Options{Limit: limit, ShedLatency: 50 * time.Millisecond})
		// hold makes a window's worth of calls of d at once.
		hold := func(d time.Duration) {
			for range limit {
				if err := l.Acquire(t.Context()); err != nil {
					t.Fatal(err)
				}
			}
			time.Sleep(d)
			for range limit {
				l.Release()
			}
		}
		hold(10 * time.Millisecond)
		low := WithPriority(t.Context(), Low)
		if err := l.Acquire(low); err != nil {
			t.Fatalf("Low Acquire with a fast store: %v", err)
		}
		l.Release()
		if err := l.AcquireBackground(); err != nil {
			t.Fatalf("AcquireBackground with a fast store: %v", err)
		}
		l.Release()

		hold(100 * time.Millisecond)
		if got := l.Stats().Latency; got != 100*time.Millisecond {
			t.Fatalf("Latency = %v after slow calls, want 100ms", got)
		}
		// A slow call in the store, held past ShedLatency.
		if err := l.Acquire(t.Context()); err != nil {
			t.Fatal(err)
		}
		time.Sleep(60 * time.Millisecond)
		var oe *OverloadError
		if err := l.Acquire(low); !errors.As(err, &oe) || oe.Reason != ReasonLatency || oe.Priority != Low || oe.RetryAfter != time.Second {
			t.Errorf("Low Acquire with a slow store: %v, want an OverloadError for %q with RetryAfter 1s", err, ReasonLatency)
		}
		if err := l.AcquireBackground(); !errors.As(err, &oe) || oe.Reason != ReasonLatency || !oe.Background {
			t.Errorf("AcquireBackground with a slow store: %v, want a background OverloadError for %q", err, ReasonLatency)
		}
		if l.TryAcquireBackground() {
			t.Error("TryAcquireBackground with a slow store: true, want false")
		}
		for _, p := range []Priority{Normal, High} {
			if err := l.Acquire(WithPriority(t.Context(), p)); err != nil {
				t.Errorf("%v Acquire with a slow store: %v", p, err)
			} else {
				l.Release()
			}
		}
		st := l.Stats()
		if st.ShedLatency != 3 || st.ShedLow != 1 || st.ShedBackground != 2 || st.Shed() != 3 {
			t.Errorf("Stats: ShedLatency %d, ShedLow %d, ShedBackground %d, Shed() %d; want 3, 1, 2, 3",
				st.ShedLatency, st.ShedLow, st.ShedBackground, st.Shed())
		}

		// The slow call returns: with no slot held, the last measure alone
		// sheds nothing, and the calls let in measure the store anew.
		l.Release()
		if err := l.Acquire(low); err != nil {
			t.Errorf("Low Acquire with nothing held past ShedLatency: %v", err)
		} else {
			l.Release()
		}
		if err := l.AcquireBackground(); err != nil {
			t.Errorf("AcquireBackground with nothing held past ShedLatency: %v", err)
		} else {
			l.Release()
		}
	})
}

// AcquireBackground gives the reason TryAcquireBackground's false stands
// for: no slot outside the reserve is ReasonReserve.
func TestAcquireBackgroundReserve(t *testing.T) {
	l := mustNew(t, Options{Limit: 2, Reserve: 1, QueueTimeout: 3 * time.Second})
	if err := l.AcquireBackground(); err != nil {
		t.Fatalf("AcquireBackground with every slot free: %v", err)
	}
	var oe *OverloadError
	err := l.AcquireBackground()
	if !errors.As(err, &oe) || !errors.Is(err, ErrOverloaded) {
		t.Fatalf("AcquireBackground with only the reserve free: %v, want an *OverloadError", err)
	}
	want := OverloadError{Reason: ReasonReserve, Background: true, RetryAfter: 3 * time.Second}
	if *oe != want {
		t.Errorf("AcquireBackground: %+v, want %+v", *oe, want)
	}
	l.Release()
	if st := l.Stats(); st.ShedReserve != 1 || st.ShedBackground != 1 || st.Acquired != 1 {
		t.Errorf("Stats: ShedReserve %d, ShedBackground %d, Acquired %d; want 1, 1, 1", st.ShedReserve, st.ShedBackground, st.Acquired)
	}
}

// A Low-priority call that would have to wait is shed with ReasonLatency
// once the longest-waiting call has waited more than ShedLatency, and one
// that waits is shed once it has waited ShedLatency itself (the store's
// latency is not measured yet); a Normal call queues whatever the wait.
func TestShedLatencyQueueWait(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		l := mustNew(t, Options{Limit: 1, ShedLatency: 50 * time.Millisecond})
		if err := l.Acquire(t.Context()); err != nil {
			t.Fatal(err)
		}
		normal := acquireAsync(l, t.Context())
		synctest.Wait()
		early := acquireAsync(l, WithPriority(t.Context(), Low))
		synctest.Wait()
		if got := l.Waiting(); got != 2 {
			t.Fatalf("Waiting() = %d, want the Normal and the early Low call", got)
		}
		time.Sleep(60 * time.Millisecond)
		var oe *OverloadError
		if err := <-early; !errors.As(err, &oe) || oe.Reason != ReasonLatency {
			t.Errorf("Low call waiting 60ms: %v, want an OverloadError for %q", err, ReasonLatency)
		}
		if err := l.Acquire(WithPriority(t.Context(), Low)); !errors.As(err, &oe) || oe.Reason != ReasonLatency {
			t.Errorf("Low Acquire behind a 60ms wait: %v, want an OverloadError for %q", err, ReasonLatency)
		}
		late := acquireAsync(l, t.Context())
		synctest.Wait()
		if got := l.Waiting(); got != 2 {
			t.Errorf("Waiting() = %d, want 2: a Normal call is not shed by the wait", got)
		}
		l.Release()
		if err := <-normal; err != nil {
			t.Fatal(err)
		}
		l.Release()
		if err := <-late; err != nil {
			t.Fatal(err)
		}
		l.Release()
		if st := l.Stats(); st.ShedLatency != 2 || st.ShedLow != 2 {
			t.Errorf("Stats: ShedLatency %d, ShedLow %d; want 2, 2", st.ShedLatency, st.ShedLow)
		}
	})
}

// With the store's latency measured, a Low-priority call waits at most
// ShedLatency less that latency, the time it has left to be answered
// within ShedLatency, and is shed with ReasonLatency then; once the latency
// is ShedLatency or more, a Low call that would have to wait is shed at
// once. Normal calls wait their QueueTimeout.
func TestShedLatencyLowWaitBudget(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		l := mustNew(t, Options{Limit: 1, ShedLatency: 100 * time.Millisecond, QueueTimeout: time.Second})
		// measure makes two windows (minWindow releases each) of calls of
		// d: the second holds none of the slots taken before.
		measure := func(d time.Duration) {
			for range 2 * minWindow {
				if err := l.Acquire(t.Context()); err != nil {
					t.Fatal(err)
				}
				time.Sleep(d)
				l.Release()
			}
			if got := l.Stats().Latency; got != d {
				t.Fatalf("Latency = %v, want %v", got, d)
			}
		}
		measure(60 * time.Millisecond)
		if err := l.Acquire(t.Context()); err != nil {
			t.Fatal(err)
		}
		start := time.Now()
		err := l.Acquire(WithPriority(t.Context(), Low))
		var oe *OverloadError
		if !errors.As(err, &oe) || oe.Reason != ReasonLatency {
			t.Errorf("Low call behind a held slot: %v, want an OverloadError for %q", err, ReasonLatency)
		}
		if waited := time.Since(start); waited != 40*time.Millisecond {
			t.Errorf("the Low call waited %v, want 40ms: ShedLatency 100ms less the latency 60ms", waited)
		}
		start = time.Now()
		if err := l.Acquire(t.Context()); !errors.As(err, &oe) || oe.Reason != ReasonQueueTimeout {
			t.Errorf("Normal call behind a held slot: %v, want an OverloadError for %q", err, ReasonQueueTimeout)
		}
		if waited := time.Since(start); waited != time.Second {
			t.Errorf("the Normal call waited %v, want the QueueTimeout, 1s", waited)
		}
		l.Release()

		measure(120 * time.Millisecond)
		if err := l.Acquire(t.Context()); err != nil {
			t.Fatal(err)
		}
		start = time.Now()
		if err := l.Acquire(WithPriority(t.Context(), Low)); !errors.As(err, &oe) || oe.Reason != ReasonLatency {
			t.Errorf("Low call behind a held slot, latency above ShedLatency: %v, want an OverloadError for %q", err, ReasonLatency)
		}
		if waited := time.Since(start); waited != 0 {
			t.Errorf("the Low call waited %v with the latency above ShedLatency, want it shed at once", waited)
		}
		l.Release()
	})
}

func TestAdaptiveOptionsErrors(t *testing.T) {
	for _, tc := range []struct {
		o    Options
		want string
	}{
		{Options{Limit: 8, MinLimit: -1}, "limiter: MinLimit is -1, must not be negative"},
		{Options{Limit: 8, MinLimit: 9}, "limiter: MinLimit is 9, must be at most Limit (8)"},
		{Options{Limit: 8, Reserve: 2, MinLimit: 2}, "limiter: MinLimit is 2, must be above Reserve (2)"},
		{Options{Limit: 8, ShedLatency: -time.Second}, "limiter: ShedLatency is -1s, must not be negative"},
	} {
		if _, err := New(tc.o); err == nil || err.Error() != tc.want {
			t.Errorf("New(%+v) = %v, want %q", tc.o, err, tc.want)
		}
	}
	l := mustNew(t, Options{Limit: 8, Reserve: 2, MinLimit: 3})
	if got := l.Limit(); got != 3 {
		t.Errorf("Limit() of a new adaptive limiter = %d, want its floor 3", got)
	}
}

// After the adaptive limit falls below the slots held, released slots are
// not handed on until fewer than the limit are held; then the first waiter
// of the highest priority gets the next one.
func TestLoweredLimitDrainsBeforeGranting(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		l := mustNew(t, Options{Limit: 8, MinLimit: 3})
		for range 3 {
			if err := l.Acquire(t.Context()); err != nil {
				t.Fatal(err)
			}
		}
		low := acquireAsync(l, WithPriority(t.Context(), Low))
		synctest.Wait()
		high := acquireAsync(l, WithPriority(t.Context(), High))
		synctest.Wait()
		l.mu.Lock()
		l.limit.Store(1) // as a window of a slower store would set it
		l.mu.Unlock()
		l.Release()
		l.Release()
		synctest.Wait()
		checkCounts(t, l, 1, 2)
		l.Release()
		if err := <-high; err != nil {
			t.Fatalf("High waiter: %v", err)
		}
		checkCounts(t, l, 1, 1)
		l.Release()
		if err := <-low; err != nil {
			t.Fatalf("Low waiter: %v", err)
		}
		l.Release()
		checkCounts(t, l, 0, 0)
	})
}
