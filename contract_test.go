package herd_test

import (
	"context"
	"errors"
	"fmt"
	"math"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/herdcache/herd"
	"github.com/herdcache/herd/flight"
	"github.com/herdcache/herd/limiter"
	"github.com/herdcache/herd/memory"
	"github.com/herdcache/herd/observe"
	"github.com/herdcache/herd/remote"
	"github.com/herdcache/herd/remote/envelope"
)

// Tests of the consistency contract in the package docs at its edges: a
// Store call that is slow, fails or is refused, a clock that is off, and
// durations at the limits.

// slowTier is a remote tier whose chosen calls block until the test lets
// them through. It is a Store and a Lease only (not a Notifier nor a
// WriteReleaser), so that no change notice tidies up behind the cache.
type slowTier struct {
	remote.Store
	remote.Lease
	// entered receives the name of each gated call before it blocks.
	entered chan string
	// gates holds, by call name ("set", "invalidate", "write", "release"),
	// a channel the call waits on; a call with none passes.
	gates map[string]chan struct{}
	// loadErr, when set, is returned by every Load.
	loadErr atomic.Pointer[error]
	// acquires counts Acquire calls.
	acquires atomic.Int64
}

func newSlowTier(r *memory.Remote, gated ...string) *slowTier {
	s := &slowTier{Store: r, Lease: r, entered: make(chan string, 16), gates: make(map[string]chan struct{})}
	for _, name := range gated {
		s.gates[name] = make(chan struct{})
	}
	return s
}

func (s *slowTier) gate(name string) {
	if g, ok := s.gates[name]; ok {
		s.entered <- name
		<-g
	}
}

func (s *slowTier) Load(ctx context.Context, key string) ([]byte, error) {
	if err := s.loadErr.Load(); err != nil {
		return nil, *err
	}
	return s.Store.Load(ctx, key)
}

func (s *slowTier) Set(ctx context.Context, key string, env []byte, ttl time.Duration) (uint64, error) {
	s.gate("set")
	return s.Store.Set(ctx, key, env, ttl)
}

func (s *slowTier) Invalidate(ctx context.Context, key string) error {
	s.gate("invalidate")
	return s.Store.Invalidate(ctx, key)
}

func (s *slowTier) Write(ctx context.Context, key string, env []byte, fence uint64, ttl time.Duration) (bool, error) {
	s.gate("write")
	return s.Store.Write(ctx, key, env, fence, ttl)
}

func (s *slowTier) Acquire(ctx context.Context, key string, ttl time.Duration, after time.Time) (remote.Grant, error) {
	if s.acquires.Add(1) > 100 {
		return remote.Grant{}, errors.New("slowTier: over 100 acquisitions: a miss is looping")
	}
	return s.Lease.Acquire(ctx, key, ttl, after)
}

// entered waits until the gated call name has been made.
func waitEntered(t *testing.T, s *slowTier, name string) {
	t.Helper()
	select {
	case got := <-s.entered:
		if got != name {
			t.Fatalf("gated call %q entered, want %q", got, name)
		}
	case <-time.After(patience):
		t.Fatalf("%s was never called", name)
	}
}

// A Get that reads the Store while Invalidate is deleting the value there
// may be served the old value, but it must not leave it behind: after
// Invalidate returns, the next Get loads. The Store's delete is held open by
// a gate, so the interleaving is the same on every run.
func TestInvalidateRacesReader(t *testing.T) {
	for _, lease := range []bool{false, true} {
		t.Run(map[bool]string{false: "NoLease", true: "Lease"}[lease], func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				tier := newSlowTier(memory.New(), "invalidate")
				c := newCache(t, tierOptions(tier, lease))
				mustGet(t, c, "k", func(context.Context) (int, error) { return 1, nil }, 1)
				synctest.Wait() // the write-back

				done := make(chan error, 1)
				go func() { done <- c.Invalidate(bounded(t), "k") }()
				waitEntered(t, tier, "invalidate")
				// The Store still holds 1: a reader now may get it.
				if v, err := c.Get(bounded(t), "k", func(context.Context) (int, error) { return 2, nil }); err != nil || v != 1 && v != 2 {
					t.Fatalf("Get during Invalidate = %d, %v", v, err)
				}
				close(tier.gates["invalidate"])
				if err := <-done; err != nil {
					t.Fatalf("Invalidate: %v", err)
				}
				mustGet(t, c, "k", func(context.Context) (int, error) { return 3, nil }, 3)
			})
		})
	}
}

// Set writes the Store before the local tier, inside one change: a Get that
// reads the Store's old value while Set's write is in flight cannot leave it
// behind either.
func TestSetRacesReader(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		tier := newSlowTier(memory.New())
		c := newCache(t, tierOptions(tier, false))
		mustGet(t, c, "k", func(context.Context) (int, error) { return 1, nil }, 1)
		synctest.Wait()
		tier.gates["set"] = make(chan struct{})

		done := make(chan error, 1)
		go func() { done <- c.Set(bounded(t), "k", 5) }()
		waitEntered(t, tier, "set")
		c2 := newCache(t, tierOptions(tier, false)) // no local copy: reads the Store
		mustGet(t, c2, "k", nil, 1)
		if v, err := c.Get(bounded(t), "k", nil); err != nil || v != 1 {
			t.Fatalf("Get during Set = %d, %v; want the old 1", v, err)
		}
		close(tier.gates["set"])
		if err := <-done; err != nil {
			t.Fatalf("Set: %v", err)
		}
		mustGet(t, c, "k", nil, 5)
	})
}

// tierOptions are the options of a replica over tier, with its Lease when
// lease is set; fresh for testSoft, near-cache 100ms, no jitter.
func tierOptions(tier *slowTier, lease bool) *herd.Options[int] {
	o := &herd.Options[int]{NoBreaker: true, MaxEntries: 100, SoftTTL: testSoft, HardTTL: testHard, Store: tier, NearTTL: 100 * time.Millisecond}
	if lease {
		o.Lease, o.LeaseTTL = tier, fleetLeaseTTL
	}
	return o
}

// Without a Lease nothing fences other replicas' writes, but this process
// orders its own: a load that began before its own Invalidate or Set never
// writes its value to the Store afterwards, for this replica or another to
// read.
func TestOwnLoadCannotOverwriteOwnChange(t *testing.T) {
	for _, change := range []string{"Invalidate", "Set"} {
		t.Run(change, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				r := memory.New()
				opts := func() *herd.Options[int] {
					return &herd.Options[int]{NoBreaker: true, MaxEntries: 100, SoftTTL: testSoft, Store: r, NearTTL: 100 * time.Millisecond}
				}
				a, b := newCache(t, opts()), newCache(t, opts())
				gate := make(chan struct{})
				old := getAsync(bounded(t), a, "k", func(ctx context.Context) (int, error) {
					return 1, hold(ctx, gate) // "old"
				})
				synctest.Wait()
				want := 0 // nothing: the next Get loads
				if change == "Set" {
					want = 5
					if err := a.Set(bounded(t), "k", 5); err != nil {
						t.Fatal(err)
					}
				} else if err := a.Invalidate(bounded(t), "k"); err != nil {
					t.Fatal(err)
				}
				close(gate)
				if res := recv(t, old); res.err != nil || res.v != 1 {
					t.Fatalf("the load's own caller got %d, %v; want 1", res.v, res.err)
				}
				synctest.Wait()
				time.Sleep(150 * time.Millisecond) // past NearTTL
				for name, c := range map[string]*herd.Cache[int]{"this replica": a, "another replica": b} {
					v, err := c.Get(bounded(t), "k", func(context.Context) (int, error) { return 9, nil })
					if err != nil || v == 1 || want != 0 && v != want {
						t.Errorf("%s: Get = %d, %v after %s; want %d", name, v, err, change, max(want, 9))
					}
				}
			})
		})
	}
}

// A replica whose clock runs ahead of the tier's sees a value stale that the
// tier calls fresh. Under NoStale that disagreement ends in one load, not in
// a loop of acquisitions each handing back the same value.
func TestClockAheadLoadsOnce(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		tier := newSlowTier(memory.New())
		a := newCache(t, tierOptions(tier, true))
		mustGet(t, a, "k", func(context.Context) (int, error) { return 1, nil }, 1)
		synctest.Wait()

		o := tierOptions(tier, true)
		o.NoStale = true
		b, err := herd.New(o)
		if err != nil {
			t.Fatal(err)
		}
		defer b.Close(context.Background())
		herd.SetClockOffset(b, testSoft+time.Second) // a's value is stale to b
		before := tier.acquires.Load()
		load, loads := counting()
		v, err := b.Get(bounded(t), "k", load)
		if err != nil || v != 1 || loads.Load() != 1 {
			t.Fatalf("Get on the skewed replica = %d, %v after %d loads; want its own load's 1", v, err, loads.Load())
		}
		if n := tier.acquires.Load() - before; n != 1 {
			t.Errorf("the skewed replica made %d acquisitions, want 1", n)
		}
	})
}

// The empty key is a key: it is what Key("") returns. It is stored and
// shared like any other, and never mistaken for a sick Store.
func TestEmptyKeyIsAKey(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := memory.New()
		opts := func() *herd.Options[int] {
			o := fleetOptions(r)
			o.BreakerThreshold, o.BreakerCooldown, o.NoBreaker = 3, time.Second, false
			return o
		}
		a, b := newCache(t, opts()), newCache(t, opts())
		load, loads := counting()
		for range 5 {
			mustGet(t, a, herd.Key(""), load, 1)
		}
		synctest.Wait()
		fleetMustGet(t, b, "", nil, 1)
		if st := a.Stats(); st.BreakerOpens != 0 || st.RemoteErrors != 0 || loads.Load() != 1 {
			t.Errorf("5 Gets of \"\": %d loads, %d remote errors, breaker opened %d times; want 1, 0, 0", loads.Load(), st.RemoteErrors, st.BreakerOpens)
		}
	})
}

// rejectingTier refuses every read and acquisition of keys that start with
// "bad", as a tier refuses a call about one key's state.
type rejectingTier struct{ *memory.Remote }

var errBadKey = errors.New("bad key state")

func (r rejectingTier) Load(ctx context.Context, key string) ([]byte, error) {
	if strings.HasPrefix(key, "bad") {
		return nil, errors.Join(remote.ErrRejected, errBadKey)
	}
	return r.Remote.Load(ctx, key)
}

func (r rejectingTier) Acquire(ctx context.Context, key string, ttl time.Duration, after time.Time) (remote.Grant, error) {
	if strings.HasPrefix(key, "bad") {
		return remote.Grant{}, errors.Join(remote.ErrRejected, errBadKey)
	}
	return r.Remote.Acquire(ctx, key, ttl, after)
}

// A call the tier refuses for one key's sake says nothing of the tier's
// health: however often it happens, the breaker stays closed and every other
// key keeps the shared tier.
func TestRejectedCallsDoNotTripBreaker(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := memory.New()
		opts := func(tier interface {
			remote.Store
			remote.Lease
		}) *herd.Options[int] {
			o := fleetOptions(r)
			o.Store, o.Lease = tier, tier
			o.BreakerThreshold, o.BreakerCooldown, o.NoBreaker = 3, time.Second, false
			return o
		}
		a := newCache(t, opts(rejectingTier{r}))
		for i := range 10 {
			mustGet(t, a, fmt.Sprint("bad", i), func(context.Context) (int, error) { return i, nil }, i)
		}
		if st := a.Stats(); st.Degraded || st.BreakerOpens != 0 {
			t.Fatalf("after 10 misses refused by the tier the breaker opened %d times (degraded %v), want never", st.BreakerOpens, st.Degraded)
		}
		mustGet(t, a, "good", func(context.Context) (int, error) { return 7, nil }, 7)
		synctest.Wait()
		fleetMustGet(t, newCache(t, opts(r)), "good", nil, 7)
	})
}

// A Store read that fails (a timeout on a busy machine) does not make the
// miss load on its own: it still goes through the lease, and waits for the
// replica that holds it.
func TestFailedReadStillTakesLease(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := memory.New()
		a := fleetReplica(t, r, nil)
		tier := newSlowTier(r)
		errTimeout := error(context.DeadlineExceeded)
		tier.loadErr.Store(&errTimeout)
		o := tierOptions(tier, true)
		o.OnLeaseHeld, o.LeaseWait = herd.Wait, time.Minute
		o.BreakerThreshold, o.BreakerCooldown, o.NoBreaker = 5, time.Second, false
		b := newCache(t, o)

		gate := make(chan struct{})
		resA := getAsync(bounded(t), a, "k", func(ctx context.Context) (int, error) { return 1, hold(ctx, gate) })
		synctest.Wait()
		var loadsB atomic.Int64
		resB := getAsync(bounded(t), b, "k", func(context.Context) (int, error) {
			loadsB.Add(1)
			return 2, nil
		})
		synctest.Wait()
		close(gate)
		if res := recv(t, resA); res.err != nil || res.v != 1 {
			t.Fatalf("holder got %d, %v", res.v, res.err)
		}
		if res := recv(t, resB); res.err != nil || res.v != 1 || loadsB.Load() != 0 {
			t.Fatalf("replica with a failed read got %d, %v after %d loads of its own; want the holder's 1 and none", res.v, res.err, loadsB.Load())
		}
	})
}

// gatedWriter is a memory.Remote whose lease write-back blocks until the
// test lets it through.
type gatedWriter struct {
	*memory.Remote
	entered, gate chan struct{}
}

func (g gatedWriter) WriteRelease(ctx context.Context, key string, env []byte, fence uint64, ttl time.Duration, token string) (bool, error) {
	g.entered <- struct{}{}
	<-g.gate
	return g.Remote.WriteRelease(ctx, key, env, fence, ttl, token)
}

func (g gatedWriter) Set(ctx context.Context, key string, env []byte, ttl time.Duration) (uint64, error) {
	g.entered <- struct{}{}
	<-g.gate
	return g.Remote.Set(ctx, key, env, ttl)
}

// A load's callers get its value as soon as it returns: the write-back to
// the Store (with the release of the lease) runs in the background, and
// Close waits for it.
func TestWriteBackOffCallersPath(t *testing.T) {
	for _, lease := range []bool{true, false} {
		t.Run(map[bool]string{false: "NoLease", true: "Lease"}[lease], func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				r := memory.New()
				w := gatedWriter{Remote: r, entered: make(chan struct{}, 1), gate: make(chan struct{})}
				o := fleetOptions(r)
				o.Store, o.Lease = w, w
				if !lease {
					o.Lease, o.LeaseTTL = nil, 0
				}
				c, err := herd.New(o)
				if err != nil {
					t.Fatal(err)
				}
				mustGet(t, c, "k", func(context.Context) (int, error) { return 1, nil }, 1)
				<-w.entered // the write-back is under way, held
				mustGet(t, c, "k", nil, 1)

				closed := make(chan error, 1)
				go func() { closed <- c.Close(context.Background()) }()
				synctest.Wait()
				select {
				case err := <-closed:
					t.Fatalf("Close returned (%v) before the write-back ended", err)
				default:
				}
				close(w.gate)
				if err := <-closed; err != nil {
					t.Fatalf("Close: %v", err)
				}
				if b, err := r.Load(t.Context(), "k"); err != nil || b == nil {
					t.Fatalf("the Store holds %q, %v after Close; want the written value", b, err)
				}
			})
		})
	}
}

// Durations at the limits: New refuses any above MaxTTL, naming the field,
// and a load's own TTLs saturate instead of wrapping into the past.
func TestDurationsSaturate(t *testing.T) {
	o := testOptions()
	o.HardTTL = math.MaxInt64
	if _, err := herd.New(o); err == nil {
		t.Fatal("New accepted a HardTTL of MaxInt64")
	}
	synctest.Test(t, func(t *testing.T) {
		o := testOptions()
		o.SoftTTL, o.HardTTL = time.Minute, herd.MaxTTL
		c := newCache(t, o)
		load, loads := counting()
		for range 3 {
			mustGet(t, c, "max", load, 1)
		}
		huge := func(ctx context.Context) (int, error) {
			herd.SetTTL(ctx, math.MaxInt64, math.MaxInt64)
			return load(ctx)
		}
		for range 3 {
			mustGet(t, c, "huge", huge, 2)
		}
		if n := loads.Load(); n != 2 {
			t.Errorf("6 Gets of 2 keys made %d loads, want 2", n)
		}
	})
}

// The longest LoadTimeout gives the load a deadline in the future, not one
// wrapped into the past.
func TestLongestLoadTimeout(t *testing.T) {
	o := testOptions()
	o.LoadTimeout = herd.MaxTTL
	c := newCache(t, o)
	_, err := c.Get(t.Context(), "k", func(ctx context.Context) (int, error) {
		d, ok := ctx.Deadline()
		if !ok || !d.After(time.Now().Add(herd.MaxTTL-time.Hour)) || ctx.Err() != nil {
			return 0, errors.New("the load's context has deadline " + d.String() + " or has ended")
		}
		return 1, nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// A load that calls runtime.Goexit without coalescing gives its caller
// flight.ErrGoexit, as a coalesced one does.
func TestGoexitWithoutCoalescing(t *testing.T) {
	o := testOptions()
	o.DisableCoalescing = true
	c := newCache(t, o)
	_, err := c.Get(t.Context(), "k", func(context.Context) (int, error) {
		runtime.Goexit()
		return 0, nil
	})
	if !errors.Is(err, flight.ErrGoexit) {
		t.Fatalf("Get = %v, want flight.ErrGoexit", err)
	}
}

// A Get with no loader on a cold key takes neither the lease, whose
// acquisition would advance the fence, nor a limiter slot.
func TestNoLoaderTakesNothing(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := memory.New()
		l, err := limiter.New(limiter.Options{Limit: 1})
		if err != nil {
			t.Fatal(err)
		}
		o := fleetOptions(r)
		o.Limiter = l
		c := newCache(t, o)
		if _, err := c.Get(bounded(t), "cold", nil); !errors.Is(err, herd.ErrNoLoader) {
			t.Fatalf("Get with no loader = %v, want ErrNoLoader", err)
		}
		if st := r.Stats(); st.AcquireLease != 0 {
			t.Errorf("the Get took the lease %d times, want never", st.AcquireLease)
		}
		if st := l.Stats(); st.Acquired != 0 {
			t.Errorf("the Get took %d limiter slots, want none", st.Acquired)
		}
	})
}

// A stored value whose envelope is sound but whose bytes the codec cannot
// read is loaded again without the lease (the tier handed the value, not a
// lease), so no lease is extended, released or reported lost.
func TestUndecodableValueTakesNoLease(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := memory.New()
		o := fleetOptions(r)
		var lost atomic.Int64
		o.Recorder = leaseCounter{lost: &lost}
		c := newCache(t, o)
		env := envelopeOf(t, []byte("not json"), time.Now().Add(time.Hour))
		if _, err := r.Set(t.Context(), "k", env, time.Hour); err != nil {
			t.Fatal(err)
		}
		mustGet(t, c, "k", func(context.Context) (int, error) {
			time.Sleep(2 * fleetLeaseTTL) // long enough for a watchdog to tick
			return 4, nil
		}, 4)
		synctest.Wait()
		if st := c.Stats(); st.LeaseLost != 0 || st.LeaseExtended != 0 || lost.Load() != 0 {
			t.Errorf("no lease was taken, yet %d extensions and %d lost leases were counted (%d reported)", st.LeaseExtended, st.LeaseLost, lost.Load())
		}
		if st := r.Stats(); st.AcquireLease != 0 || st.Extends != 0 {
			t.Errorf("the tier saw %d leases and %d extensions, want none", st.AcquireLease, st.Extends)
		}
	})
}

// leaseCounter counts the LeaseLost events a cache reports.
type leaseCounter struct {
	observe.NopRecorder
	lost *atomic.Int64
}

func (l leaseCounter) RecordLease(e observe.LeaseEvent, _ time.Duration) {
	if e == observe.LeaseLost {
		l.lost.Add(1)
	}
}

// envelopeOf encodes value as a remote entry fresh until soft.
func envelopeOf(t *testing.T, value []byte, soft time.Time) []byte {
	t.Helper()
	return envelope.Append(nil, &envelope.Envelope{Soft: soft.UnixMilli(), Hard: soft.UnixMilli(), Value: value})
}

// A background refresh that the limiter sheds makes no remote call at all,
// and backs off before the next read tries again.
func TestShedRefreshTouchesNoRedis(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := memory.New()
		l, err := limiter.New(limiter.Options{Limit: 2, Reserve: 1})
		if err != nil {
			t.Fatal(err)
		}
		o := fleetOptions(r)
		o.Limiter, o.RefreshBackoff = l, time.Second
		c := newCache(t, o)
		mustGet(t, c, "k", func(context.Context) (int, error) { return 1, nil }, 1)
		synctest.Wait()
		// Hold the one slot that is not reserved for foreground misses.
		gate := make(chan struct{})
		busy := getAsync(bounded(t), c, "busy", func(ctx context.Context) (int, error) { return 2, hold(ctx, gate) })
		synctest.Wait()
		time.Sleep(fleetSoft) // k is stale now
		before := r.Stats()
		refresh := func(context.Context) (int, error) { return 3, nil }
		for range 6 {
			mustGet(t, c, "k", refresh, 1) // stale, served; its refresh is shed, then backs off
			synctest.Wait()
		}
		after := r.Stats()
		acquired := func(s memory.Stats) uint64 { return s.AcquireLease + s.AcquireHeld + s.AcquireValue }
		if n := acquired(after) - acquired(before); n != 0 {
			t.Errorf("shed refreshes made %d acquisitions, want none", n)
		}
		if shed := l.Stats().ShedReserve; shed != 1 {
			t.Errorf("%d refreshes were shed over 6 reads, want 1: the others back off", shed)
		}
		close(gate)
		recv(t, busy)
	})
}
