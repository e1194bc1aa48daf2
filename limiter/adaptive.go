package limiter

import (
	"math"
	"time"
)

// tolerance is how far above the no-load latency a window's latency may be
// while the adaptive limit still grows: up to 25% of queueing at the store.
const tolerance = 1.25

// estimator measures the store's latency over windows of released slots and
// adapts the limit from it. It is guarded by the Limiter's mu.
//
// A window's latency is Little's law over the window: the slot-time held
// (the integral of the slots in use) divided by the slots released. It needs
// no per-call timestamp, so Release keeps its signature, and in a steady
// state it equals the mean time a slot is held whatever the window's length.
// A window closes at the release that makes it at least max(2, limit/2)
// releases long, about one round of the slots when they are all busy.
//
// At the close of a window with latency rtt, mean in-flight calls n and
// no-load estimate d:
//   - d becomes rtt if rtt is lower (d is the lowest latency seen);
//   - if rtt <= tolerance*d the store is not queueing: when at least half
//     the limit was in use at some instant of the window, the limit grows
//     by its square root (a call-limited window says nothing of capacity);
//   - otherwise the store queues: the limit becomes min(limit, n)*d/rtt,
//     the concurrency that would have given the no-load latency if latency
//     grows with concurrency, but at least half the limit;
//   - when the limit is already at its floor and rtt is still above
//     tolerance*d, the store has become slower by itself, not from our
//     calls: d becomes rtt, so that a uniformly slower store gets its
//     concurrency back; a lower latency later brings d down at once.
//
// The limit stays within [min, max]; a fixed limit (min == 0) only measures.
type estimator struct {
	min, max int
	limit    float64 // the adaptive limit, in [min, max]
	noLoad   float64 // nanoseconds; zero before the first window

	start    time.Time // when the window began
	last     time.Time // when area was last brought up to date
	area     float64   // slot-nanoseconds held in the window
	releases int       // slots released in the window
	peak     int       // most slots held at once in the window
}

func newEstimator(min, max int) *estimator {
	now := time.Now()
	return &estimator{min: min, max: max, limit: float64(max), start: now, last: now}
}

// measureLocked brings the estimator up to date before the slots in use
// change; release reports a slot released by Release, which may close the
// window and change the limit. l.mu must be held and l.est set.
func (l *Limiter) measureLocked(release bool) {
	e := l.est
	now := time.Now()
	if dt := now.Sub(e.last); dt > 0 {
		e.area += float64(l.inUse) * float64(dt)
	}
	e.last = now
	e.peak = max(e.peak, l.inUse)
	if !release {
		return
	}
	e.releases++
	if e.releases < max(2, int(e.limit)/2) {
		return
	}
	elapsed := float64(now.Sub(e.start))
	if elapsed <= 0 {
		return
	}
	rtt := e.area / float64(e.releases)
	e.update(rtt, e.area/elapsed)
	e.start, e.area, e.releases, e.peak = now, 0, 0, l.inUse
	l.latency.Store(int64(rtt))
	l.noLoad.Store(int64(e.noLoad))
	if e.min == 0 {
		return
	}
	limit := int(e.limit)
	l.limit.Store(int64(limit))
	// A raised limit lets waiting calls in at once; the slot being released
	// by the caller is handed on after this, by releaseLocked.
	for l.inUse < limit && l.grantLocked() {
		l.inUse++
		if int64(l.inUse) > l.maxInUse.Load() {
			l.maxInUse.Store(int64(l.inUse))
		}
	}
}

// update closes a window whose latency was rtt nanoseconds with inflight
// slots held on average.
func (e *estimator) update(rtt, inflight float64) {
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
		e.limit = max(e.limit/2, min(e.limit, inflight)*e.noLoad/rtt)
	}
	e.limit = min(max(e.limit, float64(e.min)), float64(e.max))
}
