package herd_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/herdcache/herd"
	"github.com/herdcache/herd/memory"
	"github.com/herdcache/herd/remote"
)

// keyLoads counts, across a fleet, how often each key was given to a
// batch loader, and checks that no call was given a key twice.
type keyLoads struct {
	t  *testing.T
	mu sync.Mutex
	n  map[string]int
}

func newKeyLoads(t *testing.T) *keyLoads { return &keyLoads{t: t, n: map[string]int{}} }

// load returns a batch loader that gives each key v(key) after gate.
func (k *keyLoads) load(gate <-chan struct{}, v func(string) int) herd.BatchLoadFunc[int] {
	return func(ctx context.Context, keys []string) (map[string]int, error) {
		k.mu.Lock()
		seen := map[string]bool{}
		for _, key := range keys {
			if seen[key] {
				k.t.Errorf("a loader call was given %q twice", key)
			}
			seen[key] = true
			k.n[key]++
		}
		k.mu.Unlock()
		if gate != nil {
			if err := hold(ctx, gate); err != nil {
				return nil, err
			}
		}
		m := make(map[string]int, len(keys))
		for _, key := range keys {
			m[key] = v(key)
		}
		return m, nil
	}
}

func (k *keyLoads) counts() map[string]int {
	k.mu.Lock()
	defer k.mu.Unlock()
	return maps(k.n)
}

func maps(m map[string]int) map[string]int {
	c := make(map[string]int, len(m))
	for k, v := range m {
		c[k] = v
	}
	return c
}

func batchKeys(prefix string, n int) []string {
	keys := make([]string, n)
	for i := range keys {
		keys[i] = fmt.Sprintf("%s%03d", prefix, i)
	}
	return keys
}

// TestFleetGetManyLoadsEachKeyOncePerFleet: 20 replicas × 10 goroutines
// read overlapping batches of 60 keys at once, with each expiry: every key
// is loaded once per expiry across the fleet, and every caller gets every
// value.
func TestFleetGetManyLoadsEachKeyOncePerFleet(t *testing.T) {
	const replicas, callers, expiries = 20, 10, 3
	synctest.Test(t, func(t *testing.T) {
		r := memory.New()
		cs := fleetReplicas(t, replicas, r, func(o *herd.Options[int]) { o.OnLeaseHeld = herd.Wait })
		all := batchKeys("k", 100)
		for exp := range expiries {
			loads := newKeyLoads(t)
			gate := make(chan struct{})
			// Each key's value is its own: a value handed to another key
			// shows.
			want := func(k string) int { return slices.Index(all, k)*expiries + exp }
			load := loads.load(gate, want)
			var wg sync.WaitGroup
			errs := make(chan error, replicas*callers)
			for i, c := range cs {
				for j := range callers {
					off := (i*callers + j) * 7 % 41
					keys := all[off : off+60]
					wg.Go(func() {
						items := c.GetMany(bounded(t), keys, load)
						for n, it := range items {
							if it.Err != nil || it.Value != want(keys[n]) {
								errs <- fmt.Errorf("replica %d: %q = %d, %v; want %d", i, keys[n], it.Value, it.Err, want(keys[n]))
							}
						}
					})
				}
			}
			synctest.Wait()
			close(gate)
			wg.Wait()
			close(errs)
			for err := range errs {
				t.Error(err)
			}
			for k, n := range loads.counts() {
				if n != 1 {
					t.Errorf("expiry %d: %q loaded %d times across the fleet, want 1", exp, k, n)
				}
			}
			if got := len(loads.counts()); got != len(all) {
				t.Errorf("expiry %d: %d keys loaded, want %d", exp, got, len(all))
			}
			if s := r.Stats(); s.Batches == 0 {
				t.Errorf("expiry %d: no batch calls of the remote tier", exp)
			}
			time.Sleep(fleetHard + time.Second) // every key gone: the next round loads again
		}
	})
}

// TestFleetGetManyLoadsItsLeasesBeforeWaiting: while another replica holds
// the lease of one key, a GetMany loads the keys it leased at once and only
// then waits for the held key; two replicas each holding a lease the other
// waits on do not stall each other.
func TestFleetGetManyLoadsItsLeasesBeforeWaiting(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := memory.New()
		a, b := fleetReplica(t, r, nil), fleetReplica(t, r, func(o *herd.Options[int]) { o.OnLeaseHeld = herd.Wait })
		ctx := bounded(t)
		gateA := make(chan struct{})
		loadsA, loadsB := newKeyLoads(t), newKeyLoads(t)
		doneA := make(chan []herd.Item[int], 1)
		go func() { doneA <- a.GetMany(ctx, []string{"x"}, loadsA.load(gateA, func(string) int { return 1 })) }()
		synctest.Wait() // a holds x's lease, its load blocked

		doneB := make(chan []herd.Item[int], 1)
		go func() {
			doneB <- b.GetMany(ctx, []string{"x", "y"}, loadsB.load(nil, func(string) int { return 2 }))
		}()
		synctest.Wait()
		if got := loadsB.counts(); got["y"] != 1 || got["x"] != 0 {
			t.Fatalf("b's loads while a holds x = %v, want y loaded, x not", got)
		}
		if v, err := a.Get(ctx, "y", fleetNoLoad(t, "a's Get of y")); err != nil || v != 2 {
			t.Errorf("a's Get of y = %d, %v; want b's value 2 from the Store", v, err)
		}
		close(gateA)
		itemsB := <-doneB
		if itemsB[0].Value != 1 || itemsB[1].Value != 2 || itemsB[0].Err != nil || itemsB[1].Err != nil {
			t.Errorf("b's items = %+v, want x from a (1) and y (2)", itemsB)
		}
		if it := (<-doneA)[0]; it.Value != 1 {
			t.Errorf("a's item = %+v, want 1", it)
		}
	})
}

// TestFleetGetManyLoserReadsAreTheirKeys: a batch that reads the Store more
// than once, here for its losers after its own load and again while one of
// them waits, gives each key what the Store holds for it: never what an
// earlier read of the batch found for another key.
func TestFleetGetManyLoserReadsAreTheirKeys(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := memory.New()
		wait := func(o *herd.Options[int]) { o.OnLeaseHeld = herd.Wait }
		a1, a2, b := fleetReplica(t, r, nil), fleetReplica(t, r, nil), fleetReplica(t, r, wait)
		ctx := bounded(t)
		values := map[string]int{"x": 1, "w": 2, "y": 3}
		value := func(k string) int { return values[k] }
		gateX, gateW, gateB := make(chan struct{}), make(chan struct{}), make(chan struct{})
		go a1.GetMany(ctx, []string{"x"}, newKeyLoads(t).load(gateX, value))
		go a2.GetMany(ctx, []string{"w"}, newKeyLoads(t).load(gateW, value))
		synctest.Wait() // x and w leased, their loads blocked
		done := make(chan []herd.Item[int], 1)
		go func() { done <- b.GetMany(ctx, []string{"y", "w", "x"}, newKeyLoads(t).load(gateB, value)) }()
		synctest.Wait() // b leased y and loads it; w and x are held elsewhere
		close(gateW)
		synctest.Wait() // w stored; b, still loading y, reads it after
		close(gateB)
		// b read w and x after its load, and serves w; x, still loading,
		// is read again after the first backoff, and then waited for.
		time.Sleep(time.Second)
		synctest.Wait()
		close(gateX)
		for i, it := range <-done {
			key := []string{"y", "w", "x"}[i]
			if it.Err != nil || it.Value != value(key) {
				t.Errorf("%q = %d, %v; want %d", key, it.Value, it.Err, value(key))
			}
		}
	})
}

// TestFleetGetManyLoserPolicies: keys whose lease another replica holds are
// served stale (ServeStale), failed (FailFast) or waited for (Wait).
func TestFleetGetManyLoserPolicies(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := memory.New()
		a, b := fleetReplica(t, r, nil), fleetReplica(t, r, nil)
		ctx := bounded(t)
		mustGet(t, a, "old", fleetValue(1), 1)
		time.Sleep(fleetSoft + time.Second) // old is stale in the Store
		release, res := fleetHold(t, a, "old", 2)
		release2, res2 := fleetHold(t, a, "none", 3)

		items := b.GetMany(ctx, []string{"old", "none"}, newKeyLoads(t).load(nil, func(string) int { return -1 }), herd.WithLoserPolicy(herd.FailFast))
		if items[0].Err != nil || items[0].Value != 1 {
			t.Errorf("FailFast, stale value in the Store: %+v, want it served stale (1)", items[0])
		}
		if !errors.Is(items[1].Err, herd.ErrLeaseHeld) {
			t.Errorf("FailFast, nothing stored: %+v, want ErrLeaseHeld", items[1])
		}
		// A stale value is served whatever the policy, as Get serves it;
		// Wait waits for the holder of a key with nothing to serve.
		done := make(chan []herd.Item[int], 1)
		go func() {
			done <- b.GetMany(ctx, []string{"old", "none"}, newKeyLoads(t).load(nil, func(string) int { return -1 }), herd.WithLoserPolicy(herd.Wait))
		}()
		synctest.Wait()
		select {
		case it := <-done:
			t.Fatalf("Wait returned %+v while the holder loads", it)
		default:
		}
		release()
		release2()
		if items := <-done; items[0].Err != nil || items[0].Value != 1 || items[1].Err != nil || items[1].Value != 3 {
			t.Errorf("Wait = %+v, want the stale 1 and the holder's 3", items)
		}
		recv(t, res)
		recv(t, res2)
	})
}

// TestFleetGetManyInvalidationAcrossReplicas: an Invalidate on one of 5
// replicas reaches the others' local tiers, and their next GetMany loads
// the key once for the fleet.
func TestFleetGetManyInvalidationAcrossReplicas(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := memory.New()
		cs := fleetReplicas(t, 5, r, nil)
		ctx := bounded(t)
		keys := batchKeys("inv", 10)
		loads := newKeyLoads(t)
		for _, c := range cs {
			wantItems(t, keys, c.GetMany(ctx, keys, loads.load(nil, func(k string) int { return len(k) })), nil)
		}
		if err := cs[0].Invalidate(ctx, keys[3]); err != nil {
			t.Fatal(err)
		}
		synctest.Wait()
		for i, c := range cs {
			if _, ok := c.GetIfPresent(keys[3]); ok {
				t.Errorf("replica %d still holds the invalidated key", i)
			}
		}
		for _, c := range cs {
			wantItems(t, keys, c.GetMany(ctx, keys, loads.load(nil, func(k string) int { return len(k) })), nil)
		}
		got := loads.counts()
		for _, k := range keys {
			want := 1
			if k == keys[3] {
				want = 2
			}
			if got[k] != want {
				t.Errorf("%q loaded %d times, want %d", k, got[k], want)
			}
		}
	})
}

// singleCalls hides the batch operations of a memory.Remote, so that a
// cache falls back to one call per key.
type singleCalls struct {
	remote.Store
	remote.Lease
}

func (s singleCalls) Subscribe(fn func(remote.Notice)) func() {
	return s.Store.(remote.Notifier).Subscribe(fn)
}

// TestFleetGetManyFallsBackToSingleCalls: a remote tier without the batch
// contracts gives the same results, one call per key.
func TestFleetGetManyFallsBackToSingleCalls(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := memory.New()
		tier := singleCalls{Store: r, Lease: r}
		mod := func(o *herd.Options[int]) { o.Store, o.Lease, o.OnLeaseHeld = tier, tier, herd.Wait }
		cs := fleetReplicas(t, 3, r, mod)
		if _, ok := remote.Store(tier).(remote.BatchStore); ok {
			t.Fatal("the wrapper still offers the batch contracts")
		}
		keys := batchKeys("one", 20)
		loads := newKeyLoads(t)
		gate := make(chan struct{})
		var wg sync.WaitGroup
		for _, c := range cs {
			wg.Go(func() {
				wantItems(t, keys, c.GetMany(bounded(t), keys, loads.load(gate, func(k string) int { return len(k) })), nil)
			})
		}
		synctest.Wait()
		close(gate)
		wg.Wait()
		for _, k := range keys {
			if n := loads.counts()[k]; n != 1 {
				t.Errorf("%q loaded %d times, want 1", k, n)
			}
		}
		if n := r.Stats().Batches; n != 0 {
			t.Errorf("%d batch calls through a tier without them", n)
		}
		// Served by the Store to a replica that never saw the keys.
		d := fleetReplica(t, r, mod)
		wantItems(t, keys, d.GetMany(bounded(t), keys, loads.load(nil, func(string) int { return -1 })), nil)
		if s := d.Stats(); s.RemoteHits != int64(len(keys)) || s.Loads != 0 {
			t.Errorf("new replica: RemoteHits %d, Loads %d; want %d and 0", s.RemoteHits, s.Loads, len(keys))
		}
		_ = slices.Clone(keys)
	})
}

// TestFleetGetManyLoadsALeaseAsSoonAsItComes: a GetMany waiting on two
// keys held elsewhere gets the lease of one when its holder's lease runs
// out, and loads it at once, while it still waits for the other, whose
// holder's load waits in turn for that key: no stall until LeaseWait.
func TestFleetGetManyLoadsALeaseAsSoonAsItComes(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := memory.New()
		const leaseWait = time.Minute
		x := fleetReplica(t, r, func(o *herd.Options[int]) { o.OnLeaseHeld, o.LeaseWait = herd.Wait, leaseWait })
		y := fleetReplica(t, r, nil)
		ctx := bounded(t)
		// a's holder is gone: its lease ends at fleetLeaseTTL.
		if g, err := r.Acquire(ctx, "a", fleetLeaseTTL, time.Time{}); err != nil || g.Token == "" {
			t.Fatalf("Acquire(a) = %+v, %v", g, err)
		}
		// y holds b, and its load waits for a's value to reach the Store,
		// as a replica whose batch waits on a key x leased would.
		resB := getAsync(ctx, y, "b", func(ctx context.Context) (int, error) {
			for {
				if env, _ := r.Load(ctx, "a"); env != nil {
					return 2, nil
				}
				select {
				case <-ctx.Done():
					return 0, ctx.Err()
				case <-time.After(100 * time.Millisecond): // polls the Store
				}
			}
		})
		synctest.Wait()
		start := time.Now()
		loads := newKeyLoads(t)
		items := x.GetMany(ctx, []string{"a", "b"}, loads.load(nil, func(k string) int {
			if k == "a" {
				return 1
			}
			return -1
		}))
		took := time.Since(start)
		if items[0].Err != nil || items[0].Value != 1 || items[1].Err != nil || items[1].Value != 2 {
			t.Errorf("x's items = %+v, want a loaded here (1) and b from y (2)", items)
		}
		if took >= leaseWait {
			t.Errorf("x's GetMany took %v, the LeaseWait: it held a's lease while it waited for b", took)
		}
		if got := loads.counts(); got["a"] != 1 || got["b"] != 0 {
			t.Errorf("x's loads = %v, want a once and b never", got)
		}
		if res := recv(t, resB); res.err != nil || res.v != 2 {
			t.Errorf("y's Get of b = %+v, want 2", res)
		}
	})
}
