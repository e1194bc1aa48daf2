package herd_test

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/herdcache/herd"
	"github.com/herdcache/herd/memory"
)

// After MarkStale on one replica of five, every replica's readers are
// served at once, the value stale (or, until the notice is read, as it
// was), while exactly one load runs for the fleet; then all of them serve
// the new value.
func TestMarkStaleFleet(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := memory.New()
		cs := fleetReplicas(t, 5, r, nil)
		for _, c := range cs {
			fleetMustGet(t, c, "k", fleetValue(1), 1)
		}
		if err := cs[1].MarkStale(t.Context(), "k"); err != nil {
			t.Fatal(err)
		}
		synctest.Wait() // the notice arrives

		gate := make(chan struct{})
		var loads atomic.Int64
		load := func(ctx context.Context) (int, error) {
			loads.Add(1)
			return 2, hold(ctx, gate)
		}
		var wg sync.WaitGroup
		for range 4 { // reads before, during and after the refresh starts
			for i, c := range cs {
				for range 10 {
					wg.Go(func() {
						t0 := time.Now()
						v, err := c.Get(t.Context(), "k", load)
						if err != nil || v != 1 {
							t.Errorf("replica %d: Get = %d, %v; want the old 1 at once", i, v, err)
						}
						if w := time.Since(t0); w > 0 {
							t.Errorf("replica %d: a reader waited %v", i, w)
						}
					})
				}
			}
			wg.Wait()
			synctest.Wait()
		}
		stale := int64(0)
		for _, c := range cs {
			stale += c.Stats().StaleServed
		}
		if n := loads.Load(); n != 1 || stale == 0 {
			t.Fatalf("%d loads for the fleet and %d stale serves; want 1 load and stale serves", n, stale)
		}
		close(gate)
		synctest.Wait()
		for i, c := range cs {
			fleetNoticed(t, c, "k")
			if v, err := c.Get(t.Context(), "k", fleetNoLoad(t, "a replica")); err != nil || v != 2 {
				t.Errorf("replica %d after the refresh: Get = %d, %v; want 2", i, v, err)
			}
		}
	})
}

// MarkStale fences out a load that began before it, leaves a NoStale
// caller to load, and needs a Store that can do it.
func TestMarkStaleEdges(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := newCache(t, testOptions())
		gate := make(chan struct{})
		res := getAsync(t.Context(), c, "k", func(ctx context.Context) (int, error) { return 1, hold(ctx, gate) })
		synctest.Wait()
		if err := c.MarkStale(t.Context(), "k"); err != nil {
			t.Fatal(err)
		}
		close(gate)
		if r := recv(t, res); r.err != nil || r.v != 1 {
			t.Fatalf("the load begun before MarkStale: %d, %v; want 1 for its caller", r.v, r.err)
		}
		load, loads := counting()
		mustGet(t, c, "k", load, 1) // its value was not kept: a miss
		if err := c.MarkStale(t.Context(), "k"); err != nil {
			t.Fatal(err)
		}
		if v, err := c.Get(t.Context(), "k", load, herd.NoStale()); err != nil || v != 2 {
			t.Fatalf("NoStale Get after MarkStale = %d, %v; want a load (2)", v, err)
		}
		if n := loads.Load(); n != 2 {
			t.Fatalf("%d loads, want 2", n)
		}

		o := testOptions()
		o.Store, o.NoNearCache, o.NoBreaker = nopStore{}, true, true
		if err := newCache(t, o).MarkStale(t.Context(), "k"); !errors.Is(err, errors.ErrUnsupported) {
			t.Errorf("MarkStale with a Store that is no Staler: %v, want ErrUnsupported", err)
		}
		if err := c.Close(t.Context()); err != nil {
			t.Fatal(err)
		}
		if err := c.MarkStale(t.Context(), "k"); !errors.Is(err, herd.ErrClosed) {
			t.Errorf("MarkStale after Close: %v, want ErrClosed", err)
		}
	})
}
