package herd_test

import (
	"context"
	"errors"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/herdcache/herd"
	"github.com/herdcache/herd/flight"
	"github.com/herdcache/herd/limiter"
	"github.com/herdcache/herd/memory"
)

// checkOutward fails the test unless err is an error a Cache method may
// return: its text starts with "herd: " and names neither of the packages
// herd uses inside (flight, limiter), and errors.Is finds each of is.
func checkOutward(t *testing.T, path string, err error, is ...error) {
	t.Helper()
	if err == nil {
		t.Errorf("%s: no error", path)
		return
	}
	msg := err.Error()
	if !strings.HasPrefix(msg, "herd: ") || strings.Contains(msg, "flight:") || strings.Contains(msg, "limiter:") {
		t.Errorf("%s: error %q; want one that starts with herd: and names no internal package", path, msg)
	}
	for _, target := range is {
		if !errors.Is(err, target) {
			t.Errorf("%s: error %q does not wrap %v", path, msg, target)
		}
	}
}

var errBoom = errors.New("boom")

// Every way an error of the flight or the limiter reaches a caller of Get,
// GetMany or Warm says herd: and keeps errors.Is and errors.As working.
func TestCacheErrorsSayHerd(t *testing.T) {
	panicky := func(context.Context) (int, error) { panic(errBoom) }
	goexit := func(context.Context) (int, error) { runtime.Goexit(); return 0, nil }
	batchPanics := func(context.Context, []string) (map[string]int, error) { panic(errBoom) }

	t.Run("load panics", func(t *testing.T) {
		for _, alone := range []bool{false, true} {
			o := testOptions()
			o.DisableCoalescing = alone
			c := newCache(t, o)
			_, err := c.Get(bounded(t), "k", panicky)
			checkOutward(t, "Get", err, errBoom)
			var pe *flight.PanicError
			if !errors.As(err, &pe) || pe.Value != errBoom || len(pe.Stack) == 0 {
				t.Errorf("Get: errors.As finds no *flight.PanicError with the value and a stack in %v", err)
			}
			if want := `herd: get "k": load panicked: boom`; err.Error() != want {
				t.Errorf("Get: %q, want %q", err, want)
			}
			items := c.GetMany(bounded(t), []string{"a", "b"}, batchPanics)
			for _, it := range items {
				checkOutward(t, "GetMany", it.Err, errBoom)
			}
			rep := c.Warm(bounded(t), []string{"w"}, func(context.Context, string) (int, error) { panic(errBoom) })
			checkOutward(t, "Warm", rep.Errors["w"], errBoom)
		}
	})

	t.Run("load calls Goexit", func(t *testing.T) {
		c := newCache(t, testOptions())
		_, err := c.Get(bounded(t), "k", goexit)
		checkOutward(t, "Get", err, flight.ErrGoexit)
		items := c.GetMany(bounded(t), []string{"a"}, func(context.Context, []string) (map[string]int, error) {
			runtime.Goexit()
			return nil, nil
		})
		checkOutward(t, "GetMany", items[0].Err, flight.ErrGoexit)
	})

	t.Run("caller's context ends", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			c := newCache(t, testOptions())
			gate := make(chan struct{})
			defer close(gate)
			held := func(ctx context.Context) (int, error) { return 1, hold(ctx, gate) }
			heldMany := func(ctx context.Context, keys []string) (map[string]int, error) {
				return map[string]int{}, hold(ctx, gate)
			}
			for _, first := range []bool{true, false} { // the caller started the load, or joined it
				key := map[bool]string{true: "starter", false: "joiner"}[first]
				if !first {
					getAsync(t.Context(), c, key, held)
					synctest.Wait()
				}
				ctx, cancel := context.WithCancelCause(t.Context())
				ch := getAsync(ctx, c, key, held)
				synctest.Wait()
				cancel(errBoom)
				checkOutward(t, "Get ("+key+")", recv(t, ch).err, context.Canceled, errBoom)

				mctx, mcancel := context.WithCancel(t.Context())
				done := make(chan []herd.Item[int])
				go func() { done <- c.GetMany(mctx, []string{key + "-many"}, heldMany) }()
				synctest.Wait()
				mcancel()
				checkOutward(t, "GetMany ("+key+")", (<-done)[0].Err, context.Canceled)
			}
			ctx, cancel := context.WithCancel(t.Context())
			cancel()
			rep := c.Warm(ctx, []string{"w"}, nil)
			checkOutward(t, "Warm (not reached)", rep.Errors["w"], context.Canceled)
		})
	})

	t.Run("limiter sheds", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			l, err := limiter.New(limiter.Options{Limit: 1, QueueTimeout: time.Second})
			if err != nil {
				t.Fatal(err)
			}
			o := testOptions()
			o.Limiter = l
			c := newCache(t, o)
			gate := make(chan struct{})
			defer close(gate)
			getAsync(t.Context(), c, "slot", func(ctx context.Context) (int, error) { return 1, hold(ctx, gate) })
			synctest.Wait()
			_, err = c.Get(bounded(t), "k", loadSeven)
			checkOutward(t, "Get", err, herd.ErrOverloaded)
			var oe *limiter.OverloadError
			if !errors.As(err, &oe) || oe.Reason != limiter.ReasonQueueTimeout {
				t.Errorf("Get: errors.As finds no *limiter.OverloadError of a queue timeout in %v", err)
			}
			items := c.GetMany(bounded(t), []string{"m"}, func(context.Context, []string) (map[string]int, error) { return nil, nil })
			checkOutward(t, "GetMany", items[0].Err, herd.ErrOverloaded)
		})
	})

	t.Run("load's time ends in the limiter's queue", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			l, err := limiter.New(limiter.Options{Limit: 1}) // waits for as long as the load may
			if err != nil {
				t.Fatal(err)
			}
			o := testOptions()
			o.Limiter = l
			o.LoadTimeout = time.Second
			c := newCache(t, o)
			gate := make(chan struct{})
			defer close(gate)
			getAsync(t.Context(), c, "slot", func(ctx context.Context) (int, error) { return 1, hold(context.Background(), gate) })
			synctest.Wait()
			_, err = c.Get(bounded(t), "k", loadSeven)
			checkOutward(t, "Get", err, context.DeadlineExceeded)
		})
	})

	t.Run("lease loser's context ends", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			r := memory.New()
			a := fleetReplica(t, r, nil)
			b := fleetReplica(t, r, func(o *herd.Options[int]) { o.OnLeaseHeld = herd.Wait })
			gate := make(chan struct{})
			defer close(gate)
			getAsync(t.Context(), a, "k", func(ctx context.Context) (int, error) { return 1, hold(ctx, gate) })
			synctest.Wait()
			ctx, cancel := context.WithCancel(t.Context())
			ch := getAsync(ctx, b, "k", loadSeven)
			synctest.Wait()
			cancel()
			checkOutward(t, "Get (lease loser)", recv(t, ch).err, context.Canceled)
		})
	})
}

// failingStore is a Store, Staler and Clearer whose every call fails.
type failingStore struct{}

func (failingStore) Load(context.Context, string) ([]byte, error) { return nil, errBoom }
func (failingStore) Write(context.Context, string, []byte, uint64, time.Duration) (bool, error) {
	return false, errBoom
}
func (failingStore) Set(context.Context, string, []byte, time.Duration) (uint64, error) {
	return 0, errBoom
}
func (failingStore) Invalidate(context.Context, string) error          { return errBoom }
func (failingStore) MarkStale(context.Context, string) (uint64, error) { return 0, errBoom }
func (failingStore) InvalidateAll(context.Context) error               { return errBoom }

// failingCodec cannot encode.
type failingCodec struct{ herd.Codec[int] }

func (failingCodec) Marshal(int) ([]byte, error) { return nil, errBoom }

// The changes' errors say herd: and wrap what failed.
func TestChangeErrorsSayHerd(t *testing.T) {
	ctx := bounded(t)
	o := testOptions()
	o.Store, o.NoNearCache, o.NoBreaker = failingStore{}, true, true
	c := newCache(t, o)
	checkOutward(t, "Set", c.Set(ctx, "k", 1), herd.ErrDegraded, errBoom)
	checkOutward(t, "SetWithTTL", c.SetWithTTL(ctx, "k", 1, time.Second, 0), herd.ErrDegraded, errBoom)
	checkOutward(t, "Invalidate", c.Invalidate(ctx, "k"), herd.ErrDegraded, errBoom)
	checkOutward(t, "InvalidateAll", c.InvalidateAll(ctx), herd.ErrDegraded, errBoom)
	checkOutward(t, "MarkStale", c.MarkStale(ctx, "k"), herd.ErrDegraded, errBoom)
	checkOutward(t, "InvalidateTag", c.InvalidateTag(ctx, "t"), errors.ErrUnsupported)
	_, err := c.WarmHot(ctx, 1, nil)
	checkOutward(t, "WarmHot", err)

	o.Codec = failingCodec{herd.DefaultCodec[int]()}
	c = newCache(t, o)
	checkOutward(t, "Set (encode)", c.Set(ctx, "k", 1), errBoom)
	checkOutward(t, "Pin", c.Pin("k", nil), herd.ErrNoLoader)
}

// A load's SetTTL or SetTTLFor, and SetWithTTL, with TTLs that New refuses
// as SoftTTL and HardTTL, get New's words: the load fails, and nothing is
// stored or cached. (A load's TTLs above MaxTTL saturate instead.)
func TestBadTTLsAnsweredAsNew(t *testing.T) {
	for _, ttl := range [][2]time.Duration{
		{0, 0}, {-time.Second, 0}, {time.Minute, time.Second}, {time.Second, -time.Second},
		{herd.MaxTTL + 1, 0}, {time.Second, herd.MaxTTL + 1},
	} {
		o := testOptions()
		o.SoftTTL, o.HardTTL = ttl[0], ttl[1]
		_, err := herd.New(o)
		if err == nil {
			t.Fatalf("New accepted TTLs %v", ttl)
		}
		words := strings.TrimPrefix(err.Error(), "herd: ")

		ctx := bounded(t)
		c := newCache(t, testOptions())
		err = c.SetWithTTL(ctx, "set", 1, ttl[0], ttl[1])
		if err == nil || !strings.HasPrefix(err.Error(), "herd: ") || !strings.HasSuffix(err.Error(), ": "+words) {
			t.Errorf("SetWithTTL with TTLs %v: %v; want an error ending in New's %q", ttl, err, words)
		}
		peek(t, c, "set", 0, false, "after a refused SetWithTTL")

		if ttl[0] > herd.MaxTTL || ttl[1] > herd.MaxTTL {
			continue // a load's TTLs saturate at MaxTTL (TestDurationsSaturate)
		}
		var loads atomic.Int64
		load := func(ctx context.Context) (int, error) {
			loads.Add(1)
			herd.SetTTL(ctx, ttl[0], ttl[1])
			return 1, nil
		}
		for range 2 { // nothing is cached: the second Get loads again
			_, err = c.Get(ctx, "load", load)
			if err == nil || err.Error() != "herd: SetTTL: "+words {
				t.Errorf("Get whose load calls SetTTL(%v): %v; want %q", ttl, err, "herd: SetTTL: "+words)
			}
		}
		if n := loads.Load(); n != 2 {
			t.Errorf("SetTTL(%v): %d loads for two Gets, want 2 (a failed load caches nothing)", ttl, n)
		}

		items := c.GetMany(ctx, []string{"a", "b"}, func(ctx context.Context, keys []string) (map[string]int, error) {
			herd.SetTTLFor(ctx, "a", ttl[0], ttl[1])
			return map[string]int{"a": 1, "b": 2}, nil
		})
		for i, it := range items {
			if it.Err == nil || it.Err.Error() != `herd: SetTTLFor "a": `+words {
				t.Errorf("GetMany whose load calls SetTTLFor(a, %v): key %d got %d, %v; want New's words", ttl, i, it.Value, it.Err)
			}
		}
		peek(t, c, "b", 0, false, "after a batch load that failed")
	}
}
