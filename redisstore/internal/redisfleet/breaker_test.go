package redisfleet_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/herdcache/herd"
	"github.com/herdcache/herd/observe"
	"github.com/herdcache/herd/redisstore/internal/redistest"
)

// breakerEvents records a replica's breaker changes, in order, and signals
// each on a channel.
type breakerEvents struct {
	observe.NopRecorder
	replica int
	mu      sync.Mutex
	changes []observe.EventKind // guarded by mu
	causes  []error             // guarded by mu: each opening's
	opened  chan struct{}       // one send per opening, never blocking the cache
	closed  chan struct{}       // one send per closing
	// anyOpened, when not nil, is sent the replica of each opening.
	anyOpened chan<- int
}

func newBreakerEvents(replica int, anyOpened chan<- int) *breakerEvents {
	return &breakerEvents{replica: replica, opened: make(chan struct{}, 100), closed: make(chan struct{}, 100), anyOpened: anyOpened}
}

func (r *breakerEvents) RecordEvent(e observe.Event) {
	var ch chan struct{}
	switch e.Kind {
	case observe.EventBreakerOpened:
		ch = r.opened
	case observe.EventBreakerClosed:
		ch = r.closed
	default:
		return
	}
	r.mu.Lock()
	r.changes = append(r.changes, e.Kind)
	if e.Kind == observe.EventBreakerOpened {
		r.causes = append(r.causes, e.Err)
	}
	r.mu.Unlock()
	select {
	case ch <- struct{}{}:
	default:
	}
	if e.Kind == observe.EventBreakerOpened && r.anyOpened != nil {
		select {
		case r.anyOpened <- r.replica:
		default:
		}
	}
}

// opensBy returns the failures that opened the breaker, in order.
func (r *breakerEvents) opensBy() []error {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]error(nil), r.causes...)
}

func (r *breakerEvents) seen() []observe.EventKind {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]observe.EventKind(nil), r.changes...)
}

// await waits for one signal on ch, for at most d.
func await(t *testing.T, ch <-chan struct{}, d time.Duration, what string) {
	t.Helper()
	select {
	case <-ch:
	case <-time.After(d):
		t.Fatalf("no %s within %v", what, d)
	}
}

// awaitBy waits for one signal on ch until deadline.
func awaitBy(t *testing.T, ch <-chan struct{}, deadline time.Time, what string) {
	t.Helper()
	select {
	case <-ch:
	case <-time.After(time.Until(deadline)):
		t.Fatalf("no %s by the deadline", what)
	}
}

// keyLoads records the loads of one replica per key, to tell whether two
// of one key ever ran at once, and signals each load's start.
type keyLoads struct {
	mu       sync.Mutex
	running  map[string]int // guarded by mu
	overlaps int            // guarded by mu
	started  chan struct{}  // one send per load, never blocking it
}

func (l *keyLoads) start(key string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.running == nil {
		l.running = map[string]int{}
	}
	l.running[key]++
	if l.running[key] > 1 {
		l.overlaps++
	}
	select {
	case l.started <- struct{}{}:
	default:
	}
}

func (l *keyLoads) end(key string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.running[key]--
}

func (l *keyLoads) overlapped() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.overlaps
}

// drain empties ch of the signals it holds.
func drain(ch <-chan struct{}) {
	for {
		select {
		case <-ch:
		default:
			return
		}
	}
}

// awaitNBy waits for n signals on ch until deadline.
func awaitNBy(t *testing.T, ch <-chan struct{}, n int, deadline time.Time, what string) {
	t.Helper()
	timeout := time.After(time.Until(deadline))
	for i := range n {
		select {
		case <-ch:
		case <-timeout:
			t.Fatalf("%d of %d %s by the deadline", i, n, what)
		}
	}
}

// Redis is killed under load and restarted on the same port: each of 8
// replicas, reading tagged values over its own go-redis client (default
// options) with the recommended breaker, opens its breaker once and closes
// it once, and no replica runs two loads of one key at once meanwhile.
// Each Redis call has the fleet's generous deadline: on a loaded machine a
// live Redis that answers late is not the outage under test. The waits for
// events share deadlines that a loaded machine meets: each replica's
// events arrive in their own time, in any order.
// While the breakers are open no replica may call Redis for tag versions
// (each such call dials the dead server, and once a pool has failed
// PoolSize dials go-redis fails every new connection at once with the last
// dial error until its redial, once a second, succeeds: calls made after a
// probe closed the breaker would then fail on a server that is back); and
// calls that were under way when a probe closed the breaker must not open
// it again.
func TestBreakerRecoversOnceAfterRestart(t *testing.T) {
	node := redistest.Server(t)
	const (
		replicas   = 8
		readers    = 5 // per replica
		keyCount   = 10
		recompute  = 20 * time.Millisecond
		settle     = 1500 * time.Millisecond // past go-redis' one-second redial
		eventBound = 30 * time.Second        // for each phase, all replicas together
	)
	var events []*breakerEvents
	anyOpened := make(chan int, 100)
	rs := fleet(t, replicas, func() redis.UniversalClient { return node.Client() }, func(o *herd.Options[string]) {
		o.SoftTTL = 200 * time.Millisecond
		o.HardTTL = 400 * time.Millisecond
		d := herd.DefaultOptions[string]() // the recommended breaker
		o.BreakerThreshold, o.BreakerCooldown = d.BreakerThreshold, d.BreakerCooldown
		ev := newBreakerEvents(len(events), anyOpened)
		events = append(events, ev)
		o.Recorder = ev
	})
	keys := make([]string, keyCount)
	for i := range keys {
		keys[i] = herd.Key("restart", fmt.Sprint(i))
	}
	loads := make([]*keyLoads, replicas)
	served := make([]chan struct{}, replicas) // one send per Get answered
	stop := make(chan struct{})
	var wg sync.WaitGroup
	var errCount, noFresh atomic.Int64
	var firstErr atomic.Value
	for i, r := range rs {
		loads[i] = &keyLoads{started: make(chan struct{}, 10_000)}
		served[i] = make(chan struct{}, 10_000)
		for g := range readers {
			wg.Go(func() {
				tick := time.NewTicker(2 * time.Millisecond) // a client's think time
				defer tick.Stop()
				for n := g; ; n++ {
					key := keys[n%len(keys)]
					load := func(ctx context.Context) (string, error) {
						loads[i].start(key)
						defer loads[i].end(key)
						herd.Tags(ctx, "tag-"+key)
						select {
						case <-time.After(recompute):
						case <-ctx.Done():
							return "", ctx.Err()
						}
						return "v", nil
					}
					switch _, err := r.cache.Get(context.Background(), key, load); {
					case errors.Is(err, herd.ErrNoFreshValue):
						// Its value passed HardTTL before it could be
						// taken, four times: a loaded machine, not the
						// outage; counted apart.
						noFresh.Add(1)
					case err != nil:
						errCount.Add(1)
						firstErr.CompareAndSwap(nil, err)
					}
					select {
					case served[i] <- struct{}{}:
					default:
					}
					select {
					case <-stop:
						return
					case <-tick.C:
					}
				}
			})
		}
	}
	halt := sync.OnceFunc(func() {
		close(stop)
		wg.Wait()
	})
	defer halt()

	// Every replica serves its readers from Redis before the kill.
	deadline := time.Now().Add(eventBound)
	for i := range rs {
		awaitNBy(t, served[i], 10*keyCount, deadline, fmt.Sprintf("Gets answered on replica %d", i))
	}

	node.Kill()
	deadline = time.Now().Add(eventBound)
	for i, ev := range events {
		awaitBy(t, ev.opened, deadline, fmt.Sprintf("breaker opening on replica %d after the kill", i))
	}
	// Down long enough that every replica's copies pass their hard TTL and
	// are loaded again locally, tagged, several times.
	for i := range rs {
		drain(loads[i].started)
	}
	deadline = time.Now().Add(eventBound)
	for i := range rs {
		awaitNBy(t, loads[i].started, 3*keyCount, deadline, fmt.Sprintf("loads on replica %d while Redis is down", i))
	}
	overlapsDown := make([]int, replicas)
	for i := range rs {
		overlapsDown[i] = loads[i].overlapped()
	}

	restarted := time.Now()
	node.Restart()
	deadline = time.Now().Add(eventBound)
	for i, ev := range events {
		awaitBy(t, ev.closed, deadline, fmt.Sprintf("breaker closing on replica %d after the restart", i))
	}
	closedBy := time.Since(restarted)
	// The replicas go on reading after the last closing: a breaker that
	// opens again within settle fails the test at once.
	for range replicas {
		<-anyOpened // the openings after the kill, each seen above
	}
	select {
	case i := <-anyOpened:
		t.Errorf("replica %d's breaker opened again %v after the restart, %v after the last closing; the failures that opened it: %v", i, time.Since(restarted), time.Since(restarted)-closedBy, events[i].opensBy())
	case <-time.After(settle):
	}
	halt()

	t.Logf("every breaker closed within %v of the restart", closedBy)
	for i, r := range rs {
		s := r.cache.Stats()
		seen := events[i].seen()
		if s.BreakerOpens != 1 || len(seen) != 2 || seen[0] != observe.EventBreakerOpened || seen[1] != observe.EventBreakerClosed {
			t.Errorf("replica %d: breaker opened %d times, events %v; want opened once, then closed once", i, s.BreakerOpens, seen)
		}
		if s.Degraded {
			t.Errorf("replica %d still degraded at the end, %v after the restart", i, time.Since(restarted))
		}
		if n := loads[i].overlapped(); n > 0 {
			t.Errorf("replica %d ran two loads of one key at once %d times (%d of them while down)", i, n, overlapsDown[i])
		}
		if s.KeyConcurrencyMax > 1 {
			t.Errorf("replica %d: KeyConcurrencyMax %d, want 1", i, s.KeyConcurrencyMax)
		}
	}
	if n := errCount.Load(); n > 0 {
		t.Errorf("%d Gets failed around the outage, e.g. %v", n, firstErr.Load())
	}
	t.Logf("%d Gets found their values expired (ErrNoFreshValue) on every attempt", noFresh.Load())
}

// A tagged read while the breaker is open makes no Redis call: with Redis
// frozen (SIGSTOP), each miss is loaded locally at once, instead of waiting
// out the client's timeout on the tags' versions.
func TestTagVersionsHonourBreaker(t *testing.T) {
	node := redistest.Server(t)
	remoteTimeouts.Store(t.Name(), 250*time.Millisecond)
	trips := &roundTrips{}
	ev := newBreakerEvents(0, nil)
	rs := fleet(t, 1, func() redis.UniversalClient {
		c := node.Client()
		c.AddHook(trips)
		return c
	}, func(o *herd.Options[string]) {
		o.Recorder = ev
		o.BreakerCooldown = time.Minute // no probe during the test
	})
	c := rs[0].cache
	load := func(ctx context.Context) (string, error) {
		herd.Tags(ctx, "catalog")
		return "v", nil
	}
	ctx := context.Background()
	if _, err := c.Get(ctx, herd.Key("warm"), load); err != nil {
		t.Fatal(err)
	}

	node.Pause()
	for i := 0; ; i++ {
		select {
		case <-ev.opened:
		default:
			if i > 100 {
				t.Fatal("the breaker did not open after 100 misses on a frozen Redis")
			}
			if _, err := c.Get(ctx, herd.Key("open", fmt.Sprint(i)), load); err != nil {
				t.Fatal(err)
			}
			continue
		}
		break
	}
	before := trips.trips.Load()
	const misses = 20
	start := time.Now()
	for i := range misses {
		v, err := c.Get(ctx, herd.Key("down", fmt.Sprint(i)), load)
		if err != nil || v != "v" {
			t.Fatalf("Get with the breaker open = %q, %v; want v", v, err)
		}
	}
	took := time.Since(start)
	if n := trips.trips.Load() - before; n != 0 {
		t.Errorf("%d tagged misses with the breaker open made %d Redis calls, want none (%v)", misses, n, trips.byName)
	}
	// Each call to the frozen server would cost the 250ms timeout.
	if took >= 250*time.Millisecond {
		t.Errorf("%d tagged misses with the breaker open took %v, want less than one Redis timeout", misses, took)
	}
	if s := c.Stats(); !s.Degraded || s.BreakerOpens != 1 {
		t.Errorf("Degraded %v after %d opens, want true after 1", s.Degraded, s.BreakerOpens)
	}
}
