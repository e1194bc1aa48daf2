package lab

import (
	"context"
	"testing"
	"testing/synctest"
)

// TestSlowOrigin runs slow-origin on the fake clock, where the lab's timers
// are never late: it reports the three rungs, and the adaptive rung keeps
// its promises while the default static limit drives the database far past
// its capacity.
func TestSlowOrigin(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		o := Quick()
		o.Scenarios = []string{slowScenario}
		o.Check = true
		s, err := RunSuite(context.Background(), o)
		if err != nil {
			t.Fatal(err)
		}
		if len(s.Runs) != len(SlowRungs) {
			t.Fatalf("%d runs, want %d", len(s.Runs), len(SlowRungs))
		}
		byRung := map[string]Run{}
		for i, r := range s.Runs {
			if r.Scenario != slowScenario || r.Layer != SlowRungs[i] {
				t.Errorf("run %d is %s/%s, want %s/%s", i, r.Scenario, r.Layer, slowScenario, SlowRungs[i])
			}
			byRung[r.Layer] = r
		}
		if got := byRung["static-default"].Extra["db_mean_inflight"]; got < 3*float64(o.Capacity) {
			t.Errorf("static-default: mean database in-flight %.1f, want it far past the capacity %d", got, o.Capacity)
		}
		if len(s.Checks) != 3 {
			t.Fatalf("%d checks, want 3", len(s.Checks))
		}
		for _, c := range s.Checks {
			if !c.OK {
				t.Errorf("missed: %s: %s (measured %s)", c.Layer, c.Promise, c.Measured)
			}
		}
	})
}

// TestGoodputCheck judges made-up rungs: one that answers as many requests
// as the best static rung, give or take the slices' noise, passes; one that
// loses a fifth of its answers in a third of the run (a limit that backs
// off through the slow phase) fails, and so does one that loses 3% in
// every slice.
func TestGoodputCheck(t *testing.T) {
	rung := func(name string, good func(i int) int) slowMeasures {
		m := slowMeasures{rung: name, overloadCalls: 1, goodBy: make([]int, slowSlices)}
		for i := range slowSlices {
			m.goodBy[i] = good(i)
			m.good += m.goodBy[i]
			m.offered += 400
		}
		return m
	}
	best := rung("static-tuned", func(i int) int { return 300 + []int{-6, 0, 6}[i%3] })
	for _, c := range []struct {
		name string
		good func(i int) int
		ok   bool
	}{
		{"same, other noise", func(i int) int { return 300 + []int{3, -6, 3}[i%3] }, true},
		{"lost in the slow phase", func(i int) int {
			if i >= 12 && i < 21 {
				return 240
			}
			return 300
		}, false},
		{"3% lower throughout", func(int) int { return 291 }, false},
	} {
		got := goodputCheck(rung("adaptive", c.good), best)
		if got.OK != c.ok {
			t.Errorf("%s: OK %v, want %v: %s (measured %s)", c.name, got.OK, c.ok, got.Promise, got.Measured)
		}
	}
}
