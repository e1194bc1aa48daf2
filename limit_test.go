package herd_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/herdcache/herd"
	"github.com/herdcache/herd/limiter"
	"github.com/herdcache/herd/memory"
)

// Behaviour tests of the limiter inside the cache: the cap on concurrent
// loads, shedding, the reserve for foreground misses, priorities, and Warm.
// Everything runs in a synctest bubble; loads are held by channels or take
// fake time.

const (
	limSoft = 10 * time.Second
	limHard = 20 * time.Second
)

// limCache returns a single-process cache using l (nil: no limiter), closed
// when the test (or bubble) ends.
func limCache(t *testing.T, l *limiter.Limiter) *herd.Cache[int] {
	t.Helper()
	return newCache(t, &herd.Options[int]{
		MaxEntries: 5000,
		SoftTTL:    limSoft,
		HardTTL:    limHard,
		Limiter:    l,
	})
}

func limLimiter(t *testing.T, o limiter.Options) *limiter.Limiter {
	t.Helper()
	l, err := limiter.New(o)
	if err != nil {
		t.Fatalf("limiter.New: %v", err)
	}
	return l
}

// limPeak measures how many calls run at once.
type limPeak struct {
	now, max atomic.Int64
}

func (p *limPeak) enter() {
	n := p.now.Add(1)
	for {
		m := p.max.Load()
		if n <= m || p.max.CompareAndSwap(m, n) {
			return
		}
	}
}

func (p *limPeak) leave() { p.now.Add(-1) }

type limResult struct {
	v   int
	err error
}

// limGetAsync runs Get on a new goroutine and hands its result to the
// channel.
func limGetAsync(ctx context.Context, c *herd.Cache[int], key string, load herd.LoadFunc[int]) <-chan limResult {
	ch := make(chan limResult, 1)
	go func() {
		v, err := c.Get(ctx, key, load)
		ch <- limResult{v, err}
	}()
	return ch
}

// limGate is a load that records the order loads start in and blocks until
// its gate is opened.
type limGate struct {
	mu    sync.Mutex
	order []string
	gate  chan struct{}
	open  func()
}

func newLimGate(t *testing.T) *limGate {
	g := &limGate{gate: make(chan struct{})}
	g.open = sync.OnceFunc(func() { close(g.gate) })
	t.Cleanup(g.open)
	return g
}

// load returns a load for key that records key and, if wait, blocks until
// the gate opens; it returns v.
func (g *limGate) load(key string, v int, wait bool) herd.LoadFunc[int] {
	return func(context.Context) (int, error) {
		g.mu.Lock()
		g.order = append(g.order, key)
		g.mu.Unlock()
		if wait {
			<-g.gate
		}
		return v, nil
	}
}

func (g *limGate) started() []string {
	g.mu.Lock()
	defer g.mu.Unlock()
	return slices.Clone(g.order)
}

// 8. The cap.

func TestLimitCapsConcurrentLoads(t *testing.T) {
	const keys, limit = 1000, 8
	for _, tt := range []struct {
		name    string
		limited bool
	}{
		{"limited", true},
		{"control without limiter", false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				var l *limiter.Limiter
				if tt.limited {
					l = limLimiter(t, limiter.Options{Limit: limit})
				}
				c := limCache(t, l)
				var peak limPeak
				var wg sync.WaitGroup
				for i := range keys {
					wg.Go(func() {
						v, err := c.Get(t.Context(), fmt.Sprint("k", i), func(context.Context) (int, error) {
							peak.enter()
							defer peak.leave()
							time.Sleep(10 * time.Millisecond)
							return i, nil
						})
						if err != nil || v != i {
							t.Errorf("Get(k%d) = %d, %v; want %d, nil", i, v, err, i)
						}
					})
				}
				wg.Wait()
				got := peak.max.Load()
				if tt.limited {
					if got > limit {
						t.Errorf("%d loads ran at once, want at most %d", got, limit)
					}
					if got < limit {
						t.Errorf("at most %d loads ran at once; want the limiter to let %d run", got, limit)
					}
					if st := c.Stats(); st.Loads != keys || st.Shed != 0 {
						t.Errorf("Stats: Loads %d, Shed %d; want %d and 0", st.Loads, st.Shed, keys)
					}
				} else if got != keys {
					t.Errorf("without a limiter %d loads ran at once, want %d", got, keys)
				}
			})
		})
	}
}

// 9. Queue timeout.

func TestLimitQueueTimeoutSheds(t *testing.T) {
	const timeout = 100 * time.Millisecond
	synctest.Test(t, func(t *testing.T) {
		l := limLimiter(t, limiter.Options{Limit: 1, QueueTimeout: timeout})
		c := limCache(t, l)
		g := newLimGate(t)
		held := limGetAsync(t.Context(), c, "held", g.load("held", 1, true))
		synctest.Wait()

		var called atomic.Bool
		start := time.Now()
		_, err := c.Get(t.Context(), "other", func(context.Context) (int, error) {
			called.Store(true)
			return 2, nil
		})
		if waited := time.Since(start); waited != timeout {
			t.Errorf("the shed Get waited %v, want the QueueTimeout %v", waited, timeout)
		}
		if !errors.Is(err, herd.ErrOverloaded) {
			t.Fatalf("Get = %v; want an error matching ErrOverloaded", err)
		}
		var oe *limiter.OverloadError
		if !errors.As(err, &oe) || oe.Reason != limiter.ReasonQueueTimeout {
			t.Errorf("Get error %v; want an *OverloadError with reason %q", err, limiter.ReasonQueueTimeout)
		}
		if called.Load() {
			t.Error("the shed Get called its load")
		}
		if n := c.Stats().Shed; n != 1 {
			t.Errorf("Stats().Shed = %d, want 1", n)
		}

		g.open()
		if r := <-held; r.err != nil || r.v != 1 {
			t.Fatalf("held Get = %d, %v; want 1, nil", r.v, r.err)
		}
		// The error was not cached: with the slot free the key loads.
		if v, err := c.Get(t.Context(), "other", g.load("other", 2, false)); err != nil || v != 2 {
			t.Errorf("Get after the slot freed = %d, %v; want 2, nil", v, err)
		}
	})
}

// 10. The reserve.

func TestLimitReserveShedsBackgroundRefresh(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		l := limLimiter(t, limiter.Options{Limit: 4, Reserve: 1})
		c := limCache(t, l)
		if v, err := c.Get(t.Context(), "s", func(context.Context) (int, error) { return 1, nil }); err != nil || v != 1 {
			t.Fatalf("Get(s) = %d, %v; want 1, nil", v, err)
		}
		time.Sleep(limSoft + time.Second) // s is stale

		g := newLimGate(t)
		var held []<-chan limResult
		for i := range 3 {
			key := fmt.Sprint("f", i)
			held = append(held, limGetAsync(t.Context(), c, key, g.load(key, 10+i, true)))
		}
		synctest.Wait()
		if n := l.InUse(); n != 3 {
			t.Fatalf("%d slots in use, want 3 (Limit - Reserve)", n)
		}

		var refreshes atomic.Int64
		refresh := func(context.Context) (int, error) {
			refreshes.Add(1)
			return 2, nil
		}
		if v, err := c.Get(t.Context(), "s", refresh); err != nil || v != 1 {
			t.Errorf("stale Get(s) = %d, %v; want the stale 1, nil", v, err)
		}
		synctest.Wait() // the background refresh has given up
		if n := refreshes.Load(); n != 0 {
			t.Errorf("the background refresh loaded %d times while only reserved slots were free; want 0", n)
		}
		st := c.Stats()
		if st.StaleRefreshes != 1 || st.Shed != 1 || st.RefreshFailures != 0 {
			t.Errorf("Stats: StaleRefreshes %d, Shed %d, RefreshFailures %d; want 1, 1, 0", st.StaleRefreshes, st.Shed, st.RefreshFailures)
		}
		if n := l.Stats().ShedReserve; n != 1 {
			t.Errorf("limiter ShedReserve = %d, want 1", n)
		}

		// A foreground miss takes the reserved slot.
		v, err := c.Get(t.Context(), "f3", func(context.Context) (int, error) {
			if n := l.InUse(); n != 4 {
				t.Errorf("%d slots in use during the foreground miss, want 4", n)
			}
			return 13, nil
		})
		if err != nil || v != 13 {
			t.Errorf("foreground Get(f3) = %d, %v; want 13, nil", v, err)
		}

		g.open()
		for i, ch := range held {
			if r := <-ch; r.err != nil || r.v != 10+i {
				t.Errorf("Get(f%d) = %d, %v; want %d, nil", i, r.v, r.err, 10+i)
			}
		}
		// The shed refresh backs off for the limiter's RetryAfter: a stale
		// read before it has passed starts no refresh.
		if v, err := c.Get(t.Context(), "s", refresh); err != nil || v != 1 {
			t.Errorf("stale Get(s) = %d, %v; want the stale 1, nil", v, err)
		}
		synctest.Wait()
		if n := refreshes.Load(); n != 0 {
			t.Errorf("a stale read during the back-off refreshed %d times, want 0", n)
		}
		time.Sleep(l.RetryAfter())
		// With slots free again the next stale read refreshes.
		if v, err := c.Get(t.Context(), "s", refresh); err != nil || v != 1 {
			t.Errorf("stale Get(s) = %d, %v; want the stale 1, nil", v, err)
		}
		synctest.Wait()
		if n := refreshes.Load(); n != 1 {
			t.Errorf("with free slots the refresh loaded %d times, want 1", n)
		}
		if v, err := c.Get(t.Context(), "s", refresh); err != nil || v != 2 {
			t.Errorf("Get(s) after the refresh = %d, %v; want 2, nil", v, err)
		}
	})
}

// 11. Priorities.

func TestLimitPriorityInContext(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		l := limLimiter(t, limiter.Options{Limit: 1})
		c := limCache(t, l)
		g := newLimGate(t)
		ctx := t.Context()
		hold := limGetAsync(ctx, c, "hold", g.load("hold", 0, true))
		synctest.Wait()
		low := limGetAsync(limiter.WithPriority(ctx, limiter.Low), c, "low", g.load("low", 1, false))
		synctest.Wait()
		high := limGetAsync(limiter.WithPriority(ctx, limiter.High), c, "high", g.load("high", 2, false))
		synctest.Wait()
		if n := l.Waiting(); n != 2 {
			t.Fatalf("%d Gets waiting for the slot, want 2", n)
		}
		g.open()
		for _, ch := range []<-chan limResult{hold, low, high} {
			if r := <-ch; r.err != nil {
				t.Errorf("Get: %v", r.err)
			}
		}
		if got, want := g.started(), []string{"hold", "high", "low"}; !slices.Equal(got, want) {
			t.Errorf("loads started in order %q, want %q", got, want)
		}
	})
}

// A coalesced load waits with its first caller's priority: a High caller
// that joins a Low one does not raise it.
func TestLimitCoalescedLoadKeepsFirstPriority(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		l := limLimiter(t, limiter.Options{Limit: 1})
		c := limCache(t, l)
		g := newLimGate(t)
		ctx := t.Context()
		hold := limGetAsync(ctx, c, "hold", g.load("hold", 0, true))
		synctest.Wait()
		lowX := limGetAsync(limiter.WithPriority(ctx, limiter.Low), c, "x", g.load("x", 1, false))
		synctest.Wait()
		highX := limGetAsync(limiter.WithPriority(ctx, limiter.High), c, "x", g.load("x-high", 1, false))
		synctest.Wait()
		normalY := limGetAsync(ctx, c, "y", g.load("y", 2, false))
		synctest.Wait()
		if n := l.Waiting(); n != 2 {
			t.Fatalf("%d loads waiting for the slot, want 2 (x once, y)", n)
		}
		g.open()
		for _, ch := range []<-chan limResult{hold, lowX, highX, normalY} {
			if r := <-ch; r.err != nil {
				t.Errorf("Get: %v", r.err)
			}
		}
		if got, want := g.started(), []string{"hold", "y", "x"}; !slices.Equal(got, want) {
			t.Errorf("loads started in order %q, want %q", got, want)
		}
	})
}

// 12. MaxQueue.

func TestLimitMaxQueueShedsLowAtOnce(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		l := limLimiter(t, limiter.Options{Limit: 1, MaxQueue: 2})
		c := limCache(t, l)
		g := newLimGate(t)
		ctx := t.Context()
		lowCtx := limiter.WithPriority(ctx, limiter.Low)
		waiting := []<-chan limResult{
			limGetAsync(ctx, c, "hold", g.load("hold", 0, true)),
		}
		synctest.Wait()
		// A Low Get waits while the queue is below MaxQueue.
		waiting = append(waiting, limGetAsync(lowCtx, c, "low1", g.load("low1", 1, false)))
		synctest.Wait()
		waiting = append(waiting, limGetAsync(ctx, c, "normal1", g.load("normal1", 2, false)))
		synctest.Wait()
		if n := l.Waiting(); n != 2 {
			t.Fatalf("%d Gets waiting, want 2", n)
		}

		var called atomic.Bool
		start := time.Now()
		_, err := c.Get(lowCtx, "low2", func(context.Context) (int, error) {
			called.Store(true)
			return 3, nil
		})
		if d := time.Since(start); d != 0 {
			t.Errorf("the Low Get beyond MaxQueue waited %v, want 0", d)
		}
		var oe *limiter.OverloadError
		if !errors.Is(err, herd.ErrOverloaded) || !errors.As(err, &oe) || oe.Reason != limiter.ReasonQueueFull {
			t.Errorf("Low Get beyond MaxQueue = %v; want ErrOverloaded with reason %q", err, limiter.ReasonQueueFull)
		}
		if called.Load() {
			t.Error("the shed Get called its load")
		}
		if n := c.Stats().Shed; n != 1 {
			t.Errorf("Stats().Shed = %d, want 1", n)
		}

		// Normal and High Gets still wait.
		waiting = append(waiting,
			limGetAsync(ctx, c, "normal2", g.load("normal2", 4, false)),
			limGetAsync(limiter.WithPriority(ctx, limiter.High), c, "high", g.load("high", 5, false)))
		synctest.Wait()
		if n := l.Waiting(); n != 4 {
			t.Errorf("%d Gets waiting, want 4", n)
		}
		g.open()
		for _, ch := range waiting {
			if r := <-ch; r.err != nil {
				t.Errorf("Get: %v", r.err)
			}
		}
	})
}

// A lease loser waits for the holder without a limiter slot: with the one
// slot of a limiter shared by two replicas held by the lease holder, the
// loser is neither queued nor shed, and gets the holder's value.
func TestLimitLeaseLoserHoldsNoSlot(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		l := limLimiter(t, limiter.Options{Limit: 1, QueueTimeout: 100 * time.Millisecond})
		r := memory.New()
		replica := func() *herd.Cache[int] {
			c, err := herd.New(&herd.Options[int]{
				NoNearCache: true,
				NoBreaker:   true,
				MaxEntries:  100,
				SoftTTL:     limSoft,
				Limiter:     l,
				Store:       r,
				Lease:       r,
				LeaseTTL:    5 * time.Second,
				OnLeaseHeld: herd.Wait,
				LeaseWait:   time.Minute,
			})
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
		a, b := replica(), replica()
		g := newLimGate(t)
		resA := limGetAsync(t.Context(), a, "k", g.load("a", 1, true))
		synctest.Wait()
		resB := limGetAsync(t.Context(), b, "k", g.load("b", 2, false))
		time.Sleep(time.Second) // ten queue timeouts
		if n, w := l.InUse(), l.Waiting(); n != 1 || w != 0 {
			t.Errorf("%d slots in use, %d waiting while B waits for the lease; want 1 and 0", n, w)
		}
		g.open()
		for _, ch := range []<-chan limResult{resA, resB} {
			if res := <-ch; res.err != nil || res.v != 1 {
				t.Errorf("Get = %d, %v; want the holder's 1, nil", res.v, res.err)
			}
		}
		if got := g.started(); !slices.Equal(got, []string{"a"}) {
			t.Errorf("loads %q, want only the holder's", got)
		}
		if st := l.Stats(); st.Shed() != 0 || st.Acquired != 1 {
			t.Errorf("limiter: %d shed, %d acquired; want 0 and 1", st.Shed(), st.Acquired)
		}
	})
}

// 13. Warm.

func limKeys(n int) []string {
	keys := make([]string, n)
	for i := range keys {
		keys[i] = fmt.Sprint("w", i)
	}
	return keys
}

var errWarm = errors.New("warm load failed")

func TestLimitWarmCapsConcurrency(t *testing.T) {
	const n, limit = 1000, 8
	synctest.Test(t, func(t *testing.T) {
		l := limLimiter(t, limiter.Options{Limit: limit})
		c := limCache(t, l)
		var peak limPeak
		var loads atomic.Int64
		rep := c.Warm(t.Context(), limKeys(n), func(ctx context.Context, key string) (int, error) {
			loads.Add(1)
			peak.enter()
			defer peak.leave()
			time.Sleep(10 * time.Millisecond)
			return len(key), nil
		})
		if rep.Loaded != n || rep.Fresh != 0 || rep.Failed != 0 || len(rep.Errors) != 0 {
			t.Errorf("WarmReport = %+v; want Loaded %d only", rep, n)
		}
		if got := peak.max.Load(); got > limit || got < 1 {
			t.Errorf("%d loads ran at once, want 1 to %d", got, limit)
		}
		if got := loads.Load(); got != n {
			t.Errorf("%d loads, want %d", got, n)
		}
		for _, k := range []string{"w0", "w999"} {
			if v, err := c.Get(t.Context(), k, func(context.Context) (int, error) { return -1, nil }); err != nil || v != len(k) {
				t.Errorf("Get(%s) after Warm = %d, %v; want %d, nil", k, v, err, len(k))
			}
		}
	})
}

func TestLimitWarmFailuresAndFresh(t *testing.T) {
	const n = 1000
	synctest.Test(t, func(t *testing.T) {
		c := limCache(t, limLimiter(t, limiter.Options{Limit: 8}))
		keys := limKeys(n)
		failing := make(map[string]bool)
		for i := 0; i < n; i += 10 {
			failing[keys[i]] = true
		}
		var loads atomic.Int64
		load := func(ctx context.Context, key string) (int, error) {
			loads.Add(1)
			time.Sleep(time.Millisecond)
			if failing[key] {
				return 0, fmt.Errorf("%s: %w", key, errWarm)
			}
			return 1, nil
		}
		rep := c.Warm(t.Context(), keys, load)
		if rep.Loaded != n-len(failing) || rep.Fresh != 0 || rep.Failed != len(failing) {
			t.Errorf("WarmReport: Loaded %d, Fresh %d, Failed %d; want %d, 0, %d", rep.Loaded, rep.Fresh, rep.Failed, n-len(failing), len(failing))
		}
		checkErrors := func(rep herd.WarmReport) {
			t.Helper()
			if len(rep.Errors) != len(failing) {
				t.Errorf("%d errors reported, want %d", len(rep.Errors), len(failing))
			}
			for k, err := range rep.Errors {
				if !failing[k] || !errors.Is(err, errWarm) {
					t.Errorf("Errors[%q] = %v; want only the failing keys, with their load's error", k, err)
				}
			}
		}
		checkErrors(rep)

		// Again: the loaded keys are fresh and not loaded; errors were not cached.
		loads.Store(0)
		rep = c.Warm(t.Context(), keys, load)
		if rep.Loaded != 0 || rep.Fresh != n-len(failing) || rep.Failed != len(failing) {
			t.Errorf("second WarmReport: Loaded %d, Fresh %d, Failed %d; want 0, %d, %d", rep.Loaded, rep.Fresh, rep.Failed, n-len(failing), len(failing))
		}
		if got := loads.Load(); got != int64(len(failing)) {
			t.Errorf("second Warm loaded %d keys, want only the %d that failed", got, len(failing))
		}
		checkErrors(rep)
	})
}

func TestLimitWarmStopsWhenCancelled(t *testing.T) {
	const n, cancelAt, limit = 1000, 50, 8
	t.Run("during", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			c := limCache(t, limLimiter(t, limiter.Options{Limit: limit}))
			ctx, cancel := context.WithCancel(t.Context())
			defer cancel()
			var loads atomic.Int64
			rep := c.Warm(ctx, limKeys(n), func(context.Context, string) (int, error) {
				if loads.Add(1) == cancelAt {
					cancel()
				}
				time.Sleep(time.Millisecond)
				return 1, nil
			})
			// Loads that callers left keep running to completion; let them.
			time.Sleep(time.Second)
			synctest.Wait()
			got := loads.Load()
			if got < cancelAt || got >= cancelAt+limit {
				t.Errorf("%d loads; want Warm to stop within %d of the cancellation at %d", got, limit, cancelAt)
			}
			if rep.Loaded+rep.Fresh+rep.Failed != n || rep.Failed < n-int(got) || rep.Loaded > int(got) {
				t.Errorf("WarmReport: Loaded %d, Fresh %d, Failed %d after %d loads; want every key reported and the unreached ones failed", rep.Loaded, rep.Fresh, rep.Failed, got)
			}
			for k, err := range rep.Errors {
				if !errors.Is(err, context.Canceled) {
					t.Errorf("Errors[%q] = %v; want context.Canceled", k, err)
				}
			}
		})
	})
	t.Run("before", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			c := limCache(t, limLimiter(t, limiter.Options{Limit: limit}))
			ctx, cancel := context.WithCancel(t.Context())
			cancel()
			var loads atomic.Int64
			rep := c.Warm(ctx, limKeys(n), func(context.Context, string) (int, error) {
				loads.Add(1)
				return 1, nil
			})
			if loads.Load() != 0 || rep.Failed != n || len(rep.Errors) != n {
				t.Errorf("cancelled Warm: %d loads, report %d failed, %d errors; want 0, %d, %d", loads.Load(), rep.Failed, len(rep.Errors), n, n)
			}
		})
	})
}

// 14. HTTP.

func TestLimitWriteOverloadedFromGet(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		l := limLimiter(t, limiter.Options{Limit: 1, QueueTimeout: 1500 * time.Millisecond})
		c := limCache(t, l)
		g := newLimGate(t)
		held := limGetAsync(t.Context(), c, "held", g.load("held", 1, true))
		synctest.Wait()
		_, err := c.Get(t.Context(), "other", g.load("other", 2, false))

		rec := httptest.NewRecorder()
		if !herd.WriteOverloaded(rec, fmt.Errorf("handler: %w", err)) {
			t.Fatalf("WriteOverloaded(%v) = false, want true", err)
		}
		if rec.Code != http.StatusServiceUnavailable {
			t.Errorf("status %d, want 503", rec.Code)
		}
		if got := rec.Header().Get("Retry-After"); got != "2" {
			t.Errorf("Retry-After %q, want \"2\" (1.5s rounded up)", got)
		}

		g.open()
		<-held

		// A Get that failed for another reason writes nothing.
		_, err = c.Get(t.Context(), "broken", func(context.Context) (int, error) { return 0, errWarm })
		rec = httptest.NewRecorder()
		if herd.WriteOverloaded(rec, err) || rec.Header().Get("Retry-After") != "" {
			t.Errorf("WriteOverloaded(%v) wrote a 503; want nothing", err)
		}
	})
}
