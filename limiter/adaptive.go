package limiter

import (
	"math"
	"time"
)

// minWindow is the fewest releases a window holds, so that one slow or
// fast call moves its mean by a fifth at most.
const minWindow = 5

// tolerance is how far above the no-load latency a window's latency may be
// while the adaptive limit still grows: up to 25% of queueing at the store.
const tolerance = 1.25

// estimator measures the store's latency over windows of released slots and
// adapts the limit from it. It is guarded by the Limiter's mu.
//
// Release carries no token, so a released slot is paired with the oldest
// slot held: its latency is the time since that slot was taken. When calls
// finish in the order they started this is each call's latency; otherwise
// a window's mean is off by at most the age of the oldest held slot over
// the window's releases, and over any span that starts and ends with no
// slot held the latencies sum exactly to the true ones.
//
// A window counts only the slots taken since it began, so that it measures
// the limit it was opened with, and closes at the release that makes it
// max(minWindow, limit/2) releases long. At its close,
// with rtt its mean latency, peak the most slots held at once in it and d
// the no-load estimate:
//   - d becomes rtt if rtt is lower (d is the lowest latency seen);
//   - if rtt <= tolerance*d the store is not queueing: when at least half
//     the limit was held at some instant of the window, the limit grows by
//     its square root (a window short of calls says nothing of capacity);
//   - otherwise the store queues: the limit becomes min(limit, peak)*d/rtt,
//     the concurrency that gives the no-load latency if latency grows in
//     proportion to concurrency, but at least half the limit;
//   - when the limit is already at its floor and rtt is still above
//     tolerance*d, the store has become slower by itself, not from these
//     calls: d becomes rtt, so that a uniformly slower store gets its
//     concurrency back; a lower latency later brings d down at once.
//
// The limit stays within [min, max]. With min == 0 the limit is fixed and
// the estimator only measures, for ShedLatency.
type estimator struct {
	min, max int
	// limit is the adaptive limit, in [min, max]. It starts at min, so that
	// the first windows see the store with few calls in it: d is the lowest
	// latency seen, and a store first met with many calls would never show
	// its no-load latency.
	limit  float64
	noLoad float64 // nanoseconds; zero before the first window

	// starts holds when each held slot was taken, oldest first: a ring of
	// len(starts) == max entries, n of them used from head.
	starts  []time.Time
	head, n int

	sum      float64   // nanoseconds of latency released in the window
	releases int       // slots released in the window
	peak     int       // most slots held at once in the window
	since    time.Time // when the window began: slots taken before are not counted
}

func newEstimator(floor, ceiling int) *estimator {
	return &estimator{min: floor, max: ceiling, limit: float64(max(floor, 1)), starts: make([]time.Time, ceiling)}
}

// took records a slot taken at now.
func (e *estimator) took(now time.Time, inUse int) {
	e.starts[(e.head+e.n)%len(e.starts)] = now
	e.n++
	e.peak = max(e.peak, inUse)
}

// forget drops the newest start: a slot granted to a call that left before
// using it.
func (e *estimator) forget() {
	e.n--
}

// measureReleaseLocked measures the release of a slot now, pairing it with the
// oldest held slot, and closes the window when it is long enough. l.mu must
// be held and l.est set.
func (l *Limiter) measureReleaseLocked() {
	e := l.est
	now := time.Now()
	start := e.starts[e.head]
	e.head = (e.head + 1) % len(e.starts)
	e.n--
	if start.Before(e.since) {
		return // taken under the previous window's limit
	}
	e.sum += float64(now.Sub(start))
	e.releases++
	if e.releases < max(minWindow, int(e.limit)/2) {
		return
	}
	rtt := e.sum / float64(e.releases)
	e.update(rtt)
	e.sum, e.releases, e.peak, e.since = 0, 0, l.inUse, now
	l.latency.Store(int64(rtt))
	l.noLoad.Store(int64(e.noLoad))
	if e.min == 0 {
		return
	}
	limit := int(e.limit)
	l.limit.Store(int64(limit))
	// A raised limit lets waiting calls in at once; the slot being released
	// is handed on after this, by releaseLocked.
	for l.inUse < limit && l.grantLocked() {
		l.inUse++
		if int64(l.inUse) > l.maxInUse.Load() {
			l.maxInUse.Store(int64(l.inUse))
		}
	}
}

// update closes a window whose mean latency was rtt nanoseconds.
func (e *estimator) update(rtt float64) {
	if e.noLoad == 0 || rtt < e.noLoad {
		e.noLoad = rtt
	}
	if e.min == 0 {
		return
	}
	switch {
	case rtt <= tolerance*e.noLoad:
		if 2*e.peak >= int(e.limit) {
			e.limit += math.Sqrt(e.limit)
		}
	case int(e.limit) <= e.min:
		e.noLoad = rtt
	default:
		e.limit = max(e.limit/2, min(e.limit, float64(e.peak))*e.noLoad/rtt)
	}
	e.limit = min(max(e.limit, float64(e.min)), float64(e.max))
}
