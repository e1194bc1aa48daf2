package herd_test

import (
	"context"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/herdcache/herd"
	"github.com/herdcache/herd/memory"
)

// Early refresh decided once per value: how many loads a hot key costs per
// TTL does not grow with its read rate, and no reader waits for one.

const (
	earlyTTL  = 2 * time.Second
	earlyLoad = 250 * time.Millisecond
)

type earlyRun struct {
	loads   int           // after the first, cold one
	periods float64       // TTLs of reading after that load
	waited  int64         // reads that took any (fake) time
	longest time.Duration // the longest of them
}

func (r earlyRun) perTTL() float64 { return float64(r.loads) / r.periods }

// readHot reads key on every cache from readers goroutines each, rate reads
// per second per cache in all, for periods TTLs after a first load, and
// counts the loads that followed it and the reads that waited.
func readHot(t *testing.T, cs []*herd.Cache[int], rate, periods int) earlyRun {
	t.Helper()
	const readers = 10
	var loads atomic.Int64
	load := func(context.Context) (int, error) {
		n := loads.Add(1)
		time.Sleep(earlyLoad) // the backing store
		return int(n), nil
	}
	ctx := t.Context()
	if _, err := cs[0].Get(ctx, "hot", load); err != nil {
		t.Fatal(err)
	}
	synctest.Wait()
	loads.Store(0)
	start := time.Now()
	total := time.Duration(periods) * earlyTTL
	tick := time.Duration(readers) * time.Second / time.Duration(rate)
	var (
		wg      sync.WaitGroup
		waited  atomic.Int64
		mu      sync.Mutex
		longest time.Duration
	)
	for _, c := range cs {
		for range readers {
			wg.Go(func() {
				for time.Since(start) < total {
					t0 := time.Now()
					if _, err := c.Get(ctx, "hot", load); err != nil {
						t.Error(err)
						return
					}
					if w := time.Since(t0); w > 0 {
						waited.Add(1)
						mu.Lock()
						longest = max(longest, w)
						mu.Unlock()
					}
					time.Sleep(tick)
				}
			})
		}
	}
	wg.Wait()
	synctest.Wait()
	return earlyRun{loads: int(loads.Load()), periods: float64(periods), waited: waited.Load(), longest: longest}
}

// One replica at 200, 2,000 and 20,000 reads per second, with a stale
// window and without: at most 1.25 loads per TTL at every rate, the same
// within 10% at 100 times the rate, and no reader waits. Every run draws
// the same numbers for its values in turn, so the runs differ in their read
// rate alone.
func TestEarlyRefreshIndependentOfReadRate(t *testing.T) {
	const periods = 20
	for _, tt := range []struct {
		name string
		hard time.Duration
	}{
		{"stale window", 2 * earlyTTL},
		{"no stale window", earlyTTL},
	} {
		t.Run(tt.name, func(t *testing.T) {
			var runs []earlyRun
			for _, rate := range []int{200, 2000, 20000} {
				synctest.Test(t, func(t *testing.T) {
					c := newCache(t, &herd.Options[int]{MaxEntries: 10, SoftTTL: earlyTTL, HardTTL: tt.hard, Beta: 1})
					rng := rand.New(rand.NewPCG(3, 4))
					herd.SetDraws(c, func() float64 { return 1 - rng.Float64() }, nil)
					r := readHot(t, []*herd.Cache[int]{c}, rate, periods)
					t.Logf("%6d reads/s: %d loads in %d TTLs, %.3f per TTL; %d reads waited (longest %v)",
						rate, r.loads, periods, r.perTTL(), r.waited, r.longest)
					if r.perTTL() > 1.25 {
						t.Errorf("%d reads/s: %.3f loads per TTL, want at most 1.25", rate, r.perTTL())
					}
					if r.waited != 0 {
						t.Errorf("%d reads/s: %d reads waited for a load (longest %v), want none", rate, r.waited, r.longest)
					}
					runs = append(runs, r)
				})
			}
			if len(runs) != 3 {
				t.Fatalf("%d of 3 rates ran", len(runs))
			}
			if lo, hi := runs[0].perTTL(), runs[2].perTTL(); hi > 1.1*lo || hi < 0.9*lo {
				t.Errorf("loads per TTL: %.3f at 20,000 reads/s against %.3f at 200; want within 10%%", hi, lo)
			}
		})
	}
}

// Across a fleet of 20 replicas sharing a Store and a Lease, at 50 and 500
// reads per second each, the replicas agree on each value's refresh instant
// (drawn from the value itself): at most 1.25 loads per TTL fleet-wide.
func TestEarlyRefreshFleetWide(t *testing.T) {
	const periods = 20
	for _, rate := range []int{50, 500} {
		synctest.Test(t, func(t *testing.T) {
			r := memory.New()
			cs := fleetReplicas(t, 20, r, func(o *herd.Options[int]) {
				o.SoftTTL, o.HardTTL, o.Beta = earlyTTL, 2*earlyTTL, 1
				o.NearTTL = time.Second
			})
			run := readHot(t, cs, rate, periods)
			t.Logf("20 replicas × %d reads/s: %d loads in %d TTLs, %.3f per TTL; %d reads waited (longest %v)",
				rate, run.loads, periods, run.perTTL(), run.waited, run.longest)
			if run.perTTL() > 1.25 {
				t.Errorf("%d reads/s per replica: %.3f loads per TTL fleet-wide, want at most 1.25", rate, run.perTTL())
			}
		})
	}
}
