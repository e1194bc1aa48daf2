package redisfleet_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/herdcache/herd"
	"github.com/herdcache/herd/redisstore/internal/redistest"
	"github.com/herdcache/herd/remote"
	"github.com/herdcache/herd/remote/envelope"
	"github.com/herdcache/herd/remote/keyspace"
)

// names returns the Redis keys of key for the replicas fleet made for t.
func names(t testing.TB, key string) keyspace.Names {
	t.Helper()
	s, err := keyspace.New(fmt.Sprintf("fleet:%s:", t.Name()))
	if err != nil {
		t.Fatal(err)
	}
	return s.Names(key)
}

// getWithin runs Get with a context that never ends, as a caller with
// context.Background does, and fails the test if it has not returned within
// a bound far above what one load takes.
func getWithin(t *testing.T, c *herd.Cache[string], key string, load herd.LoadFunc[string], opts ...herd.CallOption) (string, error) {
	t.Helper()
	type res struct {
		v   string
		err error
	}
	ch := make(chan res, 1)
	go func() {
		v, err := c.Get(context.Background(), key, load, opts...)
		ch <- res{v, err}
	}()
	select {
	case r := <-ch:
		return r.v, r.err
	case <-time.After(30 * time.Second):
		t.Fatalf("Get(%q) did not return within 30s", key)
		return "", nil
	}
}

// An envelope planted in Redis with expiries past MaxExpiry (year 3000) is
// corrupt to Go and to the scripts alike: it is reloaded once under the
// fence, never served, and never loops a miss.
func TestFarExpiryIsReloaded(t *testing.T) {
	node := redistest.Server(t)
	year3000 := time.Date(3000, 1, 1, 0, 0, 0, 0, time.UTC).UnixMilli()
	soon := time.Now().Add(time.Hour).UnixMilli()
	for _, tc := range []struct {
		name       string
		soft, hard int64
		opts       []herd.CallOption
	}{
		{"both/NoStale", year3000, year3000, []herd.CallOption{herd.NoStale()}},
		{"both/default", year3000, year3000, nil},
		{"hard/NoStale", soon, year3000, []herd.CallOption{herd.NoStale()}},
		{"hard/default", soon, year3000, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rs := fleet(t, 2, func() redis.UniversalClient { return node.Client() }, nil)
			key := herd.Key("planted")
			planted := envelope.Append(nil, &envelope.Envelope{Soft: tc.soft, Hard: tc.hard, Value: []byte(`"planted"`)})
			if err := node.Client().Set(t.Context(), names(t, key).Value, planted, time.Hour).Err(); err != nil {
				t.Fatal(err)
			}
			loads := 0
			v, err := getWithin(t, rs[0].cache, key, func(context.Context) (string, error) {
				loads++
				return "loaded", nil
			}, tc.opts...)
			if err != nil || v != "loaded" || loads != 1 {
				t.Fatalf("Get over the planted value = %q, %v after %d loads; want loaded after 1", v, err, loads)
			}
			// The load replaced it in Redis, for the fleet.
			v, err = getWithin(t, rs[1].cache, key, func(context.Context) (string, error) {
				return "", errors.New("should have been served from Redis")
			}, tc.opts...)
			if err != nil || v != "loaded" {
				t.Fatalf("another replica got %q, %v; want the reloaded value", v, err)
			}
		})
	}
}

// A fence key that holds no fence makes its key's scripts fail, and only its
// key's: the breaker stays closed, the key is loaded without the lease, and
// every other key keeps the shared tier.
func TestCorruptFenceKeepsBreakerClosed(t *testing.T) {
	node := redistest.Server(t)
	rs := fleet(t, 2, func() redis.UniversalClient { return node.Client() }, nil)
	key := herd.Key("corrupt-fence")
	if err := node.Client().Set(t.Context(), names(t, key).Fence, "not a fence", 0).Err(); err != nil {
		t.Fatal(err)
	}
	for i := range 5 {
		if err := rs[0].cache.Invalidate(t.Context(), key); !errors.Is(err, remote.ErrRejected) {
			t.Fatalf("Invalidate over a corrupt fence = %v, want an error wrapping remote.ErrRejected", err)
		}
		if err := rs[0].cache.Set(t.Context(), key, "set"); !errors.Is(err, remote.ErrRejected) {
			t.Fatalf("Set over a corrupt fence = %v, want an error wrapping remote.ErrRejected", err)
		}
		want := fmt.Sprint("v", i)
		v, err := getWithin(t, rs[0].cache, key, func(context.Context) (string, error) { return want, nil }, herd.NoStale())
		if err != nil || v != want {
			t.Fatalf("Get %d = %q, %v; want %q", i, v, err, want)
		}
	}
	if st := rs[0].cache.Stats(); st.BreakerOpens != 0 || st.Degraded {
		t.Fatalf("the breaker opened %d times over one corrupt fence key, want never", st.BreakerOpens)
	}
	other := herd.Key("other")
	if v, err := getWithin(t, rs[0].cache, other, func(context.Context) (string, error) { return "shared", nil }); err != nil || v != "shared" {
		t.Fatalf("Get(other) = %q, %v", v, err)
	}
	// Close waits for the write-back, which runs in the background.
	if err := rs[0].cache.Close(t.Context()); err != nil {
		t.Fatal(err)
	}
	if b, err := rs[1].remote.Load(t.Context(), other); err != nil || b == nil {
		t.Fatalf("the other key's value is not in Redis: %q, %v", b, err)
	}
}

// A burst of callers of one key does not become a burst on Redis: 50
// callers on each of 20 replicas, released at once, with no local copy and
// the value fresh in Redis, make at most one GET per replica.
func TestStoreReadsCoalesced(t *testing.T) {
	node := redistest.Server(t)
	counters := make([]*roundTrips, 20)
	next := 0
	rs := fleet(t, 20, func() redis.UniversalClient {
		c := node.Client()
		counters[next] = &roundTrips{}
		c.AddHook(counters[next])
		next++
		return c
	}, func(o *herd.Options[string]) {
		o.SoftTTL, o.NearTTL = time.Minute, time.Minute
	})
	key := herd.Key("burst")
	env := envelope.Append(nil, &envelope.Envelope{
		Soft:  time.Now().Add(time.Minute).UnixMilli(),
		Hard:  time.Now().Add(time.Minute).UnixMilli(),
		Value: []byte("stored"), // the string codec stores the bytes as they are
	})
	if _, err := rs[0].remote.Set(t.Context(), key, env, time.Minute); err != nil {
		t.Fatal(err)
	}
	before := commandstatsGets(t, node.Client())
	gets := make([]int64, len(counters))
	for i, c := range counters {
		gets[i] = c.count("get")
	}
	start := make(chan struct{})
	var wg sync.WaitGroup
	for _, r := range rs {
		for range 50 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-start
				v, err := r.cache.Get(t.Context(), key, func(context.Context) (string, error) {
					return "", errors.New("loaded: the stored value was not served")
				})
				if err != nil || v != "stored" {
					t.Errorf("Get = %q, %v; want the stored value", v, err)
				}
			}()
		}
	}
	close(start)
	wg.Wait()
	total := int64(0)
	for i, c := range counters {
		n := c.count("get") - gets[i]
		total += n
		if n > 1 {
			t.Errorf("replica %d sent %d GETs for one key, want at most 1", i, n)
		}
	}
	server := commandstatsGets(t, node.Client()) - before
	t.Logf("1,000 Gets on 20 replicas: %d GETs counted by the clients, %d by the server (INFO commandstats)", total, server)
	if total == 0 {
		t.Fatal("no GET was counted: the hook judged nothing")
	}
}

// commandstatsGets returns how many GET calls the server has served.
func commandstatsGets(t *testing.T, c redis.UniversalClient) int64 {
	t.Helper()
	calls, _ := commandstats(t, c)
	return calls["get"]
}
