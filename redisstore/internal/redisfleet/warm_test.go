package redisfleet_test

import (
	"context"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/herdcache/herd"
	"github.com/herdcache/herd/redisstore/internal/redistest"
)

// A replica that joins a fleet sharing its hot keys in Redis warms the 20
// the fleet reads most with WarmHot, and in its first second after WarmHot
// returns serves them with no miss.
func TestWarmHotFromFleet(t *testing.T) {
	const (
		soft = 2 * time.Second
		keys = 100
	)
	node := redistest.Server(t)
	newClient := func() redis.UniversalClient { return node.Client() }
	tune := func(o *herd.Options[string]) {
		o.SoftTTL, o.HardTTL = soft, 10*soft
		o.NearTTL = time.Second
		o.OnLeaseHeld = herd.ServeStale
		o.ShareHotKeys = 20
		o.Load = func(_ context.Context, key string) (string, error) { return "v-" + key, nil }
	}
	rs := fleet(t, 5, newClient, tune)

	// The fleet reads each of the keys k0 to k19 ten times a round and the
	// others once, a round every 10ms, until the test ends.
	ctx, stop := context.WithCancel(t.Context())
	var wg sync.WaitGroup
	defer func() { stop(); wg.Wait() }()
	for _, r := range rs {
		wg.Go(func() {
			for round := 0; round < 6000 && ctx.Err() == nil; round++ {
				for i := range keys {
					n := 1
					if i < 20 {
						n = 10
					}
					for range n {
						if _, err := r.cache.Get(ctx, "k"+strconv.Itoa(i), nil); err != nil && ctx.Err() == nil {
							t.Errorf("fleet Get(k%d): %v", i, err)
							return
						}
					}
				}
				select {
				case <-ctx.Done():
				case <-time.After(10 * time.Millisecond):
				}
			}
		})
	}
	// Each replica shares its hot keys at the end of its first soft TTL.
	deadline := time.Now().Add(soft + 10*time.Second)
	for {
		hot, err := rs[0].remote.Hot(t.Context(), 20, soft)
		if err != nil {
			t.Fatalf("Hot: %v", err)
		}
		if len(hot) == 20 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the fleet's hot set holds %d keys %v after %v, want 20", len(hot), hot, soft+10*time.Second)
		}
		time.Sleep(50 * time.Millisecond) // polls Redis for the fleet's first share
	}

	fresh := fleet(t, 1, newClient, tune)[0]
	report, err := fresh.cache.WarmHot(t.Context(), 20, nil)
	if err != nil {
		t.Fatalf("WarmHot: %v", err)
	}
	if report.Failed != 0 || report.Loaded+report.Fresh != 20 {
		t.Fatalf("WarmHot report %+v, want 20 keys warmed and none failed", report)
	}
	before := fresh.cache.Stats()
	start := time.Now()
	reads := 0
	for time.Since(start) < time.Second {
		for i := range 20 {
			if _, err := fresh.cache.Get(t.Context(), "k"+strconv.Itoa(i), nil); err != nil {
				t.Fatalf("Get(k%d): %v", i, err)
			}
			reads++
		}
		time.Sleep(5 * time.Millisecond) // paces the reader
	}
	st := fresh.cache.Stats()
	t.Logf("warm report %+v; first second: %d reads, %d misses, %d hits, %d stale, %d waited on Redis",
		report, reads, st.Misses-before.Misses, st.Hits-before.Hits, st.StaleServed-before.StaleServed, st.RemoteWaits-before.RemoteWaits)
	if st.Misses != before.Misses || st.RemoteWaits != before.RemoteWaits {
		t.Errorf("%d misses and %d reads that waited on Redis, of the 20 hottest keys in the first second after WarmHot; want 0 and 0",
			st.Misses-before.Misses, st.RemoteWaits-before.RemoteWaits)
	}
}
