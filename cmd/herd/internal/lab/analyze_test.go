package lab

import (
	"math"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

func call(id uint64, replica int, start, end time.Duration) Call {
	return Call{ID: id, Replica: replica, Start: start * time.Millisecond, End: end * time.Millisecond, Done: true}
}

func ids(eps [][]Call) [][]uint64 {
	var out [][]uint64
	for _, ep := range eps {
		var g []uint64
		for _, c := range ep {
			g = append(g, c.ID)
		}
		out = append(out, g)
	}
	return out
}

// TestEpisodes checks the grouping of calls into expiry events: calls that
// start while one of the group is running join it; a call starting when all
// have ended (even at the same instant) begins the next.
func TestEpisodes(t *testing.T) {
	running := call(9, 0, 900, 0)
	running.Done = false
	calls := []Call{
		call(3, 1, 50, 120), // joins 1: starts before 1 ends
		call(1, 0, 0, 100),
		call(4, 2, 115, 130), // joins: 3 still running
		call(5, 0, 130, 200), // starts as the last one ends: new event
		call(6, 1, 500, 600),
		running,
		call(10, 2, 5000, 5001), // after a call that never ended: same event
	}
	got := ids(episodes(calls))
	want := [][]uint64{{1, 3, 4}, {5}, {6}, {9, 10}}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("episodes (-want +got):\n%s", diff)
	}
	if n := countLoads(episodes(calls)[0]); n != 3 {
		t.Errorf("countLoads = %d, want 3", n)
	}
	failed := call(11, 0, 0, 10)
	failed.Failed = true
	if n := countLoads([]Call{failed, call(12, 0, 0, 10)}); n != 1 {
		t.Errorf("countLoads with one failed call = %d, want 1", n)
	}
}

func TestSweep(t *testing.T) {
	calls := []Call{call(1, 0, 0, 25), call(2, 0, 5, 15), call(3, 0, 15, 40), call(4, 0, 40, 41), call(5, 0, 60, 70)}
	started, peak := sweep(calls, 10*time.Millisecond, 8)
	if !slices.Equal(started, []int64{2, 1, 0, 0, 1, 0, 1, 0}) {
		t.Errorf("started = %v, want [2 1 0 0 1 0 1 0]", started)
	}
	// [0,10): 1 and 2; [10,20): 1, 2 until 15, 3 from 15 → 2; [20,30): 1
	// until 25, 3 → 2; [30,40): 3 → 1; [40,50): 3 ends as 4 starts → 1;
	// [50,60): none; [60,70): 5; [70,80): 5 ended at 70 → none.
	if !slices.Equal(peak, []int{2, 2, 2, 1, 1, 0, 1, 0}) {
		t.Errorf("peak = %v, want [2 2 2 1 1 0 1 0]", peak)
	}
}

func TestQuantile(t *testing.T) {
	var d []time.Duration
	for i := 1; i <= 1000; i++ {
		d = append(d, time.Duration(i))
	}
	for q, want := range map[float64]time.Duration{0.5: 500, 0.99: 990, 0.999: 999, 1: 1000} {
		if got := quantile(d, q); got != want {
			t.Errorf("quantile(1..1000, %v) = %v, want %v", q, got, want)
		}
	}
	if quantile(nil, 0.5) != 0 {
		t.Error("quantile of nothing is not zero")
	}
}

// TestWaited checks which requests count as having waited for the backing
// store.
func TestWaited(t *testing.T) {
	ms := time.Millisecond
	calls := []Call{call(1, 0, 0, 100), call(2, 0, 200, 300)}
	th := 25 * ms
	for _, tc := range []struct {
		name string
		q    request
		want bool
	}{
		{"served by a call that ended during it", request{start: 150 * ms, end: 300 * ms, call: 2}, true},
		{"served a value made before it began", request{start: 150 * ms, end: 151 * ms, call: 1}, false},
		{"slow, but served a value made before it began", request{start: 150 * ms, end: 190 * ms, call: 1}, false},
		{"read a value written a moment ago", request{start: 299 * ms, end: 301 * ms, call: 2}, false},
		{"seeded value", request{start: 0, end: 50 * ms, call: 0}, false},
		{"failed after waiting", request{start: 0, end: 50 * ms, outcome: outcomeError}, true},
		{"failed at once", request{start: 0, end: ms, outcome: outcomeShed}, false},
	} {
		if got := waited(tc.q, calls, th); got != tc.want {
			t.Errorf("%s: waited = %v, want %v", tc.name, got, tc.want)
		}
	}
}

// TestLoadsPerTTL checks the loads per soft TTL of hot-key: the loads of
// the expiry events over the time from the warm-up's value to the last
// event's end, in TTLs.
func TestLoadsPerTTL(t *testing.T) {
	ttl := 200 * time.Millisecond
	// The warm-up's value was written at 40ms; each value replaced 190ms
	// after the one before, with one load each: 3 loads in 570ms.
	ahead := [][]Call{
		{call(2, 1, 190, 230)},
		{call(3, 0, 380, 420)},
		{call(4, 2, 570, 610)},
	}
	if got, want := loadsPerTTL(ahead, 40*time.Millisecond, ttl), 3*200.0/570; math.Abs(got-want) > 1e-9 {
		t.Errorf("loadsPerTTL = %v, want %v", got, want)
	}
	// Three replicas loading at each expiry, one of them failing: the
	// failure is not a load.
	failed := call(7, 2, 250, 290)
	failed.Failed = true
	eps := [][]Call{
		{call(5, 0, 240, 280), call(6, 1, 245, 285), failed},
		{call(8, 0, 480, 520), call(9, 1, 490, 530), call(10, 2, 495, 540)},
	}
	if got, want := loadsPerTTL(eps, 40*time.Millisecond, ttl), 5*200.0/500; math.Abs(got-want) > 1e-9 {
		t.Errorf("loadsPerTTL with several loads per expiry = %v, want %v", got, want)
	}
	if got := loadsPerTTL(nil, 0, ttl); got != 0 {
		t.Errorf("loadsPerTTL without an expiry = %v, want 0", got)
	}
}

// TestStaleByRefresh checks which stale serves came before the refresh of
// their value began, and which refreshes ran past their value's expiry.
func TestStaleByRefresh(t *testing.T) {
	ms := time.Millisecond
	running := call(4, 0, 600, 0)
	running.Done = false
	eps := [][]Call{
		{call(1, 0, 200, 240)},
		{call(2, 1, 390, 440)},
		{call(3, 2, 500, 540)},
		{running},
	}
	slack := 10 * ms
	for _, tc := range []struct {
		name         string
		at           []time.Duration
		before, late int
	}{
		{"before the first refresh's end: not counted", []time.Duration{100 * ms, 239 * ms}, 0, 0},
		{"while a refresh that began before runs late", []time.Duration{430 * ms, 439 * ms}, 0, 1},
		{"within slack of its end, on a replica picking it up", []time.Duration{440 * ms, 450 * ms}, 0, 1},
		{"past the slack, before the next refresh began", []time.Duration{451 * ms, 499 * ms}, 2, 0},
		{"the stale read that starts a refresh, and those during it", []time.Duration{499 * ms, 500 * ms, 520 * ms}, 1, 1},
		{"a refresh that has not ended yet", []time.Duration{5000 * ms}, 0, 1},
		{"mixed, out of order", []time.Duration{599 * ms, 241 * ms, 300 * ms, 395 * ms, 241 * ms}, 2, 2},
	} {
		before, late := staleByRefresh(tc.at, eps, 240*ms, slack)
		if before != tc.before || late != tc.late {
			t.Errorf("%s: staleByRefresh = %d before, %d late; want %d, %d", tc.name, before, late, tc.before, tc.late)
		}
	}
	if before, late := staleByRefresh([]time.Duration{300 * ms}, nil, 0, slack); before != 1 || late != 0 {
		t.Errorf("a stale serve with no refresh at all: %d before, %d late; want 1, 0", before, late)
	}
}

// TestChecksApply checks that a layer's promises apply to it and every rung
// above it, variant promises only to their variant, and that each verdict
// follows the measure.
func TestChecksApply(t *testing.T) {
	promisesOf := func(cs []Check) []string {
		var out []string
		for _, c := range cs {
			out = append(out, c.Promise)
		}
		return out
	}
	m := &measures{plan: plan{"flush", "none", ""}, maxPerKey: 5, maxPerReplicaKey: 3}
	if cs := checks(m); len(cs) != 0 {
		t.Errorf("flush/none has promises %v, want none", promisesOf(cs))
	}
	m.plan.layer = "coalescing"
	if cs := checks(m); len(cs) != 1 || cs[0].OK || !strings.Contains(cs[0].Promise, "per replica per key") {
		t.Errorf("flush/coalescing with 3 loads per replica per key: %+v, want one failed per-replica check", cs)
	}
	m.plan.layer, m.maxPerReplicaKey, m.maxPerKey = "swr", 1, 1
	if cs := checks(m); len(cs) != 2 || cs[0].OK || cs[1].OK || cs[0].Observations != 0 {
		t.Errorf("flush/swr with no key loaded: %+v, want the coalescing and lease promises, failed: nothing judged", cs)
	}
	m.keysLoaded, m.pairsLoaded = 20, 45
	if cs := checks(m); len(cs) != 2 || !cs[0].OK || !cs[1].OK || cs[0].Observations != 45 || cs[1].Observations != 20 {
		t.Errorf("flush/swr with one load per key: %+v, want the coalescing and lease promises, passed over 45 and 20", cs)
	}
	m.plan.layer, m.peakReplica, m.allCalls = "limiter", limiterSlots+1, 60
	cs := checks(m)
	if len(cs) != 3 || cs[2].OK || !strings.Contains(cs[2].Promise, "limiter's cap") {
		t.Errorf("flush/limiter over the cap: %+v, want a failed limiter check third", cs)
	}

	cold := &measures{plan: plan{"cold-start", "none", "cold"}, waitedWarm: 3}
	if cs := checks(cold); len(cs) != 0 {
		t.Errorf("cold-start/none cold has promises %v, want none", promisesOf(cs))
	}
	warm := &measures{plan: plan{"cold-start", "none", "warm"}, waitedWarm: 3, warmRequests: 50}
	if cs := checks(warm); len(cs) != 1 || cs[0].OK || cs[0].Layer != "none (warm)" {
		t.Errorf("cold-start/none warm with 3 waits: %+v, want one failed warm check", cs)
	}

	if cs := checks(warm); slices.ContainsFunc(cs, func(c Check) bool { return strings.Contains(c.Promise, "fleet") }) {
		t.Errorf("cold-start/none warm has the fleet's promises: %v", promisesOf(cs))
	}

	hot := &measures{plan: plan{"hot-key", "xfetch", ""}, maxPerExpiry: 1, maxPerReplicaExpiry: 1}
	hot.run.Expiries = 4
	hot.run.WaitedOnOrigin = 2
	cs = checks(hot)
	if len(cs) != 3 || !cs[0].OK || !cs[1].OK || cs[2].OK {
		t.Errorf("hot-key/xfetch with 2 waits: %+v, want coalescing and lease passed, no-wait failed", cs)
	}
	hot.run.Expiries, hot.run.WaitedOnOrigin = 0, 0
	for _, c := range checks(hot) {
		if c.OK {
			t.Errorf("hot-key/xfetch without any expiry passed %q: nothing was measured", c.Promise)
		}
	}

	// Refresh-ahead's promises apply from its rung only.
	hot.plan.layer, hot.run.Expiries, hot.allCalls = "limiter", 3, 4
	hot.loadsPerTTL, hot.staleBeforeRefresh, hot.aheadRefreshes = 1.3, 1, 0
	if cs := checks(hot); len(cs) != 4 {
		t.Errorf("hot-key/limiter: %d checks %v, want 4, none of refresh-ahead", len(cs), promisesOf(cs))
	}
	hot.plan.layer = "ahead"
	cs = checks(hot)
	if len(cs) != 6 || cs[4].OK || cs[5].OK || !strings.Contains(cs[4].Promise, "loads per soft TTL") ||
		!strings.Contains(cs[5].Promise, "before its refresh began") {
		t.Errorf("hot-key/ahead at 1.3 loads per TTL with a stale serve before a refresh: %+v, want the two refresh-ahead checks last, failed", cs)
	}
	hot.loadsPerTTL, hot.staleBeforeRefresh = 1.05, 0
	if cs := checks(hot); !cs[4].OK || cs[5].OK {
		t.Errorf("hot-key/ahead with no refresh ahead: %+v, want the loads check passed, the stale one failed (nothing refreshed ahead)", cs[4:])
	}
	hot.aheadRefreshes = 9
	for _, c := range checks(hot) {
		if !c.OK {
			t.Errorf("hot-key/ahead at 1.05 loads per TTL, nothing stale before a refresh, 9 refreshes ahead: %q failed", c.Promise)
		}
	}
}

// TestAheadInTimeBusy checks refresh-ahead's in-time promise on a busy
// machine: a stale serve before a refresh fails it while the run's timers
// ran less than half a refresh's lead late, and suspends it (judging that
// refreshes ran ahead) once they ran later than that.
func TestAheadInTimeBusy(t *testing.T) {
	m := &measures{plan: plan{"hot-key", "ahead", ""}, staleBeforeRefresh: 1, aheadRefreshes: 3,
		meanLoad: 40 * time.Millisecond, timerLate: 10 * time.Millisecond, loadsPerTTL: 1}
	m.run.Expiries = 2
	inTime := func() Check { return checks(m)[5] }
	if c := inTime(); c.OK || strings.Contains(c.Measured, "suspends") {
		t.Errorf("a stale serve before a refresh, timers 10ms late for a 48ms lead: %+v, want failed", c)
	}
	m.timerLate = 30 * time.Millisecond
	if c := inTime(); !c.OK || !strings.Contains(c.Measured, "timers up to 30ms late, at least half the refresh's lead of 48ms") {
		t.Errorf("a stale serve before a refresh, timers 30ms late: %+v, want suspended and passed", c)
	}
	m.aheadRefreshes = 0
	if c := inTime(); c.OK {
		t.Errorf("no refresh ahead on a busy machine: %+v, want failed", c)
	}
	m.staleBeforeRefresh, m.aheadRefreshes = 0, 3
	if c := inTime(); !c.OK || strings.Contains(c.Measured, "suspends") {
		t.Errorf("no stale serve before a refresh on a busy machine: %+v, want passed, not suspended", c)
	}
}

// TestFleetChecks checks the promises of cold-start's fleet variant: no
// wait on a warmed key, every key of the hot set taken from the Store with
// no backing-store call, and warmed keys that take most of the hottest
// fifth's reads; none of them holds when the hot set stayed empty.
func TestFleetChecks(t *testing.T) {
	good := func() *measures {
		return &measures{
			plan: plan{"cold-start", "none", "fleet"},
			hot:  4, hotSetKeys: 4, minWarmed: 4, maxWarmed: 4,
			minReadShare: 0.976, minHottest: 3,
			warmRequests: 90, warmedTotal: 12, replicasWarmed: 3,
			minFound: 4, heldFound: true,
		}
	}
	cs := checks(good())
	if len(cs) != 3 || !strings.Contains(cs[0].Promise, "no client waited") ||
		!strings.Contains(cs[1].Promise, "no backing-store call") || !strings.Contains(cs[2].Promise, "hottest") {
		t.Fatalf("cold-start/none fleet: %+v, want the no-wait, from-the-Store and hottest promises", cs)
	}
	for _, c := range cs {
		if !c.OK {
			t.Errorf("%q failed on good measures (measured %s)", c.Promise, c.Measured)
		}
	}
	if want := "97.6% on the worst replica, 3 of the 4 hottest"; cs[2].Measured != want {
		t.Errorf("hottest measured %q, want %q", cs[2].Measured, want)
	}
	m := good()
	m.plan.layer = "limiter"
	if cs := checks(m); len(cs) != 3 || cs[0].Layer != "limiter (fleet)" {
		t.Errorf("cold-start/limiter fleet: %d checks, want the fleet's 3 (it loads nothing for the others to judge)", len(cs))
	}

	for name, tc := range map[string]struct {
		edit   func(*measures)
		failed []int // indices of the checks that fail
	}{
		"a wait on a warmed key":           {func(m *measures) { m.waitedWarm = 1 }, []int{0}},
		"a backing-store call":             {func(m *measures) { m.warmCalls = 1 }, []int{1}},
		"a key loaded":                     {func(m *measures) { m.warmLoaded = 1 }, []int{1}},
		"a key failed":                     {func(m *measures) { m.warmFailed = 1 }, []int{1}},
		"a WarmHot error":                  {func(m *measures) { m.warmErrors = 1 }, []int{1}},
		"a replica short of what it found": {func(m *measures) { m.minWarmed, m.heldFound = 3, false }, []int{1}},
		"a replica that found nothing":     {func(m *measures) { m.minFound = 0 }, []int{1}},
		"keys of too little popularity":    {func(m *measures) { m.minReadShare = 0.89 }, []int{2}},
		"an empty hot set": {func(m *measures) {
			m.hotSetKeys, m.minWarmed, m.maxWarmed, m.minReadShare, m.minHottest = 0, 0, 0, 0, 0
		}, []int{1, 2}},
		"no request for a warmed key": {func(m *measures) { m.warmRequests = 0 }, []int{0}},
		"no replica warmed":           {func(m *measures) { m.replicasWarmed, m.warmedTotal = 0, 0 }, []int{1, 2}},
	} {
		m := good()
		tc.edit(m)
		var failed []int
		for i, c := range checks(m) {
			if !c.OK {
				failed = append(failed, i)
			}
		}
		if !slices.Equal(failed, tc.failed) {
			t.Errorf("%s: checks %v failed, want %v", name, failed, tc.failed)
		}
	}
}

// TestChecksWithoutObservationsFail checks that every promise of every
// scenario and variant, on the top rung, fails when it judged nothing,
// however good what it measured looks, and says it judged 0 of what.
func TestChecksWithoutObservationsFail(t *testing.T) {
	n := 0
	for sc := range promises {
		variants := []string{""}
		if sc == "cold-start" {
			variants = []string{"cold", "warm", "fleet"}
		}
		for _, v := range variants {
			m := &measures{plan: plan{sc, Layers[len(Layers)-1], v}, loadsPerTTL: 1, aheadRefreshes: 3}
			for _, c := range checks(m) {
				n++
				if c.OK || c.Observations != 0 || c.Observed == "" {
					t.Errorf("%s/%s: %q with nothing judged: ok %v, %d %q; want failed, 0 and what it counts",
						sc, v, c.Promise, c.OK, c.Observations, c.Observed)
				}
			}
		}
	}
	if n < 20 {
		t.Errorf("only %d checks evaluated", n)
	}
}

// TestNodeKillChecks checks node-kill's promises: they judge the loads and
// the requests while the node was down, and hold over them.
func TestNodeKillChecks(t *testing.T) {
	m := &measures{plan: plan{"node-kill", "coalescing", ""}, maxPerReplicaKeyDown: 1, downLoads: 21, downRequests: 93}
	cs := checks(m)
	if len(cs) != 2 || !cs[0].OK || !cs[1].OK || cs[0].Observations != 21 || cs[0].Observed != "loads while down" ||
		cs[1].Observations != 93 || cs[1].Observed != "requests while down" {
		t.Errorf("node-kill/coalescing: %+v, want both passed over 21 loads and 93 requests while down", cs)
	}
	m.maxPerReplicaKeyDown, m.avoidableErrors = 2, 1
	if cs := checks(m); cs[0].OK || cs[1].OK {
		t.Errorf("node-kill/coalescing with 2 loads of a key on a replica and an error: %+v, want both failed", cs)
	}
	m = &measures{plan: plan{"node-kill", "lease", ""}, maxPerReplicaKeyDown: 0, downRequests: 93}
	if cs := checks(m); cs[0].OK || cs[0].Measured != "max 0" || cs[0].Observations != 0 {
		t.Errorf("node-kill/lease with no load while down: %+v, want failed, nothing judged", cs[0])
	}
}

// TestMaxOverlap checks the most loads of one key that overlapped on one
// replica: calls of other replicas or keys, calls one after the other, and
// failed calls do not add up.
func TestMaxOverlap(t *testing.T) {
	key := func(c Call, k int) Call { c.Key = k; return c }
	failed := call(9, 0, 2, 8)
	failed.Failed = true
	calls := []Call{
		call(1, 0, 0, 10), call(2, 1, 5, 15), key(call(3, 0, 5, 15), 1), // other replica, other key
		call(4, 0, 10, 20), // after call 1 ended
		failed,
	}
	if got := maxOverlap(calls); got != 1 {
		t.Errorf("maxOverlap = %d, want 1", got)
	}
	if got := maxOverlap(append(calls, call(5, 0, 12, 14))); got != 2 {
		t.Errorf("maxOverlap with calls 4 and 5 overlapping on replica 0 = %d, want 2", got)
	}
	if got := maxOverlap(nil); got != 0 {
		t.Errorf("maxOverlap of nothing = %d", got)
	}
}

// TestCallsSince checks which calls the promises after a flush judge: those
// that started at or after it, but not those of the caches it retired.
func TestCallsSince(t *testing.T) {
	calls := []Call{call(1, 0, 0, 10), call(2, 0, 100, 110), call(3, 1, 105, 120), call(4, 2, 150, 160)}
	retired := func(id uint64) bool { return id == 3 }
	got := callsSince(calls, 100*time.Millisecond, retired)
	if diff := cmp.Diff([][]uint64{{2, 4}}, ids([][]Call{got})); diff != "" {
		t.Errorf("callsSince (-want +got):\n%s", diff)
	}
}

// TestRemoteHeld checks the promises of coalescing and the lease when the
// remote tier failed: one that held says so; one that did not is judged
// by what holds whatever Redis does, no two loads of a key overlapping on
// one replica; without failures nothing changes.
func TestRemoteHeld(t *testing.T) {
	m := &measures{plan: plan{"flush", "lease", ""}, maxPerKey: 2, maxPerReplicaKey: 1, keysLoaded: 20, pairsLoaded: 40, maxOverlap: 1}
	lease := func() Check { return checks(m)[1] }
	if c := lease(); c.OK || c.Measured != "max 2" {
		t.Errorf("2 loads of a key with no remote failure: %+v, want failed", c)
	}
	m.remoteFailures = 3
	if c := lease(); !c.OK || !strings.Contains(c.Measured, "max 2; the remote tier failed 3 times, which suspends the promise") ||
		!strings.Contains(c.Measured, "(max 1 at once)") || c.Observations != 20 {
		t.Errorf("2 loads of a key after 3 remote failures, none overlapping on a replica: %+v, want passed, saying why", c)
	}
	m.maxOverlap = 2
	if c := lease(); c.OK {
		t.Errorf("2 overlapping loads of a key on one replica after remote failures: %+v, want failed", c)
	}
	m.maxPerKey = 1
	if c := lease(); !c.OK || c.Measured != "max 1; the remote tier failed 3 times" {
		t.Errorf("1 load per key despite remote failures: %+v, want passed, with the failures", c)
	}
	hot := &measures{plan: plan{"hot-key", "lease", ""}, maxPerExpiry: 3, maxPerReplicaExpiry: 1, remoteFailures: 5, maxOverlap: 1}
	hot.run.Expiries = 2
	if cs := checks(hot); !cs[0].OK || !cs[1].OK || !strings.Contains(cs[1].Measured, "suspends") {
		t.Errorf("hot-key/lease, 3 loads of an expiry after 5 remote failures, no overlap: %+v, want both passed", cs)
	}
}

// TestFleetMeasures checks the measures of the keys the replicas warmed:
// the worst replica's share of the hottest fifth's reads, and how many of
// the hottest fifth it holds.
func TestFleetMeasures(t *testing.T) {
	f := &fleetWarm{
		hotKeys: []int{0, 1, 2, 4},
		warmed:  [][]int{{0, 1, 2, 4}, {0, 1, 2, 3}, {0, 1, 2}},
		found:   []int{4, 4, 3},
	}
	f.report.Loaded, f.report.Failed, f.errors = 1, 2, 3
	var m measures
	m.fleetMeasures(f, 4)
	top := popularity(0) + popularity(1) + popularity(2) + popularity(3)
	want := (top - popularity(3)) / top // the third replica's 0, 1 and 2
	if m.hot != 4 || m.hotSetKeys != 4 || m.minWarmed != 3 || m.maxWarmed != 4 ||
		m.minHottest != 3 || math.Abs(m.minReadShare-want) > 1e-12 ||
		m.warmLoaded != 1 || m.warmFailed != 2 || m.warmErrors != 3 ||
		m.minFound != 3 || !m.heldFound || m.warmedTotal != 11 || m.replicasWarmed != 3 {
		t.Errorf("fleetMeasures = %+v, want hot 4, set 4, 3 to 4 warmed, 3 hottest, share %v, 1 loaded, 2 failed, 3 errors, "+
			"3 found at least, each held, 11 warmed over 3 replicas", m, want)
	}
	f.found[1] = 3 // the second replica holds a key its WarmHot did not find
	m = measures{}
	if m.fleetMeasures(f, 4); m.heldFound {
		t.Error("fleetMeasures: a replica holding other keys than it found counts as holding what it found")
	}
	var empty measures
	empty.fleetMeasures(&fleetWarm{}, 4)
	if empty.hotSetKeys != 0 || empty.minReadShare != 0 || empty.minWarmed != 0 || empty.heldFound {
		t.Errorf("fleetMeasures of an empty hot set = %+v, want zeros", empty)
	}
}

func TestReadShare(t *testing.T) {
	// Zipf(1.1): key 3 takes 4^-1.1 ≈ 0.218 of key 0's reads, key 4 0.170.
	top := 1 + math.Pow(2, -1.1) + math.Pow(3, -1.1) + math.Pow(4, -1.1)
	for _, tc := range []struct {
		keys    []int
		share   float64
		hottest int
	}{
		{[]int{0, 1, 2, 3}, 1, 4},
		{[]int{3, 1, 0, 2}, 1, 4},
		{[]int{0, 1, 2, 4}, (top - math.Pow(4, -1.1) + math.Pow(5, -1.1)) / top, 3},
		{[]int{0}, 1 / top, 1},
		{[]int{-1, 5}, math.Pow(6, -1.1) / top, 0},
		{nil, 0, 0},
	} {
		if got := readShare(tc.keys, 4); math.Abs(got-tc.share) > 1e-12 {
			t.Errorf("readShare(%v, 4) = %v, want %v", tc.keys, got, tc.share)
		}
		if got := hottestCount(tc.keys, 4); got != tc.hottest {
			t.Errorf("hottestCount(%v, 4) = %d, want %d", tc.keys, got, tc.hottest)
		}
	}
	for key, want := range map[string]int{"k0": 0, "k19": 19, "k": -1, "x1": -1, "k-1": -1, "k1x": -1, "": -1} {
		if got := keyIndex(key); got != want {
			t.Errorf("keyIndex(%q) = %d, want %d", key, got, want)
		}
	}
}

// TestPresets checks the presets' predicted figures: the design's
// replicas × rate × recompute time unprotected, one per replica with
// coalescing, one with the lease.
func TestPresets(t *testing.T) {
	want := map[string]map[string]float64{
		"seed-a": {"none": 500, "coalescing": 1, "lease": 1},
		"seed-b": {"none": 400, "coalescing": 20, "lease": 1},
	}
	for _, name := range Presets {
		o, err := PresetOptions(name)
		if err != nil {
			t.Fatal(err)
		}
		if err := o.Validate(); err != nil {
			t.Errorf("%s: %v", name, err)
		}
		if o.Latency.Kind != "fixed" || o.Capacity != 0 || o.ClientTimeout <= 0 || o.Preset != name {
			t.Errorf("%s: latency %v, capacity %d, client timeout %v, preset %q; want fixed latency, no capacity limit, a client timeout",
				name, o.Latency, o.Capacity, o.ClientTimeout, o.Preset)
		}
		for layer, w := range want[name] {
			got, ok := Predict(layer, o.Replicas, o.Rate, o.Latency.Mean())
			if !ok || math.Abs(got-w) > 1e-9 {
				t.Errorf("%s: Predict(%s) = %v, %v; want %v", name, layer, got, ok, w)
			}
		}
		runs := []Run{
			{Scenario: "hot-key", Layer: "none", Expiries: 3, CallsPerExpiry: want[name]["none"] * 1.19},
			{Scenario: "hot-key", Layer: "coalescing", Expiries: 3, CallsPerExpiry: want[name]["coalescing"] * 0.79},
			{Scenario: "hot-key", Layer: "lease", Expiries: 0},
			{Scenario: "hot-key", Layer: "swr", Expiries: 3, CallsPerExpiry: 1},
			{Scenario: "flush", Layer: "none", Expiries: 1, CallsPerExpiry: 9},
		}
		ps := predictions(&o, runs)
		if len(ps) != 3 || !ps[0].Within || ps[1].Within || ps[2].Within || ps[0].Preset != name {
			t.Errorf("%s: predictions %+v, want none within (+19%%), coalescing outside (−21%%), lease outside (nothing measured)", name, ps)
		}
	}
	if _, err := PresetOptions("seed-c"); err == nil {
		t.Error("PresetOptions(seed-c) succeeded")
	}
	if _, ok := Predict("swr", 2, 10, time.Second); ok {
		t.Error("Predict(swr) claims a figure")
	}
	if got, _ := Predict("none", 1, 1, time.Millisecond); got != 1 {
		t.Errorf("Predict(none) below one call = %v, want 1 (the call that recomputes)", got)
	}
}

// TestPredictionBand checks the band of a prediction: ±20% for a long
// run or a layer set by the replica count, wider (three standard deviations
// of the mean of few expiries) for --quick's unprotected hot key, with a
// note saying why and how many expiries ±20% needs.
func TestPredictionBand(t *testing.T) {
	q := Quick()
	p, _ := Predict("none", q.Replicas, q.Rate, q.Latency.Mean()) // 24
	band, note := predictionBand("none", p, 2, q.Latency)
	// √((1/24 + 0.2²)/2) = 0.202, three of it.
	if math.Abs(band-0.606) > 0.001 {
		t.Errorf("--quick none over 2 expiries: band %.3f, want 0.606", band)
	}
	for _, want := range []string{"±61% rather than ±20%", "the mean of 2 expiries", "±20% needs 19 expiries"} {
		if !strings.Contains(note, want) {
			t.Errorf("note %q lacks %q", note, want)
		}
	}
	if band, note := predictionBand("none", p, 19, q.Latency); band != minBand || note != "" {
		t.Errorf("--quick none over 19 expiries: band %v, note %q; want ±20%%, none", band, note)
	}
	for _, name := range Presets {
		o, _ := PresetOptions(name)
		p, _ := Predict("none", o.Replicas, o.Rate, o.Latency.Mean())
		if band, note := predictionBand("none", p, 5, o.Latency); band != minBand || note != "" {
			t.Errorf("%s none over 5 expiries: band %v, note %q; want ±20%%", name, band, note)
		}
	}
	if band, note := predictionBand("coalescing", 3, 2, q.Latency); band != minBand || note != "" {
		t.Errorf("coalescing: band %v, note %q; want ±20%%", band, note)
	}
	if _, note := predictionBand("none", p, 0, q.Latency); !strings.Contains(note, "no expiry measured") {
		t.Errorf("no expiry: note %q", note)
	}

	runs := []Run{{Scenario: "hot-key", Layer: "none", Expiries: 2, CallsPerExpiry: 17}}
	ps := predictions(&q, runs)
	if len(ps) != 1 || !ps[0].Within || ps[0].Checked || ps[0].Band != band || ps[0].Expiries != 2 || ps[0].Note == "" {
		t.Errorf("--quick none at 17 (0.71×) over 2 expiries: %+v, want within its band, not a check, with a note", ps)
	}
	runs[0].CallsPerExpiry = 40
	if ps := predictions(&q, runs); ps[0].Within {
		t.Errorf("--quick none at 40 (1.67×): %+v, want outside its band", ps[0])
	}
}

// TestValidate checks that every bad setting is refused with its own message.
func TestValidate(t *testing.T) {
	for _, o := range []Options{Defaults(), Quick()} {
		if err := o.Validate(); err != nil {
			t.Errorf("default options: %v", err)
		}
	}
	for name, tc := range map[string]struct {
		edit func(*Options)
		want string
	}{
		"scenario":      {func(o *Options) { o.Scenarios = []string{"hot-key", "meltdown"} }, `unknown scenario "meltdown"`},
		"no scenario":   {func(o *Options) { o.Scenarios = nil }, "no scenario"},
		"layer":         {func(o *Options) { o.Layers = []string{"cdn"} }, `unknown layer "cdn"`},
		"replicas":      {func(o *Options) { o.Replicas = 0 }, "replicas"},
		"rate":          {func(o *Options) { o.Rate = -1 }, "rate"},
		"rate too high": {func(o *Options) { o.Rate = 1e6 }, "rate"},
		"clients":       {func(o *Options) { o.ClosedLoop, o.Clients = true, 0 }, "clients"},
		"keys":          {func(o *Options) { o.Keys = 0 }, "keys"},
		"latency":       {func(o *Options) { o.Latency = Latency{} }, "latency"},
		"capacity":      {func(o *Options) { o.Capacity = -1 }, "capacity"},
		"failure":       {func(o *Options) { o.FailureRate = 1 }, "failure rate"},
		"ttl":           {func(o *Options) { o.TTL = 0 }, "TTL"},
		"duration":      {func(o *Options) { o.Duration = time.Hour }, "duration"},
		"timeout":       {func(o *Options) { o.ClientTimeout = 0 }, "client timeout"},
		"both redis":    {func(o *Options) { o.RedisAddr, o.SpawnRedis = "127.0.0.1:6379", true }, "exclude each other"},
		"remote redis":  {func(o *Options) { o.RedisAddr, o.Scenarios = "10.1.2.3:6379", []string{"flush"} }, "loopback"},
		"redis form":    {func(o *Options) { o.RedisAddr, o.Scenarios = "localhost", []string{"flush"} }, "host:port"},
		"redis kill":    {func(o *Options) { o.RedisAddr = "[::1]:6379" }, "node-kill cannot kill"},
		"remote pg":     {func(o *Options) { o.PostgresDSN = "postgres://postgres@db.example.com:5432/postgres" }, "not a loopback"},
		"bad dsn":       {func(o *Options) { o.PostgresDSN = "postgres://%zz" }, "--origin-postgres"},
	} {
		o := Defaults()
		tc.edit(&o)
		err := o.Validate()
		if err == nil || !strings.Contains(err.Error(), tc.want) || !strings.HasPrefix(err.Error(), "lab: ") {
			t.Errorf("%s: Validate() = %v, want an error with %q", name, err, tc.want)
		}
	}
	o := Defaults()
	o.RedisAddr, o.Scenarios = "localhost:6379", []string{"flush"}
	o.PostgresDSN = "postgres://postgres@127.0.0.1:5432/postgres"
	if err := o.Validate(); err != nil {
		t.Errorf("loopback Redis and PostgreSQL refused: %v", err)
	}
}

// XFetch promises no wait only for a refresh no longer than the load
// before it plus its margin: on its rung, a wait for a load that ran
// longer is reported and not judged; from stale-while-revalidate up, it is.
func TestNoWaitJudgesLongLoadsAboveXFetch(t *testing.T) {
	ms := time.Millisecond
	calls := []Call{
		{ID: 1, Key: 7, Start: 0, End: 40 * ms, Done: true},
		{ID: 2, Key: 7, Start: 200 * ms, End: 250 * ms, Done: true}, // 50ms > 1.2 × 40ms
		{ID: 3, Key: 7, Start: 400 * ms, End: 440 * ms, Done: true}, // 40ms ≤ 1.2 × 50ms
		{ID: 4, Key: 8, Start: 400 * ms, End: 900 * ms, Done: true}, // its key's first
	}
	prev := previousLoads(calls)
	for _, tc := range []struct {
		call uint64
		long bool
	}{{1, false}, {2, true}, {3, false}, {4, false}, {0, false}, {9, false}} {
		if got := ranLong(request{call: tc.call}, calls, prev); got != tc.long {
			t.Errorf("call %d: ranLong %v, want %v", tc.call, got, tc.long)
		}
	}

	for layer, want := range map[string]bool{"xfetch": true, "swr": false, "ahead": false} {
		m := &measures{plan: plan{"hot-key", layer, ""}, waitedRanLong: 2}
		m.run.Expiries, m.run.WaitedOnOrigin = 4, 2
		if measured, _, ok := noWait.eval(m); ok != want {
			t.Errorf("%s with 2 waits, both for a load that ran long: ok %v (%s), want %v", layer, ok, measured, want)
		}
		m.waitedRanLong = 1 // one wait for a load that did not run long
		if _, _, ok := noWait.eval(m); ok {
			t.Errorf("%s with a wait for a load that did not run long passed", layer)
		}
	}
}
