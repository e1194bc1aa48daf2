package lab

import (
	"fmt"
	"math"
	"slices"
	"strconv"
	"time"

	"github.com/herdcache/herd/xfetch"
)

// measures is a Run with the figures its promises are checked against.
type measures struct {
	run  Run
	plan plan
	// hot-key: the largest number of calls in one expiry, fleet-wide and
	// for one replica.
	maxPerExpiry, maxPerReplicaExpiry int
	// hot-key: loads per soft TTL after warm-up, fleet-wide; the stale
	// serves that came before the refresh that replaced their value had
	// begun, and the late refreshes, whose value reached a replica only
	// after the old one expired; the refreshes started ahead of expiry
	// (Stats.AheadRefreshes).
	loadsPerTTL                       float64
	staleBeforeRefresh, lateRefreshes int
	aheadRefreshes                    int64
	// hot-key: the mean duration of its loads after warm-up.
	meanLoad time.Duration
	// timerLate is the most the run's traffic timers woke late: how far
	// behind the machine ran the run's goroutines.
	timerLate time.Duration
	// flush, cold-start: the largest number of calls for one key since the
	// flush or start, fleet-wide and for one replica.
	maxPerKey, maxPerReplicaKey int
	// flush, cold-start: the keys loaded, and the (replica, key) pairs.
	keysLoaded, pairsLoaded int
	// node-kill: the largest number of calls one replica made for one key
	// while the node was down; the calls, loads and requests that began
	// while it was down; the errors no failure explains.
	maxPerReplicaKeyDown int
	downCalls, downLoads int
	downRequests         int64
	avoidableErrors      int64
	// cold-start warm and fleet: requests for warmed keys, those that
	// waited, and the backing-store calls that started while the replicas
	// warmed.
	warmRequests, waitedWarm int64
	// hot-key: the requests that waited for a load that took longer than
	// its key's load before it by more than XFetch's margin.
	waitedRanLong int64
	warmCalls     int
	// cold-start fleet: the size of the hottest fifth, and of the hot set
	// the replicas found (0 when it stayed empty); the fewest and the most
	// keys one replica's local tier held once warmed; WarmHot's keys loaded
	// and failed over every replica, and its calls that failed; for the
	// replica whose warmed keys did worst, the share of the hottest fifth's
	// popularity they take, and how many of the hottest fifth it warmed.
	hot, hotSetKeys        int
	minWarmed, maxWarmed   int
	warmLoaded, warmFailed int
	warmErrors             int
	minReadShare           float64
	minHottest             int
	// warmedTotal is the keys held once warmed, summed over the replicas
	// that warmed (replicasWarmed); minFound the fewest keys one replica's
	// WarmHot found in the Store, and heldFound whether each replica held
	// exactly the keys its WarmHot found.
	warmedTotal, replicasWarmed int
	minFound                    int
	heldFound                   bool
	// remoteFailures counts the remote tier's failures the run's caches
	// saw: failed calls, writes fenced after a lease lapsed, leases lost,
	// breaker openings (Stats). maxOverlap is the most loads of one key
	// that overlapped in time on one replica, among the calls the
	// promises judge: in-process coalescing keeps it at 1 whatever the
	// remote tier does.
	remoteFailures int64
	maxOverlap     int
	// peakReplica is the highest backing-store concurrency of one replica,
	// over allCalls, every backing-store call of the run.
	peakReplica int
	allCalls    int
}

// waitThreshold is the least latency at which a request answered by a
// backing-store call that ended during it counts as having waited for it: a
// quarter of the mean recompute time, at least 1ms. Below it, the request
// only read a value written a moment before.
func (o *Options) waitThreshold() time.Duration {
	return max(time.Millisecond, o.Latency.Mean()/4)
}

// analyze turns what the run recorded into a Run and its measures.
func (e *runEnv) analyze() *measures {
	calls := e.origin.Calls()
	m := &measures{plan: e.p}
	r := &m.run
	r.Scenario, r.Layer, r.Variant = e.p.scenario, e.p.layer, e.p.variant

	// Requests after warm-up: counts, waits and latency percentiles.
	warmed := e.warmedKeys()
	threshold := e.o.waitThreshold()
	prev := previousLoads(calls)
	lat := make([]time.Duration, 0, len(e.reqs))
	for _, q := range e.reqs {
		if q.start < e.measureFrom {
			continue
		}
		r.Requests++
		d := q.end - q.start
		lat = append(lat, d)
		switch q.outcome {
		case outcomeShed:
			r.Shed++
		case outcomeError:
			m.avoidableErrors++
		}
		if q.outcome != outcomeOK {
			r.Errors++
		}
		if e.killAt > 0 && q.start >= e.killAt && q.start < e.restartAt {
			m.downRequests++
		}
		isWarmed := warmed(int(q.replica), int(q.key))
		if isWarmed {
			m.warmRequests++
		}
		if waited(q, calls, threshold) {
			r.WaitedOnOrigin++
			if isWarmed {
				m.waitedWarm++
			}
			if ranLong(q, calls, prev) {
				m.waitedRanLong++
			}
		}
	}
	slices.Sort(lat)
	r.P50, r.P99, r.P999 = quantile(lat, 0.5), quantile(lat, 0.99), quantile(lat, 0.999)

	for _, rep := range e.reps {
		for _, c := range rep.caches() {
			st := c.Stats()
			r.StaleServed += st.StaleServed
			m.aheadRefreshes += st.AheadRefreshes
			m.remoteFailures += st.RemoteErrors + st.FencedWrites + st.LeaseLost + st.BreakerOpens
		}
	}

	counted := make([]Call, 0, len(calls))
	end := e.trafficEnd
	for _, c := range calls {
		if c.Start >= e.countFrom {
			counted = append(counted, c)
		}
		if c.Done {
			end = max(end, c.End)
		}
	}
	r.OriginCalls = int64(len(counted))
	m.allCalls = len(calls)
	var perReplica []int
	r.PeakOrigin, perReplica = e.origin.Peak()
	for _, p := range perReplica {
		m.peakReplica = max(m.peakReplica, p)
	}
	r.Bucket = e.o.bucket()
	r.Timeline, r.Concurrency = sweep(calls, r.Bucket, int(end/r.Bucket)+1)

	extra := map[string]float64{}
	switch e.p.scenario {
	case "hot-key":
		// Expiry events: groups of overlapping calls. Every call that starts
		// while another for the key is still running recomputes the same
		// expiry; the next expiry's first call starts after they all ended.
		// An expiry whose first call came too late for its stampede to be
		// seen whole is left out.
		last := e.trafficEnd - 2*e.o.Latency.Mean()
		all := episodes(counted)
		var measured [][]Call
		var n int
		for _, ep := range all {
			if ep[0].Start > last {
				continue
			}
			measured = append(measured, ep)
			r.Events = append(r.Events, Event{EventExpiry, ep[0].Start})
			r.Expiries++
			n += len(ep)
			m.maxPerExpiry = max(m.maxPerExpiry, countLoads(ep))
			for _, v := range perReplicaCounts(ep) {
				m.maxPerReplicaExpiry = max(m.maxPerReplicaExpiry, v)
			}
		}
		if r.Expiries > 0 {
			r.CallsPerExpiry = float64(n) / float64(r.Expiries)
		}
		m.maxOverlap = maxOverlap(counted)
		// The warm-up's value was written as the counting began.
		m.loadsPerTTL = loadsPerTTL(measured, e.countFrom, e.ttl)
		// RefreshAheadHot finds the hot key over the caches' first soft TTL,
		// which may end after the warm-up's value is due for its refresh:
		// stale serves count once that refresh's value has reached every
		// replica, which each does within its NearTTL.
		if len(all) > 0 {
			slack := e.nearTTL()
			m.staleBeforeRefresh, m.lateRefreshes = staleByRefresh(e.stale.times(), all, lastEnd(all[0])+slack, slack)
		}
		m.meanLoad = meanLoad(counted)
		extra["max_calls_per_expiry"] = float64(m.maxPerExpiry)
		extra["max_calls_per_replica_per_expiry"] = float64(m.maxPerReplicaExpiry)
		extra["loads_per_ttl"] = m.loadsPerTTL
		if e.rung >= rung("swr") { // below it nothing is served stale
			extra["stale_before_refresh"] = float64(m.staleBeforeRefresh)
			extra["late_refreshes"] = float64(m.lateRefreshes)
		}
		if e.rung >= rung("ahead") {
			extra["ahead_refreshes"] = float64(m.aheadRefreshes)
		}
	case "flush", "cold-start":
		from := e.flushAt
		if e.p.scenario == "cold-start" {
			from = 0
			r.Events = []Event{{EventStart, e.measureFrom}}
		} else if e.flushAt > 0 {
			r.Events = []Event{{EventFlush, e.flushAt}}
		}
		since := callsSince(counted, from, func(id uint64) bool {
			return e.p.scenario == "flush" && e.generation(id) == 0
		})
		m.maxOverlap = maxOverlap(since)
		perKey, perReplicaKey := keyCounts(since)
		m.keysLoaded, m.pairsLoaded = len(perKey), len(perReplicaKey)
		for _, v := range perKey {
			m.maxPerKey = max(m.maxPerKey, v)
		}
		for _, v := range perReplicaKey {
			m.maxPerReplicaKey = max(m.maxPerReplicaKey, v)
		}
		r.Expiries = 1
		r.CallsPerExpiry = float64(r.OriginCalls)
		extra["keys_loaded"] = float64(len(perKey))
		extra["max_calls_per_key"] = float64(m.maxPerKey)
		extra["max_calls_per_replica_per_key"] = float64(m.maxPerReplicaKey)
		if e.p.variant == "warm" || e.p.variant == "fleet" {
			for _, c := range calls {
				if c.Start >= e.warmFrom && c.Start < e.measureFrom {
					m.warmCalls++
				}
			}
			extra["waited_on_warmed_keys"] = float64(m.waitedWarm)
			extra["warm_calls"] = float64(m.warmCalls)
			if e.warmFailed > 0 {
				extra["warm_failed"] = float64(e.warmFailed)
			}
		}
		if f := e.fleet; f != nil {
			m.fleetMeasures(f, e.hot)
			extra["veteran_reads"] = float64(f.veteranReads)
			extra["hot_set_keys"] = float64(m.hotSetKeys)
			extra["warmed_keys"] = float64(m.minWarmed)
			extra["warmed_hottest"] = float64(m.minHottest)
			extra["warmed_read_share"] = m.minReadShare
			if f.veteranErrors > 0 {
				extra["veteran_errors"] = float64(f.veteranErrors)
			}
			if f.errors > 0 {
				extra["warm_errors"] = float64(f.errors)
			}
		}
	case "node-kill":
		var down []Call
		for _, c := range counted {
			if c.Start >= e.killAt && c.Start < e.restartAt {
				down = append(down, c)
			}
		}
		m.downCalls, m.downLoads = len(down), countLoads(down)
		if e.killAt > 0 {
			r.Events = []Event{{EventKill, e.killAt}, {EventRestart, e.restartAt}}
		}
		// While the node is down each replica is on its own: group each
		// replica's calls for a key into expiry events (calls overlapping in
		// time); an early refresh after an earlier one ended is another event.
		byReplicaKey := map[[2]int][]Call{}
		for _, c := range down {
			k := [2]int{c.Replica, c.Key}
			byReplicaKey[k] = append(byReplicaKey[k], c)
		}
		for _, cs := range byReplicaKey {
			for _, ep := range episodes(cs) {
				m.maxPerReplicaKeyDown = max(m.maxPerReplicaKeyDown, countLoads(ep))
			}
		}
		r.Expiries = 1
		r.CallsPerExpiry = float64(r.OriginCalls)
		extra["requests_while_down"] = float64(m.downRequests)
		extra["calls_while_down"] = float64(m.downCalls)
		extra["max_calls_per_replica_per_key_per_expiry_while_down"] = float64(m.maxPerReplicaKeyDown)
		extra["avoidable_errors"] = float64(m.avoidableErrors)
		extra["down_ms"] = float64((e.restartAt - e.killAt).Milliseconds())
	}
	if e.rung >= rung("limiter") {
		extra["peak_per_replica"] = float64(m.peakReplica)
	}
	if m.remoteFailures > 0 {
		extra["remote_failures"] = float64(m.remoteFailures)
	}
	m.timerLate = time.Duration(e.late.Load())
	extra["timer_late_ms"] = msOf(m.timerLate)
	r.Extra = extra
	return m
}

// generation returns the generation of the cache that made call id (see
// replica.gen).
func (e *runEnv) generation(id uint64) int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.callGen[id]
}

// callsSince returns the calls of cs that started at or after from, but
// those of a cache a flush retired.
func callsSince(cs []Call, from time.Duration, retired func(id uint64) bool) []Call {
	var out []Call
	for _, c := range cs {
		if c.Start >= from && !retired(c.ID) {
			out = append(out, c)
		}
	}
	return out
}

// meanLoad returns the mean duration of the loads among calls (zero
// without one).
func meanLoad(calls []Call) time.Duration {
	var sum time.Duration
	n := 0
	for _, c := range calls {
		if c.Done && loads(c) {
			sum += c.End - c.Start
			n++
		}
	}
	if n == 0 {
		return 0
	}
	return sum / time.Duration(n)
}

// maxOverlap returns the most loads of one key that overlapped in time on
// one replica among calls (0 without a load).
func maxOverlap(calls []Call) int {
	byReplicaKey := map[[2]int][]Call{}
	for _, c := range calls {
		k := [2]int{c.Replica, c.Key}
		byReplicaKey[k] = append(byReplicaKey[k], c)
	}
	n := 0
	for _, cs := range byReplicaKey {
		for _, ep := range episodes(cs) {
			n = max(n, countLoads(ep))
		}
	}
	return n
}

// warmedKeys returns whether a replica warmed a key before traffic: the
// hottest fifth on every replica in cold-start's warm variant, the keys
// each replica's local tier held after WarmHot in its fleet variant, none
// otherwise.
func (e *runEnv) warmedKeys() func(replica, key int) bool {
	switch {
	case e.p.variant == "warm":
		return func(_, key int) bool { return key < e.hot }
	case e.fleet != nil && e.fleet.warmed != nil:
		held := make([]map[int]bool, len(e.fleet.warmed))
		for i, keys := range e.fleet.warmed {
			held[i] = make(map[int]bool, len(keys))
			for _, k := range keys {
				held[i][k] = true
			}
		}
		return func(replica, key int) bool { return held[replica][key] }
	}
	return func(int, int) bool { return false }
}

// fleetMeasures sets the measures of cold-start's fleet variant from what
// it recorded, hot being the size of the hottest fifth.
func (m *measures) fleetMeasures(f *fleetWarm, hot int) {
	m.hot, m.hotSetKeys = hot, len(f.hotKeys)
	m.warmLoaded, m.warmFailed, m.warmErrors = f.report.Loaded, f.report.Failed, f.errors
	m.replicasWarmed = len(f.warmed)
	m.heldFound = len(f.warmed) > 0
	for i, keys := range f.warmed {
		m.warmedTotal += len(keys)
		if i < len(f.found) {
			m.heldFound = m.heldFound && len(keys) == f.found[i]
			if i == 0 || f.found[i] < m.minFound {
				m.minFound = f.found[i]
			}
		}
		share, hottest := readShare(keys, hot), hottestCount(keys, hot)
		if i == 0 {
			m.minWarmed, m.maxWarmed, m.minReadShare, m.minHottest = len(keys), len(keys), share, hottest
			continue
		}
		m.minWarmed, m.maxWarmed = min(m.minWarmed, len(keys)), max(m.maxWarmed, len(keys))
		m.minReadShare, m.minHottest = min(m.minReadShare, share), min(m.minHottest, hottest)
	}
}

// popularity is key k's share of reads under Zipf(zipfS), up to a factor
// common to every key.
func popularity(k int) float64 { return math.Pow(float64(k+1), -zipfS) }

// readShare returns the share of the reads of the hot hottest keys (0 …
// hot-1) that the distinct keys take: 1 when they are those keys, a little
// less when a key just outside them stands in for one just inside.
func readShare(keys []int, hot int) float64 {
	var got, top float64
	for k := range hot {
		top += popularity(k)
	}
	for _, k := range keys {
		if k >= 0 {
			got += popularity(k)
		}
	}
	if top == 0 {
		return 0
	}
	return got / top
}

// hottestCount returns how many of keys are among the hot hottest.
func hottestCount(keys []int, hot int) int {
	n := 0
	for _, k := range keys {
		if k >= 0 && k < hot {
			n++
		}
	}
	return n
}

// lastEnd returns when the last call of ep that is done ended.
func lastEnd(ep []Call) time.Duration {
	var t time.Duration
	for _, c := range ep {
		if c.Done {
			t = max(t, c.End)
		}
	}
	return t
}

// loadsPerTTL returns the loads of eps, the expiry events after warm-up in
// start order, per soft TTL (ttl) of the time from the end of the warm-up's
// load (from) to the end of the last event: each event replaces the value
// of the one before, so one load per event and values that live a whole
// TTL make 1. Zero without an event.
func loadsPerTTL(eps [][]Call, from, ttl time.Duration) float64 {
	if len(eps) == 0 {
		return 0
	}
	span := lastEnd(eps[len(eps)-1]) - from
	if span <= 0 {
		return 0
	}
	n := 0
	for _, ep := range eps {
		n += countLoads(ep)
	}
	return float64(n) * float64(ttl) / float64(span)
}

// staleByRefresh sorts the stale serves at the times in at, from time from
// on, by the refresh that replaced their value, among the expiry events eps
// (in start order). before counts the serves that came before it had begun:
// when no event was running, nor had ended within slack (the time a replica
// may take to pick up a value another replica wrote). late counts the events
// that some serve came during or within slack after: refreshes whose value
// reached a replica only after the old one expired. A refresh that starts
// before its value's soft expiry leaves
// nothing before it, however long its load runs; one that a stale read
// starts leaves that read.
func staleByRefresh(at []time.Duration, eps [][]Call, from, slack time.Duration) (before, late int) {
	during := make([]bool, len(eps))
	for _, t := range at {
		if t < from {
			continue
		}
		// The last event that began at or before t.
		i, _ := slices.BinarySearchFunc(eps, t, func(ep []Call, t time.Duration) int {
			if ep[0].Start <= t {
				return -1
			}
			return 1
		})
		if i == 0 || !covers(eps[i-1], t, slack) {
			before++
			continue
		}
		if !during[i-1] {
			during[i-1] = true
			late++
		}
	}
	return before, late
}

// covers reports whether t falls within ep or within slack after its end; an
// event with a call not yet done never ends.
func covers(ep []Call, t, slack time.Duration) bool {
	for _, c := range ep {
		if !c.Done {
			return true
		}
	}
	return t <= lastEnd(ep)+slack
}

// waited reports whether request q waited for the backing store: it failed
// after at least threshold, or it was answered by a call that ended after it
// began and it took at least threshold.
func waited(q request, calls []Call, threshold time.Duration) bool {
	if q.end-q.start < threshold {
		return false
	}
	if q.outcome != outcomeOK {
		return true
	}
	if q.call == 0 || q.call > uint64(len(calls)) {
		return false
	}
	c := calls[q.call-1]
	return c.Done && c.End > q.start
}

// previousLoads returns, by call ID, how long the key's load before the
// call took (zero for a key's first): the delta XFetch planned the call's
// start by.
func previousLoads(calls []Call) map[uint64]time.Duration {
	last := make(map[int]time.Duration)
	prev := make(map[uint64]time.Duration, len(calls))
	for _, c := range calls { // in the order they started
		if d, ok := last[c.Key]; ok {
			prev[c.ID] = d
		}
		if c.Done && !c.Failed {
			last[c.Key] = c.End - c.Start
		}
	}
	return prev
}

// ranLong reports whether the call q waited for took longer than its
// key's load before it by more than XFetch's margin: a refresh started
// as XFetch plans finishes before expiry only when it does not.
func ranLong(q request, calls []Call, prev map[uint64]time.Duration) bool {
	if q.call == 0 || q.call > uint64(len(calls)) {
		return false
	}
	c := calls[q.call-1]
	d, ok := prev[c.ID]
	return ok && c.Done && float64(c.End-c.Start) > (1+xfetch.DefaultMargin)*float64(d)
}

// loads reports whether a call counts against a promise of at most one load:
// a failure the failure rate drew is retried by design, and a call cut short
// by its context did not answer anyone.
func loads(c Call) bool { return !c.Failed }

// countLoads returns how many calls of cs count as loads.
func countLoads(cs []Call) int {
	n := 0
	for _, c := range cs {
		if loads(c) {
			n++
		}
	}
	return n
}

// perReplicaCounts returns the number of loads per replica among cs.
func perReplicaCounts(cs []Call) map[int]int {
	m := map[int]int{}
	for _, c := range cs {
		if loads(c) {
			m[c.Replica]++
		}
	}
	return m
}

// keyCounts returns the number of loads per key and per (replica, key).
func keyCounts(cs []Call) (perKey map[int]int, perReplicaKey map[[2]int]int) {
	perKey, perReplicaKey = map[int]int{}, map[[2]int]int{}
	for _, c := range cs {
		if loads(c) {
			perKey[c.Key]++
			perReplicaKey[[2]int{c.Replica, c.Key}]++
		}
	}
	return perKey, perReplicaKey
}

// episodes groups calls (of one key) into expiry events: sorted by start, a
// call joins the current group if it starts before every call of the group
// has ended, and starts a new group otherwise. A call not yet done never
// ends.
func episodes(calls []Call) [][]Call {
	cs := slices.Clone(calls)
	slices.SortStableFunc(cs, func(a, b Call) int { return cmpDur(a.Start, b.Start) })
	var out [][]Call
	var until time.Duration
	for _, c := range cs {
		end := c.End
		if !c.Done {
			end = math.MaxInt64
		}
		if len(out) == 0 || c.Start >= until {
			out = append(out, []Call{c})
			until = end
			continue
		}
		out[len(out)-1] = append(out[len(out)-1], c)
		until = max(until, end)
	}
	return out
}

func cmpDur(a, b time.Duration) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// sweep returns, for n buckets of width bucket from time zero, the calls
// started in each and the peak number of calls in flight during each (a
// call is in flight over [Start, End); one not done never ends).
func sweep(calls []Call, bucket time.Duration, n int) (started []int64, peak []int) {
	type ev struct {
		t time.Duration
		d int
	}
	evs := make([]ev, 0, 2*len(calls))
	started = make([]int64, n)
	for _, c := range calls {
		evs = append(evs, ev{c.Start, +1})
		if c.Done {
			evs = append(evs, ev{c.End, -1})
		}
		if b := int(c.Start / bucket); b >= 0 && b < n {
			started[b]++
		}
	}
	// Ends before starts at the same instant: [Start, End) intervals.
	slices.SortFunc(evs, func(a, b ev) int {
		if c := cmpDur(a.t, b.t); c != 0 {
			return c
		}
		return a.d - b.d
	})
	peak = make([]int, n)
	level, i := 0, 0
	for b := range n {
		lo, hi := time.Duration(b)*bucket, time.Duration(b+1)*bucket
		// The level at the bucket's first instant: after every event at it.
		for ; i < len(evs) && evs[i].t <= lo; i++ {
			level += evs[i].d
		}
		p := level
		for ; i < len(evs) && evs[i].t < hi; i++ {
			level += evs[i].d
			p = max(p, level)
		}
		peak[b] = p
	}
	return started, peak
}

// bucket is the width of the timeline buckets of every run of a suite:
// at most 120 over the traffic time, so that the runs' charts compare.
func (o *Options) bucket() time.Duration { return bucketFor(o.Duration) }

// bucketFor picks a round bucket width giving at most 120 buckets over d.
func bucketFor(d time.Duration) time.Duration {
	for _, b := range []time.Duration{
		10 * time.Millisecond, 20 * time.Millisecond, 50 * time.Millisecond,
		100 * time.Millisecond, 200 * time.Millisecond, 500 * time.Millisecond,
		time.Second, 2 * time.Second, 5 * time.Second, 10 * time.Second,
	} {
		if d/b < 120 {
			return b
		}
	}
	return max(d/120, time.Second)
}

// quantile returns the q-quantile of sorted (nearest rank), zero when empty.
func quantile(sorted []time.Duration, q float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	i := int(math.Ceil(q*float64(len(sorted)))) - 1
	return sorted[min(max(i, 0), len(sorted)-1)]
}

// promise is one promise of a layer in a scenario. It applies to runs of
// its layer and every rung above it, and only to the given variants when
// variants is set.
type promise struct {
	layer    string
	variants []string
	text     string
	// observed names what eval counts as its observations.
	observed string
	// eval returns what was measured, how many observations it judged, and
	// whether the promise held over them.
	eval func(m *measures) (measured string, observations int64, ok bool)
}

// remoteHeld judges a promise of coalescing or of the lease, whose figure
// (measured, held) assumes that the remote tier answered. When it failed
// (m.remoteFailures), herd degrades by design: a lease can lapse and its
// holder's write be fenced, a write that never landed drops the local
// copy it would have backed, and with the breaker open every replica loads
// on its own. A promise that held is reported with the failures; one that
// did not is judged instead by what holds whatever the remote tier does:
// no two loads of one key overlapped on one replica.
func (m *measures) remoteHeld(measured string, held bool) (string, bool) {
	if m.remoteFailures == 0 {
		return measured, held
	}
	measured += fmt.Sprintf("; the remote tier failed %d times", m.remoteFailures)
	if held {
		return measured, true
	}
	return measured + fmt.Sprintf(", which suspends the promise: judged instead that no two loads of a key overlapped on one replica (max %d at once)", m.maxOverlap),
		m.maxOverlap <= 1
}

// limiterPromise holds wherever the limiter is on: it judges every
// backing-store call of the run.
var limiterPromise = promise{
	layer:    "limiter",
	text:     fmt.Sprintf("peak backing-store concurrency ≤ the limiter's cap (%d per replica)", limiterSlots),
	observed: "backing-store calls",
	eval: func(m *measures) (string, int64, bool) {
		return fmt.Sprintf("peak %d per replica, %d fleet-wide", m.peakReplica, m.run.PeakOrigin),
			int64(m.allCalls), m.peakReplica <= limiterSlots
	},
}

// noWait is the promise of XFetch and stale-while-revalidate in hot-key:
// across the expiries, no request waited. XFetch alone promises it only
// for refreshes that take no longer than the load before them plus its
// margin (see xfetch.Lead): on its rung, a wait for a load that ran longer
// (a slow draw, a busy machine) is reported, not judged. From
// stale-while-revalidate up, every wait is judged.
var noWait = promise{
	layer:    "xfetch",
	text:     "no client waited on the backing store after warm-up",
	observed: "expiries",
	eval: func(m *measures) (string, int64, bool) {
		judged := m.run.WaitedOnOrigin
		if m.plan.layer == "xfetch" {
			judged -= m.waitedRanLong
			if m.waitedRanLong > 0 {
				return fmt.Sprintf("%d of %d requests waited, %d of them for a load that ran longer than the one before it by more than XFetch's margin (%.0f%%)",
					m.run.WaitedOnOrigin, m.run.Requests, m.waitedRanLong, 100*xfetch.DefaultMargin), m.run.Expiries, judged == 0
			}
		}
		return fmt.Sprintf("%d of %d requests waited", m.run.WaitedOnOrigin, m.run.Requests),
			m.run.Expiries, judged == 0
	},
}

// maxLoadsPerTTL bounds refresh-ahead's loads per soft TTL in hot-key. It
// replaces each value a load's duration and a fifth before it expires:
// about 1.05 loads per TTL for loads a fifth (--quick) or a quarter (the
// defaults) of the TTL, where XFetch's earlier refreshes make about 1.3 and
// 1.5. Over the two or three values a --quick run measures, TTL jitter
// (±10%) and load times (±20%) spread it by about 0.05 either way.
const maxLoadsPerTTL = 1.2

// aheadLoads and aheadInTime are refresh-ahead's promises in hot-key.
var aheadLoads = promise{
	layer:    "ahead",
	text:     fmt.Sprintf("≤ %.1f loads per soft TTL fleet-wide after warm-up", maxLoadsPerTTL),
	observed: "expiries",
	eval: func(m *measures) (string, int64, bool) {
		return fmt.Sprintf("%.2f", m.loadsPerTTL), m.run.Expiries, m.loadsPerTTL <= maxLoadsPerTTL
	},
}

// aheadLead is how far ahead of a value's soft expiry refresh-ahead begins
// its refresh, in load durations: one and a fifth.
const aheadLead = 1.2

// aheadInTime judges that refresh-ahead begins each refresh before its
// value expires. Its timer fires a lead of about 1.2 load durations before
// the expiry; a machine that runs goroutines later than that starts the
// refresh late whatever herd does. So when the run's own timers ran at
// least half that lead late (m.timerLate), a stale serve before a refresh
// suspends the promise, and what is judged instead is that refreshes did
// run ahead.
var aheadInTime = promise{
	layer:    "ahead",
	text:     "every refresh began before its value expired: no stale serve before its refresh began",
	observed: "expiries",
	eval: func(m *measures) (string, int64, bool) {
		measured := fmt.Sprintf("%d stale serves before a refresh; %d late refreshes; %d refreshes ahead",
			m.staleBeforeRefresh, m.lateRefreshes, m.aheadRefreshes)
		lead := time.Duration(aheadLead * float64(m.meanLoad))
		if m.staleBeforeRefresh == 0 || m.timerLate < lead/2 {
			return measured, m.run.Expiries, m.staleBeforeRefresh == 0 && m.aheadRefreshes > 0
		}
		return measured + fmt.Sprintf(", while the machine ran timers up to %v late, at least half the refresh's lead of %v: "+
				"that suspends the promise; judged instead that refreshes ran ahead",
				m.timerLate.Round(time.Millisecond), lead.Round(time.Millisecond)),
			m.run.Expiries, m.aheadRefreshes > 0
	},
}

// minWarmReadShare is the least share of the hottest fifth's reads that
// the keys a replica warms from the fleet must take. ShareHotKeys counts
// one local hit in 16, so keys next to each other in popularity may swap
// places at the edge of the fifth (with the defaults' 100 keys the 20th is
// read 5% more than the 21st): a stand-in costs the share only the
// difference. In a simulation of that count over one period of
// veteranReads reads, the share stayed at 0.95 or above in 20,000 runs,
// for 20 keys and for 100, and fell below 0.9 in fewer than one run in
// 1,000 with a quarter of the reads; "90% of the warmed keys among the
// hottest fifth" failed in 6% of the runs with 20 keys and 29% with 100.
const minWarmReadShare = 0.9

// fleetFromStore and fleetHottest are the promises of cold-start's fleet
// variant.
var fleetFromStore = promise{
	layer:    "none",
	variants: []string{"fleet"},
	text:     "warming from the fleet made no backing-store call: each replica took every key of the hot set from the Store",
	observed: "keys warmed",
	eval: func(m *measures) (string, int64, bool) {
		if m.hotSetKeys == 0 {
			return "the hot set stayed empty", 0, false
		}
		held := strconv.Itoa(m.minWarmed)
		if m.maxWarmed != m.minWarmed {
			held += " to " + strconv.Itoa(m.maxWarmed)
		}
		measured := fmt.Sprintf("%d calls; %s keys per replica", m.warmCalls, held)
		switch {
		case m.minFound == 0:
			measured += ", a replica's WarmHot finding the hot set empty"
		case m.heldFound:
			measured += ", each all that its WarmHot found in the hot set"
		default:
			measured += ", some replica short of what its WarmHot found in the hot set"
		}
		measured += fmt.Sprintf("; %d loaded, %d failed", m.warmLoaded, m.warmFailed)
		if m.warmErrors > 0 {
			measured += fmt.Sprintf("; %d WarmHot errors", m.warmErrors)
		}
		return measured, int64(m.warmedTotal),
			m.warmCalls == 0 && m.warmLoaded == 0 && m.warmFailed == 0 && m.warmErrors == 0 &&
				m.heldFound && m.minFound > 0
	},
}

var fleetHottest = promise{
	layer:    "none",
	variants: []string{"fleet"},
	text:     fmt.Sprintf("the keys warmed from the fleet are the hottest: ≥ %.0f%% of the reads of the hottest fifth", 100*minWarmReadShare),
	observed: "replicas",
	eval: func(m *measures) (string, int64, bool) {
		if m.hotSetKeys == 0 {
			return "the hot set stayed empty", 0, false
		}
		return fmt.Sprintf("%.1f%% on the worst replica, %d of the %d hottest", 100*m.minReadShare, m.minHottest, m.hot),
			int64(m.replicasWarmed), m.minReadShare >= minWarmReadShare
	},
}

// perReplicaKey and perKey are the promises of coalescing and the lease
// after a flush or a start: they judge the keys (per replica, or
// fleet-wide) loaded since. Cold-start's fleet variant loads none: its own
// promises say so.
func perReplicaKey(text string, variants ...string) promise {
	return oneLoad("coalescing", "replica-key pairs loaded", text, variants,
		func(m *measures) (int, int) { return m.maxPerReplicaKey, m.pairsLoaded })
}

func perKey(text string, variants ...string) promise {
	return oneLoad("lease", "keys loaded", text, variants,
		func(m *measures) (int, int) { return m.maxPerKey, m.keysLoaded })
}

// oneLoad is the promise of layer that each of what of returns as judged
// (keys, or replica-key pairs) was loaded at most once; of returns the
// most loads of one of them, and how many were judged.
func oneLoad(layer, observed, text string, variants []string, of func(*measures) (most, judged int)) promise {
	return promise{
		layer:    layer,
		variants: variants,
		text:     text,
		observed: observed,
		eval: func(m *measures) (string, int64, bool) {
			most, judged := of(m)
			measured, ok := m.remoteHeld(fmt.Sprintf("max %d", most), most <= 1)
			return measured, int64(judged), ok
		},
	}
}

// loadingVariants are cold-start's variants whose traffic loads keys.
var loadingVariants = []string{"cold", "warm"}

// promises lists the promises of each scenario.
var promises = map[string][]promise{
	"hot-key": {
		{
			layer:    "coalescing",
			text:     "≤ 1 load per replica per expiry",
			observed: "expiries",
			eval: func(m *measures) (string, int64, bool) {
				measured, ok := m.remoteHeld(fmt.Sprintf("max %d", m.maxPerReplicaExpiry), m.maxPerReplicaExpiry <= 1)
				return measured, m.run.Expiries, ok
			},
		},
		{
			layer:    "lease",
			text:     "1 load per expiry fleet-wide",
			observed: "expiries",
			eval: func(m *measures) (string, int64, bool) {
				measured, ok := m.remoteHeld(fmt.Sprintf("max %d", m.maxPerExpiry), m.maxPerExpiry <= 1)
				return measured, m.run.Expiries, ok
			},
		},
		noWait,
		limiterPromise,
		aheadLoads,
		aheadInTime,
	},
	"flush": {
		perReplicaKey("≤ 1 load per replica per key after the flush"),
		perKey("≤ 1 load per key fleet-wide after the flush"),
		limiterPromise,
	},
	"cold-start": {
		{
			layer:    "none",
			variants: []string{"warm", "fleet"},
			text:     "with warmup, no client waited on a warmed key",
			observed: "requests for warmed keys",
			eval: func(m *measures) (string, int64, bool) {
				return fmt.Sprintf("%d waited", m.waitedWarm), m.warmRequests, m.waitedWarm == 0
			},
		},
		fleetFromStore,
		fleetHottest,
		perReplicaKey("≤ 1 load per replica per key", loadingVariants...),
		perKey("≤ 1 load per key fleet-wide", loadingVariants...),
		{
			layer:    limiterPromise.layer,
			variants: loadingVariants,
			text:     limiterPromise.text,
			observed: limiterPromise.observed,
			eval:     limiterPromise.eval,
		},
	},
	"node-kill": {
		{
			layer:    "coalescing",
			text:     "≤ 1 load per replica per key per expiry while Redis is down",
			observed: "loads while down",
			eval: func(m *measures) (string, int64, bool) {
				return fmt.Sprintf("max %d", m.maxPerReplicaKeyDown), int64(m.downLoads), m.maxPerReplicaKeyDown <= 1
			},
		},
		{
			layer:    "coalescing",
			text:     "no client error the backing store could have answered (shed requests aside)",
			observed: "requests while down",
			eval: func(m *measures) (string, int64, bool) {
				return fmt.Sprintf("%d errors of %d requests", m.avoidableErrors, m.run.Requests), m.downRequests, m.avoidableErrors == 0
			},
		},
		limiterPromise,
	},
}

// checks evaluates the promises that apply to a run. A promise that judged
// no observation fails, whatever it measured.
func checks(m *measures) []Check {
	var out []Check
	label := m.plan.layer
	if m.plan.variant != "" {
		label += " (" + m.plan.variant + ")"
	}
	for _, p := range promises[m.plan.scenario] {
		if rung(m.plan.layer) < rung(p.layer) || len(p.variants) > 0 && !slices.Contains(p.variants, m.plan.variant) {
			continue
		}
		measured, n, ok := p.eval(m)
		out = append(out, Check{
			Scenario:     m.plan.scenario,
			Layer:        label,
			Promise:      p.text,
			Measured:     measured,
			Observations: n,
			Observed:     p.observed,
			OK:           ok && n > 0,
		})
	}
	return out
}

// predictions sets the formula beside the measured calls per expiry of
// every open-loop hot-key run under none, coalescing or lease. They are
// checks only in a preset.
func predictions(o *Options, runs []Run) []Prediction {
	if o.ClosedLoop {
		return nil
	}
	name := o.Preset
	if name == "" {
		name = "flags"
	}
	var out []Prediction
	for _, r := range runs {
		if r.Scenario != "hot-key" {
			continue
		}
		p, ok := Predict(r.Layer, o.Replicas, o.Rate, o.Latency.Mean())
		if !ok {
			continue
		}
		band, note := predictionBand(r.Layer, p, r.Expiries, o.Latency)
		out = append(out, Prediction{
			Preset:    name,
			Layer:     r.Layer,
			What:      "calls per expiry",
			Predicted: p,
			Measured:  r.CallsPerExpiry,
			Expiries:  r.Expiries,
			Band:      band,
			Within:    r.Expiries > 0 && within(p, r.CallsPerExpiry, band),
			Checked:   o.Preset != "",
			Note:      note,
		})
	}
	return out
}
