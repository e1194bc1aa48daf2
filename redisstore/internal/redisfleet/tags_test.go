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

// InvalidateTag on one of 5 replicas over a Cluster retires the 100 keys
// with the tag with one Redis command; every replica stops serving them;
// a read of a tagged batch costs one round trip more than an untagged one
// (the tags' versions); and the next reads load each key once for the
// fleet.
func TestInvalidateTagAcrossReplicas(t *testing.T) {
	cluster := redistest.Cluster(t)
	trips := &roundTrips{}
	n := 0
	rs := fleet(t, 5, func() redis.UniversalClient {
		c := cluster.Client()
		if n == 4 {
			c.AddHook(trips) // the last replica's client
		}
		n++
		return c
	}, func(o *herd.Options[string]) {
		o.SoftTTL = time.Minute
		o.NearTTL = 10 * time.Second // only the notice can retire the local copies in time
	})
	keys := make([]string, 100)
	for i := range keys {
		keys[i] = herd.Key("tagged", fmt.Sprint(i))
	}
	loads := map[string]int{}
	load := func(value string) herd.BatchLoadFunc[string] {
		return func(ctx context.Context, ks []string) (map[string]string, error) {
			herd.Tags(ctx, "catalog")
			m := map[string]string{}
			for _, k := range ks {
				loads[k]++
				m[k] = value
			}
			return m, nil
		}
	}
	read := func(r *replica, value string) {
		t.Helper()
		for i, it := range r.cache.GetMany(t.Context(), keys, load(value)) {
			if it.Err != nil || it.Value != value {
				t.Fatalf("%q = %q, %v; want %q", keys[i], it.Value, it.Err, value)
			}
		}
	}
	for _, r := range rs[:4] { // one replica at a time: loads are counted once each
		read(r, "v1")
	}
	before := trips.trips.Load()
	read(rs[4], "v1")
	if got := trips.trips.Load() - before; got > 2 {
		t.Errorf("a warm batch of 100 tagged keys took %d round trips, want 2: the values, then their tags' versions", got)
	}

	before = trips.trips.Load()
	if err := rs[4].cache.InvalidateTag(t.Context(), "catalog"); err != nil {
		t.Fatal(err)
	}
	if got := trips.trips.Load() - before; got > 2 {
		t.Errorf("InvalidateTag of 100 keys took %d round trips, want 1 (2 if its script had to be loaded)", got)
	}
	waitDropped(t, rs, keys, "InvalidateTag")
	clear(loads)
	for _, r := range rs {
		read(r, "v2")
	}
	for _, k := range keys {
		if loads[k] != 1 {
			t.Errorf("%q loaded %d times after InvalidateTag, want 1 for the fleet", k, loads[k])
		}
	}
}
