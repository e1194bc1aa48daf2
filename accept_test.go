package herd_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/herdcache/herd"
	"github.com/herdcache/herd/memory"
)

// peekIs is Peek with a test failure when its answer is not (want, p, nil).
func peekIs(t *testing.T, c *herd.Cache[int], key string, want int, p herd.Presence, when string) {
	t.Helper()
	v, got, err := c.Peek(t.Context(), key)
	if err != nil || got != p || v != want {
		t.Fatalf("Peek(%q) %s = %d, %v, %v; want %d, %v, nil", key, when, v, got, err, want, p)
	}
}

// refusing is an Accept that refuses the value bad and takes any other.
func refusing(bad int) herd.CallOption {
	return herd.Accept(herd.AcceptFunc[int](func(v int, _ bool) bool { return v != bad }))
}

// Peek reports what Get would be served, fresh then stale, and nothing
// past the hard expiry; it loads nothing and starts no refresh.
func TestPeek(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		o := testOptions()
		o.NegativeTTL = testSoft
		c := newCache(t, o)
		load, loads := counting()
		peekIs(t, c, "k", 0, herd.Absent, "before any Get")
		t0 := time.Now()
		mustGet(t, c, "k", load, 1)
		peekIs(t, c, "k", 1, herd.Fresh, "after a Get")
		sleepUntil(t0.Add(testSoft - 1))
		peekIs(t, c, "k", 1, herd.Fresh, "just before the soft expiry")
		sleepUntil(t0.Add(testSoft))
		peekIs(t, c, "k", 1, herd.Stale, "at the soft expiry")
		synctest.Wait()
		if n := loads.Load(); n != 1 {
			t.Errorf("%d loads after Peek of a stale value; want 1: Peek starts no refresh", n)
		}
		sleepUntil(t0.Add(testHard))
		peekIs(t, c, "k", 0, herd.Absent, "at the hard expiry")

		if _, err := c.Get(t.Context(), "gone", func(context.Context) (int, error) { return 0, herd.ErrNotFound }); err == nil {
			t.Fatal("the negative load returned no error")
		}
		if _, p, err := c.Peek(t.Context(), "gone"); p != herd.Fresh || !errors.Is(err, herd.ErrNotFound) {
			t.Errorf("Peek of a negative entry = %v, %v; want fresh, ErrNotFound", p, err)
		}
		if err := c.Close(t.Context()); err != nil {
			t.Fatal(err)
		}
		if _, p, err := c.Peek(t.Context(), "k"); p != herd.Absent || !errors.Is(err, herd.ErrClosed) {
			t.Errorf("Peek after Close = %v, %v; want absent, ErrClosed", p, err)
		}
	})
}

// A load of the key in progress does not make Peek wait, and Peek joins
// it nowhere: the load runs once, and Peek sees its value once it ends.
func TestPeekJoinsNoFlight(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := newCache(t, testOptions())
		gate := make(chan struct{})
		var loads atomic.Int32
		res := getAsync(t.Context(), c, "k", func(context.Context) (int, error) {
			loads.Add(1)
			<-gate
			return 1, nil
		})
		synctest.Wait() // the load is blocked
		peekIs(t, c, "k", 0, herd.Absent, "while the key loads")
		if st := c.Stats(); st.InFlight != 1 || st.Coalesced != 0 {
			t.Errorf("Stats while Peek ran beside a load: InFlight %d, Coalesced %d; want 1, 0", st.InFlight, st.Coalesced)
		}
		close(gate)
		if r := <-res; r.err != nil || r.v != 1 {
			t.Fatalf("Get = %d, %v; want 1", r.v, r.err)
		}
		peekIs(t, c, "k", 1, herd.Fresh, "once the load ended")
		if n := loads.Load(); n != 1 {
			t.Errorf("%d loads; want 1", n)
		}
	})
}

// With a Store, Peek reads what another replica stored, keeps it in its
// local tier, and waits for no lease another replica holds.
func TestPeekReadsStore(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := memory.New()
		a, b := fleetReplica(t, r, nil), fleetReplica(t, r, nil)
		t0 := time.Now()
		fleetMustGet(t, a, "k", fleetValue(1), 1)
		synctest.Wait() // the write-back
		peekIs(t, b, "k", 1, herd.Fresh, "of A's value on B")
		if v, ok := b.GetIfPresent("k"); !ok || v != 1 {
			t.Errorf("B's GetIfPresent after Peek = %d, %v; want 1, true: the value is kept locally", v, ok)
		}
		fleetMustGet(t, b, "k", nil, 1)

		release, res := fleetHold(t, a, "held", 7)
		peekIs(t, b, "held", 0, herd.Absent, "of a key A holds the lease of")
		if st := b.Stats(); st.InFlight != 0 || st.Loads != 0 {
			t.Errorf("B's Stats after Peek: InFlight %d, Loads %d; want no flight and no load", st.InFlight, st.Loads)
		}
		release()
		if got := <-res; got.err != nil || got.v != 7 {
			t.Fatalf("A's Get = %d, %v; want 7", got.v, got.err)
		}
		synctest.Wait() // the write-back
		peekIs(t, b, "held", 7, herd.Fresh, "once A wrote it")

		c := fleetReplica(t, r, nil)
		sleepUntil(t0.Add(fleetSoft))
		peekIs(t, c, "k", 1, herd.Stale, "of the Store's value past its soft expiry")
	})
}

// A Get with Accept loads instead of returning a value its function
// refuses, fresh or stale, returns one it takes without loading, and
// starts no refresh of a stale value it takes.
func TestAccept(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := newCache(t, testOptions())
		load, loads := counting()
		mustGet(t, c, "k", load, 1)
		mustGet(t, c, "k", load, 2, refusing(1))
		mustGet(t, c, "k", load, 2)
		mustGet(t, c, "k", load, 2, refusing(1))
		if n := loads.Load(); n != 2 {
			t.Errorf("%d loads; want 2: one for the refused value only", n)
		}

		var sawStale atomic.Bool
		takeStale := herd.Accept(herd.AcceptFunc[int](func(v int, stale bool) bool {
			sawStale.Store(stale)
			return true
		}))
		time.Sleep(testSoft)
		mustGet(t, c, "k", load, 2, takeStale)
		synctest.Wait()
		if n := loads.Load(); n != 2 || !sawStale.Load() {
			t.Errorf("a stale value taken: %d loads, told stale %v; want 2 loads (no refresh), stale true", n, sawStale.Load())
		}
		mustGet(t, c, "k", load, 3, refusing(2))

		wrong := herd.Accept(herd.AcceptFunc[string](func(string, bool) bool { return true }))
		if _, err := c.Get(t.Context(), "k", load, wrong); err == nil {
			t.Error("Get with an Accept of another value type returned no error")
		}
	})
}

// A Get with Accept that joins a load whose result it refuses does not
// return it: it loads again, on its own.
func TestAcceptRefusesJoinedFlight(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := newCache(t, testOptions())
		gate := make(chan struct{})
		first := getAsync(t.Context(), c, "k", func(context.Context) (int, error) {
			<-gate
			return 1, nil
		})
		synctest.Wait()
		var second atomic.Int32
		picky := getAsync(t.Context(), c, "k", func(context.Context) (int, error) {
			second.Add(1)
			return 2, nil
		}, refusing(1))
		synctest.Wait()
		if n := second.Load(); n != 0 {
			t.Fatalf("the second Get loaded %d times while the first load ran; want it to wait", n)
		}
		close(gate)
		if r := <-first; r.err != nil || r.v != 1 {
			t.Errorf("first Get = %d, %v; want 1", r.v, r.err)
		}
		if r := <-picky; r.err != nil || r.v != 2 {
			t.Errorf("Get refusing 1 = %d, %v; want 2 from its own load", r.v, r.err)
		}
		if n := second.Load(); n != 1 {
			t.Errorf("the refusing Get loaded %d times; want 1", n)
		}
	})
}

// A refused value does not stop the lease: B, refusing what the Store
// holds, loads under the lease and writes back; A, refusing it too while
// B loads, waits for B and takes B's value rather than loading.
func TestAcceptWithLease(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := memory.New()
		a, b := fleetReplica(t, r, func(o *herd.Options[int]) { o.OnLeaseHeld = herd.Wait }),
			fleetReplica(t, r, func(o *herd.Options[int]) { o.OnLeaseHeld = herd.Wait })
		fleetMustGet(t, a, "k", fleetValue(1), 1)
		fleetMustGet(t, b, "k", nil, 1)
		time.Sleep(fleetNear / 2) // B's value expires later than the one refused

		release, res := fleetHold(t, b, "k", 2, refusing(1))
		waiting := getAsync(t.Context(), a, "k", fleetNoLoad(t, "A"), refusing(1))
		synctest.Wait()
		select {
		case got := <-waiting:
			t.Fatalf("A's Get ended while B held the lease: %d, %v", got.v, got.err)
		default:
		}
		release()
		if got := <-res; got.err != nil || got.v != 2 {
			t.Fatalf("B's Get = %d, %v; want 2", got.v, got.err)
		}
		if got := <-waiting; got.err != nil || got.v != 2 {
			t.Fatalf("A's Get = %d, %v; want B's 2", got.v, got.err)
		}
		if st := a.Stats(); st.Loads != 1 {
			t.Errorf("A made %d loads; want 1 (the first)", st.Loads)
		}
		synctest.Wait()
		peekIs(t, fleetReplica(t, r, nil), "k", 2, herd.Fresh, "of the Store on a third replica")
	})
}
