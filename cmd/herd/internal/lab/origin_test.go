package lab

import (
	"context"
	"errors"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"
)

func TestParseLatency(t *testing.T) {
	ms := time.Millisecond
	good := map[string]Latency{
		"fixed:250ms":          {Kind: "fixed", A: 250 * ms},
		"250ms":                {Kind: "fixed", A: 250 * ms},
		"lognormal:250ms,50ms": {Kind: "lognormal", A: 250 * ms, B: 50 * ms},
		"lognormal:250ms":      {Kind: "lognormal", A: 250 * ms, B: 50 * ms},
		"uniform:200ms, 300ms": {Kind: "uniform", A: 200 * ms, B: 300 * ms},
		" fixed:1s ":           {Kind: "fixed", A: time.Second},
	}
	for in, want := range good {
		got, err := ParseLatency(in)
		if err != nil || got != want {
			t.Errorf("ParseLatency(%q) = %+v, %v; want %+v", in, got, err, want)
		}
		if again, err := ParseLatency(got.Flag()); err != nil || again != got {
			t.Errorf("ParseLatency(%q.Flag() = %q) = %+v, %v; want it back", in, got.Flag(), again, err)
		}
	}
	for _, in := range []string{
		"", "fixed", "fixed:", "fixed:abc", "fixed:-5ms", "fixed:0s", "fixed:1ms,2ms",
		"lognormal:250ms,50ms,1ms", "lognormal:250ms,-1ms", "uniform:300ms,200ms",
		"uniform:200ms", "gamma:1s", "fixed:2h",
	} {
		if l, err := ParseLatency(in); err == nil {
			t.Errorf("ParseLatency(%q) = %+v, want an error", in, l)
		} else if !strings.HasPrefix(err.Error(), "lab: latency ") {
			t.Errorf("ParseLatency(%q) error %q lacks the \"lab: latency \" prefix", in, err)
		}
	}
}

// TestLatencyDraws checks each distribution's draws from a seeded source:
// sample mean (and spread) within tolerance of what it claims, and the
// same draws from the same seed.
func TestLatencyDraws(t *testing.T) {
	ms := time.Millisecond
	for _, tc := range []struct {
		l        Latency
		sd       float64 // expected standard deviation, ms
		min, max time.Duration
	}{
		{Latency{Kind: "fixed", A: 250 * ms}, 0, 250 * ms, 250 * ms},
		{Latency{Kind: "lognormal", A: 250 * ms, B: 50 * ms}, 50, 1, time.Hour},
		{Latency{Kind: "lognormal", A: 100 * ms, B: 0}, 0, 100 * ms, 100 * ms},
		{Latency{Kind: "uniform", A: 200 * ms, B: 300 * ms}, 100 / math.Sqrt(12), 200 * ms, 300 * ms},
	} {
		const n = 50_000
		r := rand.New(rand.NewPCG(7, 7))
		var sum, sq float64
		first := make([]time.Duration, 10)
		for i := range n {
			d := tc.l.Draw(r)
			if d < tc.min || d > tc.max {
				t.Fatalf("%v: draw %v outside [%v, %v]", tc.l, d, tc.min, tc.max)
			}
			if i < len(first) {
				first[i] = d
			}
			x := float64(d) / float64(ms)
			sum += x
			sq += x * x
		}
		mean := sum / n
		sd := math.Sqrt(max(sq/n-mean*mean, 0))
		want := float64(tc.l.Mean()) / float64(ms)
		if math.Abs(mean-want) > 0.01*want {
			t.Errorf("%v: sample mean %.2fms, want %.2fms ± 1%%", tc.l, mean, want)
		}
		if math.Abs(sd-tc.sd) > 0.03*max(tc.sd, 1) {
			t.Errorf("%v: sample sd %.2fms, want %.2fms ± 3%%", tc.l, sd, tc.sd)
		}
		r2 := rand.New(rand.NewPCG(7, 7))
		for i, d := range first {
			if again := tc.l.Draw(r2); again != d {
				t.Fatalf("%v: draw %d from the same seed = %v, first time %v", tc.l, i, again, d)
			}
		}
	}
}

// startCalls makes n calls at the same instant, on replica i%replicas, and
// waits for them.
func startCalls(o *Origin, n, replicas int) []error {
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() { _, errs[i] = o.Call(context.Background(), i, i%replicas) })
	}
	wg.Wait()
	return errs
}

// TestOriginCounts checks the counting of calls, their times and the peak
// concurrency, fleet-wide and per replica, on the fake clock.
func TestOriginCounts(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		o := NewOrigin(OriginOptions{Latency: Latency{Kind: "fixed", A: 100 * time.Millisecond}})
		startCalls(o, 6, 3)
		time.Sleep(time.Second)
		startCalls(o, 2, 3)
		calls := o.Calls()
		if len(calls) != 8 {
			t.Fatalf("%d calls recorded, want 8", len(calls))
		}
		for i, c := range calls {
			wantStart := time.Duration(0)
			if i >= 6 {
				wantStart = 1100 * time.Millisecond
			}
			if c.ID != uint64(i+1) || !c.Done || c.Failed || c.Start != wantStart || c.End != wantStart+100*time.Millisecond {
				t.Errorf("call %d = %+v, want ID %d, done, [%v, %v)", i, c, i+1, wantStart, wantStart+100*time.Millisecond)
			}
		}
		fleet, per := o.Peak()
		if fleet != 6 || !slices.Equal(per, []int{2, 2, 2}) {
			t.Errorf("Peak() = %d, %v; want 6, [2 2 2]", fleet, per)
		}
		started, peak := sweep(calls, 100*time.Millisecond, 13)
		if started[0] != 6 || started[11] != 2 || peak[0] != 6 || peak[1] != 0 || peak[11] != 2 {
			t.Errorf("sweep: started %v, peak %v", started, peak)
		}
		if o.Inflight() != 0 {
			t.Errorf("Inflight() = %d after every call returned", o.Inflight())
		}
	})
}

// TestOriginCapacity checks the slowdown beyond capacity: a call starting
// with n > capacity calls in flight lasts latency × n/capacity.
func TestOriginCapacity(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		o := NewOrigin(OriginOptions{Latency: Latency{Kind: "fixed", A: 100 * time.Millisecond}, Capacity: 2})
		startCalls(o, 5, 1)
		var got []time.Duration
		for _, c := range o.Calls() {
			got = append(got, c.End-c.Start)
			if c.Latency != c.End-c.Start {
				t.Errorf("call %d: latency %v recorded, lasted %v", c.ID, c.Latency, c.End-c.Start)
			}
		}
		slices.Sort(got)
		want := []time.Duration{100, 100, 150, 200, 250} // × ms: n = 1, 2, 3, 4, 5
		for i := range want {
			want[i] *= time.Millisecond
		}
		if !slices.Equal(got, want) {
			t.Errorf("durations %v, want %v", got, want)
		}
	})
}

// TestOriginFailureRate checks that the failure rate is drawn per call from
// the seed, and that failures are recorded.
func TestOriginFailureRate(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		o := NewOrigin(OriginOptions{Latency: Latency{Kind: "fixed", A: time.Millisecond}, FailureRate: 0.3, Seed: 3})
		const n = 20_000
		failed := 0
		for i := range n {
			_, err := o.Call(context.Background(), i, 0)
			if err != nil {
				if !errors.Is(err, ErrOriginFailure) {
					t.Fatalf("call %d: %v, want ErrOriginFailure", i, err)
				}
				failed++
			}
		}
		if f := float64(failed) / n; math.Abs(f-0.3) > 0.015 {
			t.Errorf("failure share %.3f, want 0.3 ± 0.015", f)
		}
		recorded := 0
		for _, c := range o.Calls() {
			if c.Failed {
				recorded++
			}
		}
		if recorded != failed {
			t.Errorf("%d calls recorded as failed, %d returned an error", recorded, failed)
		}
	})
}

// TestOriginCancel checks that an ended context ends a call at once, that it
// is recorded as failed, and that WaitIdle waits for running calls.
func TestOriginCancel(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		o := NewOrigin(OriginOptions{Latency: Latency{Kind: "fixed", A: time.Hour}})
		ctx, cancel := context.WithCancel(context.Background())
		idle := make(chan error)
		go func() { idle <- o.WaitIdle(context.Background()) }()
		done := make(chan error)
		go func() { _, err := o.Call(ctx, 0, 0); done <- err }()
		synctest.Wait()
		select {
		case <-idle:
			// WaitIdle may have returned before the call started: try again.
			go func() { idle <- o.WaitIdle(context.Background()) }()
			synctest.Wait()
		default:
		}
		select {
		case err := <-idle:
			t.Fatalf("WaitIdle returned %v while a call was running", err)
		default:
		}
		time.Sleep(time.Second)
		cancel()
		if err := <-done; !errors.Is(err, context.Canceled) {
			t.Fatalf("call ended with %v, want context.Canceled", err)
		}
		if err := <-idle; err != nil {
			t.Fatalf("WaitIdle = %v", err)
		}
		c := o.Calls()[0]
		if !c.Done || !c.Failed || c.End != time.Second {
			t.Errorf("canceled call recorded as %+v, want done, failed, ended at 1s", c)
		}
	})
}

// TestOriginQuery checks that a real query is given the drawn latency (with
// no simulated slowdown) instead of the Origin sleeping.
func TestOriginQuery(t *testing.T) {
	var got []time.Duration
	var mu sync.Mutex
	o := NewOrigin(OriginOptions{
		Latency:  Latency{Kind: "fixed", A: time.Hour},
		Capacity: 1,
		Query: func(_ context.Context, d time.Duration) error {
			mu.Lock()
			got = append(got, d)
			mu.Unlock()
			return nil
		},
	})
	if errs := startCalls(o, 3, 1); errors.Join(errs...) != nil {
		t.Fatal(errs)
	}
	if !slices.Equal(got, []time.Duration{time.Hour, time.Hour, time.Hour}) {
		t.Errorf("query given %v, want the drawn hour each time", got)
	}
}
