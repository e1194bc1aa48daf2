package herd_test

import (
	"context"
	"errors"
	"strconv"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/herdcache/herd"
	"github.com/herdcache/herd/memory"
	"github.com/herdcache/herd/observe"
)

// A key pinned on five replicas, and never read there, stays fresh for ten
// soft TTLs: each value is replaced once, shortly before its soft expiry, by
// one load for the whole fleet. A sixth replica, which only reads, is never
// served anything stale and never loads.
func TestPinnedKeyStaysFresh(t *testing.T) {
	const (
		soft    = 2 * time.Second
		periods = 10
		load    = 100 * time.Millisecond
	)
	synctest.Test(t, func(t *testing.T) {
		r := memory.New()
		mod := func(o *herd.Options[int]) {
			o.SoftTTL, o.HardTTL = soft, 2*soft
			o.NearTTL = time.Second
			o.MaxRefreshAhead = 10
		}
		var loads atomic.Int64
		pinLoad := func(context.Context) (int, error) {
			n := loads.Add(1)
			time.Sleep(load) // the backing store
			return int(n), nil
		}
		for i := range 5 {
			c := fleetReplica(t, r, mod)
			if err := c.Pin("k", pinLoad); err != nil {
				t.Fatalf("Pin on replica %d: %v", i, err)
			}
		}
		reader := fleetReplica(t, r, mod)
		time.Sleep(load) // the first load
		synctest.Wait()
		if n := loads.Load(); n != 1 {
			t.Fatalf("%d loads of the pinned key at first, want 1 for the fleet", n)
		}
		start := time.Now()
		last := 0
		for time.Since(start) < periods*soft {
			time.Sleep(50 * time.Millisecond)
			t0 := time.Now()
			v, err := reader.Get(t.Context(), "k", fleetNoLoad(t, "the reader"), herd.NoStale())
			if err != nil {
				t.Fatalf("the reader's Get at %v: %v", time.Since(start), err)
			}
			if w := time.Since(t0); w > 0 {
				t.Fatalf("the reader waited %v at %v", w, time.Since(start))
			}
			last = max(last, v)
		}
		n := loads.Load() - 1
		t.Logf("%d loads after the first in %d soft TTLs (%.2f per TTL); the reader saw value %d last", n, periods, float64(n)/periods, last)
		if per := float64(n) / periods; per > 1.15 || per < 0.9 {
			t.Errorf("%.2f loads per soft TTL, want about one (at most 1.15)", per)
		}
		if st := reader.Stats(); st.StaleServed != 0 || st.Loads != 0 {
			t.Errorf("the reader's Stats: StaleServed %d, Loads %d; want 0, 0", st.StaleServed, st.Loads)
		}
	})
}

// Unpin stops the refreshes; Pin refuses a cache with refresh-ahead off,
// with no load, past MaxRefreshAhead and after Close.
func TestPinAndUnpin(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		o := testOptions()
		o.MaxRefreshAhead = 2
		c := newCache(t, o)
		load, calls := counting()
		if err := c.Pin("a", load); err != nil {
			t.Fatal(err)
		}
		synctest.Wait()
		if calls.Load() != 1 {
			t.Fatalf("%d loads after Pin, want 1", calls.Load())
		}
		time.Sleep(3 * testSoft)
		synctest.Wait()
		pinned := calls.Load()
		if pinned < 3 {
			t.Fatalf("%d loads in three soft TTLs pinned, want at least 3", pinned)
		}
		c.Unpin("a")
		time.Sleep(3 * testSoft)
		synctest.Wait()
		if n := calls.Load(); n != pinned {
			t.Errorf("%d loads after Unpin, want none", n-pinned)
		}

		if err := c.Pin("b", nil); !errors.Is(err, herd.ErrNoLoader) {
			t.Errorf("Pin with no load: %v, want ErrNoLoader", err)
		}
		if err := c.Pin("b", load); err != nil {
			t.Fatal(err)
		}
		if err := c.Pin("c", load); err != nil {
			t.Fatal(err)
		}
		if err := c.Pin("d", load); err == nil {
			t.Error("a third Pin with MaxRefreshAhead 2 succeeded")
		}
		if err := c.Pin("b", load); err != nil {
			t.Errorf("pinning a pinned key again: %v", err)
		}
		off := newCache(t, testOptions())
		if err := off.Pin("a", load); err == nil {
			t.Error("Pin with MaxRefreshAhead 0 succeeded")
		}
		if err := c.Close(t.Context()); err != nil {
			t.Fatal(err)
		}
		if err := c.Pin("e", load); !errors.Is(err, herd.ErrClosed) {
			t.Errorf("Pin after Close: %v, want ErrClosed", err)
		}
	})
}

// With RefreshAheadHot, the key read most is kept fresh while it is read:
// readers of it never meet a stale value or a miss after the first load.
// Once nobody reads it, it stops being refreshed within a soft TTL.
func TestHotKeyRefreshedAheadWhileRead(t *testing.T) {
	const soft = 2 * time.Second
	synctest.Test(t, func(t *testing.T) {
		var loads atomic.Int64
		var lastLoad atomic.Int64 // Unix ns
		c := newCache(t, &herd.Options[int]{
			MaxEntries:      100,
			SoftTTL:         soft,
			HardTTL:         2 * soft,
			MaxRefreshAhead: 4,
			RefreshAheadHot: 1,
			DisableStats:    true, // refresh-ahead counts reads all the same
			Load: func(_ context.Context, key string) (int, error) {
				if key == "hot" {
					loads.Add(1)
					lastLoad.Store(time.Now().UnixNano())
				}
				time.Sleep(100 * time.Millisecond) // the backing store
				return 1, nil
			},
		})
		// Two soft TTLs of reads for the tracker to find the hot key, then
		// eight in which every read must be fresh at once.
		start := time.Now()
		var stale, cold int
		for time.Since(start) < 10*soft {
			t0 := time.Now()
			if _, err := c.Get(t.Context(), "hot", nil, herd.NoStale()); err != nil {
				t.Fatal(err)
			}
			if time.Since(start) > 2*soft && time.Since(t0) > 0 {
				stale++
			}
			// Keys read once each: never the hottest.
			cold++
			if _, err := c.Get(t.Context(), "cold-"+strconv.Itoa(cold), nil); err != nil {
				t.Fatal(err)
			}
			time.Sleep(10 * time.Millisecond)
		}
		if stale != 0 {
			t.Errorf("%d reads of the hot key waited for a load after the tracker found it, want 0", stale)
		}
		if st := c.Stats(); st.AheadRefreshes == 0 {
			t.Error("no refresh-ahead ran")
		}
		lastRead := time.Now()
		before := loads.Load()
		time.Sleep(5 * soft)
		synctest.Wait()
		if after := time.Unix(0, lastLoad.Load()); after.After(lastRead.Add(soft)) {
			t.Errorf("the hot key was loaded %v after its last read (%d loads since), want none later than one soft TTL", after.Sub(lastRead), loads.Load()-before)
		}
	})
}

// A hot key read less often than NearTTL, so that each read finds a copy
// past NearTTL and has it read again from the Store, is still refreshed
// ahead: the copy read again holds the same value and keeps the mark that
// it was read. No read after the first soft TTL is served stale.
func TestHotKeyRefreshedAheadAcrossRevalidations(t *testing.T) {
	const soft = 10 * time.Second
	synctest.Test(t, func(t *testing.T) {
		r := memory.New()
		c := fleetReplica(t, r, func(o *herd.Options[int]) {
			o.SoftTTL, o.HardTTL = soft, 2*soft
			o.MaxRefreshAhead, o.RefreshAheadHot = 1, 1
			o.Load = func(context.Context, string) (int, error) {
				time.Sleep(100 * time.Millisecond) // the backing store
				return 1, nil
			}
		})
		start := time.Now()
		var (
			st   observe.Stats
			took bool
		)
		for time.Since(start) < 5*soft {
			if time.Since(start) >= 2*soft && !took {
				st, took = c.Stats(), true
			}
			if _, err := c.Get(t.Context(), "k", nil); err != nil {
				t.Fatal(err)
			}
			time.Sleep(2 * fleetNear)
		}
		got := c.Stats()
		t.Logf("after the second soft TTL: %d stale, %d refreshed ahead, %d revalidations",
			got.StaleServed-st.StaleServed, got.AheadRefreshes-st.AheadRefreshes, got.Revalidations-st.Revalidations)
		if got.Revalidations == st.Revalidations {
			t.Fatal("no read found a copy past NearTTL: the test reads too often")
		}
		if got.StaleServed != st.StaleServed || got.AheadRefreshes-st.AheadRefreshes < 2 {
			t.Errorf("after the second soft TTL: %d served stale, %d refreshed ahead; want 0 and at least 2",
				got.StaleServed-st.StaleServed, got.AheadRefreshes-st.AheadRefreshes)
		}
	})
}

// A pinned key's refresh plans by the larger of its last load's duration
// and nine tenths of the one before, so a fast load does not cut the lead
// of the slower one after it: with loads alternating 100ms and 180ms, a
// reader that takes nothing stale never waits.
func TestPinnedKeyFreshWithSlowerLoads(t *testing.T) {
	const soft = 2 * time.Second
	synctest.Test(t, func(t *testing.T) {
		c := newCache(t, &herd.Options[int]{MaxEntries: 10, SoftTTL: soft, HardTTL: 2 * soft, MaxRefreshAhead: 1})
		var loads atomic.Int64
		if err := c.Pin("k", func(context.Context) (int, error) {
			n := loads.Add(1)
			time.Sleep(time.Duration(100+80*(n%2)) * time.Millisecond)
			return int(n), nil
		}); err != nil {
			t.Fatal(err)
		}
		time.Sleep(time.Second) // the first load
		start := time.Now()
		for time.Since(start) < 10*soft {
			t0 := time.Now()
			if _, err := c.Get(t.Context(), "k", fleetNoLoad(t, "the reader"), herd.NoStale()); err != nil {
				t.Fatal(err)
			}
			if w := time.Since(t0); w > 0 {
				t.Fatalf("the reader waited %v at %v", w, time.Since(start))
			}
			time.Sleep(10 * time.Millisecond)
		}
		if n := loads.Load(); n < 10 {
			t.Errorf("%d loads in 10 soft TTLs, want at least 10", n)
		}
	})
}
