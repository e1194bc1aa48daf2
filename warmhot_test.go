package herd_test

import (
	"context"
	"errors"
	"slices"
	"strconv"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/herdcache/herd"
	"github.com/herdcache/herd/memory"
)

// hotReads has each replica read key i (of 100) 100-i times, spread over
// d, so that key i is the i-th most read.
func hotReads(t *testing.T, cs []*herd.Cache[int], d time.Duration) {
	t.Helper()
	const keys = 100
	step := d / keys
	for i := range keys {
		for _, c := range cs {
			for range keys - i {
				if _, err := c.Get(t.Context(), "k"+strconv.Itoa(i), nil); err != nil {
					t.Fatal(err)
				}
			}
		}
		time.Sleep(step)
	}
}

// A replica started beside a fleet that shares its hot keys warms the 20
// the fleet reads most from the Store, with no load of its own, and serves
// them with no miss in its first second (values that go stale meanwhile are
// served stale while they refresh).
func TestWarmHotFromFleet(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := memory.New()
		var loads atomic.Int64
		mod := func(o *herd.Options[int]) {
			o.ShareHotKeys = 20
			o.Load = func(_ context.Context, key string) (int, error) {
				loads.Add(1)
				return strconv.Atoi(key[1:])
			}
		}
		fleet := fleetReplicas(t, 3, r, mod)
		start := time.Now()
		hotReads(t, fleet, fleetSoft/2)
		time.Sleep(time.Until(start.Add(fleetSoft + time.Millisecond))) // the soft TTL's count ends and is shared
		// The fleet keeps reading, so what it stored stays fresh.
		hotReads(t, fleet[:1], time.Millisecond)
		synctest.Wait()

		before := loads.Load()
		fresh := fleetReplica(t, r, mod)
		report, err := fresh.WarmHot(t.Context(), 20, nil)
		if err != nil {
			t.Fatalf("WarmHot: %v", err)
		}
		if report.Failed != 0 || report.Loaded+report.Fresh != 20 {
			t.Fatalf("WarmHot report %+v, want 20 keys warmed and none failed", report)
		}
		if n := loads.Load() - before; n != 0 {
			t.Errorf("warming made %d loads, want 0: the fleet's values are in the Store", n)
		}
		st := fresh.Stats()
		start = time.Now()
		for time.Since(start) < time.Second {
			for i := range 20 {
				if v, err := fresh.Get(t.Context(), "k"+strconv.Itoa(i), nil); err != nil || v != i {
					t.Fatalf("Get(k%d) = %d, %v; want %d, nil", i, v, err, i)
				}
			}
			time.Sleep(10 * time.Millisecond)
		}
		if got := fresh.Stats(); got.Misses != st.Misses || got.Hits == st.Hits {
			t.Errorf("in its first second: %d misses, %d hits; want 0 misses", got.Misses-st.Misses, got.Hits-st.Hits)
		}
	})
}

// A key the fleet stops reading leaves the hot set within two periods.
func TestShareHotKeysForgetsColdKeys(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := memory.New()
		const period = fleetSoft / 4
		mod := func(o *herd.Options[int]) {
			o.ShareHotKeys, o.ShareHotKeysEvery = 5, period
			o.Load = func(context.Context, string) (int, error) { return 1, nil }
		}
		c := fleetReplica(t, r, mod)
		for range 10 {
			if _, err := c.Get(t.Context(), "cold", nil); err != nil {
				t.Fatal(err)
			}
		}
		time.Sleep(period + time.Millisecond)
		synctest.Wait()
		if keys, err := r.Hot(t.Context(), 5, period); err != nil || !slices.Equal(keys, []string{"cold"}) {
			t.Fatalf("hot set after a period = %q, %v; want [cold]", keys, err)
		}
		for range 2 {
			for range 10 {
				if _, err := c.Get(t.Context(), "warm", nil); err != nil {
					t.Fatal(err)
				}
			}
			time.Sleep(period)
			synctest.Wait()
		}
		if keys, err := r.Hot(t.Context(), 5, period); err != nil || !slices.Equal(keys, []string{"warm"}) {
			t.Errorf("hot set two periods after the last read of cold = %q, %v; want [warm]", keys, err)
		}
	})
}

func TestWarmHotErrors(t *testing.T) {
	ctx := context.Background()
	local := newCache(t, testOptions())
	if _, err := local.WarmHot(ctx, 20, nil); err == nil {
		t.Error("WarmHot with no Store: no error")
	}
	r := memory.New()
	c := newCache(t, fleetOptions(r))
	if _, err := c.WarmHot(ctx, 0, nil); err == nil {
		t.Error("WarmHot(0): no error")
	}
	r.SetDown(errors.New("down"))
	if _, err := c.WarmHot(ctx, 20, nil); err == nil {
		t.Error("WarmHot with the Store down: no error")
	}
	r.SetDown(nil)
	if err := c.Close(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := c.WarmHot(ctx, 20, nil); !errors.Is(err, herd.ErrClosed) {
		t.Errorf("WarmHot after Close: %v, want ErrClosed", err)
	}
}

// The hot-set and refresh-ahead timers may fire before New returns: with
// periods this short, -race sees any unguarded start.
func TestShortPeriodsStartCleanly(t *testing.T) {
	r := memory.New()
	for range 50 {
		c, err := herd.New(&herd.Options[int]{
			NoNearCache: true,
			NoBreaker:   true,
			MaxEntries:  10, SoftTTL: time.Millisecond, Store: r,
			ShareHotKeys: 1, ShareHotKeysEvery: time.Nanosecond,
			MaxRefreshAhead: 1, RefreshAheadHot: 1,
			Load: func(context.Context, string) (int, error) { return 1, nil },
		})
		if err != nil {
			t.Fatal(err)
		}
		// HardTTL is SoftTTL, 1 ms: on a loaded machine the value can expire
		// before each of the Get's attempts takes it, which it reports.
		if _, err := c.Get(t.Context(), "k", nil); err != nil && !errors.Is(err, herd.ErrNoFreshValue) {
			t.Fatal(err)
		}
		if err := c.Close(t.Context()); err != nil {
			t.Fatal(err)
		}
	}
}
