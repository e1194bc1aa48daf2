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
