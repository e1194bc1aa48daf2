package redisfleet_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/herdcache/herd"
	"github.com/herdcache/herd/observe"
	"github.com/herdcache/herd/redisstore"
	"github.com/herdcache/herd/redisstore/internal/redistest"
	"github.com/herdcache/herd/remote"
)

func TestMain(m *testing.M) {
	if raw := os.Getenv(replicaEnv); raw != "" {
		os.Exit(replicaMain(raw))
	}
	// A killed server makes go-redis log each failed dial; the tests count
	// the failures themselves.
	redis.SetLogger(quiet{})
	os.Exit(m.Run())
}

type quiet struct{}

func (quiet) Printf(context.Context, string, ...any) {}

// Redis-backed tests run on wall time: their bounds are generous and no
// assertion depends on a timing that a loaded machine could miss.

// remoteTimeouts holds the Redis call deadline of tests that need a short one.
var remoteTimeouts sync.Map

// remoteLive holds the LivePeriod of the Remotes of tests that set one.
var remoteLive sync.Map

type replica struct {
	cache  *herd.Cache[string]
	remote *redisstore.Remote
	loads  atomic.Int64
}

// fleet starts n replicas, each with its own client from newClient and its
// own Remote, sharing one key prefix.
func fleet(t testing.TB, n int, newClient func() redis.UniversalClient, tune func(*herd.Options[string])) []*replica {
	t.Helper()
	prefix := fmt.Sprintf("fleet:%s:", t.Name())
	rs := make([]*replica, n)
	for i := range rs {
		timeout := 2 * time.Second // generous: a loaded machine must not turn into a Redis outage
		if o, ok := remoteTimeouts.Load(t.Name()); ok {
			timeout = o.(time.Duration)
		}
		var live time.Duration
		if p, ok := remoteLive.Load(t.Name()); ok {
			live = p.(time.Duration)
		}
		r, err := redisstore.New(redisstore.Options{Client: newClient(), Prefix: prefix, Timeout: timeout, LivePeriod: live})
		if err != nil {
			t.Fatal(err)
		}
		o := &herd.Options[string]{
			Name:             fmt.Sprintf("replica-%d", i),
			MaxEntries:       1000,
			SoftTTL:          time.Second,
			Store:            r,
			Lease:            r,
			LeaseTTL:         2 * time.Second,
			OnLeaseHeld:      herd.Wait,
			LeaseWait:        10 * time.Second,
			NearTTL:          100 * time.Millisecond,
			BreakerThreshold: 3,
			BreakerCooldown:  200 * time.Millisecond,
		}
		if tune != nil {
			tune(o)
		}
		c, err := herd.New(o)
		if err != nil {
			t.Fatal(err)
		}
		rs[i] = &replica{cache: c, remote: r}
		t.Cleanup(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			_ = c.Close(ctx)
			_ = r.Close()
		})
	}
	return rs
}

// stampede has every replica's goroutines Get key at once, with a load that
// takes recompute, and returns the loads made per replica.
func stampede(t *testing.T, rs []*replica, goroutines int, key, value string, recompute time.Duration) []int64 {
	t.Helper()
	before := make([]int64, len(rs))
	for i, r := range rs {
		before[i] = r.loads.Load()
	}
	start := make(chan struct{})
	var wg sync.WaitGroup
	errs := make(chan error, len(rs)*goroutines)
	for _, r := range rs {
		load := func(ctx context.Context) (string, error) {
			r.loads.Add(1)
			select {
			case <-time.After(recompute):
			case <-ctx.Done():
				return "", ctx.Err()
			}
			return value, nil
		}
		for range goroutines {
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-start
				ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
				defer cancel()
				v, err := r.cache.Get(ctx, key, load)
				if err == nil && v != value {
					err = fmt.Errorf("got %q, want %q", v, value)
				}
				if err != nil {
					errs <- err
				}
			}()
		}
	}
	close(start)
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	loads := make([]int64, len(rs))
	for i, r := range rs {
		loads[i] = r.loads.Load() - before[i]
	}
	return loads
}

func sum(xs []int64) (s int64) {
	for _, x := range xs {
		s += x
	}
	return s
}

// expire waits until key has left the Store and every replica's local copy
// is past its hard TTL.
func expire(t *testing.T, rs []*replica, key string, hard time.Duration) {
	t.Helper()
	deadline := time.Now().Add(hard + 5*time.Second)
	for {
		env, err := rs[0].remote.Load(context.Background(), key)
		if err == nil && env == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%q did not expire from Redis: %v", key, err)
		}
		time.Sleep(10 * time.Millisecond) // waiting out a real TTL on a real server
	}
	time.Sleep(20 * time.Millisecond) // the local copies' hard TTL ends with Redis's, to the millisecond
}

func testOneLoadPerExpiry(t *testing.T, newClient func() redis.UniversalClient) {
	// The soft TTL is long enough that a round ends inside it even on a busy
	// machine: a round that outlived it would span two expiries.
	const ttl = 2 * time.Second
	rs := fleet(t, 20, newClient, func(o *herd.Options[string]) { o.SoftTTL = ttl })
	key := herd.Key("hot", "one")
	clean := 0
	for round := range 3 {
		start := time.Now()
		loads := stampede(t, rs, 50, key, fmt.Sprint("v", round), 200*time.Millisecond)
		if judgeRound(t, fmt.Sprint("round ", round), loads, time.Since(start), ttl) {
			clean++
		}
		expire(t, rs, key, ttl)
	}
	if clean == 0 {
		t.Fatal("every round outlived the soft TTL: nothing judged one load per expiry")
	}
}

// judgeRound checks the loads of one stampede that took took, over a value
// fresh for ttl, and reports whether the round was clean. A round that ended
// within ttl spanned one expiry: exactly one load fleet-wide. One that
// outlived it (a busy machine) may have spanned two, and is held to the
// degraded promise, at most one load per replica, and logged.
func judgeRound(t *testing.T, name string, loads []int64, took, ttl time.Duration) bool {
	t.Helper()
	if took < ttl {
		if got := sum(loads); got != 1 {
			t.Fatalf("%s: %d loads across %d replicas, want exactly 1 (per replica: %v)", name, got, len(loads), loads)
		}
		return true
	}
	for i, n := range loads {
		if n > 1 {
			t.Fatalf("%s (%v, past the %v TTL): replica %d loaded %d times, want at most 1", name, took, ttl, i, n)
		}
	}
	t.Logf("%s took %v, past the %v TTL: judged by the degraded bound, %d loads (per replica: %v)", name, took, ttl, sum(loads), loads)
	return false
}

func TestOneLoadPerExpiry(t *testing.T) {
	node := redistest.Server(t)
	testOneLoadPerExpiry(t, func() redis.UniversalClient { return node.Client() })
}

func TestOneLoadPerExpiryCluster(t *testing.T) {
	cluster := redistest.Cluster(t)
	testOneLoadPerExpiry(t, func() redis.UniversalClient { return cluster.Client() })
}

// Without the lease each replica loads once: the control that shows what the
// lease saves.
func TestOneLoadPerReplicaWithoutLease(t *testing.T) {
	node := redistest.Server(t)
	rs := fleet(t, 20, func() redis.UniversalClient { return node.Client() }, func(o *herd.Options[string]) {
		o.Lease = nil
	})
	loads := stampede(t, rs, 50, herd.Key("hot", "nolease"), "v", 300*time.Millisecond)
	for i, n := range loads {
		if n > 1 {
			t.Errorf("replica %d loaded %d times, want at most 1 (in-process coalescing)", i, n)
		}
	}
	if got := sum(loads); got < 2 {
		t.Errorf("%d loads without a lease, want one per replica that missed (expected about 20)", got)
	}
	t.Logf("loads without a lease: %d across 20 replicas", sum(loads))
}

// A holder that crashed mid-load (its load never returns, its watchdog no
// longer extends the lease, it never releases) is taken over once its lease
// expires.
func TestHolderCrashTakeover(t *testing.T) {
	node := redistest.Server(t)
	const leaseTTL = time.Second
	b := fleet(t, 1, func() redis.UniversalClient { return node.Client() }, func(o *herd.Options[string]) {
		o.LeaseTTL = leaseTTL
	})[0]
	r, err := redisstore.New(redisstore.Options{Client: node.Client(), Prefix: fmt.Sprintf("fleet:%s:", t.Name())})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	crashed := herd.Must(herd.New(&herd.Options[string]{
		NoNearCache: true,
		NoBreaker:   true,
		MaxEntries:  10, SoftTTL: time.Minute, Store: r, Lease: lostLease{r},
		LeaseTTL: leaseTTL, OnLeaseHeld: herd.Wait,
	}))
	defer crashed.Close(context.Background())
	key := herd.Key("crash")

	acquired := make(chan struct{})
	never := make(chan struct{})
	defer close(never)
	// The crashed holder's lease is taken after t0 and runs out a lease TTL
	// later: B cannot load sooner than that after t0.
	t0 := time.Now()
	go func() {
		_, _ = crashed.Get(context.Background(), key, func(ctx context.Context) (string, error) {
			close(acquired)
			<-never
			return "", errors.New("crashed")
		})
	}()
	<-acquired
	var took time.Duration
	v, err := b.cache.Get(context.Background(), key, func(ctx context.Context) (string, error) {
		took = time.Since(t0)
		return "b", nil
	})
	if err != nil || v != "b" {
		t.Fatalf("takeover Get = %q, %v; want b", v, err)
	}
	bound := leaseTTL + time.Second + 500*time.Millisecond // lease TTL + maximum backoff + 500ms
	t.Logf("takeover after %v (lease TTL %v, bound %v)", took, leaseTTL, bound)
	if took > bound {
		t.Errorf("takeover took %v, want at most %v", took, bound)
	}
	if took < leaseTTL {
		t.Errorf("takeover after %v, before the crashed holder's lease (%v) ran out", took, leaseTTL)
	}
}

// lostLease wraps a Lease whose extensions never reach Redis: the holder is
// paused or crashed, and its lease runs out mid-load.
type lostLease struct{ remote.Lease }

func (lostLease) Extend(context.Context, string, string, time.Duration) (bool, error) {
	return true, nil
}

// fencedSignal receives a value each time its caches' writes are refused.
type fencedSignal chan struct{}

func (fencedSignal) RecordGet(observe.GetResult)           {}
func (fencedSignal) RecordLoad(time.Duration, error, bool) {}
func (fencedSignal) RecordShed(string, bool)               {}
func (f fencedSignal) RecordLease(e observe.LeaseEvent, _ time.Duration) {
	if e == observe.LeaseFenced {
		f <- struct{}{}
	}
}

// A holder paused past its lease finishes after another replica wrote: its
// write is refused and the newer value stays.
func TestPausedHolderIsFenced(t *testing.T) {
	node := redistest.Server(t)
	rs := fleet(t, 2, func() redis.UniversalClient { return node.Client() }, nil)
	prefix := fmt.Sprintf("fleet:%s:", t.Name())
	r, err := redisstore.New(redisstore.Options{Client: node.Client(), Prefix: prefix})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	fenced := make(fencedSignal, 1)
	paused := herd.Must(herd.New(&herd.Options[string]{
		NoNearCache: true,
		NoBreaker:   true,
		MaxEntries:  10, SoftTTL: time.Minute, Store: r, Lease: lostLease{r},
		LeaseTTL: 300 * time.Millisecond, OnLeaseHeld: herd.Wait, Recorder: fenced,
	}))
	defer paused.Close(context.Background())
	key := herd.Key("paused")

	started, finish := make(chan struct{}), make(chan struct{})
	done := make(chan error, 1)
	go func() {
		v, err := paused.Get(context.Background(), key, func(ctx context.Context) (string, error) {
			close(started)
			<-finish
			return "old", nil
		})
		if err == nil && v != "old" {
			err = fmt.Errorf("paused holder got %q", v)
		}
		done <- err
	}()
	<-started
	// The paused holder's lease runs out; another replica takes over and writes.
	v, err := rs[0].cache.Get(context.Background(), key, func(ctx context.Context) (string, error) { return "new", nil })
	if err != nil || v != "new" {
		t.Fatalf("second replica Get = %q, %v", v, err)
	}
	close(finish)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	<-fenced // the write-back runs in the background
	if n := paused.Stats().FencedWrites; n != 1 {
		t.Errorf("paused holder's fenced writes = %d, want 1", n)
	}
	fresh := fleet(t, 1, func() redis.UniversalClient { return node.Client() }, nil)[0]
	v, err = fresh.cache.Get(context.Background(), key, func(ctx context.Context) (string, error) {
		return "", errors.New("should have been served from Redis")
	})
	if err != nil || v != "new" {
		t.Fatalf("after the paused holder finished, Redis serves %q, %v; want new", v, err)
	}
	if v, _ := paused.Get(context.Background(), key, nil); v != "new" {
		t.Errorf("the paused holder serves %q locally, want new", v)
	}
}

// An invalidation during a load keeps the load's value out of Redis, however
// the two interleave.
func TestInvalidateDuringLoad(t *testing.T) {
	node := redistest.Server(t)
	fenced := make(fencedSignal, 100)
	rs := fleet(t, 2, func() redis.UniversalClient { return node.Client() }, func(o *herd.Options[string]) {
		o.Recorder = fenced
	})
	a, b := rs[0], rs[1]
	ctx := context.Background()
	for i := range 50 {
		key := herd.Key("inv", fmt.Sprint(i))
		started, finish := make(chan struct{}), make(chan struct{})
		done := make(chan struct{})
		go func() {
			defer close(done)
			_, _ = a.cache.Get(ctx, key, func(ctx context.Context) (string, error) {
				close(started)
				<-finish
				return "old", nil
			})
		}()
		<-started
		if err := b.cache.Invalidate(ctx, key); err != nil {
			t.Fatal(err)
		}
		close(finish)
		<-done
		select { // the write-back runs in the background: wait for its refusal
		case <-fenced:
		case <-time.After(10 * time.Second):
			t.Fatalf("round %d: the load's write-back was not refused within 10s", i)
		}
		env, err := a.remote.Load(ctx, key)
		if err != nil {
			t.Fatal(err)
		}
		if env != nil {
			t.Fatalf("round %d: the load that began before Invalidate wrote its value back", i)
		}
		v, err := b.cache.Get(ctx, key, func(ctx context.Context) (string, error) { return "new", nil })
		if err != nil || v != "new" {
			t.Fatalf("round %d: Get after Invalidate = %q, %v; want a new load", i, v, err)
		}
	}
	if n := a.cache.Stats().FencedWrites; n != 50 {
		t.Errorf("fenced writes = %d, want 50", n)
	}
}

// Losers are woken by the holder's completion notice, not by the fallback
// re-read, for the most part.
func TestLosersWokenByPush(t *testing.T) {
	node := redistest.Server(t)
	rs := fleet(t, 20, func() redis.UniversalClient { return node.Client() }, func(o *herd.Options[string]) {
		o.SoftTTL = 300 * time.Millisecond
	})
	key := herd.Key("wake")
	for round := range 3 {
		stampede(t, rs, 5, key, fmt.Sprint(round), 300*time.Millisecond)
		expire(t, rs, key, 300*time.Millisecond)
	}
	var push, poll int64
	for _, r := range rs {
		s := r.cache.Stats()
		push += s.WokenByPush
		poll += s.WokenByPoll
	}
	t.Logf("losers woken by push %d, by fallback re-read %d", push, poll)
	if push+poll == 0 {
		t.Fatal("no loser waited")
	}
	// On a quiet machine nearly all are woken by push; on a busy one a
	// notice can take longer than the first 50ms re-read, which then finds
	// the value as well. Most must still come by push.
	if share := float64(push) / float64(push+poll); share < 0.5 {
		t.Errorf("%.1f%% of losers woken by push, want most of them", 100*share)
	}
}

// anyDegraded reports whether a replica of rs serves without its Store.
func anyDegraded(rs []*replica) bool {
	for _, r := range rs {
		if r.cache.Stats().Degraded {
			return true
		}
	}
	return false
}

// deadlineWhile gives every call and dial of a client the deadline d, within
// its caller's own, while on is set: the client of a Remote whose Timeout
// is d, for one phase of a test.
type deadlineWhile struct {
	on *atomic.Bool
	d  time.Duration
}

func (h deadlineWhile) bound(ctx context.Context) (context.Context, context.CancelFunc) {
	if !h.on.Load() {
		return ctx, func() {}
	}
	return context.WithTimeout(ctx, h.d)
}

func (h deadlineWhile) DialHook(next redis.DialHook) redis.DialHook {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		ctx, cancel := h.bound(ctx)
		defer cancel()
		return next(ctx, network, addr)
	}
}

func (h deadlineWhile) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		ctx, cancel := h.bound(ctx)
		defer cancel()
		return next(ctx, cmd)
	}
}

func (h deadlineWhile) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		ctx, cancel := h.bound(ctx)
		defer cancel()
		return next(ctx, cmds)
	}
}

// Redis dies while 20 replicas serve traffic: no caller sees an error, each
// replica loads at most once per key at a time, and after a restart the fleet
// is back to one load per expiry.
func TestRedisKilled(t *testing.T) {
	node := redistest.Server(t)
	// Until Redis is back, each call ends within 250 ms, the default
	// Timeout, so that the breakers see the outage while it lasts: go-redis
	// goes on redialling a refused address for longer, and a call sent
	// before the kill must not hold a replica's refresh past the outage.
	// After the restart, the fleet's generous deadline, so that a machine
	// busy enough to slow calls down is not taken for an outage that keeps
	// breakers open.
	var short atomic.Bool
	short.Store(true)
	rs := fleet(t, 20, func() redis.UniversalClient {
		c := node.Client()
		c.AddHook(deadlineWhile{on: &short, d: redisstore.DefaultTimeout})
		return c
	}, func(o *herd.Options[string]) {
		o.SoftTTL = 200 * time.Millisecond
		o.HardTTL = 400 * time.Millisecond
	})
	key := herd.Key("killed")
	ctx := context.Background()
	loadsDown := make([]atomic.Int64, len(rs))
	var down atomic.Bool
	var errCount atomic.Int64
	var firstErr atomic.Value
	serve := func(until time.Time) {
		var wg sync.WaitGroup
		for i, r := range rs {
			load := func(ctx context.Context) (string, error) {
				r.loads.Add(1)
				if down.Load() {
					loadsDown[i].Add(1)
				}
				time.Sleep(20 * time.Millisecond) // the recompute
				return "v", nil
			}
			for range 5 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for time.Now().Before(until) {
						if _, err := r.cache.Get(ctx, key, load); err != nil {
							errCount.Add(1)
							firstErr.CompareAndSwap(nil, err)
						}
						time.Sleep(5 * time.Millisecond) // pacing: a client's think time
					}
				}()
			}
		}
		wg.Wait()
	}
	serve(time.Now().Add(500 * time.Millisecond))
	node.Kill()
	down.Store(true)
	serve(time.Now().Add(1500 * time.Millisecond))
	down.Store(false)
	node.Restart()
	short.Store(false)
	// Each breaker closes on a probe, one cooldown after it opened, once a
	// probe finds Redis back: go-redis may answer the first calls after a
	// restart with the dial error it remembers, for up to a second, and a
	// busy machine delays the probes, so traffic goes on until every
	// replica has recovered, within a bound that leaves room for both.
	recoverBy := time.Now().Add(10 * time.Second)
	serve(time.Now().Add(time.Second))
	for anyDegraded(rs) && time.Now().Before(recoverBy) {
		serve(time.Now().Add(250 * time.Millisecond))
	}

	if n := errCount.Load(); n > 0 {
		t.Fatalf("%d Gets failed around the outage, e.g. %v", n, firstErr.Load())
	}
	for i, r := range rs {
		s := r.cache.Stats()
		if s.KeyConcurrencyMax > 1 {
			t.Errorf("replica %d ran %d loads of one key at once", i, s.KeyConcurrencyMax)
		}
		// Down for 1.5s with a 400ms hard TTL: a handful of expiries, one load each.
		if n := loadsDown[i].Load(); n > 8 {
			t.Errorf("replica %d loaded %d times in 1.5s down, want about one per 400ms expiry", i, n)
		}
		if s.BreakerOpens == 0 {
			t.Errorf("replica %d's breaker never opened", i)
		}
	}
	for i, r := range rs {
		if r.cache.Stats().Degraded {
			t.Errorf("replica %d still degraded 10s after Redis came back", i)
		}
	}
	// Back to one load per expiry across the fleet.
	expire(t, rs, key, 400*time.Millisecond)
	start := time.Now()
	loads := stampede(t, rs, 10, key, "after", 200*time.Millisecond)
	judgeRound(t, "after the restart", loads, time.Since(start), 400*time.Millisecond)
}
