package redisfleet_test

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/herdcache/herd"
	"github.com/herdcache/herd/redisstore"
	"github.com/herdcache/herd/redisstore/internal/redistest"
)

// scaleCase is one workload of the fleet-scale benchmarks: replicas
// in-process replicas, each with its own go-redis client and subscription,
// over one redis-server, each offered rate Gets a second spread evenly
// over keys keys, while one replica Sets changes keys a second (picked at
// random), for run. Loads take load; SoftTTL is soft (scaleSoft unless
// set), HardTTL 5×soft (losers served stale), NearTTL scaleNear, Beta 1.
type scaleCase struct {
	replicas, rate, keys int
	load                 time.Duration
	changes              int
	run                  time.Duration
	// soft is the SoftTTL; zero: scaleSoft.
	soft time.Duration
	// live is the Remotes' LivePeriod (heartbeats); zero: none.
	live time.Duration
	// holdAll has every replica read every key before the run, so that
	// each holds a copy of each.
	holdAll bool
}

const (
	scaleSoft = 2 * time.Second
	scaleNear = time.Second
)

// BenchmarkFleetScaleHotKey measures the Redis traffic of a fleet reading
// one hot key (TTL 2 s, NearTTL 1 s, no changes): 20 replicas × 50 Gets/s
// with a 400 ms load, 50 × 40 and 200 × 10 with 300 ms, each also with
// heartbeats (LivePeriod 1 s). It reports Redis round trips per
// Get and per second, lease acquisitions per Get (the caches'
// LeaseAcquired and LeaseContended), commands per second (each command of
// a pipeline counted), GETs and scripts per second, loads per TTL
// fleet-wide, and the Gets' latency percentiles, over the run that follows
// the fleet's first expiry of the key (which costs a lease attempt per
// replica: none knows yet that others share its keys, see the README). One
// run per iteration: go test -run '^$' -bench FleetScaleHotKey -benchtime 1x.
func BenchmarkFleetScaleHotKey(b *testing.B) {
	for _, c := range []scaleCase{
		{replicas: 20, rate: 50, keys: 1, load: 400 * time.Millisecond, run: 12 * time.Second},
		{replicas: 20, rate: 50, keys: 1, load: 400 * time.Millisecond, run: 12 * time.Second, live: redisstore.DefaultLivePeriod},
		{replicas: 50, rate: 40, keys: 1, load: 300 * time.Millisecond, run: 12 * time.Second},
		{replicas: 50, rate: 40, keys: 1, load: 300 * time.Millisecond, run: 12 * time.Second, live: redisstore.DefaultLivePeriod},
		{replicas: 200, rate: 10, keys: 1, load: 300 * time.Millisecond, run: 12 * time.Second},
		{replicas: 200, rate: 10, keys: 1, load: 300 * time.Millisecond, run: 12 * time.Second, live: redisstore.DefaultLivePeriod},
	} {
		b.Run(c.name(), func(b *testing.B) {
			for b.Loop() {
				scaleRun(b, c)
			}
		})
	}
}

// name is the case's sub-benchmark name: replicas x rate, -live with
// heartbeats.
func (c scaleCase) name() string {
	name := fmt.Sprintf("%dx%d", c.replicas, c.rate)
	if c.live > 0 {
		name += "-live"
	}
	return name
}

// BenchmarkFleetScaleChanges measures the Redis traffic of a fleet that
// holds a copy of each of 1,000 keys on every replica, 1% of them changed
// per second (10 Sets a second, values small enough to travel in the
// notice), each replica offered Gets spread over the keys: 20 × 10 and
// 200 × 3, NearTTL 1 s, without and with heartbeats (LivePeriod 1 s). The
// values live ten minutes, so the traffic is what keeping the copies
// current costs. Besides what BenchmarkFleetScaleHotKey reports, it
// reports Redis operations per change. One run per iteration:
// go test -run '^$' -bench FleetScaleChanges -benchtime 1x.
func BenchmarkFleetScaleChanges(b *testing.B) {
	for _, f := range []struct{ replicas, rate int }{{20, 10}, {200, 3}} {
		for _, live := range []time.Duration{0, redisstore.DefaultLivePeriod} {
			c := scaleCase{replicas: f.replicas, rate: f.rate, keys: 1000, load: 50 * time.Millisecond, changes: 10, run: 12 * time.Second, soft: 10 * time.Minute, live: live, holdAll: true}
			b.Run(c.name(), func(b *testing.B) {
				for b.Loop() {
					scaleRun(b, c)
				}
			})
		}
	}
}

// holdAll has every replica of rs read every key of keys, a hundred at a
// time, from the Store.
func holdAll(b *testing.B, rs []*replica, keys []string) {
	noLoad := func(_ context.Context, ks []string) (map[string]string, error) {
		return nil, fmt.Errorf("%d keys missing from the Store", len(ks))
	}
	for i, r := range rs {
		for lo := 0; lo < len(keys); lo += 100 {
			for _, it := range r.cache.GetMany(b.Context(), keys[lo:min(lo+100, len(keys))], noLoad) {
				if it.Err != nil {
					b.Fatalf("replica %d: %v", i, it.Err)
				}
			}
		}
	}
}

// BenchmarkFleetScaleKeys measures the Redis traffic of a fleet reading
// 1,000 keys, 1% of them changed per second (10 Sets a second), each
// replica offered Gets spread over the keys: 20 and 50 replicas × 10 a
// second, 200 × 3 (at 10, a 2-core machine's 200 clients time out),
// NearTTL 1 s. The values live a minute (SoftTTL 60 s), so
// that the traffic is what keeping copies current costs, not refreshes.
// It reports what BenchmarkFleetScaleHotKey does, and loads per TTL per
// key. One run per iteration:
// go test -run '^$' -bench FleetScaleKeys -benchtime 1x.
func BenchmarkFleetScaleKeys(b *testing.B) {
	for _, f := range []struct{ replicas, rate int }{{20, 10}, {50, 10}, {200, 3}} {
		c := scaleCase{replicas: f.replicas, rate: f.rate, keys: 1000, load: 50 * time.Millisecond, changes: 10, run: 12 * time.Second, soft: time.Minute}
		b.Run(c.name(), func(b *testing.B) {
			for b.Loop() {
				scaleRun(b, c)
			}
		})
	}
}

// scaleRun is one run of a fleet-scale benchmark on a server of its own.
func scaleRun(b *testing.B, c scaleCase) {
	soft := cmp.Or(c.soft, scaleSoft)
	node := redistest.Server(b)
	hooks := make([]*roundTrips, 0, c.replicas)
	if c.live > 0 {
		remoteLive.Store(b.Name(), c.live)
		defer remoteLive.Delete(b.Name())
	}
	var failed atomic.Int64
	var firstErr sync.Map // command name → its first error
	rs := fleet(b, c.replicas, func() redis.UniversalClient {
		cl := node.Client()
		h := &roundTrips{done: func(cmd redis.Cmder, _ time.Duration, err error) {
			if err != nil && !errors.Is(err, redis.Nil) {
				failed.Add(1)
				firstErr.LoadOrStore(cmd.Name(), err)
			}
		}}
		hooks = append(hooks, h)
		cl.AddHook(h)
		return cl
	}, func(o *herd.Options[string]) {
		o.MaxEntries = 2 * c.keys
		o.SoftTTL, o.HardTTL = soft, 5*soft
		o.OnLeaseHeld = herd.ServeStale
		o.NearTTL = scaleNear
		o.Beta = 1
		o.RefreshBackoff = time.Second
	})
	keys := make([]string, c.keys)
	for i := range keys {
		keys[i] = herd.Key("scale", strconv.Itoa(i))
	}
	var loads atomic.Int64
	load := func(ctx context.Context) (string, error) {
		select {
		case <-time.After(c.load):
		case <-ctx.Done():
			return "", ctx.Err()
		}
		loads.Add(1)
		return strconv.FormatInt(time.Now().UnixNano(), 10), nil
	}
	gets := make([]func(context.Context) error, len(rs))
	for i, r := range rs {
		gets[i] = func(ctx context.Context) error {
			_, err := r.cache.Get(ctx, keys[rand.IntN(len(keys))], load)
			return err
		}
	}
	// The keys are stored before the run, and each replica reads one, or
	// every one.
	ctx := b.Context()
	for _, k := range keys {
		if err := rs[0].cache.Set(ctx, k, "set"); err != nil {
			b.Fatal(err)
		}
	}
	warm(b, gets)
	if c.holdAll {
		holdAll(b, rs, keys)
	}
	if soft < c.run {
		// The fleet's first expiry, before the run: until then no replica
		// knows that others share its keys, and each asks for the lease
		// at the expiry's instant, unstaggered; from then on each does.
		openLoop(b, gets, c.rate, soft+c.load+scaleNear)
	}

	trips, commands := make([]int64, len(hooks)), make([]map[string]int64, len(hooks))
	snapshot := func() {
		for i, h := range hooks {
			trips[i] = h.trips.Load()
			h.mu.Lock()
			commands[i] = make(map[string]int64, len(h.byName))
			for k, v := range h.byName {
				commands[i][k] = v
			}
			h.mu.Unlock()
		}
	}
	snapshot()
	leased := func() (n int64) {
		for _, r := range rs {
			s := r.cache.Stats()
			n += s.LeaseAcquired + s.LeaseContended
		}
		return n
	}
	leasedBefore := leased()
	loads.Store(0)
	failed.Store(0)
	start := time.Now()
	stop := make(chan struct{})
	var sets atomic.Int64
	var changer sync.WaitGroup
	if c.changes > 0 {
		changer.Go(func() {
			tick := time.NewTicker(time.Second / time.Duration(c.changes))
			defer tick.Stop()
			for {
				select {
				case <-stop:
					return
				case <-tick.C:
				}
				if err := rs[0].cache.Set(ctx, keys[rand.IntN(len(keys))], "changed"); err == nil {
					sets.Add(1)
				}
			}
		})
	}
	lat := openLoop(b, gets, c.rate, c.run)
	close(stop)
	changer.Wait()
	run := time.Since(start)
	acquires := leased() - leasedBefore

	var dTrips, dCommands, dGets int64
	scripts := int64(0)
	for i, h := range hooks {
		dTrips += h.trips.Load() - trips[i]
		h.mu.Lock()
		for k, v := range h.byName {
			d := v - commands[i][k]
			dCommands += d
			switch k {
			case "get", "mget":
				dGets += d
			case "evalsha", "eval":
				scripts += d
			}
		}
		h.mu.Unlock()
	}
	secs := run.Seconds()
	report(b, lat, int(loads.Load()), run, soft)
	if c.keys > 1 {
		b.ReportMetric(float64(loads.Load())/float64(c.keys)/(float64(run)/float64(soft)), "loads/TTL/key")
	}
	b.ReportMetric(float64(dTrips)/float64(len(lat)), "round-trips/req")
	b.ReportMetric(float64(acquires)/float64(len(lat)), "acquires/req")
	b.ReportMetric(float64(dTrips)/secs, "round-trips/s")
	b.ReportMetric(float64(dCommands)/secs, "redis-ops/s")
	b.ReportMetric(float64(dGets)/secs, "gets/s")
	b.ReportMetric(float64(scripts)/secs, "scripts/s")
	b.ReportMetric(float64(sets.Load())/secs, "changes/s")
	if sets.Load() > 0 {
		b.ReportMetric(float64(dCommands)/float64(sets.Load()), "redis-ops/change")
	}
	if n := failed.Load(); n > 0 {
		b.Logf("%d Redis commands failed during the run", n)
		firstErr.Range(func(k, v any) bool {
			b.Logf("  first %v error: %v", k, v)
			return true
		})
	}
}
