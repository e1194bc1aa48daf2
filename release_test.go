package herd_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/herdcache/herd"
	"github.com/herdcache/herd/memory"
	"github.com/herdcache/herd/remote"
)

// Tests that a lease ends whatever its load did, and that the replicas
// waiting on it learn so at once, not after the lease's time.

// A GetMany whose loader fails, panics or leaves every key out (with no
// NegativeTTL) gives its leases back: a retry on the same replica loads at
// once instead of waiting for the leases it took itself.
func TestGetManyFailureReleasesLeases(t *testing.T) {
	keys := []string{"a", "b", "c"}
	fails := map[string]herd.BatchLoadFunc[int]{
		"error": func(context.Context, []string) (map[string]int, error) { return nil, errLoad },
		"panic": func(context.Context, []string) (map[string]int, error) { panic("boom") },
		"none":  func(context.Context, []string) (map[string]int, error) { return nil, nil },
	}
	for name, fail := range fails {
		t.Run(name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				r := memory.New()
				c := fleetReplica(t, r, nil)
				for _, it := range c.GetMany(t.Context(), keys, fail) {
					if it.Err == nil {
						t.Fatalf("the failed GetMany served %d", it.Value)
					}
				}
				start := time.Now()
				items := c.GetMany(bounded(t), keys, func(_ context.Context, ks []string) (map[string]int, error) {
					m := map[string]int{}
					for _, k := range ks {
						m[k] = 1
					}
					return m, nil
				})
				for i, it := range items {
					if it.Err != nil || it.Value != 1 {
						t.Errorf("retry of %q = %d, %v; want 1, nil", keys[i], it.Value, it.Err)
					}
				}
				if d := time.Since(start); d > 0 {
					t.Errorf("the retry took %v; want it at once (LeaseTTL %v)", d, fleetLeaseTTL)
				}
			})
		})
	}
}

// A replica told that another holds a key's lease learns at once that the
// holder ended it without a value (its load failed): its next miss takes
// the lease and loads, instead of waiting out the holder's time.
func TestLoserLearnsFailedHolderAtOnce(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := memory.New()
		a := fleetReplica(t, r, nil)
		b := fleetReplica(t, r, nil)
		gate := make(chan struct{})
		resA := getAsync(t.Context(), a, "k", func(ctx context.Context) (int, error) {
			if err := hold(ctx, gate); err != nil {
				return 0, err
			}
			return 0, errLoad
		})
		synctest.Wait() // A holds the lease
		if _, err := b.Get(t.Context(), "k", fleetNoLoad(t, "B"), herd.WithLoserPolicy(herd.FailFast)); !errors.Is(err, herd.ErrLeaseHeld) {
			t.Fatalf("B's FailFast Get while A holds the lease: %v; want ErrLeaseHeld", err)
		}
		close(gate)
		if res := recv(t, resA); !errors.Is(res.err, errLoad) {
			t.Fatalf("A's Get = %d, %v; want its load's error", res.v, res.err)
		}
		synctest.Wait() // A's release is announced
		start := time.Now()
		fleetMustGet(t, b, "k", fleetValue(3), 3)
		if d := time.Since(start); d > 0 {
			t.Errorf("B's miss took %v after A released; want it at once", d)
		}
	})
}

// A Wait loser whose holder completes while the loser is between its
// attempt and its wait is woken by that completion, not by a later
// re-read of the Store: a Watcher registers before the attempt.
func TestLoserWokenByCompletionBeforeWait(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := memory.New()
		a := fleetReplica(t, r, nil)
		release, resA := fleetHold(t, a, "k", 4)
		b := fleetReplica(t, r, func(o *herd.Options[int]) {
			o.Lease = &releaseOnAcquire{Remote: r, release: release}
		})
		fleetMustGet(t, b, "k", fleetNoLoad(t, "B"), 4, herd.WithLoserPolicy(herd.Wait))
		if res := recv(t, resA); res.err != nil || res.v != 4 {
			t.Fatalf("A's Get = %d, %v; want 4, nil", res.v, res.err)
		}
		if st := b.Stats(); st.WokenByPush != 1 || st.WokenByPoll != 0 {
			t.Errorf("B woken by push %d, by poll %d; want 1, 0", st.WokenByPush, st.WokenByPoll)
		}
	})
}

// releaseOnAcquire is a replica's Lease that lets the holder finish, and
// waits for its completion to be announced, just after this replica's
// acquisition is answered, before the replica can start waiting.
type releaseOnAcquire struct {
	*memory.Remote
	release func()
}

func (l *releaseOnAcquire) Acquire(ctx context.Context, key string, ttl time.Duration, after time.Time) (remote.Grant, error) {
	g, err := l.Remote.Acquire(ctx, key, ttl, after)
	if g.HeldFor > 0 {
		l.release()
		synctest.Wait()
	}
	return g, err
}

// slowFailingStore is a Store whose reads, once failing is set, answer
// with an error after delay, as a Redis timeout does.
type slowFailingStore struct {
	*memory.Remote
	delay   time.Duration
	failing atomic.Bool
}

func (s *slowFailingStore) Load(ctx context.Context, key string) ([]byte, error) {
	if s.failing.Load() {
		time.Sleep(s.delay)
		return nil, errors.New("i/o timeout")
	}
	return s.Remote.Load(ctx, key)
}

func (s *slowFailingStore) LoadMany(ctx context.Context, keys []string) []remote.Loaded {
	if s.failing.Load() {
		time.Sleep(s.delay)
		out := make([]remote.Loaded, len(keys))
		for i := range out {
			out[i].Err = errors.New("i/o timeout")
		}
		return out
	}
	return s.Remote.LoadMany(ctx, keys)
}

// No value is served past its hard expiry because a read waited on the
// Store in between: a local copy that was servable when a miss began is
// judged again by the time after the failed read.
func TestNoValuePastHardAfterRemoteWait(t *testing.T) {
	for _, many := range []bool{false, true} {
		t.Run(map[bool]string{false: "Get", true: "GetMany"}[many], func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				r := memory.New()
				s := &slowFailingStore{Remote: r, delay: 251 * time.Millisecond}
				c := fleetReplica(t, r, func(o *herd.Options[int]) { o.Store, o.Lease = s, nil })
				fleetMustGet(t, c, "k", fleetValue(1), 1)
				hardAt := time.Now().Add(fleetHard)
				time.Sleep(fleetHard - 100*time.Millisecond) // stale, past 2×NearTTL, 100 ms to its hard expiry
				s.failing.Store(true)
				var v int
				var err error
				if many {
					it := c.GetMany(bounded(t), []string{"k"}, func(context.Context, []string) (map[string]int, error) {
						return map[string]int{"k": 2}, nil
					})[0]
					v, err = it.Value, it.Err
				} else {
					v, err = c.Get(bounded(t), "k", fleetValue(2))
				}
				if err == nil && v == 1 {
					t.Errorf("served the copy 1, %v past its hard expiry", time.Since(hardAt))
				}
			})
		})
	}
}

// flakyTier is a replica's Store and Lease whose next fails reads and
// acquisitions fail, as calls that time out do.
type flakyTier struct {
	*memory.Remote
	fails atomic.Int32
	// WatchValues hides the Remote's: no completion carries its value, so
	// that a loser re-reads the Store after it.
	WatchValues struct{}
}

func (l *flakyTier) LoadMany(ctx context.Context, keys []string) []remote.Loaded {
	if l.fails.Add(-1) >= 0 {
		out := make([]remote.Loaded, len(keys))
		for i := range out {
			out[i].Err = errors.New("i/o timeout")
		}
		return out
	}
	return l.Remote.LoadMany(ctx, keys)
}

func (l *flakyTier) Acquire(ctx context.Context, key string, ttl time.Duration, after time.Time) (remote.Grant, error) {
	if l.fails.Add(-1) >= 0 {
		return remote.Grant{}, errors.New("i/o timeout")
	}
	return l.Remote.Acquire(ctx, key, ttl, after)
}

// A Wait loser whose re-read and attempt after the holder's completion
// both fail (a hiccup that does not open the breaker) waits out its
// backoff and then finds the holder's value: it neither stalls nor loads.
func TestLoserRidesOutFailedAttempt(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := memory.New()
		a := fleetReplica(t, r, nil)
		release, resA := fleetHold(t, a, "k", 5)
		fl := &flakyTier{Remote: r}
		b := fleetReplica(t, r, func(o *herd.Options[int]) { o.Store, o.Lease = fl, fl })
		resB := getAsync(bounded(t), b, "k", fleetNoLoad(t, "B"), herd.WithLoserPolicy(herd.Wait))
		synctest.Wait() // B waits for A
		fl.fails.Store(2)
		release()
		if res := recv(t, resA); res.err != nil || res.v != 5 {
			t.Fatalf("A's Get = %d, %v; want 5, nil", res.v, res.err)
		}
		if res := recv(t, resB); res.err != nil || res.v != 5 {
			t.Fatalf("B's Get = %d, %v; want A's 5, nil", res.v, res.err)
		}
		if fl.fails.Load() > 0 {
			t.Error("B made no read and attempt after the holder's completion")
		}
	})
}

// TestBreakerOpensOnMissesOfDownStore: with the Store down, each miss's
// one failed read counts; a fill that has its caller's read makes no
// other call, so no empty batch read counts as the tier answering.
func TestBreakerOpensOnMissesOfDownStore(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := memory.New()
		o := fleetOptions(r)
		o.Lease, o.BreakerThreshold, o.BreakerCooldown, o.NoBreaker = nil, 2, time.Minute, false
		c := newCache(t, o)
		r.SetDown(errors.New("connection refused"))
		for _, k := range []string{"a", "b"} {
			fleetMustGet(t, c, k, fleetValue(1), 1)
		}
		if st := c.Stats(); st.BreakerOpens != 1 || !st.Degraded {
			t.Errorf("BreakerOpens %d, Degraded %v after two misses of a down Store; want 1, true", st.BreakerOpens, st.Degraded)
		}
	})
}
