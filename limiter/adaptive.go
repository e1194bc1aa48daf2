package limiter

import (
	"math"
	"slices"
	"time"
)

// minWindow is the fewest releases a window holds, so that one slow or
// fast call moves its mean by a fifth at most.
const minWindow = 5

// relearn is how many windows in a row the filtered latency must stay
// above twice the no-load latency before the store is taken to have become
// slower by itself.
const relearn = 4

// cutHelped is the share by which the latency must fall in the window after
// a cut for the cut to be taken to have helped.
const cutHelped = 0.25

// firstReleases is how many releases the no-load latency is first the mean
// of: at a coefficient of variation of 0.2, within 5% of the store's, where
// the lowest of the first windows' means (four calls each at a floor of 4)
// is often 10% below it, and a limiter whose no-load latency is too low
// counts calls as waiting that are not, and holds less than its share.
const firstReleases = 16

// queued returns how many calls of a limit may wait inside the store while
// the limit still grows: max(½, √limit/4). Each of n limiters sharing a
// store keeps about this many of its calls waiting in it, so the store
// holds n times as many calls waiting: past its capacity, a store slower
// with every call (a database contending for its locks) serves fewer calls
// a second the more it holds, each call waiting costing it about
// 1/capacity of its throughput.
func queued(limit float64) float64 { return max(0.5, math.Sqrt(limit)/4) }

// estimator measures the store's latency over windows of released slots and
// adapts the limit from it, the way TCP Vegas does. It is guarded by the
// Limiter's mu.
//
// Release carries no token, so a released slot is paired with the oldest
// slot held: its latency is the time since that slot was taken. When calls
// finish in the order they started this is each call's latency; otherwise
// a window's sum is off by the difference between what the pairing lacks
// at the window's start and at its end, as often positive as negative, and
// over any span that starts and ends with no slot held it is exact.
//
// A window closes at the release that makes it max(minWindow, limit)
// releases long, about one latency at the limit; until the first cut
// (while probing) max(2, limit), one latency; and after a cut made on a
// latency above twice the no-load one, max(2, limit/2). After a window
// that changed the limit, the releases of the next latency are not
// counted: they are of slots taken under the old limit.
//
// The no-load latency d is the mean of the first firstReleases releases'
// latencies (the windows that hold them, taken at the floor and in the
// slow start, while the store is unloaded), and then the lowest filtered
// latency seen, the filtered latency being the median of the last three
// windows' means, so that one unusually fast or slow window (a late timer,
// a stalled scheduler) moves neither d nor the decision it feeds. When the
// filtered latency stays above 2d for relearn windows in a row, the
// limit's own cuts have not brought it down: the store has become slower
// by itself, and d becomes the filtered latency, so that a uniformly
// slower store gets its concurrency back; at the first window whose
// latency is back within twice the d of before, or below the relearned d
// by cutHelped (the store became faster by itself, though the calls let in
// under the relearned d keep it slower than twice the old one), that d
// returns, and with it the limit of before the store slowed, if higher:
// that window's latency is mostly of calls the slow store served, and a
// target drawn from it would cut a limit the store can use again. A
// quicker test catches a step: when a window whose latency was above 2d
// cut the limit and the next window's latency fell by less than cutHelped,
// the cut did not help; the store is slower by itself, d becomes that
// latency and the limit before the cut returns.
//
// At a window's close, with rtt its mean latency and peak the most slots
// held at once in it, the calls of this limiter in the store are n = the
// limit when every slot was held (its fraction counts, or a limit cut to
// a target below it would lose the fraction window after window), peak
// otherwise; about n*(1-d/rtt) of them wait, and the target is the limit
// that leaves queued(limit) of them waiting: n*d/rtt + queued(limit).
// Until the first cut, a target above the limit raises it by √limit (a
// slow start from the floor), and one below cuts it to the target. After
// it, while rtt is within twice d, the limit moves halfway to the target:
// past its capacity a store whose latency grows as the square of its calls
// shows each limiter twice the excess of calls it holds, and the limiters
// sharing it, moving all the way, would overshoot by as much as they
// correct and swing around its capacity instead of settling; halfway they
// settle. A latency above twice d cuts the limit to the target, by half at
// most. The limit rises only when at least half of it was held at some
// instant of the window: a window short of calls says nothing of
// capacity. Several limiters sharing a store each keep about
// queued(limit) calls waiting in it, so the larger limits fall first and
// they meet near equal shares.
//
// The limit stays within [min, max]. With min == 0 the limit is fixed and
// the estimator only measures, for ShedLatency.
type estimator struct {
	min, max int
	// limit is the adaptive limit, in [min, max]. It starts at min, so that
	// the first windows see the store with few calls in it.
	limit  float64
	noLoad float64 // nanoseconds; zero before the first window

	// starts holds when each held slot was taken, oldest first: a ring of
	// len(starts) == max entries, n of them used from head.
	starts  []time.Time
	head, n int

	sum      float64   // nanoseconds of latency released in the window
	releases int       // slots released in the window
	peak     int       // most slots held at once in the window
	from     time.Time // releases before it are not counted

	// recent holds the latencies of the last three windows, a ring that
	// windows (the windows closed so far) indexes.
	recent  [3]float64
	windows int
	slow    int // windows in a row whose filtered latency was above 2*noLoad
	// before is the no-load latency before the store was found slower by
	// itself; zero when it was not.
	before float64
	// probing is true until the first window that lowers the limit: till
	// then the limit grows by √limit a window, as TCP's slow start doubles.
	probing bool
	// cutRTT is the latency of the last window when it lowered the limit
	// from cutFrom with a latency above twice the no-load one; zero
	// otherwise.
	cutRTT, cutFrom float64
	// limitBefore is the limit before the store was found slower by itself;
	// it returns with the no-load latency of before.
	limitBefore float64
	// firstSum and first are the latency summed over the first windows'
	// releases, and their number, until first reaches firstReleases.
	firstSum float64
	first    int
}

func newEstimator(floor, ceiling int) *estimator {
	return &estimator{min: floor, max: ceiling, limit: float64(max(floor, 1)), probing: true, starts: make([]time.Time, ceiling)}
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
	if now.Before(e.from) {
		return
	}
	e.sum += float64(now.Sub(start))
	e.releases++
	need := max(minWindow, int(e.limit))
	if e.probing && e.min > 0 {
		// While the limit grows from its floor, a window is one latency:
		// the limit's slots, released once.
		need = max(2, int(e.limit))
	}
	if e.cutRTT > 0 {
		// The window that tells whether a cut helped: half a limit of
		// releases, so that at a low limit it takes one latency, not two.
		need = max(2, int(e.limit)/2)
	}
	if e.releases < need {
		return
	}
	rtt := e.sum / float64(e.releases)
	if rtt <= 0 {
		// Slots released as soon as taken (a clock that did not move)
		// say nothing of the store.
		e.sum, e.releases, e.peak = 0, 0, l.inUse
		return
	}
	old := int(e.limit)
	e.update(rtt, e.releases)
	e.sum, e.releases, e.peak, e.from = 0, 0, l.inUse, now
	l.latency.Store(int64(rtt))
	l.noLoad.Store(int64(e.noLoad))
	if e.min == 0 {
		return
	}
	limit := int(e.limit)
	l.limit.Store(int64(limit))
	if limit == old {
		return
	}
	e.from = now.Add(time.Duration(rtt))
	// A raised limit lets waiting calls in at once; the slot being released
	// is handed on after this, by releaseLocked.
	for l.inUse < limit && l.grantLocked() {
		l.inUse++
		if int64(l.inUse) > l.maxInUse.Load() {
			l.maxInUse.Store(int64(l.inUse))
		}
	}
}

// update closes a window of n releases whose mean latency was rtt
// nanoseconds.
func (e *estimator) update(rtt float64, n int) {
	wasSlow := e.before != 0
	e.remember(rtt, n)
	if e.min == 0 {
		return
	}
	switch {
	case wasSlow && e.before == 0:
		// The store is as fast as before it slowed: the limit of then
		// returns, and this window, whose calls the slow store served,
		// decides nothing more.
		e.cutRTT = 0
		e.limit = min(max(e.limit, e.limitBefore), float64(e.max))
		return
	case !wasSlow && e.before != 0:
		// remember relearned the no-load latency, the store slow for
		// relearn windows whatever the cuts: the limit of before is the
		// higher of now and before the last cut.
		e.limitBefore = max(e.limit, e.cutFrom)
	}
	if cut := e.cutRTT; cut > 0 {
		e.cutRTT = 0
		if rtt >= (1-cutHelped)*cut && rtt > 2*e.noLoad {
			// The cut did not bring the latency down: the store became
			// slower by itself. Its latency now is its no-load latency,
			// and the limit before the cut returns.
			if e.before == 0 {
				e.before, e.limitBefore = e.noLoad, e.cutFrom
			}
			e.noLoad, e.slow = rtt, 0
			e.limit = e.cutFrom
			return
		}
	}
	held := min(e.limit, float64(e.peak))
	if e.peak >= int(e.limit) {
		held = e.limit
	}
	target := held*e.noLoad/rtt + queued(e.limit)
	busy := 2*e.peak >= int(e.limit)
	switch {
	case e.probing && target >= e.limit:
		if busy {
			e.limit += math.Sqrt(e.limit)
		}
	case !e.probing && rtt <= 2*e.noLoad:
		if target < e.limit || busy {
			e.limit += (target - e.limit) / 2
		}
	default:
		if rtt > 2*e.noLoad {
			e.cutFrom, e.cutRTT = e.limit, rtt
		}
		e.probing = false
		e.limit = max(e.limit/2, target)
	}
	e.limit = min(max(e.limit, float64(e.min)), float64(e.max))
}

// remember adds the latency of a window of n releases, and sets noLoad
// from it.
func (e *estimator) remember(rtt float64, n int) {
	e.recent[e.windows%len(e.recent)] = rtt
	e.windows++
	if e.first < firstReleases {
		e.firstSum += rtt * float64(n)
		e.first += n
		e.noLoad = e.firstSum / float64(e.first)
		return
	}
	f := median(e.recent[:min(e.windows, len(e.recent))])
	switch {
	case e.before != 0 && (min(f, rtt) <= 2*e.before || rtt < (1-cutHelped)*e.noLoad):
		// The store is back within twice its latency before it slowed, or
		// has become faster by itself (by as much as a cut that helped
		// would make it): at the first window that says so, since a
		// no-load latency learned while it was slow, kept longer, would
		// let the limit run away on a store as fast as before, and the
		// latency of the calls that limit lets in would keep it above
		// twice the old one. A store still slow is taken back to its
		// slow no-load latency two windows later, as when a cut did not
		// help.
		e.noLoad, e.before, e.slow = min(f, e.before), 0, 0
	case e.noLoad == 0 || f < e.noLoad:
		e.noLoad, e.slow = f, 0
	case f > 2*e.noLoad:
		e.slow++
	default:
		e.slow = 0
	}
	if e.slow >= relearn {
		if e.before == 0 {
			e.before = e.noLoad
		}
		e.noLoad, e.slow = f, 0
	}
}

// median returns the median of up to three latencies: the middle one, or
// the higher of two.
func median(xs []float64) float64 {
	s := slices.Sorted(slices.Values(xs))
	return s[len(s)/2]
}
