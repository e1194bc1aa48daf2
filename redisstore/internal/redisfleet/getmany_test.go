package redisfleet_test

import (
	"context"
	"fmt"
	"maps"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/herdcache/herd"
	"github.com/herdcache/herd/redisstore"
	"github.com/herdcache/herd/redisstore/internal/redistest"
)

// batchRound has 10 goroutines on each replica GetMany overlapping
// batches of 50 of keys at once, with a batch loader that takes recompute,
// and returns how often each key was given to a loader across the fleet.
func batchRound(t *testing.T, rs []*replica, keys []string, value string, recompute time.Duration) map[string]int {
	t.Helper()
	var (
		mu    sync.Mutex
		loads = map[string]int{}
		wg    sync.WaitGroup
		start = make(chan struct{})
	)
	load := func(ctx context.Context, ks []string) (map[string]string, error) {
		mu.Lock()
		for _, k := range ks {
			loads[k]++
		}
		mu.Unlock()
		time.Sleep(recompute) // the backing store's batched query
		m := make(map[string]string, len(ks))
		for _, k := range ks {
			m[k] = value + k
		}
		return m, nil
	}
	for i, r := range rs {
		for j := range 10 {
			off := (i*10 + j) * 7 % (len(keys) - 50 + 1)
			batch := keys[off : off+50]
			wg.Go(func() {
				<-start
				ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
				defer cancel()
				for n, it := range r.cache.GetMany(ctx, batch, load) {
					if it.Err != nil || it.Value != value+batch[n] {
						t.Errorf("replica %d: %q = %q, %v; want %q", i, batch[n], it.Value, it.Err, value+batch[n])
						return
					}
				}
			})
		}
	}
	close(start)
	wg.Wait()
	mu.Lock() // a background refresh may still call load
	defer mu.Unlock()
	return maps.Clone(loads)
}

func testGetManyOneLoadPerKey(t *testing.T, newClient func() redis.UniversalClient) {
	// A round ends well inside the soft TTL even on a busy machine.
	const ttl = 5 * time.Second
	rs := fleet(t, 20, newClient, func(o *herd.Options[string]) {
		o.SoftTTL = ttl
		o.LeaseTTL = 3 * time.Second
	})
	keys := make([]string, 100)
	for i := range keys {
		keys[i] = herd.Key("batch", fmt.Sprint(i))
	}
	for round := range 2 {
		start := time.Now()
		loads := batchRound(t, rs, keys, fmt.Sprint("v", round, ":"), 100*time.Millisecond)
		took := time.Since(start)
		if len(loads) != len(keys) {
			t.Fatalf("round %d: %d keys loaded, want %d", round, len(loads), len(keys))
		}
		judgeKeys(t, fmt.Sprint("round ", round), rs, loads, took, ttl)
		for _, k := range keys {
			expire(t, rs[:1], k, ttl) // and every local copy with it
		}
	}
}

// 20 replicas × 10 goroutines read overlapping batches of a 100-key set:
// each key is loaded once for the fleet, on a single node and on a Cluster.
func TestGetManyOneLoadPerKey(t *testing.T) {
	node := redistest.Server(t)
	testGetManyOneLoadPerKey(t, func() redis.UniversalClient { return node.Client() })
}

func TestGetManyOneLoadPerKeyCluster(t *testing.T) {
	cluster := redistest.Cluster(t)
	testGetManyOneLoadPerKey(t, func() redis.UniversalClient { return cluster.Client() })
}

// A batch of 100 keys costs one round trip when Redis holds them, and two
// pipelines and one PUBLISH when they must be loaded.
func TestGetManyRoundTrips(t *testing.T) {
	node := redistest.Server(t)
	trips := &roundTrips{}
	prefix := fmt.Sprintf("fleet:%s:", t.Name())
	newReplica := func(client redis.UniversalClient) *herd.Cache[string] {
		r, err := redisstore.New(redisstore.Options{Client: client, Prefix: prefix, Timeout: 2 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		c, err := herd.New(&herd.Options[string]{
			NoBreaker:  true,
			MaxEntries: 1000, SoftTTL: time.Minute, Store: r, Lease: r, LeaseTTL: 5 * time.Second, NearTTL: time.Second,
		})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			_ = c.Close(context.Background())
			_ = r.Close()
		})
		return c
	}
	keys := make([]string, 100)
	for i := range keys {
		keys[i] = herd.Key("trip", fmt.Sprint(i))
	}
	load := func(_ context.Context, ks []string) (map[string]string, error) {
		m := map[string]string{}
		for _, k := range ks {
			m[k] = "v" + k
		}
		return m, nil
	}

	// A first batch on each replica loads the scripts and opens its
	// connections: those round trips are not the batch's.
	warmUp := func(c *herd.Cache[string], h *roundTrips, name string) {
		ks := []string{herd.Key("warmup", name, "1"), herd.Key("warmup", name, "2")}
		for _, it := range c.GetMany(t.Context(), ks, load) {
			if it.Err != nil {
				t.Fatal(it.Err)
			}
		}
		waitPublish(t, h, 0)
	}
	client := node.Client()
	client.AddHook(trips)
	cold := newReplica(client)
	warmUp(cold, trips, "cold")
	before := trips.trips.Load()
	publishes := trips.count("publish")
	for _, it := range cold.GetMany(t.Context(), keys, load) {
		if it.Err != nil {
			t.Fatal(it.Err)
		}
	}
	// The write-back runs in the background, and ends with its PUBLISH.
	waitPublish(t, trips, publishes)
	if got := trips.trips.Load() - before; got != 3 {
		t.Errorf("a cold batch of 100 keys took %d round trips, want 3 (acquire, write-release, one PUBLISH)", got)
	}
	if got := trips.count("publish") - publishes; got != 1 {
		t.Errorf("%d PUBLISH for the batch, want 1", got)
	}

	warmTrips := &roundTrips{}
	warmClient := node.Client()
	warmClient.AddHook(warmTrips)
	warm := newReplica(warmClient)
	warmUp(warm, warmTrips, "warm")
	before = warmTrips.trips.Load()
	for _, it := range warm.GetMany(t.Context(), keys, load) {
		if it.Err != nil {
			t.Fatal(it.Err)
		}
	}
	if got := warmTrips.trips.Load() - before; got != 1 {
		t.Errorf("a warm batch of 100 keys took %d round trips, want 1", got)
	}
	if s := warm.Stats(); s.Loads != 2 || s.RemoteHits != 100 {
		t.Errorf("warm replica: Loads %d, RemoteHits %d; want 2 (its warm-up) and 100", s.Loads, s.RemoteHits)
	}
}

// waitPublish waits until the client h counts has sent more than n
// PUBLISH: the background write-back of a batch ends with one.
func waitPublish(t *testing.T, h *roundTrips, n int64) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for h.count("publish") <= n {
		if time.Now().After(deadline) {
			t.Fatal("no PUBLISH: the batch's write-back did not end")
		}
		time.Sleep(5 * time.Millisecond) // polls for the background write
	}
}

// Gets and GetManys of the same keys at once, on 10 replicas, share one
// load per key for the fleet.
func TestGetManyMixedWithGet(t *testing.T) {
	node := redistest.Server(t)
	const ttl = 5 * time.Second
	rs := fleet(t, 10, func() redis.UniversalClient { return node.Client() }, func(o *herd.Options[string]) {
		o.SoftTTL = ttl
		o.LeaseTTL = 3 * time.Second
	})
	keys := make([]string, 40)
	for i := range keys {
		keys[i] = herd.Key("mixed", fmt.Sprint(i))
	}
	var (
		mu    sync.Mutex
		loads = map[string]int{}
		wg    sync.WaitGroup
		start = make(chan struct{})
	)
	count := func(ks ...string) {
		mu.Lock()
		for _, k := range ks {
			loads[k]++
		}
		mu.Unlock()
		time.Sleep(50 * time.Millisecond) // the backing store
	}
	batch := func(_ context.Context, ks []string) (map[string]string, error) {
		count(ks...)
		m := map[string]string{}
		for _, k := range ks {
			m[k] = "v" + k
		}
		return m, nil
	}
	began := time.Now()
	for i, r := range rs {
		for j := range 5 {
			wg.Go(func() { // a GetMany of 20 keys
				<-start
				ks := keys[(i+j)%20 : (i+j)%20+20]
				for n, it := range r.cache.GetMany(t.Context(), ks, batch) {
					if it.Err != nil || it.Value != "v"+ks[n] {
						t.Errorf("replica %d GetMany: %q = %q, %v", i, ks[n], it.Value, it.Err)
					}
				}
			})
			wg.Go(func() { // and Gets, one key at a time
				<-start
				for n := range 8 {
					k := keys[(i*7+j*3+n)%len(keys)]
					v, err := r.cache.Get(t.Context(), k, func(context.Context) (string, error) {
						count(k)
						return "v" + k, nil
					})
					if err != nil || v != "v"+k {
						t.Errorf("replica %d Get: %q = %q, %v", i, k, v, err)
					}
				}
			})
		}
	}
	close(start)
	wg.Wait()
	judgeKeys(t, "Gets and GetManys", rs, loads, time.Since(began), ttl)
}

// judgeKeys checks the loads of each key over one round that took took,
// of values fresh for ttl: exactly one per key fleet-wide when the round
// ended within ttl and no remote call failed; otherwise (a busy machine)
// the degraded promise, at most one per replica, logged.
func judgeKeys(t *testing.T, name string, rs []*replica, loads map[string]int, took, ttl time.Duration) {
	t.Helper()
	var remoteErrors int64
	for _, r := range rs {
		remoteErrors += r.cache.Stats().RemoteErrors
	}
	for k, n := range loads {
		switch {
		case n == 1:
		case took < ttl && remoteErrors == 0:
			t.Errorf("%s: %q loaded %d times across the fleet, want 1", name, k, n)
		case n > len(rs):
			t.Errorf("%s (%v, %d remote errors): %q loaded %d times, want at most one per replica", name, took, remoteErrors, k, n)
		default:
			t.Logf("%s took %v with %d remote errors: %q loaded %d times, judged by the degraded bound", name, took, remoteErrors, k, n)
		}
	}
}

// While Redis is down, GetMany goes on serving: each replica loads what
// it does not hold, once per key, with no error; once Redis is back, the
// fleet shares its loads again.
func TestGetManyRedisDown(t *testing.T) {
	node := redistest.Server(t)
	remoteTimeouts.Store(t.Name(), 250*time.Millisecond)
	rs := fleet(t, 3, func() redis.UniversalClient { return node.Client() }, func(o *herd.Options[string]) {
		o.SoftTTL = time.Minute
	})
	loads := map[string]int{}
	var mu sync.Mutex
	load := func(_ context.Context, ks []string) (map[string]string, error) {
		mu.Lock()
		for _, k := range ks {
			loads[k]++
		}
		mu.Unlock()
		m := map[string]string{}
		for _, k := range ks {
			m[k] = "v" + k
		}
		return m, nil
	}
	keys := func(prefix string) []string {
		ks := make([]string, 20)
		for i := range ks {
			ks[i] = herd.Key(prefix, fmt.Sprint(i))
		}
		return ks
	}
	read := func(ks []string) {
		for i, r := range rs {
			for n, it := range r.cache.GetMany(t.Context(), ks, load) {
				if it.Err != nil || it.Value != "v"+ks[n] {
					t.Fatalf("replica %d: %q = %q, %v; want a value", i, ks[n], it.Value, it.Err)
				}
			}
		}
	}
	node.Kill()
	down := keys("down")
	read(down)
	read(down) // held locally now: no load
	for _, k := range down {
		if loads[k] < 1 || loads[k] > len(rs) {
			t.Errorf("Redis down: %q loaded %d times, want once per replica at most", k, loads[k])
		}
	}
	node.Restart()
	deadline := time.Now().Add(10 * time.Second)
	for _, r := range rs {
		for r.cache.Stats().Degraded {
			if time.Now().After(deadline) {
				t.Fatal("a breaker is still open 10s after Redis came back")
			}
			r.cache.GetMany(t.Context(), keys("probe"), load) // the breaker's probe
			time.Sleep(50 * time.Millisecond)                 // its cooldown
		}
	}
	up := keys("up")
	read(up)
	for _, k := range up {
		if loads[k] != 1 {
			t.Errorf("Redis back: %q loaded %d times, want 1 for the fleet", k, loads[k])
		}
	}
}
