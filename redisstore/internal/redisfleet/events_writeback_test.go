package redisfleet_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/herdcache/herd"
	"github.com/herdcache/herd/observe"
	"github.com/herdcache/herd/redisstore"
	"github.com/herdcache/herd/redisstore/internal/redistest"
)

// writeBackEvents is a Recorder that hands on each EventWriteBackFailed.
type writeBackEvents struct {
	observe.NopRecorder
	failed chan observe.Event
}

func (r writeBackEvents) RecordEvent(e observe.Event) {
	if e.Kind == observe.EventWriteBackFailed {
		r.failed <- e
	}
}

// exhaust makes the server refuse every write with OOM: a value of 2 MB,
// then maxmemory of 1 MB with the noeviction policy.
func exhaust(t *testing.T, client *redis.Client) {
	t.Helper()
	ctx := t.Context()
	if err := client.Set(ctx, "filler", strings.Repeat("x", 2<<20), 0).Err(); err != nil {
		t.Fatal(err)
	}
	for _, kv := range [][2]string{{"maxmemory-policy", "noeviction"}, {"maxmemory", "1mb"}} {
		if err := client.ConfigSet(ctx, kv[0], kv[1]).Err(); err != nil {
			t.Fatalf("CONFIG SET %s %s: %v", kv[0], kv[1], err)
		}
	}
	if err := client.Set(ctx, "probe", "x", 0).Err(); err == nil || !strings.HasPrefix(err.Error(), "OOM ") {
		t.Fatalf("SET on a full server: %v, want an OOM error", err)
	}
}

// A Get whose write-back Redis refuses with OOM (maxmemory reached under
// noeviction) reports EventWriteBackFailed with the key and Redis' error,
// and still serves the value: the write and release of a load that holds
// the lease (Redis filled while the load runs), and the unfenced Set of a
// cache without a Lease (Redis full from the start; its reads still work).
// (A load whose lease Redis refused writes nothing back: the remote tier
// failed, so it is not trusted with the value.)
func TestWriteBackRefusedByFullRedis(t *testing.T) {
	for _, c := range []struct {
		name  string
		lease bool
	}{{"lease held", true}, {"no lease", false}} {
		t.Run(c.name, func(t *testing.T) {
			node := redistest.Server(t)
			client := node.Client()
			r, err := redisstore.New(redisstore.Options{Client: client, Prefix: "events:"})
			if err != nil {
				t.Fatal(err)
			}
			defer r.Close()
			rec := writeBackEvents{failed: make(chan observe.Event, 8)}
			o := &herd.Options[string]{NoNearCache: true, NoBreaker: true, Name: "events", MaxEntries: 10, SoftTTL: time.Minute, Store: r, Recorder: rec}
			if c.lease {
				o.Lease, o.LeaseTTL = r, 5*time.Second
			}
			cache, err := herd.New(o)
			if err != nil {
				t.Fatal(err)
			}
			defer cache.Close(context.Background())
			if !c.lease {
				exhaust(t, client)
			}
			key := herd.Key("user", "tenant-7", "42")
			started, gate := make(chan struct{}), make(chan struct{})
			done := make(chan error, 1)
			go func() {
				v, err := cache.Get(context.Background(), key, func(context.Context) (string, error) {
					close(started)
					<-gate
					return "v", nil
				})
				if err == nil && v != "v" {
					err = fmt.Errorf("value %q, want v", v)
				}
				done <- err
			}()
			<-started
			if c.lease {
				exhaust(t, client) // the load holds the lease now
			}
			close(gate)
			if err := <-done; err != nil {
				t.Fatalf("Get: %v; want the value served", err)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			if err := cache.Close(ctx); err != nil { // waits for the write-back
				t.Fatal(err)
			}
			if n := len(rec.failed); n != 1 {
				t.Fatalf("%d write-back events, want 1", n)
			}
			if e := <-rec.failed; e.Key != key || e.Err == nil || !strings.Contains(e.Err.Error(), "OOM") {
				t.Errorf("event %+v, want key %q and Redis' OOM error", e, key)
			}
			st := cache.Stats()
			if want := map[bool]int64{true: 1}[c.lease]; st.WriteBackErrors != 1 || st.FencedWrites != 0 || st.LeaseAcquired != want {
				t.Errorf("WriteBackErrors %d, FencedWrites %d, LeaseAcquired %d; want 1, 0 and %d",
					st.WriteBackErrors, st.FencedWrites, st.LeaseAcquired, want)
			}
		})
	}
}
