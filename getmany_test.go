package herd_test

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/herdcache/herd"
	"github.com/herdcache/herd/flight"
	"github.com/herdcache/herd/limiter"
)

// batchLog is a batch loader that returns len(key) for each key it is
// given, except those in missing, and records each call's keys.
type batchLog struct {
	mu      sync.Mutex
	calls   [][]string
	missing map[string]bool
	extra   string // a key returned that no call asks for
}

func (l *batchLog) load(_ context.Context, keys []string) (map[string]int, error) {
	l.mu.Lock()
	l.calls = append(l.calls, slices.Clone(keys))
	l.mu.Unlock()
	m := make(map[string]int, len(keys))
	for _, k := range keys {
		if !l.missing[k] {
			m[k] = len(k)
		}
	}
	if l.extra != "" {
		m[l.extra] = -1
	}
	return m, nil
}

func (l *batchLog) got() [][]string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.calls)
}

// wantItems checks that items hold len(key) for each key of keys, except
// those in errs, which must fail with that error.
func wantItems(t *testing.T, keys []string, items []herd.Item[int], errs map[string]error) {
	t.Helper()
	if len(items) != len(keys) {
		t.Fatalf("GetMany returned %d items for %d keys", len(items), len(keys))
	}
	for i, k := range keys {
		it := items[i]
		if want, ok := errs[k]; ok {
			if !errors.Is(it.Err, want) {
				t.Errorf("item %d (%q) = %d, %v; want error %v", i, k, it.Value, it.Err, want)
			}
			continue
		}
		if it.Err != nil || it.Value != len(k) {
			t.Errorf("item %d (%q) = %d, %v; want %d, nil", i, k, it.Value, it.Err, len(k))
		}
	}
}

func TestGetManyPerPosition(t *testing.T) {
	c := newCache(t, testOptions())
	l := &batchLog{missing: map[string]bool{"gone": true}, extra: "stranger"}
	keys := []string{"a", "bb", "a", "gone", "ccc", "bb"}
	wantItems(t, keys, c.GetMany(bounded(t), keys, l.load), map[string]error{"gone": herd.ErrNotFound})
	if got, want := l.got(), [][]string{{"a", "bb", "gone", "ccc"}}; !slices.EqualFunc(got, want, slices.Equal) {
		t.Fatalf("loader calls = %q, want %q: each missing key once, in order", got, want)
	}
	if s := c.Stats(); s.Misses != 4 || s.Hits != 0 {
		t.Errorf("after the first call: %d misses, %d hits; want 4 misses, one per missing key, and no hit", s.Misses, s.Hits)
	}
	// The second call is served locally, but for the key the loader left
	// out, which is asked again without NegativeTTL.
	wantItems(t, keys, c.GetMany(bounded(t), keys, l.load), map[string]error{"gone": herd.ErrNotFound})
	if got := l.got(); len(got) != 2 || !slices.Equal(got[1], []string{"gone"}) {
		t.Fatalf("loader calls = %q, want a second call with only \"gone\"", got)
	}
	// Misses before and after a key served, one of them repeated: each is
	// loaded once, and every position gets its own key's value.
	mixed := []string{"dddd", "eeeee", "a", "ffffff", "dddd", "bb"}
	wantItems(t, mixed, c.GetMany(bounded(t), mixed, l.load), nil)
	if got := l.got(); len(got) != 3 || !slices.Equal(got[2], []string{"dddd", "eeeee", "ffffff"}) {
		t.Fatalf("loader calls = %q, want a third call with dddd, eeeee and ffffff", got)
	}
	// The key the loader returned unasked was not cached.
	if _, ok := c.GetIfPresent("stranger"); ok {
		t.Error("a key the loader was not asked for was cached")
	}
	if items := c.GetMany(bounded(t), nil, l.load); len(items) != 0 || len(l.got()) != 3 {
		t.Errorf("GetMany of no keys returned %d items and made %d loader calls, want none", len(items), len(l.got())-3)
	}
}

func TestGetManyNegativeTTL(t *testing.T) {
	o := testOptions()
	o.NegativeTTL = time.Minute
	c := newCache(t, o)
	l := &batchLog{missing: map[string]bool{"gone": true}}
	keys := []string{"gone", "here"}
	for range 2 {
		wantItems(t, keys, c.GetMany(bounded(t), keys, l.load), map[string]error{"gone": herd.ErrNotFound})
	}
	if n := len(l.got()); n != 1 {
		t.Errorf("%d loader calls, want 1: the key left out is remembered as not found", n)
	}
	if _, err := c.Get(bounded(t), "gone", fleetNoLoad(t, "Get of a negative key")); !errors.Is(err, herd.ErrNotFound) {
		t.Errorf("Get of the key left out = %v, want ErrNotFound", err)
	}
}

func TestGetManyMaxBatch(t *testing.T) {
	o := testOptions()
	o.MaxEntries = 1000
	o.MaxBatch = 100
	c := newCache(t, o)
	l := &batchLog{}
	keys := make([]string, 250)
	for i := range keys {
		keys[i] = fmt.Sprintf("key-%03d", i)
	}
	wantItems(t, keys, c.GetMany(bounded(t), keys, l.load), nil)
	var sizes []int
	for _, call := range l.got() {
		sizes = append(sizes, len(call))
	}
	if !slices.Equal(sizes, []int{100, 100, 50}) {
		t.Errorf("loader call sizes = %v, want [100 100 50]", sizes)
	}
	if s := c.Stats(); s.Loads != 250 || s.Misses != 250 {
		t.Errorf("Stats: Loads %d, Misses %d; want 250 each", s.Loads, s.Misses)
	}
}

func TestGetManyLoaderErrorFailsOnlyItsKeys(t *testing.T) {
	o := testOptions()
	o.MaxBatch = 2
	c := newCache(t, o)
	mustGet(t, c, "cached", fleetValue(6), 6)
	load := func(_ context.Context, keys []string) (map[string]int, error) {
		if slices.Contains(keys, "bad") {
			return nil, errLoad
		}
		m := map[string]int{}
		for _, k := range keys {
			m[k] = len(k)
		}
		return m, nil
	}
	keys := []string{"cached", "bad", "worse", "ok", "fine"}
	// Chunks of two: ["bad" "worse"] fails, ["ok" "fine"] loads.
	wantItems(t, keys, c.GetMany(bounded(t), keys, load), map[string]error{"bad": errLoad, "worse": errLoad})
}

func TestGetManyJoinsFlightsOfTheProcess(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := newCache(t, testOptions())
		ctx := bounded(t)
		gate := make(chan struct{})
		getA := getAsync(ctx, c, "a", func(ctx context.Context) (int, error) { return 100, hold(ctx, gate) })
		synctest.Wait()

		batchGate := make(chan struct{})
		l := &batchLog{}
		load := func(ctx context.Context, keys []string) (map[string]int, error) {
			if err := hold(ctx, batchGate); err != nil {
				return nil, err
			}
			return l.load(ctx, keys)
		}
		done := make(chan []herd.Item[int], 1)
		go func() { done <- c.GetMany(ctx, []string{"a", "bb", "ccc"}, load) }()
		synctest.Wait()
		// A Get of a key the batch is loading joins it.
		getB := getAsync(ctx, c, "bb", fleetNoLoad(t, "a Get of a key in the batch"))
		synctest.Wait()
		close(batchGate)
		synctest.Wait()
		if r, ok := ready(getB); !ok || r.err != nil || r.v != 2 {
			t.Errorf("the joined Get = %+v, %v; want 2 once the batch loaded", r, ok)
		}
		if _, ok := ready(getA); ok {
			t.Fatal("the Get of \"a\" returned before its load did")
		}
		close(gate)
		items := <-done
		if got := l.got(); len(got) != 1 || !slices.Equal(got[0], []string{"bb", "ccc"}) {
			t.Errorf("loader calls = %q, want one with [bb ccc]: \"a\" was in flight", got)
		}
		if items[0].Value != 100 || items[0].Err != nil {
			t.Errorf("item of \"a\" = %+v, want the Get's value 100", items[0])
		}
		wantItems(t, []string{"bb", "ccc"}, items[1:], nil)
		if r := recv(t, getA); r.v != 100 {
			t.Errorf("Get of \"a\" = %+v, want 100", r)
		}
	})
}

func TestGetManyOverlappingCallsLoadEachKeyOnce(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := newCache(t, testOptions())
		ctx := bounded(t)
		gate := make(chan struct{})
		var mu sync.Mutex
		var calls [][]string
		load := func(ctx context.Context, keys []string) (map[string]int, error) {
			mu.Lock()
			calls = append(calls, slices.Clone(keys))
			mu.Unlock()
			if err := hold(ctx, gate); err != nil {
				return nil, err
			}
			m := map[string]int{}
			for _, k := range keys {
				m[k] = len(k)
			}
			return m, nil
		}
		first := make(chan []herd.Item[int], 1)
		go func() { first <- c.GetMany(ctx, []string{"a", "bb"}, load) }()
		synctest.Wait()
		second := make(chan []herd.Item[int], 1)
		go func() { second <- c.GetMany(ctx, []string{"bb", "ccc"}, load) }()
		synctest.Wait()
		close(gate)
		wantItems(t, []string{"a", "bb"}, <-first, nil)
		wantItems(t, []string{"bb", "ccc"}, <-second, nil)
		want := [][]string{{"a", "bb"}, {"ccc"}}
		if !slices.EqualFunc(calls, want, slices.Equal) {
			t.Errorf("loader calls = %q, want %q: a loader sees only its own call's keys, each key loaded once", calls, want)
		}
	})
}

func TestGetManyPanicAndGoexitReachEveryKey(t *testing.T) {
	for _, tc := range []struct {
		name string
		die  func()
		want func(error) bool
	}{
		{"panic", func() { panic("boom") }, func(err error) bool {
			var pe *flight.PanicError
			return errors.As(err, &pe) && pe.Value == "boom"
		}},
		{"Goexit", runtime.Goexit, func(err error) bool { return errors.Is(err, flight.ErrGoexit) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				c := newCache(t, testOptions())
				ctx := bounded(t)
				mustGet(t, c, "kept", fleetValue(4), 4)
				gate := make(chan struct{})
				load := func(ctx context.Context, keys []string) (map[string]int, error) {
					_ = hold(ctx, gate)
					tc.die()
					return nil, nil
				}
				done := make(chan []herd.Item[int], 1)
				go func() { done <- c.GetMany(ctx, []string{"kept", "x", "y"}, load) }()
				synctest.Wait()
				joined := getAsync(ctx, c, "x", fleetNoLoad(t, "a Get joining the batch"))
				synctest.Wait()
				close(gate)
				items := <-done
				if items[0].Value != 4 || items[0].Err != nil {
					t.Errorf("the key served before the load = %+v, want 4", items[0])
				}
				for i, k := range []string{"x", "y"} {
					if err := items[i+1].Err; !tc.want(err) {
						t.Errorf("item %q error = %v, want the %s's", k, err, tc.name)
					}
				}
				if r := recv(t, joined); !tc.want(r.err) {
					t.Errorf("the joined Get's error = %v, want the %s's", r.err, tc.name)
				}
				// The keys are free for a new load.
				mustGet(t, c, "x", fleetValue(9), 9)
			})
		})
	}
}

// TestGetManyPanicFailsOnlyItsCall: with MaxBatch 2, a panic or Goexit in
// the loader call of the first two keys fails those two only; the call of
// the other two is still made and serves them.
func TestGetManyPanicFailsOnlyItsCall(t *testing.T) {
	for name, die := range map[string]func(){"panic": func() { panic("boom") }, "Goexit": runtime.Goexit} {
		t.Run(name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				o := testOptions()
				o.MaxBatch = 2
				c := newCache(t, o)
				var calls [][]string
				load := func(_ context.Context, keys []string) (map[string]int, error) {
					calls = append(calls, keys)
					if slices.Contains(keys, "a") {
						die()
					}
					m := map[string]int{}
					for _, k := range keys {
						m[k] = len(k)
					}
					return m, nil
				}
				items := c.GetMany(bounded(t), []string{"a", "b", "ccc", "dddd"}, load)
				for i := range 2 {
					if items[i].Err == nil {
						t.Errorf("item %d = %d; want the error of its call", i, items[i].Value)
					}
				}
				for i, want := range []int{3, 4} {
					if it := items[i+2]; it.Err != nil || it.Value != want {
						t.Errorf("item %d = %d, %v; want %d from the second call", i+2, it.Value, it.Err, want)
					}
				}
				if len(calls) != 2 {
					t.Errorf("loader calls = %q; want two", calls)
				}
			})
		})
	}
}

func TestGetManyCallerContextBoundsOnlyItsWait(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := newCache(t, testOptions())
		gate := make(chan struct{})
		load := func(ctx context.Context, keys []string) (map[string]int, error) {
			if err := hold(ctx, gate); err != nil {
				return nil, err
			}
			return map[string]int{"x": 1}, nil
		}
		ctx, cancel := context.WithCancel(bounded(t))
		done := make(chan []herd.Item[int], 1)
		go func() { done <- c.GetMany(ctx, []string{"x"}, load) }()
		synctest.Wait()
		other := getAsync(bounded(t), c, "x", fleetNoLoad(t, "a Get joining the batch"))
		synctest.Wait()
		cancel()
		items := <-done
		if !errors.Is(items[0].Err, context.Canceled) {
			t.Errorf("the cancelled caller's item = %+v, want context.Canceled", items[0])
		}
		close(gate)
		if r := recv(t, other); r.err != nil || r.v != 1 {
			t.Errorf("the other caller = %+v, want 1: the load goes on for it", r)
		}
	})
}

func TestGetManyPerKeyDecisions(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := newCache(t, testOptions())
		load := func(ctx context.Context, keys []string) (map[string]int, error) {
			herd.SetTTL(ctx, 2*testSoft, 2*testSoft)
			herd.SetTTLFor(ctx, "short", time.Second, time.Second)
			herd.NoCacheFor(ctx, "never")
			m := map[string]int{}
			for _, k := range keys {
				m[k] = len(k)
			}
			return m, nil
		}
		keys := []string{"short", "never", "long"}
		wantItems(t, keys, c.GetMany(bounded(t), keys, load), nil)
		if _, ok := c.GetIfPresent("never"); ok {
			t.Error("the key the loader said not to cache is cached")
		}
		time.Sleep(2 * time.Second)
		if _, ok := c.GetIfPresent("short"); ok {
			t.Error("the key with a 1s TTL is fresh after 2s")
		}
		time.Sleep(testSoft) // past the options' SoftTTL, within SetTTL's
		if _, ok := c.GetIfPresent("long"); !ok {
			t.Error("the key under the call's SetTTL expired at the options' SoftTTL")
		}
	})
}

func TestGetManyRefreshesStaleKeysInOneBatch(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := newCache(t, testOptions())
		l := &batchLog{}
		keys := []string{"a", "bb", "ccc", "dddd"}
		wantItems(t, keys, c.GetMany(bounded(t), keys, l.load), nil)
		time.Sleep(testSoft + time.Second) // stale, within testHard
		gate := make(chan struct{})
		load := func(ctx context.Context, ks []string) (map[string]int, error) {
			_ = hold(ctx, gate)
			m, _ := l.load(ctx, ks)
			for k := range m {
				m[k] *= 10
			}
			return m, nil
		}
		// Served stale at once while one refresh runs.
		wantItems(t, keys, c.GetMany(bounded(t), keys, load), nil)
		close(gate)
		synctest.Wait()
		calls := l.got()
		if len(calls) != 2 || !slices.Equal(calls[1], keys) {
			t.Fatalf("loader calls = %q, want the stale keys refreshed in one call", calls)
		}
		for _, k := range keys {
			if v, ok := c.GetIfPresent(k); !ok || v != 10*len(k) {
				t.Errorf("%q after the refresh = %d, %v; want %d", k, v, ok, 10*len(k))
			}
		}
		if s := c.Stats(); s.StaleRefreshes != 4 || s.StaleServed != 4 {
			t.Errorf("Stats: StaleRefreshes %d, StaleServed %d; want 4 each", s.StaleRefreshes, s.StaleServed)
		}
	})
}

func TestGetManyTakesOneLimiterSlot(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		o := testOptions()
		l, err := limiter.New(limiter.Options{Limit: 2, QueueTimeout: time.Minute})
		if err != nil {
			t.Fatal(err)
		}
		o.Limiter = l
		c := newCache(t, o)
		gate := make(chan struct{})
		var inUse int
		load := func(ctx context.Context, keys []string) (map[string]int, error) {
			inUse = c.Stats().Limiter.InUse
			_ = hold(ctx, gate)
			m := map[string]int{}
			for _, k := range keys {
				m[k] = len(k)
			}
			return m, nil
		}
		keys := []string{"a", "bb", "ccc", "dddd", "eeeee"}
		done := make(chan []herd.Item[int], 1)
		go func() { done <- c.GetMany(bounded(t), keys, load) }()
		synctest.Wait()
		close(gate)
		wantItems(t, keys, <-done, nil)
		if inUse != 1 {
			t.Errorf("the batch load held %d limiter slots, want 1", inUse)
		}
	})
}

func TestGetManyLoadManyOption(t *testing.T) {
	l := &batchLog{}
	o := testOptions()
	o.LoadMany = l.load
	c := newCache(t, o)
	wantItems(t, []string{"a", "bb"}, c.GetMany(bounded(t), []string{"a", "bb"}, nil), nil)
	// Get without a loader goes through LoadMany, one key per call.
	mustGet(t, c, "ccc", nil, 3)
	// Warm loads in batches.
	r := c.Warm(bounded(t), []string{"a", "dddd", "eeeee"}, nil)
	if r.Loaded != 2 || r.Fresh != 1 || r.Failed != 0 {
		t.Errorf("Warm = %+v, want 2 loaded, 1 fresh", r)
	}
	want := [][]string{{"a", "bb"}, {"ccc"}, {"dddd", "eeeee"}}
	if got := l.got(); !slices.EqualFunc(got, want, slices.Equal) {
		t.Errorf("loader calls = %q, want %q", got, want)
	}
	if _, err := herd.New(&herd.Options[int]{MaxEntries: 1, SoftTTL: time.Second, MaxBatch: -1}); err == nil {
		t.Error("New accepted a negative MaxBatch")
	}
}

func TestGetManyClosedAndNoLoader(t *testing.T) {
	c := newCache(t, testOptions())
	items := c.GetMany(bounded(t), []string{"a"}, nil)
	if !errors.Is(items[0].Err, herd.ErrNoLoader) {
		t.Errorf("GetMany without a loader = %+v, want ErrNoLoader", items[0])
	}
	c2, err := herd.New(testOptions())
	if err != nil {
		t.Fatal(err)
	}
	if err := c2.Close(bounded(t)); err != nil {
		t.Fatal(err)
	}
	var calls atomic.Int32
	items = c2.GetMany(bounded(t), []string{"a", "b"}, func(context.Context, []string) (map[string]int, error) {
		calls.Add(1)
		return nil, nil
	})
	if !errors.Is(items[0].Err, herd.ErrClosed) || !errors.Is(items[1].Err, herd.ErrClosed) || calls.Load() != 0 {
		t.Errorf("GetMany on a closed cache = %+v with %d loads, want ErrClosed and none", items, calls.Load())
	}
}

func TestGetStaleReadsRefreshInOneBatch(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		l := &batchLog{}
		o := testOptions()
		o.LoadMany = l.load
		c := newCache(t, o)
		keys := []string{"a", "bb", "ccc", "dddd"}
		wantItems(t, keys, c.GetMany(bounded(t), keys, nil), nil)
		time.Sleep(testSoft + time.Second) // stale, within testHard
		for range 3 {
			for _, k := range keys {
				mustGet(t, c, k, nil, len(k)) // served stale at once
			}
		}
		synctest.Wait()
		if n := len(l.got()); n != 1 {
			t.Fatalf("%d loader calls before the window closed, want 1 (the first GetMany)", n)
		}
		time.Sleep(time.Second) // past the window
		synctest.Wait()
		calls := l.got()
		if len(calls) != 2 || !slices.Equal(calls[1], keys) {
			t.Fatalf("loader calls = %q, want the stale keys refreshed in one call", calls)
		}
		if s := c.Stats(); s.StaleRefreshes != 4 {
			t.Errorf("Stats.StaleRefreshes = %d, want 4", s.StaleRefreshes)
		}
		for _, k := range keys {
			if _, ok := c.GetIfPresent(k); !ok {
				t.Errorf("%q is not fresh after the refresh", k)
			}
		}
	})
}
