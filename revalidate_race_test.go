package herd_test

import (
	"context"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/herdcache/herd"
	"github.com/herdcache/herd/memory"
	"github.com/herdcache/herd/remote"
)

// heldLoads is a memory.Remote whose Load, while armed, reads the stored
// bytes at once but returns them only when gate is closed: a read of the
// Store that is slow to come back.
type heldLoads struct {
	*memory.Remote
	armed atomic.Bool
	gate  chan struct{}
}

func (h *heldLoads) Load(ctx context.Context, key string) ([]byte, error) {
	b, err := h.Remote.Load(ctx, key)
	if h.armed.Load() {
		<-h.gate
	}
	return b, err
}

// A background read of the Store that began before a refresh landed does
// not put its older value over the refreshed one.
func TestRevalidationDoesNotUndoRefresh(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := &heldLoads{Remote: memory.New(), gate: make(chan struct{})}
		c := newCache(t, &herd.Options[int]{
			NoBreaker:  true,
			MaxEntries: 10, SoftTTL: 10 * time.Second, HardTTL: 20 * time.Second,
			Store: h, Lease: h, LeaseTTL: 5 * time.Second, NearTTL: 8 * time.Second,
		})
		t0 := time.Now()
		fleetMustGet(t, c, "k", fleetValue(1), 1)

		// Past NearTTL: the read is served and one background read of the
		// Store starts; it reads value 1 and is slow to come back.
		sleepUntil(t0.Add(8*time.Second + 500*time.Millisecond))
		h.armed.Store(true)
		fleetMustGet(t, c, "k", fleetNoLoad(t, "a read past NearTTL"), 1)
		synctest.Wait()
		h.armed.Store(false)

		// Stale: served while a refresh loads value 2 and writes it back.
		sleepUntil(t0.Add(10*time.Second + time.Millisecond))
		fleetMustGet(t, c, "k", fleetValue(2), 1)
		synctest.Wait()

		close(h.gate) // the slow read of value 1 comes back
		synctest.Wait()
		fleetMustGet(t, c, "k", fleetNoLoad(t, "a read after the refresh"), 2)
	})
}

// deafLoads is heldLoads that also drops, while deaf, every notice the
// Store would hand its subscribers: notices lost on the way.
type deafLoads struct {
	heldLoads
	deaf atomic.Bool
	fn   func(remote.Notice) // the subscriber, for a test to hand notices
}

func (d *deafLoads) Subscribe(fn func(remote.Notice)) (stop func()) {
	d.fn = fn
	return d.Remote.Subscribe(func(n remote.Notice) {
		if !d.deaf.Load() {
			fn(n)
		}
	})
}

// slowReadFleet makes two replicas over one memory.Remote, b writing and a
// reading value 1 of "k", whose notices a stops hearing. At t0 plus 1.5
// NearTTL (returned, with NearTTL) a reads "k" past NearTTL: it is served,
// and the background read of the Store it starts reads value 1 and is slow
// to answer, until d.gate is closed.
func slowReadFleet(t *testing.T) (a, b *herd.Cache[int], d *deafLoads, t0 time.Time, near time.Duration) {
	near = time.Second
	m := memory.New()
	d = &deafLoads{heldLoads: heldLoads{Remote: m, gate: make(chan struct{})}}
	o := func(s remote.Store, l remote.Lease) *herd.Options[int] {
		return &herd.Options[int]{
			NoBreaker:  true,
			MaxEntries: 10, SoftTTL: time.Minute, HardTTL: time.Minute,
			Store: s, Lease: l, LeaseTTL: 5 * time.Second, NearTTL: near,
		}
	}
	a, b = newCache(t, o(d, d)), newCache(t, o(m, m))
	t0 = time.Now()
	fleetMustGet(t, b, "k", fleetValue(1), 1)
	fleetMustGet(t, a, "k", fleetNoLoad(t, "the replica that reads it"), 1)
	d.deaf.Store(true)

	sleepUntil(t0.Add(near + near/2))
	d.armed.Store(true)
	fleetMustGet(t, a, "k", fleetNoLoad(t, "a read past NearTTL"), 1)
	synctest.Wait()
	d.armed.Store(false)
	return a, b, d, t0, near
}

// A read of the Store whose answer comes late is dated from when it was
// sent: the value it brings, which another replica changed meanwhile with
// a notice this one lost, is served no longer after the change than the
// documented 2×NearTTL. Dated from its answer instead, it was served for
// the answer's delay longer.
func TestSlowReadDatedFromItsSending(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		a, b, d, t0, near := slowReadFleet(t)
		// The change, whose notice a does not hear; then the answer.
		sleepUntil(t0.Add(near + 6*near/10))
		changed := time.Now()
		if err := b.Set(context.Background(), "k", 2); err != nil {
			t.Fatal(err)
		}
		sleepUntil(t0.Add(2*near + 4*near/10))
		close(d.gate)
		synctest.Wait()

		sleepUntil(changed.Add(2*near + time.Millisecond))
		fleetMustGet(t, a, "k", fleetNoLoad(t, "a read 2×NearTTL after the change"), 2)
	})
}

// A read of the Store sent before this replica learnt that it lost
// notices (the zero Notice) but answered after it is not trusted: the
// value it brings may be one a lost notice changed, and is read again.
func TestSlowReadBeforeLostNoticesNotTrusted(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		a, b, d, t0, near := slowReadFleet(t)
		// The change, unheard; then word that notices were lost; then the
		// answer of the read sent before both.
		sleepUntil(t0.Add(near + 6*near/10))
		if err := b.Set(context.Background(), "k", 2); err != nil {
			t.Fatal(err)
		}
		sleepUntil(t0.Add(near + 7*near/10))
		d.fn(remote.Notice{})
		sleepUntil(t0.Add(near + 8*near/10))
		close(d.gate)
		synctest.Wait()

		sleepUntil(t0.Add(near + 9*near/10))
		fleetMustGet(t, a, "k", fleetNoLoad(t, "a read after the notices were found lost"), 2)
	})
}

// heldReleases is deafLoads whose WriteRelease, having written and
// released (so that the lease's completion is announced), returns only
// once released is closed: the holder has not yet heard how its write went.
type heldReleases struct {
	deafLoads
	released chan struct{}
}

func (h *heldReleases) WriteRelease(ctx context.Context, key string, env []byte, fence uint64, ttl time.Duration, token string) (bool, error) {
	ok, err := h.Remote.WriteRelease(ctx, key, env, fence, ttl, token)
	<-h.released
	return ok, err
}

// A replica's own completed lease is not taken for another replica's:
// while its write-back has released the lease but not returned, and its
// change notice is not heard, a read that finds its value due for an
// early refresh starts the refresh, and no read of the Store replaces the
// value as if another holder had written a newer one.
func TestOwnCompletionIsNoOtherHolders(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := &heldReleases{deafLoads: deafLoads{heldLoads: heldLoads{Remote: memory.New(), gate: make(chan struct{})}}, released: make(chan struct{})}
		h.deaf.Store(true)
		c := newCache(t, &herd.Options[int]{
			NoBreaker:  true,
			MaxEntries: 10, SoftTTL: 10 * time.Second, HardTTL: 20 * time.Second,
			Store: h, Lease: h, LeaseTTL: 5 * time.Second, NearTTL: 5 * time.Second,
			Beta: 10,
		})
		// A draw this small at Beta 10 leads by 11.2 load times: the value
		// is due for an early refresh as soon as it is written.
		herd.SetDraws(c, func() float64 { return 1e-12 }, nil)
		fleetMustGet(t, c, "k", func(context.Context) (int, error) {
			time.Sleep(time.Second)
			return 1, nil
		}, 1)
		synctest.Wait() // the write-back released the lease, and waits

		gate := make(chan struct{})
		var loads atomic.Int32
		fleetMustGet(t, c, "k", func(context.Context) (int, error) {
			loads.Add(1)
			<-gate
			return 2, nil
		}, 1)
		synctest.Wait()
		st := c.Stats()
		close(gate)
		close(h.released)
		if loads.Load() != 1 || st.EarlyRefreshes != 1 || st.Revalidations != 0 {
			t.Errorf("%d refresh loads, EarlyRefreshes %d, Revalidations %d; want 1, 1, 0", loads.Load(), st.EarlyRefreshes, st.Revalidations)
		}
	})
}
