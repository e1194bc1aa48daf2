package herd_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/herdcache/herd"
	"github.com/herdcache/herd/memory"
	"github.com/herdcache/herd/remote"
)

// Behaviour tests of a fleet: several Cache values sharing one memory.Remote
// as Store, Lease and Notifier act as replicas of one service. Everything
// runs in a synctest bubble, where memory.Remote's expiries follow the fake
// clock, time.Sleep only moves that clock, and loads are held by channels.

const (
	fleetSoft     = 10 * time.Second
	fleetHard     = 20 * time.Second
	fleetLeaseTTL = 5 * time.Second
	fleetNear     = time.Second
)

// fleetOptions are the options of one replica over r: fresh for fleetSoft,
// stale until fleetHard, with a lease, no jitter and no early refresh, so
// expiries are exact.
func fleetOptions(r *memory.Remote) *herd.Options[int] {
	return &herd.Options[int]{
		NoBreaker:  true,
		MaxEntries: 1000,
		SoftTTL:    fleetSoft,
		HardTTL:    fleetHard,
		Store:      r,
		Lease:      r,
		LeaseTTL:   fleetLeaseTTL,
		NearTTL:    fleetNear,
	}
}

// fleetReplica returns a replica over r with fleetOptions changed by mod (if
// not nil), closed when the test (or bubble) ends.
func fleetReplica(t *testing.T, r *memory.Remote, mod func(*herd.Options[int])) *herd.Cache[int] {
	t.Helper()
	o := fleetOptions(r)
	if mod != nil {
		mod(o)
	}
	return newCache(t, o)
}

// fleetReplicas returns n replicas over r, each made by fleetReplica.
func fleetReplicas(t *testing.T, n int, r *memory.Remote, mod func(*herd.Options[int])) []*herd.Cache[int] {
	t.Helper()
	cs := make([]*herd.Cache[int], n)
	for i := range cs {
		cs[i] = fleetReplica(t, r, mod)
	}
	return cs
}

type fleetResult struct {
	replica int
	v       int
	err     error
}

// fleetStorm runs callers Gets of key on every replica at once, replica i
// with load(i), and returns a function that collects their results.
func fleetStorm(ctx context.Context, cs []*herd.Cache[int], callers int, key string, load func(replica int) herd.LoadFunc[int]) (collect func() []fleetResult) {
	ch := make(chan fleetResult, len(cs)*callers)
	for i, c := range cs {
		l := load(i)
		for range callers {
			go func() {
				v, err := c.Get(ctx, key, l)
				ch <- fleetResult{replica: i, v: v, err: err}
			}()
		}
	}
	return func() []fleetResult {
		rs := make([]fleetResult, 0, cap(ch))
		for range cap(ch) {
			rs = append(rs, <-ch)
		}
		return rs
	}
}

// fleetMustGet fails the test unless c's Get of key returns want. load may
// be nil: then a load fails the test.
func fleetMustGet(t *testing.T, c *herd.Cache[int], key string, load herd.LoadFunc[int], want int, opts ...herd.CallOption) {
	t.Helper()
	if load == nil {
		load = func(context.Context) (int, error) {
			t.Errorf("Get(%q) called its load, want the stored value %d", key, want)
			return -1, nil
		}
	}
	v, err := c.Get(t.Context(), key, load, opts...)
	if err != nil || v != want {
		t.Fatalf("Get(%q) = %d, %v; want %d, nil", key, v, err, want)
	}
}

// fleetNoticed lets a write's notice reach c and the one background read it
// leads to replace c's copy of key: the first read after the notice is
// served the superseded copy and starts that read.
func fleetNoticed(t *testing.T, c *herd.Cache[int], key string) {
	t.Helper()
	synctest.Wait() // the notice arrives
	if _, err := c.Get(t.Context(), key, fleetNoLoad(t, "a read after a notice")); err != nil {
		t.Fatalf("Get(%q) after a notice: %v", key, err)
	}
	synctest.Wait() // the background read replaces the copy
}

// fleetValue returns a load that returns v.
func fleetValue(v int) herd.LoadFunc[int] {
	return func(context.Context) (int, error) { return v, nil }
}

// fleetNoLoad returns a load that fails the test when called.
func fleetNoLoad(t *testing.T, who string) herd.LoadFunc[int] {
	return func(context.Context) (int, error) {
		t.Errorf("%s called its load", who)
		return -1, errors.New("unexpected load")
	}
}

// fleetHold starts a Get of key on c whose load blocks until release is
// called and then returns v, and returns once that load is blocked: c then
// holds key's lease. release runs at the end of the test at the latest.
func fleetHold(t *testing.T, c *herd.Cache[int], key string, v int, opts ...herd.CallOption) (release func(), res <-chan result) {
	t.Helper()
	gate := make(chan struct{})
	var started atomic.Int32
	res = getAsync(t.Context(), c, key, func(context.Context) (int, error) {
		started.Add(1)
		<-gate
		return v, nil
	}, opts...)
	release = sync.OnceFunc(func() { close(gate) })
	t.Cleanup(release)
	synctest.Wait()
	if n := started.Load(); n != 1 {
		release()
		t.Fatalf("the holder's load started %d times, want 1", n)
	}
	return release, res
}

// 1. One load per expiry across the fleet.

func TestFleetHotKeyOneLoadPerExpiry(t *testing.T) {
	const replicas, callers, expiries = 20, 50, 5
	synctest.Test(t, func(t *testing.T) {
		r := memory.New()
		cs := fleetReplicas(t, replicas, r, nil)
		var loads atomic.Int64
		for round := 1; round <= expiries; round++ {
			gate := make(chan struct{})
			collect := fleetStorm(t.Context(), cs, callers, "hot", func(int) herd.LoadFunc[int] {
				return func(context.Context) (int, error) {
					loads.Add(1)
					<-gate
					return round, nil
				}
			})
			synctest.Wait() // every caller is waiting: on the load, the flight or the lease
			if n := loads.Load(); n != int64(round) {
				t.Errorf("expiry %d: %d loads running fleet-wide, want 1", round, n-int64(round-1))
			}
			close(gate)
			for _, res := range collect() {
				if res.err != nil || res.v != round {
					t.Fatalf("expiry %d: replica %d got %d, %v; want %d, nil", round, res.replica, res.v, res.err, round)
				}
			}
			if n := loads.Load(); n != int64(round) {
				t.Fatalf("after expiry %d: %d loads in all, want %d (one per expiry)", round, n, round)
			}
			time.Sleep(fleetHard + time.Second) // past the hard TTL: in every tier
		}
		if st := r.Stats(); st.AcquireLease != expiries || st.Writes != expiries {
			t.Errorf("remote: %d leases, %d writes; want %d each", st.AcquireLease, st.Writes, expiries)
		}
		var woken int64
		for _, c := range cs {
			woken += c.Stats().WokenByPush
		}
		if woken == 0 {
			t.Error("no replica was woken by a completion notice")
		}
	})
}

// Without a lease each replica coalesces its own callers only: one load per
// replica per expiry.
func TestFleetHotKeyWithoutLeaseLoadsOncePerReplica(t *testing.T) {
	const replicas, callers, expiries = 20, 50, 5
	synctest.Test(t, func(t *testing.T) {
		r := memory.New()
		cs := fleetReplicas(t, replicas, r, func(o *herd.Options[int]) { o.Lease = nil })
		perReplica := make([]atomic.Int64, replicas)
		for round := 1; round <= expiries; round++ {
			gate := make(chan struct{})
			collect := fleetStorm(t.Context(), cs, callers, "hot", func(i int) herd.LoadFunc[int] {
				return func(context.Context) (int, error) {
					perReplica[i].Add(1)
					<-gate
					return round, nil
				}
			})
			synctest.Wait()
			close(gate)
			for _, res := range collect() {
				if res.err != nil || res.v != round {
					t.Fatalf("expiry %d: replica %d got %d, %v; want %d, nil", round, res.replica, res.v, res.err, round)
				}
			}
			for i := range perReplica {
				if n := perReplica[i].Load(); n != int64(round) {
					t.Fatalf("after expiry %d: replica %d loaded %d times, want %d (one per expiry)", round, i, n, round)
				}
			}
			time.Sleep(fleetHard + time.Second)
		}
	})
}

// With coalescing off and no lease every caller loads: the counting above
// does see a stampede when there is one.
func TestFleetHotKeyWithoutProtectionStampedes(t *testing.T) {
	const replicas, callers = 20, 50
	synctest.Test(t, func(t *testing.T) {
		r := memory.New()
		cs := fleetReplicas(t, replicas, r, func(o *herd.Options[int]) {
			o.Lease = nil
			o.DisableCoalescing = true
		})
		var loads atomic.Int64
		gate := make(chan struct{})
		collect := fleetStorm(t.Context(), cs, callers, "hot", func(int) herd.LoadFunc[int] {
			return func(context.Context) (int, error) {
				loads.Add(1)
				<-gate
				return 1, nil
			}
		})
		synctest.Wait()
		close(gate)
		for _, res := range collect() {
			if res.err != nil || res.v != 1 {
				t.Fatalf("replica %d got %d, %v; want 1, nil", res.replica, res.v, res.err)
			}
		}
		if n := loads.Load(); n != replicas*callers {
			t.Errorf("%d loads without protection, want %d (one per caller)", n, replicas*callers)
		}
	})
}

// 2. Lease losers.

// fleetStaleSetup loads key on a with value 1, reads it into b, and moves
// the clock to where both copies are stale (and past their NearTTL).
func fleetStaleSetup(t *testing.T, a, b *herd.Cache[int], key string) {
	t.Helper()
	fleetMustGet(t, a, key, fleetValue(1), 1)
	fleetMustGet(t, b, key, nil, 1)
	time.Sleep(fleetSoft + time.Second)
}

func TestFleetLoserServeStaleWithStaleValue(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := memory.New()
		a, b := fleetReplica(t, r, nil), fleetReplica(t, r, nil)
		fleetStaleSetup(t, a, b, "k")
		release, resA := fleetHold(t, a, "k", 2, herd.NoStale())

		resB := getAsync(t.Context(), b, "k", fleetNoLoad(t, "B"))
		synctest.Wait()
		got, ok := ready(resB)
		if !ok {
			t.Fatal("B is waiting for A's load; want the stale value at once")
		}
		if got.err != nil || got.v != 1 {
			t.Fatalf("B got %d, %v; want the stale 1, nil", got.v, got.err)
		}
		if st := b.Stats(); st.StaleServed == 0 || st.Loads != 0 || st.RefreshFailures != 0 {
			t.Errorf("B's Stats = %+v; want StaleServed > 0, Loads 0, RefreshFailures 0", st)
		}

		release()
		if res := <-resA; res.err != nil || res.v != 2 {
			t.Fatalf("A got %d, %v; want 2, nil", res.v, res.err)
		}
		fleetNoticed(t, b, "k")
		fleetMustGet(t, b, "k", nil, 2)
	})
}

// fleetWaitsForHolder checks that a Get of "k" on b, started while a holds
// the lease, waits for a's load and returns its value without loading.
func fleetWaitsForHolder(t *testing.T, a, b *herd.Cache[int], opts ...herd.CallOption) {
	t.Helper()
	release, resA := fleetHold(t, a, "k", 42)
	resB := getAsync(t.Context(), b, "k", fleetNoLoad(t, "B"), opts...)
	synctest.Wait()
	if got, ok := ready(resB); ok {
		t.Fatalf("B returned %d, %v while A's load runs; want it to wait", got.v, got.err)
	}
	release()
	if res := <-resA; res.err != nil || res.v != 42 {
		t.Fatalf("A got %d, %v; want 42, nil", res.v, res.err)
	}
	if res := <-resB; res.err != nil || res.v != 42 {
		t.Fatalf("B got %d, %v; want A's 42, nil", res.v, res.err)
	}
	if st := b.Stats(); st.WokenByPush < 1 || st.Loads != 0 {
		t.Errorf("B's Stats: WokenByPush %d, Loads %d; want >= 1 and 0", st.WokenByPush, st.Loads)
	}
}

func TestFleetLoserServeStaleWithoutValueWaits(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := memory.New()
		a := fleetReplica(t, r, nil)
		b := fleetReplica(t, r, func(o *herd.Options[int]) { o.OnLeaseHeld = herd.ServeStale })
		fleetWaitsForHolder(t, a, b)
	})
}

func TestFleetLoserWaitWaits(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := memory.New()
		a := fleetReplica(t, r, nil)
		b := fleetReplica(t, r, func(o *herd.Options[int]) { o.OnLeaseHeld = herd.Wait })
		fleetWaitsForHolder(t, a, b)
	})
}

func TestFleetLoserFailFast(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := memory.New()
		a := fleetReplica(t, r, nil)
		b := fleetReplica(t, r, func(o *herd.Options[int]) { o.OnLeaseHeld = herd.FailFast })
		release, resA := fleetHold(t, a, "k", 42)
		resB := getAsync(t.Context(), b, "k", fleetNoLoad(t, "B"))
		synctest.Wait()
		got, ok := ready(resB)
		if !ok {
			t.Fatal("B is waiting; want ErrLeaseHeld at once")
		}
		if !errors.Is(got.err, herd.ErrLeaseHeld) {
			t.Errorf("B got %d, %v; want ErrLeaseHeld", got.v, got.err)
		}
		release()
		<-resA
	})
}

func TestFleetLoserPolicyPerCall(t *testing.T) {
	t.Run("Wait over FailFast", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			r := memory.New()
			a := fleetReplica(t, r, nil)
			b := fleetReplica(t, r, func(o *herd.Options[int]) { o.OnLeaseHeld = herd.FailFast })
			fleetWaitsForHolder(t, a, b, herd.WithLoserPolicy(herd.Wait))
		})
	})
	t.Run("FailFast over Wait", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			r := memory.New()
			a := fleetReplica(t, r, nil)
			b := fleetReplica(t, r, func(o *herd.Options[int]) { o.OnLeaseHeld = herd.Wait })
			release, resA := fleetHold(t, a, "k", 42)
			resB := getAsync(t.Context(), b, "k", fleetNoLoad(t, "B"), herd.WithLoserPolicy(herd.FailFast))
			synctest.Wait()
			got, ok := ready(resB)
			if !ok || !errors.Is(got.err, herd.ErrLeaseHeld) {
				t.Errorf("B got %+v (ready %v); want ErrLeaseHeld at once", got, ok)
			}
			release()
			<-resA
			if !ok {
				<-resB
			}
		})
	})
}

// NoStale turns ServeStale into Wait: B has a stale value but waits for A's.
func TestFleetLoserNoStaleWaits(t *testing.T) {
	for _, tt := range []struct {
		name string
		opts []herd.CallOption
		mod  func(*herd.Options[int])
	}{
		{"per call", []herd.CallOption{herd.NoStale()}, nil},
		{"option", nil, func(o *herd.Options[int]) { o.NoStale = true }},
	} {
		t.Run(tt.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				r := memory.New()
				a := fleetReplica(t, r, nil)
				b := fleetReplica(t, r, tt.mod)
				fleetStaleSetup(t, a, b, "k")
				release, resA := fleetHold(t, a, "k", 2, herd.NoStale())
				resB := getAsync(t.Context(), b, "k", fleetNoLoad(t, "B"), tt.opts...)
				synctest.Wait()
				if got, ok := ready(resB); ok {
					t.Fatalf("B returned %d, %v while A's load runs; want it to wait, not serve stale", got.v, got.err)
				}
				release()
				<-resA
				if res := <-resB; res.err != nil || res.v != 2 {
					t.Fatalf("B got %d, %v; want A's 2, nil", res.v, res.err)
				}
				if st := b.Stats(); st.StaleServed != 0 || st.WokenByPush < 1 {
					t.Errorf("B's Stats: StaleServed %d, WokenByPush %d; want 0 and >= 1", st.StaleServed, st.WokenByPush)
				}
			})
		})
	}
}

func TestFleetLoserWaitTimesOut(t *testing.T) {
	const leaseWait = 2 * time.Second
	synctest.Test(t, func(t *testing.T) {
		r := memory.New()
		a := fleetReplica(t, r, nil)
		b := fleetReplica(t, r, func(o *herd.Options[int]) {
			o.OnLeaseHeld = herd.Wait
			o.LeaseWait = leaseWait
		})
		release, resA := fleetHold(t, a, "k", 42)
		start := time.Now()
		_, err := b.Get(t.Context(), "k", fleetNoLoad(t, "B"))
		waited := time.Since(start)
		if !errors.Is(err, herd.ErrLeaseTimeout) {
			t.Errorf("B's Get error = %v; want ErrLeaseTimeout", err)
		}
		if waited < leaseWait || waited > leaseWait+time.Second {
			t.Errorf("B waited %v; want LeaseWait (%v) up to one backoff step more", waited, leaseWait)
		}
		if st := b.Stats(); st.LeaseWaitTimeouts != 1 || st.Loads != 0 {
			t.Errorf("B's Stats: LeaseWaitTimeouts %d, Loads %d; want 1 and 0", st.LeaseWaitTimeouts, st.Loads)
		}
		release()
		<-resA
	})
}

// LoadOnLeaseTimeout: a Wait loser that gave up loads itself and serves its
// value, but does not write it to the Store: only the lease holder may.
func TestFleetLoserLoadOnLeaseTimeout(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := memory.New()
		a := fleetReplica(t, r, nil)
		b := fleetReplica(t, r, func(o *herd.Options[int]) {
			o.OnLeaseHeld = herd.Wait
			o.LeaseWait = 2 * time.Second
			o.LoadOnLeaseTimeout = true
		})
		release, resA := fleetHold(t, a, "k", 42)
		var loadsB atomic.Int64
		v, err := b.Get(t.Context(), "k", func(context.Context) (int, error) {
			loadsB.Add(1)
			return 7, nil
		})
		if err != nil || v != 7 {
			t.Errorf("B's Get = %d, %v; want its own 7, nil", v, err)
		}
		if n := loadsB.Load(); n != 1 {
			t.Errorf("B loaded %d times, want 1", n)
		}
		if st := r.Stats(); st.Writes != 0 || st.Sets != 0 {
			t.Errorf("remote: %d writes, %d sets while A holds the lease; want none", st.Writes, st.Sets)
		}
		if env, err := r.Load(t.Context(), "k"); env != nil || err != nil {
			t.Errorf("the Store holds %d bytes (err %v) before A finished; want nothing", len(env), err)
		}
		release()
		if res := <-resA; res.err != nil || res.v != 42 {
			t.Fatalf("A got %d, %v; want 42, nil", res.v, res.err)
		}
		if st := a.Stats(); st.FencedWrites != 0 {
			t.Errorf("A's write was fenced (%d); B must not have advanced the fence", st.FencedWrites)
		}
		synctest.Wait()
		fleetMustGet(t, fleetReplica(t, r, nil), "k", nil, 42)
	})
}

// 3. Fencing across replicas.

func TestFleetFencing(t *testing.T) {
	const rounds = 100
	for _, tt := range []struct {
		name string
		// change is what B does while A loads; it returns the value the
		// Store holds afterwards, or 0 for none.
		change func(ctx context.Context, b *herd.Cache[int], key string, i int) (int, error)
	}{
		{"Set", func(ctx context.Context, b *herd.Cache[int], key string, i int) (int, error) {
			return 2000 + i, b.Set(ctx, key, 2000+i)
		}},
		{"Invalidate", func(ctx context.Context, b *herd.Cache[int], key string, i int) (int, error) {
			return 0, b.Invalidate(ctx, key)
		}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				r := memory.New()
				a, b := fleetReplica(t, r, nil), fleetReplica(t, r, nil)
				for i := range rounds {
					key := fmt.Sprintf("k%d", i)
					old := 1000 + i
					release, resA := fleetHold(t, a, key, old)
					stored, err := tt.change(t.Context(), b, key, i)
					if err != nil {
						t.Fatalf("round %d: %s: %v", i, tt.name, err)
					}
					release()
					if res := <-resA; res.err != nil || res.v != old {
						t.Fatalf("round %d: A got %d, %v; want its own %d, nil", i, res.v, res.err, old)
					}
					synctest.Wait() // change notices delivered
					if n := a.Stats().FencedWrites; n != int64(i+1) {
						t.Fatalf("round %d: A's FencedWrites = %d, want %d", i, n, i+1)
					}
					env, err := r.Load(t.Context(), key)
					if err != nil {
						t.Fatal(err)
					}
					if stored == 0 {
						if env != nil {
							t.Fatalf("round %d: the Store holds a value after Invalidate", i)
						}
						// Nothing stored: a fresh replica loads anew.
						stored = 3000 + i
						fleetMustGet(t, fleetReplica(t, r, nil), key, fleetValue(stored), stored)
					} else {
						fleetMustGet(t, fleetReplica(t, r, nil), key, nil, stored)
					}
					// A's local tier does not hold its refused value either.
					fleetMustGet(t, a, key, nil, stored)
				}
			})
		})
	}
}

// 4. Near-cache.

func TestFleetNearCacheDropsOnNotice(t *testing.T) {
	t.Run("Set", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			r := memory.New()
			mod := func(o *herd.Options[int]) { o.NearTTL = 5 * time.Second }
			a, b := fleetReplica(t, r, mod), fleetReplica(t, r, mod)
			fleetMustGet(t, a, "k", fleetValue(1), 1)
			fleetMustGet(t, b, "k", nil, 1)
			if err := a.Set(t.Context(), "k", 2); err != nil {
				t.Fatal(err)
			}
			// No time passes: only the notice can replace B's copy. B's
			// readers are served it at once while one read of the Store,
			// shared by all of them, replaces it.
			synctest.Wait()
			loads := r.Stats().Loads
			var wg sync.WaitGroup
			for range 50 {
				wg.Go(func() {
					// The superseded 1 until the background read has put 2.
					if v, err := b.Get(t.Context(), "k", fleetNoLoad(t, "B")); err != nil || v != 1 && v != 2 {
						t.Errorf("B's Get after the notice = %d, %v; want 1 or 2", v, err)
					}
				})
			}
			wg.Wait()
			synctest.Wait()
			if st := b.Stats(); st.RemoteWaits != 1 || st.Revalidations != 1 {
				t.Errorf("B's Stats: RemoteWaits %d, Revalidations %d; want 1 (its first read) and 1", st.RemoteWaits, st.Revalidations)
			}
			if n := r.Stats().Loads - loads; n != 1 {
				t.Errorf("50 reads of the superseded copy made %d Store reads, want 1", n)
			}
			fleetMustGet(t, b, "k", nil, 2)
		})
	})
	t.Run("Invalidate", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			r := memory.New()
			mod := func(o *herd.Options[int]) { o.NearTTL = 5 * time.Second }
			a, b := fleetReplica(t, r, mod), fleetReplica(t, r, mod)
			fleetMustGet(t, a, "k", fleetValue(1), 1)
			fleetMustGet(t, b, "k", nil, 1)
			if err := a.Invalidate(t.Context(), "k"); err != nil {
				t.Fatal(err)
			}
			synctest.Wait() // an Invalidate's notice drops B's copy at once
			fleetMustGet(t, b, "k", fleetValue(3), 3)
		})
	})
}

// fleetDeaf is a Store that hides the Notifier of the Store it wraps: a
// replica over it misses every change notice.
type fleetDeaf struct{ remote.Store }

func TestFleetNearCacheLostNoticeBoundedByTwiceNearTTL(t *testing.T) {
	const near = 5 * time.Second
	synctest.Test(t, func(t *testing.T) {
		r := memory.New()
		deaf := fleetDeaf{r}
		if _, ok := any(deaf).(remote.Notifier); ok {
			t.Fatal("fleetDeaf implements remote.Notifier")
		}
		a := fleetReplica(t, r, func(o *herd.Options[int]) { o.NearTTL = near })
		b := fleetReplica(t, r, func(o *herd.Options[int]) {
			o.Store = deaf
			o.NearTTL, o.NoNearCache = near, near == 0
		})
		fleetMustGet(t, a, "k", fleetValue(1), 1)
		fleetMustGet(t, b, "k", nil, 1)
		read := time.Now()
		if err := a.Set(t.Context(), "k", 2); err != nil {
			t.Fatal(err)
		}
		synctest.Wait()
		fleetMustGet(t, b, "k", nil, 1) // the notice is lost: B keeps its copy
		time.Sleep(time.Until(read.Add(near - 1)))
		fleetMustGet(t, b, "k", nil, 1) // trusted until NearTTL has passed
		time.Sleep(time.Nanosecond)
		// Past NearTTL the copy is served once more while one read of the
		// Store replaces it in the background: no reader waits.
		fleetMustGet(t, b, "k", nil, 1)
		synctest.Wait()
		fleetMustGet(t, b, "k", nil, 2)
		if st := b.Stats(); st.RemoteWaits != 1 || st.Revalidations != 1 {
			t.Errorf("B's Stats: RemoteWaits %d, Revalidations %d; want 1 (its first read) and 1", st.RemoteWaits, st.Revalidations)
		}
	})
}

// A copy that nothing revalidates (the Store fails, so the background read
// does) is served until it is 2×NearTTL old, and then re-read on the
// reader's path: the staleness bound after a lost notice.
func TestFleetNearCacheReReadAtTwiceNearTTL(t *testing.T) {
	const near = 3 * time.Second // 2×near < fleetSoft: every value read is fresh
	synctest.Test(t, func(t *testing.T) {
		r := memory.New()
		flaky := &fleetFlaky{Store: r}
		a := fleetReplica(t, r, func(o *herd.Options[int]) { o.NearTTL = near })
		b := fleetReplica(t, r, func(o *herd.Options[int]) {
			o.Store, o.Lease = flaky, nil
			o.NearTTL, o.NoNearCache = near, near == 0
		})
		fleetMustGet(t, a, "k", fleetValue(1), 1)
		synctest.Wait() // A's write lands
		fleetMustGet(t, b, "k", nil, 1)
		read := time.Now()
		if err := a.Set(t.Context(), "k", 2); err != nil {
			t.Fatal(err)
		}
		flaky.failing.Store(true)
		time.Sleep(time.Until(read.Add(near)))
		fleetMustGet(t, b, "k", nil, 1) // past NearTTL: served, and its revalidation fails
		synctest.Wait()
		time.Sleep(time.Until(read.Add(2*near - 1)))
		fleetMustGet(t, b, "k", nil, 1) // not revalidated again
		flaky.failing.Store(false)
		time.Sleep(time.Nanosecond)
		fleetMustGet(t, b, "k", nil, 2) // 2×NearTTL old: read on the reader's path
		if st := b.Stats(); st.Revalidations != 1 || st.RemoteWaits != 2 {
			t.Errorf("B's Stats: Revalidations %d, RemoteWaits %d; want 1 and 2", st.Revalidations, st.RemoteWaits)
		}
	})
}

// fleetFlaky is a Store whose Loads fail while failing is set; it hides the
// Notifier of the Store it wraps.
type fleetFlaky struct {
	remote.Store
	failing atomic.Bool
}

func (f *fleetFlaky) Load(ctx context.Context, key string) ([]byte, error) {
	if f.failing.Load() {
		return nil, errors.New("flaky: load failed")
	}
	return f.Store.Load(ctx, key)
}

func TestFleetNearTTLZeroReadsStoreEveryTime(t *testing.T) {
	const gets = 10
	for _, tt := range []struct {
		near       time.Duration
		storeReads uint64
	}{
		{0, gets},
		{fleetNear, 0}, // control: within NearTTL the local copy answers
	} {
		t.Run("NearTTL="+tt.near.String(), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				r := memory.New()
				a := fleetReplica(t, r, nil)
				b := fleetReplica(t, r, func(o *herd.Options[int]) { o.NearTTL, o.NoNearCache = tt.near, tt.near == 0 })
				fleetMustGet(t, a, "k", fleetValue(1), 1)
				fleetMustGet(t, b, "k", nil, 1)
				before := r.Stats().Loads
				for range gets {
					fleetMustGet(t, b, "k", nil, 1)
				}
				if n := r.Stats().Loads - before; n != tt.storeReads {
					t.Errorf("%d Gets read the Store %d times, want %d", gets, n, tt.storeReads)
				}
			})
		})
	}
}

// 5. Degradation.

func TestFleetStoreDownDegrades(t *testing.T) {
	for _, tt := range []struct {
		name string
		mod  func(*herd.Options[int])
	}{
		{"no breaker", nil},
		{"breaker", func(o *herd.Options[int]) {
			o.BreakerThreshold, o.NoBreaker = 3, false
			o.BreakerCooldown = time.Second
		}},
	} {
		t.Run(tt.name, func(t *testing.T) { fleetStoreDownDegrades(t, tt.mod) })
	}
}

func fleetStoreDownDegrades(t *testing.T, mod func(*herd.Options[int])) {
	const replicas, callers = 20, 10
	synctest.Test(t, func(t *testing.T) {
		r := memory.New()
		cs := fleetReplicas(t, replicas, r, mod)
		var (
			value atomic.Int64 // what loads return now
			loads = make([]atomic.Int64, replicas)
		)
		loader := func(i int) herd.LoadFunc[int] {
			return func(context.Context) (int, error) {
				loads[i].Add(1)
				time.Sleep(100 * time.Millisecond)
				return int(value.Load()), nil
			}
		}
		// storm runs the Gets, lets background refreshes finish, and returns
		// the loads of each replica during it and the results.
		storm := func(v int) ([]int64, []fleetResult) {
			value.Store(int64(v))
			before := make([]int64, replicas)
			for i := range loads {
				before[i] = loads[i].Load()
			}
			rs := fleetStorm(t.Context(), cs, callers, "hot", loader)()
			time.Sleep(time.Second)
			synctest.Wait()
			n := make([]int64, replicas)
			for i := range loads {
				n[i] = loads[i].Load() - before[i]
			}
			return n, rs
		}
		sum := func(n []int64) (s int64) {
			for _, x := range n {
				s += x
			}
			return s
		}

		// Healthy: one load fleet-wide.
		n, rs := storm(10)
		for _, res := range rs {
			if res.err != nil || res.v != 10 {
				t.Fatalf("healthy: replica %d got %d, %v; want 10, nil", res.replica, res.v, res.err)
			}
		}
		if s := sum(n); s != 1 {
			t.Fatalf("healthy: %d loads fleet-wide, want 1", s)
		}

		r.SetDown(errors.New("down"))

		// Stale, within the hard TTL: the local copies are served and each
		// replica refreshes once, locally.
		time.Sleep(fleetSoft + time.Second)
		n, rs = storm(11)
		staleServed := make([]int, replicas)
		for _, res := range rs {
			if res.err != nil || (res.v != 10 && res.v != 11) {
				t.Fatalf("down, stale: replica %d got %d, %v; want 10 (stale) or 11, nil", res.replica, res.v, res.err)
			}
			if res.v == 10 {
				staleServed[res.replica]++
			}
		}
		for i := range cs {
			if staleServed[i] == 0 {
				t.Errorf("down, stale: replica %d never served its stale value", i)
			}
			if n[i] > 1 {
				t.Errorf("down, stale: replica %d loaded %d times, want at most 1", i, n[i])
			}
		}

		// Hard-expired everywhere: each replica loads once, coalescing its
		// callers, and nobody gets an error.
		time.Sleep(fleetHard + time.Second)
		n, rs = storm(12)
		for _, res := range rs {
			if res.err != nil || res.v != 12 {
				t.Fatalf("down, expired: replica %d got %d, %v; want 12, nil", res.replica, res.v, res.err)
			}
		}
		for i := range cs {
			if n[i] != 1 {
				t.Errorf("down, expired: replica %d loaded %d times, want 1", i, n[i])
			}
		}

		// Invalidate while down drops the local copy only.
		if err := cs[0].Invalidate(t.Context(), "hot"); !errors.Is(err, herd.ErrDegraded) {
			t.Errorf("Invalidate while down = %v; want an error wrapping ErrDegraded", err)
		}
		value.Store(13)
		before0, before1 := loads[0].Load(), loads[1].Load()
		fleetMustGet(t, cs[0], "hot", loader(0), 13)
		fleetMustGet(t, cs[1], "hot", loader(1), 12)
		if loads[0].Load() != before0+1 || loads[1].Load() != before1 {
			t.Errorf("after Invalidate while down: replica 0 loaded %d, replica 1 %d times; want 1 and 0",
				loads[0].Load()-before0, loads[1].Load()-before1)
		}

		// Back up: one load per expiry fleet-wide again. A breaker closes on
		// the first call after its cool-down; let one read of another key
		// make it (TestFleetBreakerProbeKeepsLease covers misses that
		// arrive while that probe is in flight).
		r.SetDown(nil)
		for v := 20; v < 22; v++ {
			time.Sleep(fleetHard + time.Second)
			if v == 20 {
				for _, c := range cs {
					fleetMustGet(t, c, "other", fleetValue(0), 0)
				}
			}
			n, rs = storm(v)
			for _, res := range rs {
				if res.err != nil || res.v != v {
					t.Fatalf("recovered: replica %d got %d, %v; want %d, nil", res.replica, res.v, res.err, v)
				}
			}
			if s := sum(n); s != 1 {
				t.Errorf("recovered: %d loads fleet-wide for one expiry, want 1", s)
			}
		}
	})
}

// fleetGatedStore is a Store whose Load, once armed, waits until the gate
// is opened.
type fleetGatedStore struct {
	remote.Store
	mu   sync.Mutex
	gate chan struct{} // nil: Load does not wait
}

func (s *fleetGatedStore) arm() (open func()) {
	s.mu.Lock()
	defer s.mu.Unlock()
	g := make(chan struct{})
	s.gate = g
	return sync.OnceFunc(func() {
		s.mu.Lock()
		s.gate = nil
		s.mu.Unlock()
		close(g)
	})
}

func (s *fleetGatedStore) Load(ctx context.Context, key string) ([]byte, error) {
	s.mu.Lock()
	g := s.gate
	s.mu.Unlock()
	if g != nil {
		<-g
	}
	return s.Store.Load(ctx, key)
}

// Misses that arrive while a half-open breaker's probe is in flight still go
// through the lease once the probe succeeds: the remote is back, so the fleet
// loads once, not once per replica (or more) on top.
func TestFleetBreakerProbeKeepsLease(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := memory.New()
		stores := []*fleetGatedStore{{Store: r}, {Store: r}}
		cs := make([]*herd.Cache[int], len(stores))
		for i, s := range stores {
			cs[i] = fleetReplica(t, r, func(o *herd.Options[int]) {
				o.Store = s
				o.BreakerThreshold, o.NoBreaker = 1, false
				o.BreakerCooldown = time.Second
			})
		}
		r.SetDown(errors.New("down"))
		for _, c := range cs {
			fleetMustGet(t, c, "k", fleetValue(1), 1) // trips the breaker, loads locally
			if !c.Stats().Degraded {
				t.Fatal("the breaker did not open")
			}
		}
		r.SetDown(nil)
		time.Sleep(fleetHard + time.Second) // past the cool-down and every expiry

		var loads atomic.Int64
		load := func(context.Context) (int, error) {
			loads.Add(1)
			return 2, nil
		}
		var results []<-chan result
		for _, s := range stores {
			open := s.arm()
			t.Cleanup(open)
			for range 3 { // the first call probes; the others arrive during the probe
				results = append(results, getAsync(t.Context(), cs[len(results)/3], "k", load))
				synctest.Wait()
			}
			open()
			synctest.Wait()
		}
		for _, ch := range results {
			if res := <-ch; res.err != nil || res.v != 2 {
				t.Errorf("Get = %d, %v; want 2, nil", res.v, res.err)
			}
		}
		if n := loads.Load(); n != 1 {
			t.Errorf("%d loads after the remote came back, want 1 fleet-wide", n)
		}
		for i, c := range cs {
			if c.Stats().Degraded {
				t.Errorf("replica %d's breaker is still open", i)
			}
		}
	})
}

// 6. Background refresh under someone else's lease.

func TestFleetBackgroundRefreshGivesUpOnHeldLease(t *testing.T) {
	const readers = 10
	for _, tt := range []struct {
		name string
		mod  func(*herd.Options[int])
		// wait moves the clock from the first load to the reads.
		wait time.Duration
		// early forces XFetch to refresh on every fresh read.
		early bool
	}{
		{name: "early", early: true, mod: func(o *herd.Options[int]) { o.Beta = 10 }},
		{name: "stale", wait: fleetSoft + time.Second},
	} {
		t.Run(tt.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				r := memory.New()
				// B hears no holds, so that its refreshes ask for the lease
				// (TestHeardHoldNoLeaseAttempt: a B that hears A's hold).
				a, b := fleetReplica(t, r, tt.mod), fleetReplica(t, r, func(o *herd.Options[int]) {
					if tt.mod != nil {
						tt.mod(o)
					}
					o.Lease = noHolds(r)
				})
				if tt.early {
					// u this small refreshes at any distance from the expiry
					// that XFetch considers at all.
					tiny := func() float64 { return 1e-12 }
					herd.SetDraws(a, tiny, nil)
					herd.SetDraws(b, tiny, nil)
				}
				// The first load takes a second, so delta is not zero.
				fleetMustGet(t, a, "k", func(context.Context) (int, error) {
					time.Sleep(time.Second)
					return 1, nil
				}, 1)
				fleetMustGet(t, b, "k", nil, 1)
				time.Sleep(tt.wait)

				// A's read starts a background refresh that takes the lease.
				gate := make(chan struct{})
				release := sync.OnceFunc(func() { close(gate) })
				t.Cleanup(release)
				var started atomic.Int32
				fleetMustGet(t, a, "k", func(context.Context) (int, error) {
					started.Add(1)
					<-gate
					return 2, nil
				}, 1)
				synctest.Wait()
				if started.Load() != 1 || r.Stats().AcquireLease != 2 {
					t.Fatalf("A's refresh: %d loads started, %d leases taken; want 1 and 2", started.Load(), r.Stats().AcquireLease)
				}

				// B's readers start refreshes that find the lease held.
				var wg sync.WaitGroup
				for range readers {
					wg.Go(func() {
						v, err := b.Get(t.Context(), "k", fleetNoLoad(t, "B"))
						if err != nil || v != 1 {
							t.Errorf("B's reader got %d, %v; want the cached 1, nil", v, err)
						}
					})
				}
				wg.Wait()
				synctest.Wait()
				st := b.Stats()
				if st.InFlight != 0 {
					t.Errorf("B has %d flights running while A holds the lease; want its refreshes to have given up", st.InFlight)
				}
				if st.Loads != 0 || st.RefreshFailures != 0 || st.LeaseContended == 0 {
					t.Errorf("B's Stats: Loads %d, RefreshFailures %d, LeaseContended %d; want 0, 0, > 0", st.Loads, st.RefreshFailures, st.LeaseContended)
				}
				if tt.early && st.EarlyRefreshes == 0 {
					t.Error("B started no early refresh")
				}
				if !tt.early && st.StaleRefreshes == 0 {
					t.Error("B started no stale refresh")
				}

				release()
				fleetNoticed(t, b, "k")
				// Value 2 plans by nine tenths of the first load's second, so
				// with Beta 10 it may be refreshed early at once: that load
				// returns 2 as well.
				fleetMustGet(t, b, "k", fleetValue(2), 2)
			})
		})
	}
}

// 7. Watchdog.

func TestFleetWatchdogExtendsLease(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := memory.New()
		mod := func(o *herd.Options[int]) {
			o.LeaseTTL = 3 * time.Second
			o.LeaseWait = time.Minute
		}
		a, b := fleetReplica(t, r, mod), fleetReplica(t, r, mod)
		resA := getAsync(t.Context(), a, "k", func(context.Context) (int, error) {
			time.Sleep(10 * time.Second)
			return 1, nil
		})
		time.Sleep(4 * time.Second) // past one LeaseTTL
		resB := getAsync(t.Context(), b, "k", fleetNoLoad(t, "B"))
		synctest.Wait()
		gotB, early := ready(resB)
		if early {
			t.Errorf("B returned %d, %v while A loads; want it to wait", gotB.v, gotB.err)
		}
		if res := <-resA; res.err != nil || res.v != 1 {
			t.Errorf("A got %d, %v; want 1, nil", res.v, res.err)
		}
		if !early {
			gotB = <-resB
		}
		if gotB.err != nil || gotB.v != 1 {
			t.Errorf("B got %d, %v; want A's 1, nil", gotB.v, gotB.err)
		}
		if n := a.Stats().LeaseExtended; n < 2 {
			t.Errorf("A's LeaseExtended = %d, want >= 2", n)
		}
		if st := r.Stats(); st.AcquireLease != 1 {
			t.Errorf("%d leases taken, want 1: B took over a running load", st.AcquireLease)
		}
	})
}

// A load that outlives its LoadTimeout no longer keeps its lease: the
// watchdog stops, the lease expires, another replica takes over, and the
// late load's write is fenced.
func TestFleetWatchdogStopsAtLoadTimeout(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := memory.New()
		a := fleetReplica(t, r, func(o *herd.Options[int]) {
			o.LeaseTTL = 3 * time.Second
			o.LoadTimeout = 5 * time.Second
		})
		b := fleetReplica(t, r, func(o *herd.Options[int]) {
			o.LeaseTTL = 3 * time.Second
			o.LeaseWait = time.Minute
		})
		gate := make(chan struct{})
		release := sync.OnceFunc(func() { close(gate) })
		t.Cleanup(release)
		start := time.Now()
		resA := getAsync(t.Context(), a, "k", func(context.Context) (int, error) {
			<-gate // ignores its context
			return 1, nil
		})
		time.Sleep(6 * time.Second) // past the LoadTimeout, within the last extension
		extends := r.Stats().Extends
		if extends == 0 {
			t.Error("the lease was never extended")
		}
		var loadsB atomic.Int64
		v, err := b.Get(t.Context(), "k", func(context.Context) (int, error) {
			loadsB.Add(1)
			return 2, nil
		})
		if err != nil || v != 2 {
			t.Fatalf("B got %d, %v; want its own 2, nil", v, err)
		}
		if took := time.Since(start); took > 10*time.Second {
			t.Errorf("B took over %v after A's load began; want within LoadTimeout+LeaseTTL+backoff", took)
		}
		if n := loadsB.Load(); n != 1 {
			t.Errorf("B loaded %d times, want 1", n)
		}
		if st := r.Stats(); st.AcquireLease != 2 || st.Extends != extends {
			t.Errorf("remote: %d leases, %d extensions; want 2 and still %d", st.AcquireLease, st.Extends, extends)
		}
		release()
		if res := <-resA; res.err != nil || res.v != 1 {
			t.Fatalf("A got %d, %v; want its own 1, nil", res.v, res.err)
		}
		synctest.Wait() // A's write-back runs in the background
		if n := a.Stats().FencedWrites; n != 1 {
			t.Errorf("A's FencedWrites = %d, want 1", n)
		}
		fleetMustGet(t, fleetReplica(t, r, nil), "k", nil, 2)
		// The refused write dropped the copy A's load had put locally.
		fleetMustGet(t, a, "k", nil, 2)
	})
}

// A miss reads the Store once: the flight uses the read its caller made just
// before starting it.
func TestFleetMissReadsStoreOnce(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := memory.New()
		a := fleetReplica(t, r, nil)
		fleetMustGet(t, a, "k", fleetValue(1), 1)
		if n := r.Stats().Loads; n != 1 {
			t.Errorf("a miss read the Store %d times, want 1", n)
		}
	})
}
