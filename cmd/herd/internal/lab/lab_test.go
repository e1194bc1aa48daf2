package lab

import (
	"context"
	"math"
	"slices"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/google/go-cmp/cmp"
)

// small returns a small embedded suite on the fake clock.
func small() Options {
	o := Defaults()
	o.Replicas = 3
	o.Rate = 100
	o.Keys = 20
	o.Latency = Latency{Kind: "fixed", A: 50 * time.Millisecond}
	o.Capacity = 0
	o.TTL = 200 * time.Millisecond
	o.Duration = 2 * time.Second
	o.ClientTimeout = time.Second
	o.Check = true
	return o
}

func runSuite(t *testing.T, o Options) *Suite {
	t.Helper()
	s, err := RunSuite(context.Background(), o)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func byLayer(s *Suite) map[string]Run {
	m := map[string]Run{}
	for _, r := range s.Runs {
		m[r.Layer+r.Variant] = r
	}
	return m
}

// TestHotKeyLadder runs hot-key under none, coalescing and lease and checks
// the ladder's direction: unprotected, every request in the recompute
// window calls the backing store (≈ replicas × rate × latency per expiry);
// coalescing makes that at most one per replica; the lease one per fleet.
func TestHotKeyLadder(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		o := small()
		o.Scenarios = []string{"hot-key"}
		o.Layers = []string{"none", "coalescing", "lease"}
		s := runSuite(t, o)
		runs := byLayer(s)
		none, co, lease := runs["none"], runs["coalescing"], runs["lease"]
		for _, r := range s.Runs {
			if r.Expiries < 3 {
				t.Fatalf("%s: %d expiries measured, want at least 3", r.Layer, r.Expiries)
			}
			if r.Errors != 0 {
				t.Errorf("%s: %d errors", r.Layer, r.Errors)
			}
		}
		if !(none.CallsPerExpiry > co.CallsPerExpiry && co.CallsPerExpiry >= lease.CallsPerExpiry) {
			t.Errorf("calls per expiry: none %.1f, coalescing %.1f, lease %.1f; want none > coalescing ≥ lease",
				none.CallsPerExpiry, co.CallsPerExpiry, lease.CallsPerExpiry)
		}
		if lease.CallsPerExpiry != 1 || lease.Extra["max_calls_per_expiry"] != 1 {
			t.Errorf("lease: %.2f calls per expiry, at most %v; want exactly 1", lease.CallsPerExpiry, lease.Extra["max_calls_per_expiry"])
		}
		if co.Extra["max_calls_per_replica_per_expiry"] != 1 || co.CallsPerExpiry > float64(o.Replicas) {
			t.Errorf("coalescing: %.2f calls per expiry, %v per replica at most; want ≤ %d and 1", co.CallsPerExpiry,
				co.Extra["max_calls_per_replica_per_expiry"], o.Replicas)
		}
		want := float64(o.Replicas) * o.Rate * o.Latency.Mean().Seconds() // 15
		if math.Abs(none.CallsPerExpiry-want) > 0.35*want {
			t.Errorf("none: %.1f calls per expiry, want ≈ %.0f", none.CallsPerExpiry, want)
		}
		if none.PeakOrigin <= lease.PeakOrigin || lease.PeakOrigin != 1 {
			t.Errorf("peak concurrency: none %d, lease %d; want none above the lease's 1", none.PeakOrigin, lease.PeakOrigin)
		}
		if lease.WaitedOnOrigin == 0 || none.WaitedOnOrigin == 0 {
			t.Error("no request waited on the backing store at expiry without a stale window")
		}
		for _, c := range s.Checks {
			if !c.OK {
				t.Errorf("check failed: %+v", c)
			}
		}
		if len(s.Checks) != 3 || len(s.Predictions) != 3 {
			t.Errorf("%d checks and %d predictions, want 3 and 3", len(s.Checks), len(s.Predictions))
		}
		if len(none.Timeline) == 0 || len(none.Timeline) != len(none.Concurrency) || none.Bucket <= 0 {
			t.Errorf("timeline of %d buckets of %v, concurrency of %d", len(none.Timeline), none.Bucket, len(none.Concurrency))
		}
		var sum int64
		for _, n := range none.Timeline {
			sum += n
		}
		if sum < none.OriginCalls {
			t.Errorf("timeline holds %d calls, the run counted %d after warm-up", sum, none.OriginCalls)
		}
	})
}

// TestHotKeyAhead runs hot-key under XFetch and under refresh-ahead, which
// takes over from it: refresh-ahead replaces each value once, shortly
// before it expires, so it loads less often per TTL than XFetch; every
// refresh begins before its value expires, and no client waits.
func TestHotKeyAhead(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		o := small()
		o.Scenarios = []string{"hot-key"}
		o.Layers = []string{"xfetch", "ahead"}
		o.Duration = 8 * time.Second // forty TTLs, for XFetch's draws to average out
		s := runSuite(t, o)
		runs := byLayer(s)
		xf, ahead := runs["xfetch"], runs["ahead"]
		if ahead.Expiries < 5 {
			t.Fatalf("ahead: %d expiries measured, want at least 5", ahead.Expiries)
		}
		for _, c := range s.Checks {
			if !c.OK {
				t.Errorf("check failed: %+v", c)
			}
		}
		if len(s.Checks) != 3+6 {
			t.Errorf("%d checks, want 3 for xfetch and 6 for ahead", len(s.Checks))
		}
		// 200ms values replaced 60ms before they expire by 50ms loads: a
		// value lives 190ms, longer when its refresh begins late (a
		// replica may drop the key from its hot set for a soft TTL).
		if got := ahead.Extra["loads_per_ttl"]; got > 1.15 || got < 0.85 {
			t.Errorf("ahead: %.3f loads per TTL, want about 200/190", got)
		}
		// XFetch draws each value's lead at random, between 60 and 110ms:
		// over forty TTLs its loads per TTL ranged 1.11-1.22 over 2,000
		// runs, refresh-ahead's 1.02-1.10, and the gap was at least 0.04 (mean
		// 0.11, standard deviation 0.017).
		if got := xf.Extra["loads_per_ttl"]; got <= ahead.Extra["loads_per_ttl"] {
			t.Errorf("xfetch: %.3f loads per TTL, want above refresh-ahead's %.3f", got, ahead.Extra["loads_per_ttl"])
		}
		if ahead.WaitedOnOrigin != 0 || ahead.Errors != 0 {
			t.Errorf("ahead: %d waited, %d errors; want none", ahead.WaitedOnOrigin, ahead.Errors)
		}
		if got := ahead.Extra["ahead_refreshes"]; got < float64(ahead.Expiries) {
			t.Errorf("ahead: %v refreshes ahead over %d expiries, want at least one each", got, ahead.Expiries)
		}
		if _, ok := xf.Extra["ahead_refreshes"]; ok {
			t.Error("xfetch reports refreshes ahead: refresh-ahead is off below its rung")
		}
	})
}

// TestMultiKeyScenarios runs flush, node-kill and cold-start with and
// without the lease and checks what each promises.
func TestMultiKeyScenarios(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		o := small()
		o.Scenarios = []string{"flush", "node-kill", "cold-start"}
		o.Layers = []string{"none", "lease", "limiter"}
		s := runSuite(t, o)
		if len(s.Runs) != 15 {
			t.Fatalf("%d runs, want 15 (flush and node-kill × 3, cold-start × 3 × cold/warm/fleet)", len(s.Runs))
		}
		for _, c := range s.Checks {
			if !c.OK {
				t.Errorf("check failed: %+v", c)
			}
		}
		get := func(scenario, layer, variant string) Run {
			for _, r := range s.Runs {
				if r.Scenario == scenario && r.Layer == layer && r.Variant == variant {
					return r
				}
			}
			t.Fatalf("no run %s/%s/%s", scenario, layer, variant)
			return Run{}
		}
		if f := get("flush", "none", ""); f.Extra["max_calls_per_key"] <= 1 {
			t.Errorf("flush/none: at most %v calls per key after the flush; want a stampede", f.Extra["max_calls_per_key"])
		}
		if f := get("flush", "lease", ""); f.Extra["max_calls_per_key"] != 1 || f.OriginCalls > int64(o.Keys) {
			t.Errorf("flush/lease: %d calls, at most %v per key; want one per key", f.OriginCalls, f.Extra["max_calls_per_key"])
		}
		for _, l := range o.Layers {
			k := get("node-kill", l, "")
			if k.Extra["calls_while_down"] == 0 || k.Extra["requests_while_down"] == 0 || k.Extra["down_ms"] <= 0 {
				t.Errorf("node-kill/%s: %v calls and %v requests while down for %vms; want keys loaded while down",
					l, k.Extra["calls_while_down"], k.Extra["requests_while_down"], k.Extra["down_ms"])
			}
		}
		for _, c := range s.Checks {
			if c.Observations == 0 {
				t.Errorf("%s / %s: %q judged nothing", c.Scenario, c.Layer, c.Promise)
			}
		}
		for _, r := range s.Runs {
			if r.Bucket != bucketFor(o.Duration) {
				t.Errorf("%s/%s/%s: buckets of %v, want the suite's %v", r.Scenario, r.Layer, r.Variant, r.Bucket, bucketFor(o.Duration))
			}
		}
		if w := get("cold-start", "lease", "warm"); w.Extra["waited_on_warmed_keys"] != 0 {
			t.Errorf("cold-start/lease warm: %v waited on warmed keys", w.Extra["waited_on_warmed_keys"])
		}
		if f := get("cold-start", "lease", "fleet"); f.OriginCalls != 0 || f.Extra["warmed_keys"] != 4 {
			t.Errorf("cold-start/lease fleet: %d calls, %v keys warmed per replica; want none and the hottest 4", f.OriginCalls, f.Extra["warmed_keys"])
		}
		if c := get("cold-start", "none", "cold"); c.WaitedOnOrigin == 0 {
			t.Error("cold-start/none cold: no request waited on the backing store")
		}
		if l := get("cold-start", "limiter", "cold"); l.Extra["peak_per_replica"] > limiterSlots {
			t.Errorf("cold-start/limiter: peak %v per replica over the cap", l.Extra["peak_per_replica"])
		}
	})
}

// TestColdStartFleet runs cold-start warm and warm from the fleet: a
// veteran's reads fill the Store's hot set through ShareHotKeys, and the
// replicas that warm from it take the hottest keys from the Store with no
// backing-store call, where warming through the backing store loads them.
func TestColdStartFleet(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		o := small()
		o.Scenarios = []string{"cold-start"}
		o.Layers = []string{"none", "lease", "ahead"}
		s := runSuite(t, o)
		fleetChecks := map[string]int{}
		for _, c := range s.Checks {
			if !c.OK {
				t.Errorf("check failed: %+v", c)
			}
			if strings.HasSuffix(c.Layer, "(fleet)") {
				fleetChecks[c.Layer]++
			}
		}
		// The three of the fleet: it loads nothing for coalescing's, the
		// lease's or the limiter's to judge.
		want := map[string]int{"none (fleet)": 3, "lease (fleet)": 3, "ahead (fleet)": 3}
		if diff := cmp.Diff(want, fleetChecks); diff != "" {
			t.Errorf("checks of the fleet variant (-want +got):\n%s", diff)
		}
		for _, r := range s.Runs {
			switch r.Variant {
			case "warm":
				if r.Extra["warm_calls"] == 0 {
					t.Errorf("%s warm: no backing-store call while warming through it", r.Layer)
				}
			case "fleet":
				if r.OriginCalls != 0 || r.WaitedOnOrigin != 0 || r.Errors != 0 || r.Requests == 0 {
					t.Errorf("%s fleet: %d calls, %d waited, %d errors of %d requests; want none of the first three",
						r.Layer, r.OriginCalls, r.WaitedOnOrigin, r.Errors, r.Requests)
				}
				for k, v := range map[string]float64{"warm_calls": 0, "hot_set_keys": 4, "warmed_keys": 4} {
					if r.Extra[k] != v {
						t.Errorf("%s fleet: %s = %v, want %v", r.Layer, k, r.Extra[k], v)
					}
				}
				if r.Extra["veteran_reads"] < veteranReads/2 || r.Extra["warmed_read_share"] < minWarmReadShare {
					t.Errorf("%s fleet: %v veteran reads, warmed keys take %v of the hottest's reads",
						r.Layer, r.Extra["veteran_reads"], r.Extra["warmed_read_share"])
				}
			}
		}
	})
}

// TestLoadModels checks the two load models against a backing store slower
// than the client timeout: open-loop arrivals keep coming at the configured
// rate; closed-loop clients send one request at a time.
func TestLoadModels(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		o := small()
		o.Scenarios, o.Layers = []string{"cold-start"}, []string{"coalescing"}
		o.Keys = 1000
		o.Latency = Latency{Kind: "fixed", A: 10 * time.Second}
		o.ClientTimeout = 100 * time.Millisecond
		o.Duration = 4 * time.Second // 2s of traffic in cold-start
		o.Check = false
		s := runSuite(t, o)
		open := s.Runs[0]
		// Each request on its own goroutine: each of the runs cold and warm
		// (whose warm-up gives up after 4 client timeouts) ends one client
		// timeout after its 2s of arrivals, however slow the answers: 4.6s;
		// fleet, answered from the Store, after a 200ms period and 1s of
		// arrivals. Requests that waited for each other would take
		// 600 × 100ms.
		if took := s.Finished.Sub(s.Started); took > 7*time.Second {
			t.Errorf("open loop: the runs took %v for 5s of arrivals; requests waited for earlier ones", took)
		}
		want := o.Rate * float64(o.Replicas) * 2 // 600
		if math.Abs(float64(open.Requests)-want) > 0.1*want {
			t.Errorf("open loop: %d requests, want ≈ %.0f", open.Requests, want)
		}
		if open.Errors != open.Requests {
			t.Errorf("open loop: %d errors of %d requests; want every one timed out", open.Errors, open.Requests)
		}
		if open.P50 != o.ClientTimeout {
			t.Errorf("open loop: p50 %v, want the client timeout %v", open.P50, o.ClientTimeout)
		}

		o.ClosedLoop, o.Clients = true, 2
		s = runSuite(t, o)
		closed := s.Runs[0]
		// Each client: wait for the 100ms timeout, think 20ms (2 clients /
		// 100 req/s): about 2s / 120ms ≈ 16 requests each.
		per := 2 * time.Second / (o.ClientTimeout + o.thinkTime())
		want = float64(o.Replicas*o.Clients) * float64(per)
		if math.Abs(float64(closed.Requests)-want) > 0.15*want+float64(o.Replicas*o.Clients) {
			t.Errorf("closed loop: %d requests, want ≈ %.0f", closed.Requests, want)
		}
		if s.LoadModel == "" || s.LoadModel[:6] != "closed" {
			t.Errorf("load model %q, want closed-loop", s.LoadModel)
		}
	})
}

// TestProgressAndEvents checks that RunSuite reports each run before and
// after it, in order, the last report with Done == Total, and that every
// run records its scenario's events on its timeline's clock: hot-key one
// per measured expiry, at a bucket where calls started; flush the flush;
// node-kill the kill and, as long after as the node was down, the
// restart; cold-start the start of traffic.
func TestProgressAndEvents(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		o := small()
		o.Scenarios = []string{"hot-key", "flush", "node-kill", "cold-start"}
		o.Layers = []string{"lease"}
		o.Check = false
		var steps []Step
		o.Progress = func(s Step) { steps = append(steps, s) }
		s := runSuite(t, o)

		total := len(s.Runs)
		if total != 6 || len(steps) != 2*total {
			t.Fatalf("%d runs, %d progress steps; want 6 runs, a step before and after each", total, len(steps))
		}
		for i, r := range s.Runs {
			before, after := steps[2*i], steps[2*i+1]
			name := r.Scenario + "/" + r.Layer
			if r.Variant != "" {
				name += "/" + r.Variant
			}
			if before.Done != i || before.Total != total || before.Name != name || before.Run != nil {
				t.Errorf("step before run %d: %+v, want done %d of %d, %s, no run", i, before, i, total, name)
			}
			if after.Done != i+1 || after.Total != total || after.Name != name || after.Run == nil ||
				after.Run.Scenario != r.Scenario || after.Run.Variant != r.Variant || after.Took <= 0 {
				t.Errorf("step after run %d: %+v, want done %d of %d, %s, its run and duration", i, after, i+1, total, name)
			}
		}
		if last := steps[len(steps)-1]; last.Done != last.Total {
			t.Errorf("last step %d of %d", last.Done, last.Total)
		}

		end := func(r Run) time.Duration { return time.Duration(len(r.Timeline)) * r.Bucket }
		for _, r := range s.Runs {
			var kinds []string
			for i, ev := range r.Events {
				kinds = append(kinds, ev.Kind)
				if ev.At < 0 || ev.At >= end(r) || (i > 0 && ev.At < r.Events[i-1].At) {
					t.Errorf("%s/%s: event %s at %v, outside the timeline [0, %v) or out of order", r.Scenario, r.Variant, ev.Kind, ev.At, end(r))
				}
			}
			switch r.Scenario {
			case "hot-key":
				if r.Expiries == 0 || int64(len(r.Events)) != r.Expiries {
					t.Errorf("hot-key: %d events for %d expiries", len(r.Events), r.Expiries)
				}
				for _, ev := range r.Events {
					if ev.Kind != EventExpiry || r.Timeline[ev.At/r.Bucket] == 0 {
						t.Errorf("hot-key: event %s at %v, where no call started", ev.Kind, ev.At)
					}
				}
			case "flush":
				if !slices.Equal(kinds, []string{EventFlush}) {
					t.Errorf("flush: events %q", kinds)
				}
			case "node-kill":
				if !slices.Equal(kinds, []string{EventKill, EventRestart}) {
					t.Errorf("node-kill: events %q", kinds)
					continue
				}
				if down := r.Events[1].At - r.Events[0].At; down.Milliseconds() != int64(r.Extra["down_ms"]) {
					t.Errorf("node-kill: kill to restart %v, down %vms", down, r.Extra["down_ms"])
				}
			case "cold-start":
				if !slices.Equal(kinds, []string{EventStart}) {
					t.Errorf("cold-start/%s: events %q", r.Variant, kinds)
				}
			}
		}
	})
}
