package redisfleet_test

import (
	"context"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/herdcache/herd"
	"github.com/herdcache/herd/redisstore/internal/redistest"
)

// After MarkStale on one of five replicas over Redis, under traffic, one
// load runs for the fleet and no reader waits for it: none is handed a
// value whose load ended after its Get began.
func TestMarkStaleUnderLoad(t *testing.T) {
	const recompute = 200 * time.Millisecond
	node := redistest.Server(t)
	rs := fleet(t, 5, func() redis.UniversalClient { return node.Client() }, func(o *herd.Options[string]) {
		o.SoftTTL, o.HardTTL = time.Minute, 2*time.Minute
		o.OnLeaseHeld = herd.ServeStale
		o.NearTTL = time.Second
	})
	var loads atomic.Int64
	// A value is the Unix nanoseconds at which its load ended.
	load := func(context.Context) (string, error) {
		loads.Add(1)
		time.Sleep(recompute) // the backing store
		return strconv.FormatInt(time.Now().UnixNano(), 10), nil
	}
	for _, r := range rs {
		if _, err := r.cache.Get(t.Context(), "k", load); err != nil {
			t.Fatal(err)
		}
	}
	if n := loads.Load(); n != 1 {
		t.Fatalf("%d loads to warm the fleet, want 1", n)
	}
	loads.Store(0)

	ctx, stop := context.WithCancel(t.Context())
	var (
		wg     sync.WaitGroup
		waited atomic.Int64
		reads  atomic.Int64
	)
	for _, r := range rs {
		for range 4 {
			wg.Go(func() {
				for i := 0; i < 2000 && ctx.Err() == nil; i++ {
					began := time.Now().UnixNano()
					v, err := r.cache.Get(ctx, "k", load)
					if err != nil {
						if ctx.Err() == nil {
							t.Errorf("Get: %v", err)
						}
						return
					}
					reads.Add(1)
					if end, _ := strconv.ParseInt(v, 10, 64); end > began {
						waited.Add(1)
					}
					time.Sleep(2 * time.Millisecond) // paces the reader
				}
			})
		}
	}
	time.Sleep(100 * time.Millisecond) // traffic under way
	if err := rs[1].cache.MarkStale(t.Context(), "k"); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for loads.Load() == 0 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond) // polls for the refresh
	}
	time.Sleep(3 * recompute) // the refresh ends and reaches every replica
	stop()
	wg.Wait()
	var stale int64
	for _, r := range rs {
		stale += r.cache.Stats().StaleServed
	}
	t.Logf("%d reads, %d served stale, %d loads, %d waited on the load", reads.Load(), stale, loads.Load(), waited.Load())
	if n := loads.Load(); n != 1 {
		t.Errorf("%d loads after MarkStale, want 1 for the fleet", n)
	}
	if waited.Load() != 0 || stale == 0 || reads.Load() == 0 {
		t.Errorf("%d of %d reads waited on the load, %d were served stale; want none waited, some stale", waited.Load(), reads.Load(), stale)
	}
}
