package herd_test

import (
	"context"
	"testing"
	"testing/synctest"
	"time"

	"github.com/herdcache/herd"
	"github.com/herdcache/herd/memory"
)

// peek is GetIfPresent with a test failure when the answer is not want.
func peek(t *testing.T, c *herd.Cache[int], key string, want int, wantOK bool, when string) {
	t.Helper()
	if v, ok := c.GetIfPresent(key); ok != wantOK || ok && v != want {
		t.Fatalf("GetIfPresent(%q) %s = %d, %v; want %d, %v", key, when, v, ok, want, wantOK)
	}
}

// GetIfPresent reports a fresh local value, exactly until its soft expiry;
// it loads nothing, starts no refresh and is not counted.
func TestGetIfPresent(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		o := testOptions()
		o.NegativeTTL = testSoft
		c := newCache(t, o)
		load, loads := counting()
		peek(t, c, "k", 0, false, "before any Get")
		t0 := time.Now()
		mustGet(t, c, "k", load, 1)
		st := c.Stats()
		peek(t, c, "k", 1, true, "after a Get")
		sleepUntil(t0.Add(testSoft - 1))
		peek(t, c, "k", 1, true, "just before the soft expiry")
		sleepUntil(t0.Add(testSoft))
		peek(t, c, "k", 0, false, "at the soft expiry")
		synctest.Wait()
		if got := c.Stats(); loads.Load() != 1 || got.Hits != st.Hits || got.Misses != st.Misses || got.StaleServed != st.StaleServed {
			t.Errorf("after GetIfPresent: %d loads, Stats %+v; want 1 load and Stats as before (%+v)", loads.Load(), got, st)
		}

		if _, err := c.Get(t.Context(), "gone", func(context.Context) (int, error) { return 0, herd.ErrNotFound }); err == nil {
			t.Fatal("the negative load returned no error")
		}
		peek(t, c, "gone", 0, false, "of a negative entry")
		if err := c.Close(t.Context()); err != nil {
			t.Fatal(err)
		}
		peek(t, c, "k", 0, false, "after Close")
	})
}

// With a Store, GetIfPresent reports a local copy while Get would serve it
// at once: within 2×NearTTL of its put and not superseded by a notice.
func TestGetIfPresentWithStore(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := memory.New()
		a, b := fleetReplica(t, r, nil), fleetReplica(t, r, nil)
		t0 := time.Now()
		fleetMustGet(t, a, "k", fleetValue(1), 1)
		sleepUntil(t0.Add(fleetNear))
		peek(t, a, "k", 1, true, "past NearTTL")
		sleepUntil(t0.Add(2*fleetNear - 1))
		peek(t, a, "k", 1, true, "just before 2×NearTTL")
		sleepUntil(t0.Add(2 * fleetNear))
		peek(t, a, "k", 0, false, "at 2×NearTTL")

		fleetMustGet(t, a, "k", fleetNoLoad(t, "a"), 1) // read again from the Store
		peek(t, a, "k", 1, true, "after the Store was read again")
		if err := b.Set(t.Context(), "k", 2); err != nil {
			t.Fatal(err)
		}
		synctest.Wait() // the notice arrives
		peek(t, a, "k", 0, false, "superseded by a notice")
		fleetNoticed(t, a, "k")
		peek(t, a, "k", 2, true, "once the new value was read")
	})
}
