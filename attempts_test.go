package herd_test

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/herdcache/herd"
	"github.com/herdcache/herd/limiter"
	"github.com/herdcache/herd/memory"
	"github.com/herdcache/herd/remote"
)

// Tests of the shared tier's economy: a replica that was told another holds
// a key's lease makes no further attempt at it before the holder's notice or
// the holder's time, and a shed refresh of the hottest key is not starved.

// acquires counts the Acquire calls a replica makes through it. It
// announces no holds: the replica learns that a lease is held only by
// asking for it (announced_test.go has the replicas that hear holds).
type acquires struct {
	leaseOnly
	n atomic.Int64
}

func (a *acquires) Acquire(ctx context.Context, key string, ttl time.Duration, after time.Time) (remote.Grant, error) {
	a.n.Add(1)
	return a.leaseOnly.Acquire(ctx, key, ttl, after)
}

// countingReplica is a replica over r whose Lease calls are counted, and
// which hears no hold announcements.
func countingReplica(t *testing.T, r *memory.Remote, mod func(*herd.Options[int])) (*herd.Cache[int], *acquires) {
	t.Helper()
	a := &acquires{leaseOnly: r}
	return fleetReplica(t, r, func(o *herd.Options[int]) {
		o.Lease = a
		if mod != nil {
			mod(o)
		}
	}), a
}

// While A's load holds the lease, B's stale reads for four seconds (four
// NearTTLs, so B re-reads its copy from the Store four times) make one lease
// attempt, not one per refresh back-off or per re-read copy; the holder's
// notice then hands B the new value without another load.
func TestFleetOneLeaseAttemptWhileHeld(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := memory.New()
		a := fleetReplica(t, r, nil)
		b, acq := countingReplica(t, r, func(o *herd.Options[int]) { o.RefreshBackoff = 100 * time.Millisecond })
		fleetStaleSetup(t, a, b, "k")
		release, resA := fleetHold(t, a, "k", 2, herd.NoStale())
		acq.n.Store(0)
		before := b.Stats()

		for range 400 {
			fleetMustGet(t, b, "k", fleetNoLoad(t, "B"), 1)
			time.Sleep(10 * time.Millisecond)
			synctest.Wait()
		}
		if n := acq.n.Load(); n != 1 {
			t.Errorf("B made %d lease attempts while A held the lease; want 1", n)
		}
		if st := b.Stats(); st.StaleRefreshes != 1 || st.LeaseContended-before.LeaseContended != 1 || st.Loads != 0 {
			t.Errorf("B's Stats: StaleRefreshes %d, LeaseContended +%d, Loads %d; want 1, +1, 0", st.StaleRefreshes, st.LeaseContended-before.LeaseContended, st.Loads)
		}

		release()
		if res := <-resA; res.err != nil || res.v != 2 {
			t.Fatalf("A got %d, %v; want 2, nil", res.v, res.err)
		}
		fleetNoticed(t, b, "k")
		fleetMustGet(t, b, "k", fleetNoLoad(t, "B"), 2)
		if n := acq.n.Load(); n != 1 {
			t.Errorf("B made %d lease attempts in all; want 1", n)
		}
	})
}

// Misses follow the same rule: a FailFast miss told once that the lease is
// held fails fast again without asking, and a Wait loser re-reads the Store
// between notices instead of trying the lease.
func TestFleetLosersAttemptOnce(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := memory.New()
		a := fleetReplica(t, r, nil)
		b, acqB := countingReplica(t, r, nil)
		c, acqC := countingReplica(t, r, nil)
		release, resA := fleetHold(t, a, "k", 7)

		for i := range 3 {
			if _, err := b.Get(t.Context(), "k", fleetNoLoad(t, "B"), herd.WithLoserPolicy(herd.FailFast)); !errors.Is(err, herd.ErrLeaseHeld) {
				t.Fatalf("FailFast Get %d on B: %v; want ErrLeaseHeld", i, err)
			}
		}
		if n := acqB.n.Load(); n != 1 {
			t.Errorf("B's three FailFast misses made %d lease attempts; want 1", n)
		}

		resC := getAsync(t.Context(), c, "k", fleetNoLoad(t, "C"), herd.WithLoserPolicy(herd.Wait))
		time.Sleep(3 * time.Second) // C re-reads the Store many times meanwhile
		synctest.Wait()
		if _, ok := ready(resC); ok {
			t.Fatal("C's Wait miss returned while A holds the lease")
		}
		if n := acqC.n.Load(); n != 1 {
			t.Errorf("C made %d lease attempts while waiting; want 1", n)
		}
		release()
		if res := recv(t, resC); res.err != nil || res.v != 7 {
			t.Fatalf("C got %d, %v; want 7, nil", res.v, res.err)
		}
		if res := <-resA; res.err != nil || res.v != 7 {
			t.Fatalf("A got %d, %v; want 7, nil", res.v, res.err)
		}
		if st := c.Stats(); st.Loads != 0 || st.WokenByPush+st.WokenByPoll != 1 {
			t.Errorf("C's Stats: Loads %d, woken %d; want 0, 1", st.Loads, st.WokenByPush+st.WokenByPoll)
		}
	})
}

// A holder that never ends its lease (a crashed process) keeps B from
// trying for as long as it said; once that time has passed, B's next stale
// read takes the lease and refreshes.
func TestFleetAttemptAgainAfterHoldersTime(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := memory.New()
		a := fleetReplica(t, r, nil)
		b, acq := countingReplica(t, r, nil)
		fleetStaleSetup(t, a, b, "k")
		// The crashed holder: a lease that nobody extends or releases.
		if g, err := r.Acquire(t.Context(), "k", fleetLeaseTTL, time.Now()); err != nil || g.Token == "" {
			t.Fatalf("Acquire = %+v, %v; want a lease", g, err)
		}
		acq.n.Store(0)
		before := b.Stats()
		deadline := time.Now().Add(fleetLeaseTTL)

		for time.Now().Before(deadline) {
			fleetMustGet(t, b, "k", fleetNoLoad(t, "B"), 1)
			time.Sleep(50 * time.Millisecond)
			synctest.Wait()
		}
		if n := acq.n.Load(); n != 1 {
			t.Fatalf("B made %d lease attempts during the holder's lease; want 1", n)
		}
		fleetMustGet(t, b, "k", fleetValue(2), 1) // starts the refresh
		synctest.Wait()
		fleetMustGet(t, b, "k", nil, 2)
		if st := b.Stats(); st.Loads != 1 || st.LeaseAcquired-before.LeaseAcquired != 1 {
			t.Errorf("B's Stats: Loads %d, LeaseAcquired +%d; want 1, +1", st.Loads, st.LeaseAcquired-before.LeaseAcquired)
		}
	})
}

// A burst of NoStale misses and stale reads on one replica, while another
// holds the lease, ends in one coalesced wait: no caller loads on its own,
// and the replica makes one lease attempt before the holder's notice.
func TestFleetNoStaleBurstStaysCoalesced(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := memory.New()
		a := fleetReplica(t, r, nil)
		b, acq := countingReplica(t, r, func(o *herd.Options[int]) { o.RefreshBackoff = 0 })
		fleetStaleSetup(t, a, b, "k")
		release, resA := fleetHold(t, a, "k", 2, herd.NoStale())
		acq.n.Store(0)
		// B is told once, by the refresh of a stale read, that A holds it.
		fleetMustGet(t, b, "k", fleetNoLoad(t, "B"), 1)
		synctest.Wait()

		var (
			wg      sync.WaitGroup
			results = make(chan result, 40)
		)
		for range 40 {
			wg.Go(func() {
				v, err := b.Get(bounded(t), "k", fleetNoLoad(t, "B"), herd.NoStale())
				results <- result{v, err}
			})
			fleetMustGet(t, b, "k", fleetNoLoad(t, "B"), 1) // a stale read beside each
			time.Sleep(time.Millisecond)
		}
		synctest.Wait()
		if n := acq.n.Load(); n != 1 {
			t.Errorf("B made %d lease attempts while A held the lease; want 1", n)
		}
		if st := b.Stats(); st.InFlight != 1 || st.Loads != 0 {
			t.Errorf("B's Stats: InFlight %d, Loads %d; want one coalesced wait and no load", st.InFlight, st.Loads)
		}
		release()
		wg.Wait()
		close(results)
		for res := range results {
			if res.err != nil || res.v != 2 {
				t.Errorf("NoStale Get on B = %d, %v; want A's 2, nil", res.v, res.err)
			}
		}
		if res := <-resA; res.err != nil || res.v != 2 {
			t.Fatalf("A got %d, %v; want 2, nil", res.v, res.err)
		}
		if st := b.Stats(); st.Loads != 0 {
			t.Errorf("B loaded %d times; want 0", st.Loads)
		}
	})
}

// The hottest key is not starved: while cold misses hold every slot, its
// refresh is shed, backs off, and once half of its stale window has passed
// waits at High priority, taking the next released slot ahead of the
// Normal misses queued before it. Only one such refresh waits per key.
func TestShedRefreshRetriedAtHighPriority(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		l := limLimiter(t, limiter.Options{Limit: 2, Reserve: 1})
		c := limCache(t, l)
		mustGet(t, c, "hot", func(context.Context) (int, error) { return 1, nil }, 1)
		time.Sleep(limSoft) // hot is stale

		// c0 and c1 hold both slots, each until its own gate opens; c2 waits.
		g0, g1 := newLimGate(t), newLimGate(t)
		c0 := limGetAsync(t.Context(), c, "c0", g0.load("c0", 10, true))
		c1 := limGetAsync(t.Context(), c, "c1", g1.load("c1", 11, true))
		synctest.Wait()
		var c2Started atomic.Bool
		queued := limGetAsync(t.Context(), c, "c2", func(context.Context) (int, error) {
			c2Started.Store(true)
			return 12, nil
		})
		synctest.Wait()
		if l.InUse() != 2 || l.Waiting() != 1 {
			t.Fatalf("limiter: %d in use, %d waiting; want 2 and 1", l.InUse(), l.Waiting())
		}

		var refreshes atomic.Int64
		hotGate := make(chan struct{})
		openHot := sync.OnceFunc(func() { close(hotGate) })
		t.Cleanup(openHot)
		refresh := func(ctx context.Context) (int, error) {
			refreshes.Add(1)
			return 2, hold(ctx, hotGate)
		}
		// Reads until the middle of the stale window: shed, then backing off.
		mid := time.Now().Add((limHard - limSoft) / 2)
		for time.Now().Before(mid) {
			mustGet(t, c, "hot", refresh, 1)
			synctest.Wait()
			time.Sleep(100 * time.Millisecond)
		}
		if n := refreshes.Load(); n != 0 {
			t.Fatalf("hot refreshed %d times while every slot was held", n)
		}
		shedBefore := c.Stats().Shed
		if shedBefore == 0 {
			t.Fatal("no refresh of hot was shed")
		}
		// Past the middle: reads start one High-priority refresh, which waits.
		for range 10 {
			mustGet(t, c, "hot", refresh, 1)
		}
		synctest.Wait()
		if l.Waiting() != 2 {
			t.Fatalf("%d calls waiting for a slot; want 2 (c2, and one refresh of hot)", l.Waiting())
		}
		g0.open() // c0 finishes: its slot goes to hot's refresh, not to c2
		if r := <-c0; r.err != nil {
			t.Fatalf("Get(c0): %v", r.err)
		}
		synctest.Wait()
		if n := refreshes.Load(); n != 1 || c2Started.Load() {
			t.Errorf("after one slot was released: hot's refresh started %d times, c2 started %v; want 1, false", n, c2Started.Load())
		}
		openHot()
		g1.open()
		for _, ch := range []<-chan limResult{c1, queued} {
			if r := <-ch; r.err != nil {
				t.Errorf("cold Get: %v", r.err)
			}
		}
		synctest.Wait() // the refresh of hot, released above, settles
		if n := refreshes.Load(); n != 1 {
			t.Errorf("hot refreshed %d times; want 1", n)
		}
		mustGet(t, c, "hot", nil, 2)
	})
}

// The replica whose refresh holds the lease makes no second attempt at it
// while the refresh loads, though NearTTL has it re-read its copy from the
// Store (a new entry, stale too) and stale reads of that copy go on.
func TestFleetRefreshingReplicaAttemptsOnce(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := memory.New()
		a, acq := countingReplica(t, r, nil)
		fleetMustGet(t, a, "k", fleetValue(1), 1)
		synctest.Wait() // the write-back lands
		time.Sleep(fleetSoft + time.Second)
		acq.n.Store(0)

		gate := make(chan struct{})
		defer close(gate)
		fleetMustGet(t, a, "k", func(ctx context.Context) (int, error) {
			if err := hold(ctx, gate); err != nil {
				return 0, err
			}
			return 2, nil
		}, 1)
		synctest.Wait()
		for range 30 { // three NearTTLs of stale reads
			time.Sleep(fleetNear / 10)
			fleetMustGet(t, a, "k", fleetNoLoad(t, "A again"), 1)
			synctest.Wait()
		}
		if n := acq.n.Load(); n != 1 {
			t.Errorf("A made %d lease attempts during its own refresh; want 1", n)
		}
		if st := a.Stats(); st.Loads != 2 {
			t.Errorf("A's Stats: Loads %d; want 2 (the first load and its one refresh)", st.Loads)
		}
	})
}

// gatedAcquires, once gating is set, counts every Acquire and holds it
// until gate is closed.
type gatedAcquires struct {
	*memory.Remote
	gating atomic.Bool
	gate   chan struct{}
	n      atomic.Int64
}

func (a *gatedAcquires) Acquire(ctx context.Context, key string, ttl time.Duration, after time.Time) (remote.Grant, error) {
	if !a.gating.Load() {
		return a.Remote.Acquire(ctx, key, ttl, after)
	}
	a.n.Add(1)
	select {
	case <-a.gate:
	case <-ctx.Done():
		return remote.Grant{}, ctx.Err()
	}
	return a.Remote.Acquire(ctx, key, ttl, after)
}

// Two copies of one key on a replica (one re-read from the Store past
// NearTTL while the other's refresh is still asking for the lease) start
// one refresh between them: one lease attempt, not one per copy.
func TestOneRefreshPerKeyAcrossCopies(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := memory.New()
		a := fleetReplica(t, r, nil)
		gated := &gatedAcquires{Remote: r, gate: make(chan struct{})}
		b := fleetReplica(t, r, func(o *herd.Options[int]) { o.Lease = gated })
		fleetStaleSetup(t, a, b, "k")
		synctest.Wait()
		gated.gating.Store(true)

		fleetMustGet(t, b, "k", fleetValue(2), 1) // the first copy's refresh asks for the lease
		synctest.Wait()
		time.Sleep(fleetNear) // past NearTTL: the next read re-reads a second copy
		fleetMustGet(t, b, "k", fleetValue(2), 1)
		synctest.Wait()
		fleetMustGet(t, b, "k", fleetValue(2), 1) // a stale read of the second copy
		synctest.Wait()
		if n := gated.n.Load(); n != 1 {
			t.Errorf("%d lease attempts while the first is answered, want 1", n)
		}
		if st := b.Stats(); st.Revalidations == 0 {
			t.Error("no second copy was read from the Store")
		}
		close(gated.gate)
		synctest.Wait()
		fleetMustGet(t, b, "k", nil, 2)
	})
}

// heldNotices is a replica's Store whose change notices wait, once held,
// until let go: the holder's completion reaches the replica first.
type heldNotices struct {
	*memory.Remote
	mu     sync.Mutex
	held   bool
	queued []remote.Notice
	fn     func(remote.Notice)
}

func (s *heldNotices) Subscribe(fn func(remote.Notice)) func() {
	s.fn = fn
	return s.Remote.Subscribe(func(n remote.Notice) {
		s.mu.Lock()
		if s.held {
			s.queued = append(s.queued, n)
			s.mu.Unlock()
			return
		}
		s.mu.Unlock()
		fn(n)
	})
}

func (s *heldNotices) hold() {
	s.mu.Lock()
	s.held = true
	s.mu.Unlock()
}

func (s *heldNotices) letGo() {
	s.mu.Lock()
	s.held = false
	q := s.queued
	s.queued = nil
	s.mu.Unlock()
	for _, n := range q {
		s.fn(n)
	}
}

// A replica told that another holds a key's lease, whose holder's
// completion reaches it before the holder's change notice does, makes no
// second lease attempt: its stale reads replace their copy with one read
// of the Store, as the notice would have them do.
func TestFleetNoAttemptBetweenCompletionAndNotice(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := memory.New()
		a := fleetReplica(t, r, nil)
		hn := &heldNotices{Remote: r}
		b, acq := countingReplica(t, r, func(o *herd.Options[int]) { o.Store = hn })
		fleetStaleSetup(t, a, b, "k")
		release, resA := fleetHold(t, a, "k", 2, herd.NoStale())
		acq.n.Store(0)
		fleetMustGet(t, b, "k", fleetNoLoad(t, "B"), 1) // B's refresh finds A's lease held
		synctest.Wait()
		hn.hold()
		release()
		if res := recv(t, resA); res.err != nil || res.v != 2 {
			t.Fatalf("A's Get = %d, %v; want 2, nil", res.v, res.err)
		}
		synctest.Wait() // A's write-back lands; B hears the completion, not the notice
		fleetMustGet(t, b, "k", fleetNoLoad(t, "B"), 1)
		synctest.Wait()
		fleetMustGet(t, b, "k", fleetNoLoad(t, "B"), 2) // the one read replaced the copy
		if n := acq.n.Load(); n != 1 {
			t.Errorf("B made %d lease attempts; want 1, before A completed", n)
		}
		hn.letGo()
		synctest.Wait()
	})
}

// A refresh shed by the limiter keeps its back-off and its turn at High
// priority though NearTTL has the replica re-read its stale copy from the
// Store (a new entry each time): the copy of the same value takes over what
// the limiter's refusal taught. Before the middle of the stale window a
// refresh is shed once per back-off (RetryAfter, a second), not once per
// read; past it, the refresh takes a slot at High priority, the reserved
// one, while the cold miss still holds the other.
func TestShedRefreshSurvivesReRead(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := memory.New()
		l := limLimiter(t, limiter.Options{Limit: 2, Reserve: 1})
		c := fleetReplica(t, r, func(o *herd.Options[int]) { o.Limiter = l })
		fleetMustGet(t, c, "k", fleetValue(1), 1)
		synctest.Wait() // the write-back lands
		time.Sleep(fleetSoft + time.Second)

		// A cold miss holds the one slot outside the reserve.
		g := newLimGate(t)
		cold := limGetAsync(t.Context(), c, "cold", g.load("cold", 10, true))
		synctest.Wait()
		var refreshes atomic.Int64
		refresh := func(context.Context) (int, error) {
			refreshes.Add(1)
			return 2, nil
		}
		mid := time.Now().Add((fleetHard - fleetSoft) / 2)
		reads := 0
		for time.Now().Before(mid.Add(-time.Second)) {
			fleetMustGet(t, c, "k", refresh, 1)
			synctest.Wait()
			time.Sleep(fleetNear / 4) // each NearTTL, the copy is read again
			reads++
		}
		if n := l.Stats().ShedReserve; n < 1 || n > 5 {
			t.Errorf("refreshes shed in %d reads over 4s before the middle of the stale window: %d, want 1 to 5", reads, n)
		}
		time.Sleep(time.Until(mid))
		fleetMustGet(t, c, "k", refresh, 1)
		synctest.Wait()
		if n := refreshes.Load(); n != 1 || l.InUse() != 1 {
			t.Errorf("past the middle of the stale window: k refreshed %d times, %d slots held; want 1 and 1 (cold's)", n, l.InUse())
		}
		fleetMustGet(t, c, "k", nil, 2)
		g.open()
		if res := <-cold; res.err != nil {
			t.Fatalf("Get(cold): %v", res.err)
		}
	})
}
