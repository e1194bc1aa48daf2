package herd_test

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"reflect"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/herdcache/herd"
	"github.com/herdcache/herd/flight"
	"github.com/herdcache/herd/observe"
	"github.com/herdcache/herd/remote"
)

// Behaviour tests of the single-process cache: no Store, no Lease. Everything
// that waits runs in a synctest bubble, where time.Sleep only moves the fake
// clock and loads are held by channels.

const (
	testSoft = 10 * time.Second
	testHard = 20 * time.Second
)

var errLoad = errors.New("load failed")

// testOptions are fresh for testSoft and stale until testHard, without jitter
// or early refresh, so expiries are exact.
func testOptions() *herd.Options[int] {
	return &herd.Options[int]{MaxEntries: 100, SoftTTL: testSoft, HardTTL: testHard}
}

// newCache returns a cache that is closed when the test (or bubble) ends.
func newCache(t *testing.T, o *herd.Options[int]) *herd.Cache[int] {
	t.Helper()
	c, err := herd.New(o)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	t.Cleanup(func() {
		if err := c.Close(context.Background()); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	return c
}

type result struct {
	v   int
	err error
}

// getAsync runs Get on a new goroutine and hands its result to the channel.
func getAsync(ctx context.Context, c *herd.Cache[int], key string, load herd.LoadFunc[int], opts ...herd.CallOption) <-chan result {
	ch := make(chan result, 1)
	go func() {
		v, err := c.Get(ctx, key, load, opts...)
		ch <- result{v, err}
	}()
	return ch
}

// ready returns the result on ch if there is one now.
func ready(ch <-chan result) (result, bool) {
	select {
	case r := <-ch:
		return r, true
	default:
		return result{}, false
	}
}

// hold blocks a load until gate is closed or the load's ctx ends, as it does
// when the cache closes: a test that fails early then ends instead of hanging.
func hold(ctx context.Context, gate <-chan struct{}) error {
	select {
	case <-gate:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// patience bounds, in fake time, every wait of a test in a bubble, so that a
// broken cache fails the test instead of hanging it.
const patience = time.Hour

// recv returns the result on ch, failing the test if none comes in time.
func recv(t *testing.T, ch <-chan result) result {
	t.Helper()
	select {
	case r := <-ch:
		return r
	case <-time.After(patience):
		t.Fatal("Get did not return")
		return result{}
	}
}

// bounded returns a context that ends after patience.
func bounded(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(t.Context(), patience)
	t.Cleanup(cancel)
	return ctx
}

func mustGet(t *testing.T, c *herd.Cache[int], key string, load herd.LoadFunc[int], want int, opts ...herd.CallOption) {
	t.Helper()
	v, err := c.Get(bounded(t), key, load, opts...)
	if err != nil || v != want {
		t.Fatalf("%v: Get(%q) = %d, %v; want %d, nil", time.Now().UTC().Format("15:04:05.000000000"), key, v, err, want)
	}
}

// counting returns a load that returns the number of its call, 1 first, and
// the counter of its calls.
func counting() (herd.LoadFunc[int], *atomic.Int64) {
	var n atomic.Int64
	return func(context.Context) (int, error) { return int(n.Add(1)), nil }, &n
}

func sleepUntil(t time.Time) { time.Sleep(time.Until(t)) }

// 1. Fresh hits.

func TestFreshHitDoesNotLoad(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := newCache(t, testOptions())
		load, loads := counting()
		mustGet(t, c, "k", load, 1)
		for range 5 {
			mustGet(t, c, "k", load, 1)
			time.Sleep(testSoft/5 - 1) // the last read is 5ns before the soft expiry
		}
		if n := loads.Load(); n != 1 {
			t.Errorf("load called %d times, want 1", n)
		}
		st := c.Stats()
		if st.Hits != 5 || st.Misses != 1 || st.Loads != 1 || st.StaleServed != 0 {
			t.Errorf("Stats = %+v; want Hits 5, Misses 1, Loads 1, StaleServed 0", st)
		}
	})
}

var sevenLoads atomic.Int64

func loadSeven(context.Context) (int, error) {
	sevenLoads.Add(1)
	return 7, nil
}

func TestFreshHitDoesNotAllocate(t *testing.T) {
	// Jitter and Beta on, so the hit path goes through the XFetch decision.
	c := newCache(t, &herd.Options[int]{MaxEntries: 10, SoftTTL: time.Hour, HardTTL: 2 * time.Hour, Jitter: 0.1, Beta: 1})
	ctx := context.Background()
	if v, err := c.Get(ctx, "k", loadSeven); v != 7 || err != nil {
		t.Fatalf("Get = %d, %v", v, err)
	}
	before := sevenLoads.Load()
	allocs := testing.AllocsPerRun(1000, func() {
		if v, err := c.Get(ctx, "k", loadSeven); v != 7 || err != nil {
			t.Fatalf("Get = %d, %v", v, err)
		}
	})
	if allocs != 0 {
		t.Errorf("a fresh hit allocates %v times, want 0", allocs)
	}
	if n := sevenLoads.Load() - before; n != 0 {
		t.Errorf("fresh hits called load %d times", n)
	}
}

// 2. Misses are coalesced.

func TestMissCoalesces(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := newCache(t, testOptions())
		gate := make(chan struct{})
		var loads atomic.Int64
		load := func(ctx context.Context) (int, error) {
			loads.Add(1)
			if err := hold(ctx, gate); err != nil {
				return 0, err
			}
			return 42, nil
		}
		const n = 1000
		results := make([]<-chan result, n)
		for i := range results {
			// Callers whose ctx can end wait on a goroutine; those whose ctx
			// cannot may run the load themselves. Mix both.
			ctx := context.Background()
			if i%2 == 0 {
				ctx = t.Context()
			}
			results[i] = getAsync(ctx, c, "k", load)
		}
		synctest.Wait() // every caller is in the load or waiting for it
		if got := loads.Load(); got != 1 {
			t.Fatalf("%d loads running for %d concurrent misses, want 1", got, n)
		}
		close(gate)
		for i, ch := range results {
			if r := recv(t, ch); r.v != 42 || r.err != nil {
				t.Errorf("caller %d got %d, %v; want 42, nil", i, r.v, r.err)
			}
		}
		st := c.Stats()
		if st.Loads != 1 || st.Misses != n {
			t.Errorf("Loads = %d, Misses = %d; want 1, %d", st.Loads, st.Misses, n)
		}
		if st.Coalesced != n-1 {
			t.Errorf("Coalesced = %d, want %d (callers that joined another caller's load)", st.Coalesced, n-1)
		}
	})
}

func TestRepeatedExpiriesLoadOncePerExpiry(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := newCache(t, testOptions())
		var loads atomic.Int64
		load := func(context.Context) (int, error) {
			n := loads.Add(1)
			time.Sleep(100 * time.Millisecond) // the load takes time, so every caller joins it
			return int(n), nil
		}
		mustGet(t, c, "k", load, 1)
		for round := 2; round <= 6; round++ {
			time.Sleep(testHard) // past the hard expiry of the value loaded last round
			const n = 100
			results := make([]<-chan result, n)
			for i := range results {
				results[i] = getAsync(t.Context(), c, "k", load)
			}
			for i, ch := range results {
				if r := recv(t, ch); r.v != round || r.err != nil {
					t.Fatalf("round %d: caller %d got %d, %v", round, i, r.v, r.err)
				}
			}
			if got := loads.Load(); got != int64(round) {
				t.Fatalf("round %d: %d loads in all, want %d (one per expiry)", round, got, round)
			}
			// Callers after the load finished get its value without loading.
			for range 10 {
				mustGet(t, c, "k", load, round)
			}
			if got := loads.Load(); got != int64(round) {
				t.Fatalf("round %d: sequential Gets after the load loaded again (%d loads)", round, got)
			}
		}
	})
}

// 3. Soft and hard TTL.

func TestStaleWhileRevalidate(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := newCache(t, testOptions())
		// Load n (n > 1) waits for gates[n].
		gates := []chan struct{}{nil, nil, make(chan struct{}), make(chan struct{})}
		var loads atomic.Int64
		load := func(ctx context.Context) (int, error) {
			n := loads.Add(1)
			if n > 1 {
				if err := hold(ctx, gates[n]); err != nil {
					return 0, err
				}
			}
			return int(n), nil
		}
		mustGet(t, c, "k", load, 1)
		time.Sleep(testSoft + testSoft/2) // stale, inside the hard TTL

		const readers = 50
		results := make([]<-chan result, readers)
		for i := range results {
			results[i] = getAsync(t.Context(), c, "k", load)
		}
		synctest.Wait()
		for i, ch := range results {
			r, ok := ready(ch)
			if !ok {
				t.Fatalf("reader %d waited for the refresh instead of getting the stale value", i)
			}
			if r.v != 1 || r.err != nil {
				t.Fatalf("reader %d got %d, %v; want the stale 1", i, r.v, r.err)
			}
		}
		if got := loads.Load(); got != 2 {
			t.Fatalf("%d loads after %d stale reads, want 2 (one background refresh)", got, readers)
		}
		st := c.Stats()
		if st.StaleServed != readers || st.StaleRefreshes != 1 {
			t.Errorf("StaleServed = %d, StaleRefreshes = %d; want %d, 1", st.StaleServed, st.StaleRefreshes, readers)
		}
		close(gates[2])
		synctest.Wait()
		mustGet(t, c, "k", load, 2)
		if st := c.Stats(); st.Hits != 1 || loads.Load() != 2 {
			t.Errorf("after the refresh: Hits = %d, loads = %d; want the new value served fresh", st.Hits, loads.Load())
		}

		// Past the hard TTL of the refreshed value (written at 15s): a miss,
		// and the caller waits for the load.
		time.Sleep(testHard)
		misses := c.Stats().Misses
		ch := getAsync(t.Context(), c, "k", load)
		synctest.Wait()
		if _, ok := ready(ch); ok {
			t.Fatal("Get past the hard TTL returned without waiting for the load")
		}
		close(gates[3])
		if r := recv(t, ch); r.v != 3 || r.err != nil {
			t.Fatalf("Get past the hard TTL = %d, %v; want 3, nil", r.v, r.err)
		}
		if got := c.Stats().Misses - misses; got != 1 {
			t.Errorf("Misses went up by %d past the hard TTL, want 1", got)
		}
	})
}

func TestNoStale(t *testing.T) {
	cases := []struct {
		name    string
		options func(*herd.Options[int])
		call    []herd.CallOption
	}{
		{"Options.NoStale", func(o *herd.Options[int]) { o.NoStale = true }, nil},
		{"NoStale()", func(*herd.Options[int]) {}, []herd.CallOption{herd.NoStale()}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				o := testOptions()
				tc.options(o)
				c := newCache(t, o)
				gate := make(chan struct{})
				var loads atomic.Int64
				var fail atomic.Bool
				load := func(ctx context.Context) (int, error) {
					n := loads.Add(1)
					if n > 1 {
						if err := hold(ctx, gate); err != nil {
							return 0, err
						}
					}
					if fail.Load() {
						return 0, errLoad
					}
					return int(n), nil
				}
				mustGet(t, c, "k", load, 1, tc.call...)

				// Between soft and hard: a miss that waits for the load.
				time.Sleep(testSoft + time.Second)
				ch := getAsync(t.Context(), c, "k", load, tc.call...)
				synctest.Wait()
				if r, ok := ready(ch); ok {
					t.Fatalf("stale Get returned %d, %v without waiting for the load", r.v, r.err)
				}
				close(gate)
				if r := recv(t, ch); r.v != 2 || r.err != nil {
					t.Fatalf("stale Get = %d, %v; want the new value 2", r.v, r.err)
				}

				// A failing load returns its error, not the stale value.
				time.Sleep(testSoft + time.Second)
				fail.Store(true)
				v, err := c.Get(bounded(t), "k", load, tc.call...)
				if !errors.Is(err, errLoad) {
					t.Fatalf("stale Get with a failing load = %d, %v; want errLoad", v, err)
				}
				st := c.Stats()
				if st.StaleServed != 0 || st.StaleIfError != 0 {
					t.Errorf("StaleServed = %d, StaleIfError = %d; want 0, 0", st.StaleServed, st.StaleIfError)
				}
				if st.Misses != 3 || st.Loads != 3 {
					t.Errorf("Misses = %d, Loads = %d; want 3, 3", st.Misses, st.Loads)
				}
			})
		})
	}
}

// 4. XFetch.

type xfetchRun struct {
	misses      int64 // after the cold miss
	staleServed int64
	perPeriod   []int // loads started in each TTL period
	maxWait     time.Duration
}

// runXFetch reads one hot key from 10 goroutines at 100 Hz each for periods
// TTL periods of 10s, with a 100ms load, SoftTTL = HardTTL and the given beta.
func runXFetch(t *testing.T, beta float64, periods int) xfetchRun {
	return runXFetchAt(t, beta, periods, 10, 10*time.Millisecond)
}

// runXFetchAt is runXFetch with readers goroutines reading once a tick.
func runXFetchAt(t *testing.T, beta float64, periods, readers int, tick time.Duration) xfetchRun {
	const (
		period   = 10 * time.Second
		loadTime = 100 * time.Millisecond
	)
	var out xfetchRun
	synctest.Test(t, func(t *testing.T) {
		c := newCache(t, &herd.Options[int]{MaxEntries: 100, SoftTTL: period, HardTTL: period, Beta: beta})
		start := time.Now()

		// The k-th draw at tick n is number 10n+k of the PCG(1, 2) stream,
		// mapped to (0, 1]: the readers of one instant share its numbers
		// whatever order they run in, so every run is the same.
		var (
			dmu   sync.Mutex
			rng   = rand.New(rand.NewPCG(1, 2))
			tickN = int64(-1)
			vals  = make([]float64, readers)
			used  int
		)
		herd.SetDraws(c, func() float64 {
			dmu.Lock()
			defer dmu.Unlock()
			for n := int64(time.Since(start) / tick); tickN < n; {
				tickN++
				for i := range vals {
					vals[i] = 1 - rng.Float64()
				}
				used = 0
			}
			if used == readers {
				t.Errorf("more than %d draws at tick %d", readers, tickN)
				used = 0
			}
			u := vals[used]
			used++
			return u
		}, nil)

		var (
			lmu    sync.Mutex
			starts []time.Duration
		)
		load := func(context.Context) (int, error) {
			lmu.Lock()
			starts = append(starts, time.Since(start))
			n := len(starts)
			lmu.Unlock()
			time.Sleep(loadTime)
			return n, nil
		}
		total := time.Duration(periods) * period
		ctx, cancel := context.WithTimeout(t.Context(), total+patience)
		defer cancel()
		if _, err := c.Get(ctx, "hot", load); err != nil {
			t.Fatal(err)
		}
		cold := c.Stats().Misses

		var (
			wg  sync.WaitGroup
			wmu sync.Mutex
		)
		for range readers {
			wg.Go(func() {
				for time.Since(start) < total {
					t0 := time.Now()
					if _, err := c.Get(ctx, "hot", load); err != nil {
						t.Error(err)
						return
					}
					if w := time.Since(t0); w > 0 {
						wmu.Lock()
						out.maxWait = max(out.maxWait, w)
						wmu.Unlock()
					}
					time.Sleep(tick)
				}
			})
		}
		wg.Wait()
		time.Sleep(loadTime) // let a refresh started by the last reads finish

		st := c.Stats()
		out.misses = st.Misses - cold
		out.staleServed = st.StaleServed
		out.perPeriod = make([]int, periods)
		lmu.Lock()
		for _, s := range starts {
			if i := int(s / period); i < periods {
				out.perPeriod[i]++
			}
		}
		lmu.Unlock()
	})
	return out
}

func TestXFetchRefreshesBeforeExpiry(t *testing.T) {
	const periods = 200
	checkXFetch(t, runXFetch(t, 1, periods), periods)
}

// checkXFetch holds a run with beta 1 to the XFetch promises: no miss after
// warm-up, no wait, nothing stale, at most 1.1 loads per period on average
// and 2 in any one.
func checkXFetch(t *testing.T, r xfetchRun, periods int) {
	t.Helper()
	total, most := 0, 0
	for _, n := range r.perPeriod {
		total += n
		most = max(most, n)
	}
	mean := float64(total) / float64(periods)
	t.Logf("beta 1: %d loads over %d periods: mean %.3f, max %d per period; misses after warm-up %d, stale served %d, longest reader wait %v",
		total, periods, mean, most, r.misses, r.staleServed, r.maxWait)
	if r.misses != 0 {
		t.Errorf("%d misses after warm-up, want 0", r.misses)
	}
	if r.maxWait != 0 {
		t.Errorf("a reader waited %v, want no waits", r.maxWait)
	}
	if r.staleServed != 0 {
		t.Errorf("StaleServed = %d, want 0 (SoftTTL = HardTTL)", r.staleServed)
	}
	if mean > 1.1 {
		t.Errorf("mean loads per period %.3f, want at most 1.1", mean)
	}
	if most > 2 {
		t.Errorf("max loads per period %d, want at most 2", most)
	}
}

// Without early refresh the same load misses at every expiry: the check above
// can fail.
func TestXFetchOffMissesAtExpiry(t *testing.T) {
	r := runXFetch(t, 0, 5)
	t.Logf("beta 0: misses after warm-up %d, longest reader wait %v", r.misses, r.maxWait)
	if r.misses == 0 || r.maxWait == 0 {
		t.Errorf("beta 0: %d misses, longest wait %v; want readers to miss and wait at expiry", r.misses, r.maxWait)
	}
}

// 5. Background refresh.

func TestRefreshRunsOnExecutor(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var (
			mu    sync.Mutex
			tasks []func()
		)
		o := testOptions()
		o.Executor = func(fn func()) {
			mu.Lock()
			tasks = append(tasks, fn)
			mu.Unlock()
		}
		c := newCache(t, o)
		load, loads := counting()
		mustGet(t, c, "k", load, 1)
		time.Sleep(testSoft)
		mustGet(t, c, "k", load, 1) // stale: hands a refresh to the executor
		mustGet(t, c, "k", load, 1) // one refresh at a time
		synctest.Wait()
		mu.Lock()
		queued := tasks
		tasks = nil
		mu.Unlock()
		if len(queued) != 1 || loads.Load() != 1 {
			t.Fatalf("%d tasks queued, %d loads; want 1 task and the refresh not run yet", len(queued), loads.Load())
		}
		queued[0]()
		if n := loads.Load(); n != 2 {
			t.Fatalf("running the task made %d loads, want 2", n)
		}
		mustGet(t, c, "k", load, 2)
	})
}

func TestEarlyRefreshRunsOnExecutor(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var queued atomic.Int64
		o := testOptions()
		o.Beta = 10
		o.Executor = func(fn func()) {
			queued.Add(1)
			go fn()
		}
		c := newCache(t, o)
		// At Beta 10 a draw this small leads by 11.2 load times, longer than
		// the TTL: the value is due for refresh as soon as it is written.
		var draws atomic.Int64
		herd.SetDraws(c, func() float64 {
			if draws.Add(1) == 1 {
				return 1e-300
			}
			return 1 // no more early refreshes
		}, nil)
		var loads atomic.Int64
		load := func(context.Context) (int, error) {
			time.Sleep(time.Second) // delta 1s: any read of a 10s TTL may refresh early
			return int(loads.Add(1)), nil
		}
		mustGet(t, c, "k", load, 1)
		mustGet(t, c, "k", load, 1) // fresh, but refreshed early
		time.Sleep(time.Second)
		synctest.Wait() // the refresh's load ends at this instant too
		if queued.Load() != 1 || loads.Load() != 2 {
			t.Fatalf("%d tasks, %d loads; want 1 task that loaded", queued.Load(), loads.Load())
		}
		if st := c.Stats(); st.EarlyRefreshes != 1 || st.StaleServed != 0 {
			t.Errorf("EarlyRefreshes = %d, StaleServed = %d; want 1, 0", st.EarlyRefreshes, st.StaleServed)
		}
		mustGet(t, c, "k", load, 2)
	})
}

func TestFailedRefreshKeepsValueAndBacksOff(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const backoff = 5 * time.Second
		const hard = 60 * time.Second
		o := testOptions()
		o.HardTTL = hard
		o.RefreshBackoff = backoff
		c := newCache(t, o)
		var loads atomic.Int64
		load := func(context.Context) (int, error) {
			if loads.Add(1) == 1 {
				return 1, nil
			}
			return 0, errLoad
		}
		t0 := time.Now()
		mustGet(t, c, "k", load, 1)
		time.Sleep(testSoft + time.Second)

		// Read every 100ms until the hard expiry: the stale value is served
		// throughout, and a refresh starts once per backoff (at 11s, 16s, …, 56s).
		var refreshes int64
		for time.Since(t0) < hard {
			mustGet(t, c, "k", load, 1)
			synctest.Wait()
			el := time.Since(t0) - (testSoft + time.Second)
			if el%backoff == 0 {
				refreshes++
			}
			if got := loads.Load(); got != 1+refreshes {
				t.Fatalf("at %v: %d loads, want %d (no retry within the backoff)", time.Since(t0), got, 1+refreshes)
			}
			time.Sleep(100 * time.Millisecond)
		}
		if refreshes != 10 {
			t.Fatalf("test expected 10 refreshes, counted %d", refreshes)
		}
		if st := c.Stats(); st.RefreshFailures != refreshes {
			t.Errorf("RefreshFailures = %d, want %d", st.RefreshFailures, refreshes)
		}
		// At the hard expiry the value is gone: a miss that gets the error.
		if v, err := c.Get(bounded(t), "k", load); !errors.Is(err, errLoad) {
			t.Errorf("Get at the hard expiry = %d, %v; want errLoad", v, err)
		}
	})
}

func TestOneRefreshAtATime(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		o := testOptions()
		o.HardTTL = time.Minute
		o.RefreshBackoff = time.Second
		var submitted atomic.Int64
		o.Executor = func(fn func()) {
			submitted.Add(1)
			go fn()
		}
		c := newCache(t, o)
		gate := make(chan struct{})
		var loads, running, most atomic.Int64
		load := func(ctx context.Context) (int, error) {
			n := loads.Add(1)
			r := running.Add(1)
			defer running.Add(-1)
			for {
				m := most.Load()
				if r <= m || most.CompareAndSwap(m, r) {
					break
				}
			}
			switch n {
			case 1:
				return 1, nil
			case 2:
				return 0, errLoad // the first refresh fails fast: backoff 1s
			}
			// The second refresh takes far longer than the backoff.
			if err := hold(ctx, gate); err != nil {
				return 0, err
			}
			return int(n), nil
		}
		mustGet(t, c, "k", load, 1)
		time.Sleep(testSoft)

		ctx := bounded(t)
		var wg sync.WaitGroup
		for range 10 {
			wg.Go(func() {
				for range 100 { // 10s of reads at 10 Hz
					if v, err := c.Get(ctx, "k", load); v != 1 || err != nil {
						t.Errorf("Get = %d, %v; want the stale 1", v, err)
						return
					}
					time.Sleep(100 * time.Millisecond)
				}
			})
		}
		wg.Wait()
		if n, s := loads.Load(), submitted.Load(); n != 3 || s != 2 {
			t.Errorf("%d loads, %d refreshes submitted over 10s of reads; want 3 and 2", n, s)
		}
		close(gate)
		synctest.Wait()
		mustGet(t, c, "k", load, 3)
		if m := most.Load(); m != 1 {
			t.Errorf("at most %d loads ran at once, want 1", m)
		}
	})
}

// 6. TTL jitter.

func TestJitterMovesBothExpiries(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const soft, hard, frac = testSoft, 15 * time.Second, 0.2
		o := &herd.Options[int]{MaxEntries: 10, SoftTTL: soft, HardTTL: hard, Jitter: frac, RefreshBackoff: time.Hour}
		c := newCache(t, o)
		draws := []float64{0, math.Nextafter(1, 0), 0.5}
		var drawn atomic.Int64
		herd.SetDraws(c, nil, func() float64 {
			i := drawn.Add(1) - 1
			if int(i) >= len(draws) {
				t.Errorf("jitter draw %d: more writes than expected", i)
				return 0.5
			}
			return draws[i]
		})
		// Misses load; background refreshes fail, so an entry stays until its
		// hard expiry and the boundaries can be seen.
		var loads atomic.Int64
		var fail atomic.Bool
		load := func(context.Context) (int, error) {
			n := loads.Add(1)
			if fail.Load() {
				return 0, errLoad
			}
			return int(n), nil
		}
		ctx := bounded(t)
		v, err := c.Get(ctx, "k", load)
		if err != nil {
			t.Fatal(err)
		}
		t0 := time.Now()
		for i, u := range draws[:2] {
			offset := time.Duration(frac * float64(soft) * (2*u - 1))
			switch i {
			case 0:
				if offset != -2*time.Second {
					t.Fatalf("offset %v", offset)
				}
			case 1:
				if offset <= 2*time.Second-time.Microsecond || offset > 2*time.Second {
					t.Fatalf("offset %v", offset)
				}
			}
			fail.Store(true)
			st := c.Stats()
			sleepUntil(t0.Add(soft + offset - 1))
			mustGet(t, c, "k", load, v)
			if got := c.Stats(); got.Hits != st.Hits+1 || got.StaleServed != st.StaleServed {
				t.Fatalf("draw %v: not fresh just before soft·%.2f", u, float64(soft+offset)/float64(soft))
			}
			sleepUntil(t0.Add(soft + offset))
			mustGet(t, c, "k", load, v)
			if got := c.Stats(); got.StaleServed != st.StaleServed+1 {
				t.Fatalf("draw %v: not stale at soft·%.2f", u, float64(soft+offset)/float64(soft))
			}
			synctest.Wait() // the refresh fails
			sleepUntil(t0.Add(hard + offset - 1))
			mustGet(t, c, "k", load, v)
			if got := c.Stats(); got.StaleServed != st.StaleServed+2 || got.Misses != st.Misses {
				t.Fatalf("draw %v: not stale just before the jittered hard expiry", u)
			}
			sleepUntil(t0.Add(hard + offset))
			fail.Store(false)
			n := loads.Load()
			v, err = c.Get(ctx, "k", load)
			if err != nil || v != int(n+1) {
				t.Fatalf("draw %v: Get at the jittered hard expiry = %d, %v; want a load", u, v, err)
			}
			if got := c.Stats(); got.Misses != st.Misses+1 {
				t.Fatalf("draw %v: no miss at the jittered hard expiry", u)
			}
			t0 = time.Now()
		}
	})
}

// 7. Errors and negative caching.

func TestErrorsAreNotCached(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := newCache(t, testOptions())
		var loads atomic.Int64
		load := func(context.Context) (int, error) {
			n := loads.Add(1)
			if n <= 2 {
				return 0, fmt.Errorf("attempt %d: %w", n, errLoad)
			}
			return int(n), nil
		}
		for i := range 2 {
			if _, err := c.Get(bounded(t), "k", load); !errors.Is(err, errLoad) {
				t.Fatalf("Get %d: error %v, want errLoad", i, err)
			}
		}
		mustGet(t, c, "k", load, 3)
		if st := c.Stats(); st.Loads != 3 || st.LoadErrors != 2 {
			t.Errorf("Loads = %d, LoadErrors = %d; want 3, 2", st.Loads, st.LoadErrors)
		}
	})
}

func notFound(loads *atomic.Int64) herd.LoadFunc[int] {
	return func(context.Context) (int, error) {
		loads.Add(1)
		return 0, fmt.Errorf("x: %w", herd.ErrNotFound)
	}
}

func TestNegativeCaching(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const negTTL = 5 * time.Second
		o := testOptions()
		o.NegativeTTL = negTTL
		c := newCache(t, o)
		var loads atomic.Int64
		load := notFound(&loads)
		if _, err := c.Get(bounded(t), "k", load); !errors.Is(err, herd.ErrNotFound) {
			t.Fatalf("Get = %v, want ErrNotFound", err)
		}
		base := c.Stats().NegativeHits
		for range 5 {
			time.Sleep(negTTL/5 - 1) // the last read is 5ns before NegativeTTL ends
			if _, err := c.Get(bounded(t), "k", load); !errors.Is(err, herd.ErrNotFound) {
				t.Fatalf("cached Get = %v, want ErrNotFound", err)
			}
		}
		if n := loads.Load(); n != 1 {
			t.Errorf("load called %d times within NegativeTTL, want 1", n)
		}
		if got := c.Stats().NegativeHits - base; got != 5 {
			t.Errorf("NegativeHits went up by %d, want 5", got)
		}
		time.Sleep(5 * time.Nanosecond) // NegativeTTL has passed
		if _, err := c.Get(bounded(t), "k", load); !errors.Is(err, herd.ErrNotFound) {
			t.Fatalf("Get = %v, want ErrNotFound", err)
		}
		if n := loads.Load(); n != 2 {
			t.Errorf("load called %d times once NegativeTTL passed, want 2", n)
		}
	})
}

func TestNotFoundNotCachedWithoutNegativeTTL(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := newCache(t, testOptions())
		var loads atomic.Int64
		load := notFound(&loads)
		for i := range 3 {
			if _, err := c.Get(bounded(t), "k", load); !errors.Is(err, herd.ErrNotFound) {
				t.Fatalf("Get %d = %v, want ErrNotFound", i, err)
			}
		}
		if n := loads.Load(); n != 3 {
			t.Errorf("load called %d times for 3 Gets, want 3", n)
		}
		if st := c.Stats(); st.NegativeHits != 0 {
			t.Errorf("NegativeHits = %d, want 0", st.NegativeHits)
		}
	})
}

// 8. Per-entry decisions.

func TestSetTTLInsideLoad(t *testing.T) {
	cases := []struct {
		name              string
		soft, hard        time.Duration // passed to SetTTL
		freshFor, staleTo time.Duration // what the entry should do
	}{
		{"shorter", time.Second, 3 * time.Second, time.Second, 3 * time.Second},
		{"longer", 30 * time.Second, 40 * time.Second, 30 * time.Second, 40 * time.Second},
		{"hard zero", 5 * time.Second, 0, 5 * time.Second, 5 * time.Second},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				o := testOptions()
				o.RefreshBackoff = time.Hour
				c := newCache(t, o)
				var loads atomic.Int64
				load := func(ctx context.Context) (int, error) {
					if loads.Add(1) > 1 {
						return 0, errLoad // refreshes fail: the entry stays until hard
					}
					herd.SetTTL(ctx, tc.soft, tc.hard)
					return 1, nil
				}
				t0 := time.Now()
				mustGet(t, c, "k", load, 1)
				sleepUntil(t0.Add(tc.freshFor - 1))
				mustGet(t, c, "k", load, 1)
				if st := c.Stats(); st.Hits != 1 || st.StaleServed != 0 {
					t.Fatalf("not fresh just before %v: %+v", tc.freshFor, st)
				}
				sleepUntil(t0.Add(tc.freshFor))
				if tc.staleTo > tc.freshFor {
					mustGet(t, c, "k", load, 1)
					if st := c.Stats(); st.StaleServed != 1 {
						t.Fatalf("not stale at %v: %+v", tc.freshFor, st)
					}
					synctest.Wait()
					sleepUntil(t0.Add(tc.staleTo - 1))
					mustGet(t, c, "k", load, 1)
					sleepUntil(t0.Add(tc.staleTo))
				}
				if v, err := c.Get(bounded(t), "k", load); !errors.Is(err, errLoad) {
					t.Fatalf("Get at %v = %d, %v; want a miss that loads (errLoad)", tc.staleTo, v, err)
				}
			})
		})
	}
	// Outside a load SetTTL and NoCache do nothing.
	herd.SetTTL(context.Background(), time.Second, time.Second)
	herd.NoCache(context.Background())
}

func TestNoCacheInsideLoad(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := newCache(t, testOptions())
		gate := make(chan struct{})
		var loads atomic.Int64
		load := func(ctx context.Context) (int, error) {
			n := loads.Add(1)
			if n == 1 {
				herd.NoCache(ctx)
				if err := hold(ctx, gate); err != nil {
					return 0, err
				}
			}
			return int(n), nil
		}
		results := make([]<-chan result, 10)
		for i := range results {
			results[i] = getAsync(t.Context(), c, "k", load)
		}
		synctest.Wait()
		close(gate)
		for i, ch := range results {
			if r := recv(t, ch); r.v != 1 || r.err != nil {
				t.Errorf("caller %d got %d, %v; want 1, nil", i, r.v, r.err)
			}
		}
		if n := loads.Load(); n != 1 {
			t.Fatalf("%d loads for the joined callers, want 1", n)
		}
		mustGet(t, c, "k", load, 2) // not cached: loads again
		mustGet(t, c, "k", load, 2) // this one was cached
	})
}

// 9. Panics and cancellation.

func TestLoadPanic(t *testing.T) {
	for _, alone := range []bool{false, true} {
		t.Run(fmt.Sprintf("DisableCoalescing=%v", alone), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				o := testOptions()
				o.DisableCoalescing = alone
				c := newCache(t, o)
				gate := make(chan struct{})
				var loads atomic.Int64
				panicky := func(ctx context.Context) (int, error) {
					loads.Add(1)
					if err := hold(ctx, gate); err != nil {
						return 0, err
					}
					panic("boom")
				}
				const n = 10
				results := make([]<-chan result, n)
				for i := range results {
					ctx := context.Background()
					if i%2 == 0 {
						ctx = t.Context()
					}
					results[i] = getAsync(ctx, c, "k", panicky)
				}
				synctest.Wait()
				close(gate)
				for i, ch := range results {
					r := recv(t, ch)
					var pe *flight.PanicError
					if !errors.As(r.err, &pe) || pe.Value != "boom" {
						t.Errorf("caller %d got %d, %v; want a *flight.PanicError with value boom", i, r.v, r.err)
					}
				}
				if want := map[bool]int64{false: 1, true: n}[alone]; loads.Load() != want {
					t.Errorf("%d loads, want %d", loads.Load(), want)
				}
				load, _ := counting()
				mustGet(t, c, "k", load, 1)
				mustGet(t, c, "k", load, 1)
			})
		})
	}
}

func TestCallerCancellation(t *testing.T) {
	cases := []struct {
		name        string
		cancelFirst bool // the cancelled caller started the load
		disableCoal bool
		wantLoads   int64
		wantBValue  int // what the caller that stays gets
	}{
		{name: "joiner cancelled", wantLoads: 1, wantBValue: 1},
		{name: "starter cancelled", cancelFirst: true, wantLoads: 1, wantBValue: 1},
		{name: "DisableCoalescing", cancelFirst: true, disableCoal: true, wantLoads: 2, wantBValue: 2},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				o := testOptions()
				o.DisableCoalescing = tc.disableCoal
				c := newCache(t, o)
				gate := make(chan struct{})
				var loads atomic.Int64
				loadErrs := make(chan error, 2)
				load := func(ctx context.Context) (int, error) {
					n := loads.Add(1)
					err := hold(ctx, gate)
					loadErrs <- err
					return int(n), err
				}
				ctxA, cancelA := context.WithCancel(t.Context())
				defer cancelA()
				var a, b <-chan result
				if tc.cancelFirst {
					a = getAsync(ctxA, c, "k", load)
					synctest.Wait()
					b = getAsync(t.Context(), c, "k", load)
				} else {
					b = getAsync(t.Context(), c, "k", load)
					synctest.Wait()
					a = getAsync(ctxA, c, "k", load)
				}
				synctest.Wait()
				cancelA()
				synctest.Wait()
				r, ok := ready(a)
				if !ok {
					t.Fatal("the cancelled caller did not return while the load ran")
				}
				if !errors.Is(r.err, context.Canceled) {
					t.Fatalf("cancelled caller got %d, %v; want an error wrapping context.Canceled", r.v, r.err)
				}
				if _, ok := ready(b); ok {
					t.Fatal("the other caller returned before the load finished")
				}
				close(gate)
				if r := recv(t, b); r.v != tc.wantBValue || r.err != nil {
					t.Fatalf("the other caller got %d, %v; want %d, nil", r.v, r.err, tc.wantBValue)
				}
				synctest.Wait()
				if n := loads.Load(); n != tc.wantLoads {
					t.Fatalf("%d loads, want %d", n, tc.wantLoads)
				}
				for range tc.wantLoads {
					if err := <-loadErrs; err != nil { // buffered: every load has sent
						t.Errorf("a load's context ended with %v before it returned; cancelling a caller must not cancel the load", err)
					}
				}
				// The load was not cancelled, so its value is cached.
				v, err := c.Get(bounded(t), "k", load)
				if err != nil || v < 1 || loads.Load() != tc.wantLoads {
					t.Errorf("Get after = %d, %v with %d loads; want a cached value", v, err, loads.Load())
				}
			})
		})
	}
}

// 10. Options.

type nopStore struct{}

func (nopStore) Load(context.Context, string) ([]byte, error) { return nil, nil }
func (nopStore) Write(context.Context, string, []byte, uint64, time.Duration) (bool, error) {
	return false, nil
}
func (nopStore) Set(context.Context, string, []byte, time.Duration) (uint64, error) { return 1, nil }
func (nopStore) Invalidate(context.Context, string) error                           { return nil }

type nopLease struct{}

func (nopLease) Acquire(context.Context, string, time.Duration, time.Time) (remote.Grant, error) {
	return remote.Grant{}, errors.New("nop")
}
func (nopLease) Extend(context.Context, string, string, time.Duration) (bool, error) {
	return false, nil
}
func (nopLease) Release(context.Context, string, string) error { return nil }
func (nopLease) Wait(context.Context, string) error            { return nil }

// newNoPanic calls New and reports a panic instead of crashing the test.
func newNoPanic(o *herd.Options[int]) (c *herd.Cache[int], panicked any, err error) {
	defer func() { panicked = recover() }()
	c, err = herd.New(o)
	return c, nil, err
}

func TestOptionsValidation(t *testing.T) {
	cases := []struct {
		name   string
		modify func(*herd.Options[int])
		want   string // in the error text
	}{
		{"MaxEntries 0", func(o *herd.Options[int]) { o.MaxEntries = 0 }, "MaxEntries"},
		{"MaxEntries -1", func(o *herd.Options[int]) { o.MaxEntries = -1 }, "MaxEntries"},
		{"SoftTTL 0", func(o *herd.Options[int]) { o.SoftTTL = 0; o.HardTTL = 0 }, "SoftTTL"},
		{"SoftTTL -1s", func(o *herd.Options[int]) { o.SoftTTL = -time.Second }, "SoftTTL"},
		{"HardTTL < SoftTTL", func(o *herd.Options[int]) { o.HardTTL = o.SoftTTL - 1 }, "HardTTL"},
		{"Jitter 1", func(o *herd.Options[int]) { o.Jitter = 1 }, "Jitter"},
		{"Jitter 1.5", func(o *herd.Options[int]) { o.Jitter = 1.5 }, "Jitter"},
		{"MaxEntries with MaxWeight", func(o *herd.Options[int]) { o.MaxWeight, o.Weigher = 10, func(string, int) uint32 { return 1 } }, "MaxEntries"},
		{"MaxWeight without Weigher", func(o *herd.Options[int]) { o.MaxEntries, o.MaxWeight = 0, 10 }, "Weigher"},
		{"Weigher without MaxWeight", func(o *herd.Options[int]) { o.Weigher = func(string, int) uint32 { return 1 } }, "MaxWeight"},
		{"HotKeys -1", func(o *herd.Options[int]) { o.HotKeys = -1 }, "HotKeys"},
		{"MaxBatch -1", func(o *herd.Options[int]) { o.MaxBatch = -1 }, "MaxBatch"},
		{"BreakerThreshold -1", func(o *herd.Options[int]) { o.BreakerThreshold = -1 }, "BreakerThreshold"},
		{"Recorder for no cache", func(o *herd.Options[int]) { o.Recorder = nilForCache{} }, "Recorder"},
		{"Jitter -0.1", func(o *herd.Options[int]) { o.Jitter = -0.1 }, "Jitter"},
		{"Jitter NaN", func(o *herd.Options[int]) { o.Jitter = math.NaN() }, "Jitter"},
		{"Jitter +Inf", func(o *herd.Options[int]) { o.Jitter = math.Inf(1) }, "Jitter"},
		{"Beta -1", func(o *herd.Options[int]) { o.Beta = -1 }, "Beta"},
		{"Beta NaN", func(o *herd.Options[int]) { o.Beta = math.NaN() }, "Beta"},
		{"Beta +Inf", func(o *herd.Options[int]) { o.Beta = math.Inf(1) }, "Beta"},
		{"NegativeTTL -1", func(o *herd.Options[int]) { o.NegativeTTL = -1 }, "NegativeTTL"},
		{"LoadTimeout -1", func(o *herd.Options[int]) { o.LoadTimeout = -1 }, "LoadTimeout"},
		{"RefreshBackoff -1", func(o *herd.Options[int]) { o.RefreshBackoff = -1 }, "RefreshBackoff"},
		{"NearTTL -1", func(o *herd.Options[int]) { o.NearTTL = -1 }, "NearTTL"},
		{"Lease without Store", func(o *herd.Options[int]) { o.Lease = nopLease{}; o.LeaseTTL = time.Second }, "Store"},
		{"LeaseTTL 0 with Lease", func(o *herd.Options[int]) {
			o.Store = nopStore{}
			o.Lease = nopLease{}
			o.NoNearCache, o.NoBreaker = true, true
		}, "LeaseTTL"},
		{"LeaseTTL -1", func(o *herd.Options[int]) { o.LeaseTTL = -1 }, "LeaseTTL"},
		{"LeaseWait -1", func(o *herd.Options[int]) { o.LeaseWait = -1 }, "LeaseWait"},
		{"unknown OnLeaseHeld", func(o *herd.Options[int]) { o.OnLeaseHeld = herd.FailFast + 1 }, "OnLeaseHeld"},
		{"BreakerCooldown 0 with threshold", func(o *herd.Options[int]) { o.BreakerThreshold = 3 }, "BreakerCooldown"},
		{"MaxRefreshAhead -1", func(o *herd.Options[int]) { o.MaxRefreshAhead = -1 }, "MaxRefreshAhead"},
		{"RefreshAheadHot -1", func(o *herd.Options[int]) { o.RefreshAheadHot = -1 }, "RefreshAheadHot"},
		{"RefreshAheadHot above MaxRefreshAhead", func(o *herd.Options[int]) { o.RefreshAheadHot, o.MaxRefreshAhead = 2, 1 }, "MaxRefreshAhead"},
		{"RefreshAheadHot without Load", func(o *herd.Options[int]) { o.RefreshAheadHot, o.MaxRefreshAhead = 1, 1 }, "needs Load"},
		{"ShareHotKeys -1", func(o *herd.Options[int]) { o.ShareHotKeys = -1 }, "ShareHotKeys"},
		{"ShareHotKeysEvery -1", func(o *herd.Options[int]) { o.ShareHotKeysEvery = -1 }, "ShareHotKeysEvery"},
		{"ShareHotKeys without Store", func(o *herd.Options[int]) { o.ShareHotKeys = 20 }, "HotSet"},
		{"ShareHotKeys with a Store that is no HotSet", func(o *herd.Options[int]) {
			o.Store = nopStore{}
			o.ShareHotKeys = 20
			o.NoNearCache, o.NoBreaker = true, true
		}, "HotSet"},
	}
	// Every duration above MaxTTL, and at the largest Duration, is refused by
	// name.
	for _, d := range []time.Duration{herd.MaxTTL + 1, math.MaxInt64} {
		for name, field := range map[string]func(*herd.Options[int]) *time.Duration{
			"SoftTTL":           func(o *herd.Options[int]) *time.Duration { return &o.SoftTTL },
			"HardTTL":           func(o *herd.Options[int]) *time.Duration { return &o.HardTTL },
			"NegativeTTL":       func(o *herd.Options[int]) *time.Duration { return &o.NegativeTTL },
			"LoadTimeout":       func(o *herd.Options[int]) *time.Duration { return &o.LoadTimeout },
			"RefreshBackoff":    func(o *herd.Options[int]) *time.Duration { return &o.RefreshBackoff },
			"NearTTL":           func(o *herd.Options[int]) *time.Duration { return &o.NearTTL },
			"LeaseTTL":          func(o *herd.Options[int]) *time.Duration { return &o.LeaseTTL },
			"LeaseWait":         func(o *herd.Options[int]) *time.Duration { return &o.LeaseWait },
			"BreakerCooldown":   func(o *herd.Options[int]) *time.Duration { return &o.BreakerCooldown },
			"ShareHotKeysEvery": func(o *herd.Options[int]) *time.Duration { return &o.ShareHotKeysEvery },
		} {
			cases = append(cases, struct {
				name   string
				modify func(*herd.Options[int])
				want   string
			}{fmt.Sprintf("%s %d", name, d), func(o *herd.Options[int]) {
				if name == "SoftTTL" {
					o.HardTTL = 0
				}
				*field(o) = d
			}, name + " must not exceed MaxTTL"})
		}
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			o := testOptions()
			tc.modify(o)
			before := *o
			c, p, err := newNoPanic(o)
			if p != nil {
				t.Fatalf("New panicked: %v", p)
			}
			if err == nil {
				c.Close(context.Background())
				t.Fatal("New accepted the options")
			}
			if c != nil {
				t.Errorf("New returned a cache with error %v", err)
			}
			if lines := strings.Split(err.Error(), "\n"); len(lines) != 1 {
				t.Errorf("error %q has %d lines, want one: one option is wrong", err, len(lines))
			}
			for line := range strings.SplitSeq(err.Error(), "\n") {
				if !strings.HasPrefix(line, "herd: ") {
					t.Errorf("error line %q lacks the herd: prefix", line)
				}
				for _, f := range optionFields {
					if n := len(f.FindAllStringIndex(line, -1)); n > 1 {
						t.Errorf("error line %q names %s %d times, want once", line, f, n)
					}
				}
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error %q does not name %s", err, tc.want)
			}
			if !sameOptions(*o, before) {
				t.Errorf("New changed the invalid Options: %+v, was %+v", *o, before)
			}
		})
	}
}

// optionFields matches each field name of Options as a word, in any case
// ("Jitter: jitter: fraction" names Jitter twice).
var optionFields = func() []*regexp.Regexp {
	var res []*regexp.Regexp
	for f := range reflect.TypeFor[herd.Options[int]]().Fields() {
		res = append(res, regexp.MustCompile(`(?i)\b`+f.Name+`\b`))
	}
	return res
}()

// nilForCache is a CacheRecorder whose ForCache returns nil, which New
// refuses.
type nilForCache struct{ observe.NopRecorder }

func (nilForCache) ForCache(string) observe.Recorder { return nil }

// sameOptions is reflect.DeepEqual with NaN equal to NaN, and any two
// Weighers equal (functions are never DeepEqual).
func sameOptions(a, b herd.Options[int]) bool {
	if (a.Weigher == nil) != (b.Weigher == nil) {
		return false
	}
	a.Weigher, b.Weigher = nil, nil
	for _, f := range []struct{ x, y *float64 }{{&a.Jitter, &b.Jitter}, {&a.Beta, &b.Beta}} {
		if math.IsNaN(*f.x) && math.IsNaN(*f.y) {
			*f.x, *f.y = 0, 0
		}
	}
	return reflect.DeepEqual(a, b)
}

func TestNewDoesNotChangeOptions(t *testing.T) {
	load := func(context.Context, string) (int, error) { return 1, nil }
	// Every field New resolves a default for is left zero.
	o := &herd.Options[int]{
		NoNearCache: true,
		NoBreaker:   true,
		MaxEntries:  10,
		SoftTTL:     time.Second,
		Store:       nopStore{},
		Lease:       nopLease{},
		LeaseTTL:    time.Second,
		Load:        load,
	}
	before := *o
	c := newCache(t, o)
	if o.Load == nil || reflect.ValueOf(o.Load).Pointer() != reflect.ValueOf(before.Load).Pointer() {
		t.Error("New changed Options.Load")
	}
	if o.Executor != nil {
		t.Error("New set Options.Executor")
	}
	after := *o
	after.Load, before.Load = nil, nil
	if !reflect.DeepEqual(after, before) {
		t.Errorf("New changed the Options:\n got %+v\nwant %+v", after, before)
	}
	if c == nil {
		t.Fatal("nil cache")
	}
}

func TestDefaults(t *testing.T) {
	c, err := herd.New[int](nil)
	if err != nil {
		t.Fatalf("New(nil): %v", err)
	}
	defer c.Close(context.Background())
	if v, err := c.Get(context.Background(), "k", loadSeven); v != 7 || err != nil {
		t.Errorf("Get on New(nil) = %d, %v", v, err)
	}
	d := herd.DefaultOptions[int]()
	c2, err := herd.New(d)
	if err != nil {
		t.Fatalf("New(DefaultOptions()): %v", err)
	}
	c2.Close(context.Background())
	if d.RefreshBackoff != time.Second {
		t.Errorf("DefaultOptions RefreshBackoff = %v, want 1s: a failing refresh must not retry on every read", d.RefreshBackoff)
	}
	d.MaxEntries = 0
	if herd.DefaultOptions[int]().MaxEntries == 0 {
		t.Error("DefaultOptions returns shared state")
	}
}

func TestMust(t *testing.T) {
	c := newCache(t, testOptions())
	if got := herd.Must(c, nil); got != c {
		t.Error("Must(c, nil) did not return c")
	}
	defer func() {
		p := recover()
		err, ok := p.(error)
		if !ok || !strings.HasPrefix(err.Error(), "herd: ") {
			t.Errorf("Must on an error panicked with %v, want the herd: error", p)
		}
	}()
	herd.Must(herd.New(&herd.Options[int]{}))
	t.Error("Must did not panic on an error")
}

// 11. DisableCoalescing.

func TestDisableCoalescing(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		o := testOptions()
		o.DisableCoalescing = true
		c := newCache(t, o)
		gate := make(chan struct{})
		var loads atomic.Int64
		load := func(ctx context.Context) (int, error) {
			loads.Add(1)
			if err := hold(ctx, gate); err != nil {
				return 0, err
			}
			return 5, nil
		}
		const n = 20
		results := make([]<-chan result, n)
		for i := range results {
			ctx := context.Background()
			if i%2 == 0 {
				ctx = t.Context()
			}
			results[i] = getAsync(ctx, c, "k", load)
		}
		synctest.Wait()
		if got := loads.Load(); got != n {
			t.Errorf("%d loads running for %d concurrent misses, want %d", got, n, n)
		}
		close(gate)
		for _, ch := range results {
			if r := recv(t, ch); r.v != 5 || r.err != nil {
				t.Errorf("Get = %d, %v", r.v, r.err)
			}
		}
		if st := c.Stats(); st.Coalesced != 0 {
			t.Errorf("Coalesced = %d, want 0", st.Coalesced)
		}
	})
}

// 12. Close.

func TestClosedCacheRefusesCalls(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := newCache(t, testOptions())
		load, loads := counting()
		mustGet(t, c, "k", load, 1)
		if err := c.Close(t.Context()); err != nil {
			t.Fatalf("Close: %v", err)
		}
		if _, err := c.Get(bounded(t), "k", load); !errors.Is(err, herd.ErrClosed) {
			t.Errorf("Get after Close: %v, want ErrClosed", err)
		}
		if _, err := c.Get(bounded(t), "other", load); !errors.Is(err, herd.ErrClosed) {
			t.Errorf("Get of a missing key after Close: %v, want ErrClosed", err)
		}
		if err := c.Set(t.Context(), "k", 9); !errors.Is(err, herd.ErrClosed) {
			t.Errorf("Set after Close: %v, want ErrClosed", err)
		}
		if err := c.Invalidate(t.Context(), "k"); !errors.Is(err, herd.ErrClosed) {
			t.Errorf("Invalidate after Close: %v, want ErrClosed", err)
		}
		if n := loads.Load(); n != 1 {
			t.Errorf("%d loads, want 1", n)
		}
		if err := c.Close(t.Context()); err != nil {
			t.Errorf("second Close: %v", err)
		}
	})
}

func TestCloseCancelsAndWaitsForRefresh(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := newCache(t, testOptions())
		var loads atomic.Int64
		loadErr := make(chan error, 1)
		load := func(ctx context.Context) (int, error) {
			if loads.Add(1) == 1 {
				return 1, nil
			}
			<-ctx.Done() // a refresh that only ends when cancelled
			loadErr <- ctx.Err()
			return 0, ctx.Err()
		}
		mustGet(t, c, "k", load, 1)
		time.Sleep(testSoft)
		mustGet(t, c, "k", load, 1)
		synctest.Wait()
		if loads.Load() != 2 {
			t.Fatal("no background refresh started")
		}
		start := time.Now()
		if err := c.Close(t.Context()); err != nil {
			t.Fatalf("Close: %v", err)
		}
		if d := time.Since(start); d != 0 {
			t.Errorf("Close took %v, want it to cancel the refresh at once", d)
		}
		select {
		case err := <-loadErr:
			if !errors.Is(err, context.Canceled) {
				t.Errorf("the refresh's context ended with %v, want context.Canceled", err)
			}
		default:
			t.Fatal("Close returned before the refresh's load returned")
		}
		// Counted by the refresh after its load returned: Close waited for it.
		if st := c.Stats(); st.RefreshFailures != 1 {
			t.Errorf("RefreshFailures = %d when Close returned, want 1", st.RefreshFailures)
		}
	})
}

func TestCloseCancelsForegroundLoad(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := newCache(t, testOptions())
		load := func(ctx context.Context) (int, error) {
			<-ctx.Done()
			return 0, ctx.Err()
		}
		ch := getAsync(t.Context(), c, "k", load)
		synctest.Wait()
		if err := c.Close(t.Context()); err != nil {
			t.Fatalf("Close: %v", err)
		}
		synctest.Wait()
		r, ok := ready(ch)
		if !ok {
			t.Fatal("Get still waiting after Close")
		}
		if !errors.Is(r.err, context.Canceled) {
			t.Errorf("Get = %d, %v; want an error wrapping context.Canceled", r.v, r.err)
		}
	})
}

func TestCloseHonoursItsContext(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := newCache(t, testOptions())
		gate := make(chan struct{})
		release := sync.OnceFunc(func() { close(gate) })
		t.Cleanup(release) // before the cache closes, should the test fail early
		var loads atomic.Int64
		load := func(ctx context.Context) (int, error) {
			if loads.Add(1) > 1 {
				<-gate // ignores its context
			}
			return int(loads.Load()), nil
		}
		mustGet(t, c, "k", load, 1)
		time.Sleep(testSoft)
		mustGet(t, c, "k", load, 1)
		ctx, cancel := context.WithTimeout(t.Context(), time.Second)
		defer cancel()
		start := time.Now()
		closed := make(chan error, 1)
		go func() { closed <- c.Close(ctx) }()
		var err error
		select {
		case err = <-closed:
		case <-time.After(patience):
			t.Fatal("Close did not return when its ctx ended")
		}
		if !errors.Is(err, context.DeadlineExceeded) || !strings.HasPrefix(err.Error(), "herd: ") {
			t.Errorf("Close = %v, want a herd: error wrapping context.DeadlineExceeded", err)
		}
		if d := time.Since(start); d != time.Second {
			t.Errorf("Close returned after %v, want 1s", d)
		}
		release() // the bubble ends only once the refresh and Close's waiter are gone
	})
}

// TestCloseCancelsSynchronousRefresh runs in real time: a cache that blocks
// Close behind a synchronous refresh holds a mutex, which a synctest bubble
// cannot wait past (the test would hang instead of failing). The refresh is an
// XFetch early refresh, so no real time has to pass for it; the test waits on
// channels, and the timer only bounds a failure.
func TestCloseCancelsSynchronousRefresh(t *testing.T) {
	o := &herd.Options[int]{
		MaxEntries:  10,
		SoftTTL:     time.Hour,
		Beta:        1e18, // with the draw below, every hit refreshes early
		LoadTimeout: 30 * time.Second,
		Executor:    func(fn func()) { fn() },
	}
	c, err := herd.New(o)
	if err != nil {
		t.Fatal(err)
	}
	herd.SetDraws(c, func() float64 { return 1e-300 }, nil)
	var loads atomic.Int64
	started := make(chan struct{})
	loadErr := make(chan error, 1)
	load := func(ctx context.Context) (int, error) {
		if loads.Add(1) == 1 {
			// XFetch needs a measured load time above zero.
			for s := time.Now(); time.Since(s) == 0; {
			}
			return 1, nil
		}
		close(started)
		<-ctx.Done()
		loadErr <- ctx.Err()
		return 0, ctx.Err()
	}
	if _, err := c.Get(context.Background(), "k", load); err != nil {
		t.Fatal(err)
	}
	got := getAsync(context.Background(), c, "k", load) // refreshes on this goroutine
	<-started
	closed := make(chan error, 1)
	go func() { closed <- c.Close(context.Background()) }()
	select {
	case err := <-closed:
		if err != nil {
			t.Errorf("Close: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Close did not cancel a refresh running on a synchronous Executor")
	}
	if err := <-loadErr; !errors.Is(err, context.Canceled) {
		t.Errorf("the refresh's context ended with %v, want context.Canceled", err)
	}
	if r := <-got; r.v != 1 || r.err != nil {
		t.Errorf("Get = %d, %v; want 1", r.v, r.err)
	}
}

// 13. Invalidate and Set during a load.

func TestInvalidateDuringLoad(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := newCache(t, testOptions())
		for i := range 200 {
			var (
				joiners   = i % 3                   // callers that join the first load before Invalidate
				withNext  = i%2 == 0                // a caller arrives after Invalidate, during the first load
				nextFirst = (i/2)%2 == 0            // its load finishes before the first one
				bg        = (i/4)%2 == 0            // callers' ctx cannot end (the first runs the load itself)
				key       = []string{"a", "b"}[i%2] // reuse keys across iterations
			)
			ctx := t.Context()
			if bg {
				ctx = context.Background()
			}
			if err := c.Invalidate(ctx, key); err != nil {
				t.Fatal(err)
			}
			gates := []chan struct{}{make(chan struct{}), make(chan struct{}), make(chan struct{})}
			close(gates[2]) // a third load, if any, runs at once
			var loads atomic.Int64
			base := 1000 * (i + 1)
			load := func(ctx context.Context) (int, error) {
				n := loads.Add(1)
				if err := hold(ctx, gates[n-1]); err != nil {
					return 0, err
				}
				return base + int(n), nil
			}
			first := []<-chan result{getAsync(ctx, c, key, load)}
			synctest.Wait()
			for range joiners {
				first = append(first, getAsync(ctx, c, key, load))
			}
			synctest.Wait()
			if err := c.Invalidate(ctx, key); err != nil {
				t.Fatal(err)
			}
			var next <-chan result
			if withNext {
				next = getAsync(ctx, c, key, load)
				synctest.Wait()
				if n := loads.Load(); n != 2 {
					t.Fatalf("iteration %d: a caller after Invalidate joined the old load (%d loads)", i, n)
				}
			}
			if withNext && nextFirst {
				close(gates[1])
				synctest.Wait()
				close(gates[0])
			} else {
				close(gates[0])
				synctest.Wait()
				close(gates[1])
			}
			for _, ch := range first {
				if r := recv(t, ch); r.v != base+1 || r.err != nil {
					t.Fatalf("iteration %d: a caller of the first load got %d, %v", i, r.v, r.err)
				}
			}
			want := base + 2 // the next load's value, or a new load's
			if withNext {
				if r := recv(t, next); r.v != want || r.err != nil {
					t.Fatalf("iteration %d: the caller after Invalidate got %d, %v; want %d", i, r.v, r.err, want)
				}
			}
			synctest.Wait()
			v, err := c.Get(ctx, key, load)
			if err != nil || v != want {
				t.Fatalf("iteration %d: Get after the loads = %d, %v; want %d (the invalidated load's %d must not be cached)", i, v, err, want, base+1)
			}
			if n := loads.Load(); n != 2 {
				t.Fatalf("iteration %d: %d loads, want 2", i, n)
			}
		}
	})
}

func TestSetDuringLoad(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := newCache(t, testOptions())
		gate := make(chan struct{})
		var loads atomic.Int64
		load := func(ctx context.Context) (int, error) {
			loads.Add(1)
			if err := hold(ctx, gate); err != nil {
				return 0, err
			}
			return 1, nil
		}
		ch := getAsync(t.Context(), c, "k", load)
		synctest.Wait()
		if err := c.Set(t.Context(), "k", 99); err != nil {
			t.Fatal(err)
		}
		mustGet(t, c, "k", load, 99)
		close(gate)
		if r := recv(t, ch); r.v != 1 || r.err != nil {
			t.Fatalf("the caller of the load got %d, %v; want its value 1", r.v, r.err)
		}
		synctest.Wait()
		mustGet(t, c, "k", load, 99) // the load's value did not overwrite the Set
		if n := loads.Load(); n != 1 {
			t.Errorf("%d loads, want 1", n)
		}
	})
}
