package herd_test

import (
	"context"
	"errors"
	"testing"
	"testing/synctest"
	"time"

	"github.com/herdcache/herd"
	"github.com/herdcache/herd/memory"
)

// SetWithTTL stores a value fresh for its own soft TTL and stale until its
// own hard TTL, in both tiers; bad TTLs store nothing.
func TestSetWithTTL(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := memory.New()
		a, b := fleetReplica(t, r, nil), fleetReplica(t, r, nil)
		ctx := t.Context()
		t0 := time.Now()
		if err := a.SetWithTTL(ctx, "k", 7, time.Minute, 3*time.Minute); err != nil {
			t.Fatal(err)
		}
		fleetMustGet(t, b, "k", fleetNoLoad(t, "b"), 7) // from the Store
		fail := func(context.Context) (int, error) { return 0, errLoad }
		sleepUntil(t0.Add(time.Minute - 1))
		for _, c := range []*herd.Cache[int]{a, b} {
			st := c.Stats()
			fleetMustGet(t, c, "k", fail, 7)
			if got := c.Stats(); got.Hits != st.Hits+1 || got.StaleServed != st.StaleServed {
				t.Fatalf("not fresh just before its own soft TTL: %+v", got)
			}
		}
		sleepUntil(t0.Add(time.Minute))
		for _, c := range []*herd.Cache[int]{a, b} {
			st := c.Stats()
			fleetMustGet(t, c, "k", fail, 7) // stale while the refresh fails
			if got := c.Stats(); got.StaleServed != st.StaleServed+1 {
				t.Fatalf("not stale at its own soft TTL: %+v", got)
			}
		}
		synctest.Wait()
		sleepUntil(t0.Add(3 * time.Minute))
		if v, err := a.Get(ctx, "k", fail); !errors.Is(err, errLoad) {
			t.Fatalf("Get at its own hard TTL = %d, %v; want a miss that loads (errLoad)", v, err)
		}

		// A hard TTL of zero: no stale window.
		t1 := time.Now()
		if err := a.SetWithTTL(ctx, "short", 1, time.Minute, 0); err != nil {
			t.Fatal(err)
		}
		sleepUntil(t1.Add(time.Minute))
		if v, err := a.Get(ctx, "short", func(context.Context) (int, error) { return 2, nil }); err != nil || v != 2 {
			t.Fatalf("Get at the soft TTL with no stale window = %d, %v; want 2 (loaded)", v, err)
		}

		for _, ttl := range [][2]time.Duration{{0, time.Second}, {-time.Second, 0}, {herd.MaxTTL + 1, 0}, {time.Second, herd.MaxTTL + 1}, {time.Minute, time.Second}, {time.Second, -time.Second}} {
			if err := a.SetWithTTL(ctx, "bad", 1, ttl[0], ttl[1]); err == nil {
				t.Errorf("SetWithTTL with TTLs %v: no error", ttl)
			}
			peek(t, a, "bad", 0, false, "after a refused SetWithTTL")
		}
	})
}
