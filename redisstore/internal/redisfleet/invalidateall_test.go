package redisfleet_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/herdcache/herd"
	"github.com/herdcache/herd/redisstore/internal/redistest"
)

// InvalidateAll on one of 5 replicas over a Cluster retires 200 keys with
// one Redis command, every replica's local tier empties on its notice, and
// the next reads load each key once for the fleet.
func TestInvalidateAllAcrossReplicas(t *testing.T) {
	cluster := redistest.Cluster(t)
	trips := &roundTrips{}
	first := true
	rs := fleet(t, 5, func() redis.UniversalClient {
		c := cluster.Client()
		if first {
			c.AddHook(trips) // replica 0's client
			first = false
		}
		return c
	}, func(o *herd.Options[string]) {
		o.SoftTTL = time.Minute
		o.NearTTL = 10 * time.Second // only the notice can empty the local tiers in time
	})
	keys := make([]string, 200)
	for i := range keys {
		keys[i] = herd.Key("all", fmt.Sprint(i))
	}
	round := func(value string) map[string]int {
		loads := map[string]int{}
		load := func(_ context.Context, ks []string) (map[string]string, error) {
			m := map[string]string{}
			for _, k := range ks {
				m[k] = value
			}
			return m, nil
		}
		for i, r := range rs {
			// One replica at a time: each key's load is counted once.
			counting := func(ctx context.Context, ks []string) (map[string]string, error) {
				for _, k := range ks {
					loads[k]++
				}
				return load(ctx, ks)
			}
			for n, it := range r.cache.GetMany(t.Context(), keys, counting) {
				if it.Err != nil || it.Value != value {
					t.Fatalf("replica %d: %q = %q, %v; want %q", i, keys[n], it.Value, it.Err, value)
				}
			}
		}
		return loads
	}
	round("v1")

	before := trips.trips.Load()
	if err := rs[0].cache.InvalidateAll(t.Context()); err != nil {
		t.Fatal(err)
	}
	if n := trips.trips.Load() - before; n > 2 {
		t.Errorf("InvalidateAll of 200 keys took %d Redis round trips, want 1 (2 if its script had to be loaded)", n)
	}
	waitDropped(t, rs, keys, "InvalidateAll")
	for _, k := range keys {
		if env, err := rs[0].remote.Load(t.Context(), k); err != nil || env != nil {
			t.Fatalf("Load(%q) after InvalidateAll = %q, %v; want nothing", k, env, err)
		}
	}
	for k, n := range round("v2") {
		if n != 1 {
			t.Errorf("%q loaded %d times after InvalidateAll, want 1 for the fleet", k, n)
		}
	}
}

// waitDropped waits until no replica serves any of keys from its local
// tier, as the notice of what (an invalidation) makes them, for at most
// 10s.
func waitDropped(t *testing.T, rs []*replica, keys []string, what string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for i, r := range rs {
		for _, k := range keys {
			for {
				if _, ok := r.cache.GetIfPresent(k); !ok {
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("replica %d still serves %q 10s after %s", i, k, what)
				}
				time.Sleep(5 * time.Millisecond) // polls for the notice
			}
		}
	}
}
