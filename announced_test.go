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
	"github.com/herdcache/herd/memory"
	"github.com/herdcache/herd/remote"
)

// Tests of quiet losers: a replica that hears another replica's lease
// announced (remote.HoldNotifier) makes no lease attempt of its own until
// the holder's notice or time, and due refreshes are staggered so that the
// first one's announcement reaches the others before they try.

// leaseOnly is what a herd Cache uses of memory.Remote's Lease, without
// its hold announcements (remote.HoldNotifier).
type leaseOnly interface {
	remote.Lease
	remote.WriteReleaser
	remote.Watcher
	remote.BatchWatcher
	remote.BatchLease
}

// quietLease is a Lease that announces no holds.
type quietLease struct{ leaseOnly }

// noHolds returns l, memory.Remote's Lease or a wrapper of it, without its
// hold announcements, for the tests of a replica that learns that a lease
// is held only by asking for it.
func noHolds(l remote.Lease) remote.Lease { return quietLease{l.(leaseOnly)} }

// hearingAcquires counts the Acquire calls a replica makes through it, and
// hands on memory.Remote's hold announcements.
type hearingAcquires struct {
	*memory.Remote
	n atomic.Int64
}

func (a *hearingAcquires) Acquire(ctx context.Context, key string, ttl time.Duration, after time.Time) (remote.Grant, error) {
	a.n.Add(1)
	return a.Remote.Acquire(ctx, key, ttl, after)
}

var _ remote.HoldNotifier = (*hearingAcquires)(nil)

// hearingLease is what a herd Cache uses of memory.Remote's Lease with its
// hold announcements, and without its completion count
// (remote.CompletionCounter).
type hearingLease interface {
	leaseOnly
	remote.HoldNotifier
}

// uncounted is a Lease that announces holds and counts no completions: a
// replica over it watches the completion of each hold it hears.
type uncounted struct{ hearingLease }

// hearingReplica is a replica over r that hears holds and whose lease
// attempts are counted; it knows the heard holders' completions through
// the Lease's completion count when counted, and by watching each
// otherwise.
func hearingReplica(t *testing.T, r *memory.Remote, counted bool) (*herd.Cache[int], *hearingAcquires) {
	t.Helper()
	a := &hearingAcquires{Remote: r}
	var l remote.Lease = a
	if !counted {
		l = uncounted{a}
	}
	return fleetReplica(t, r, func(o *herd.Options[int]) { o.Lease = l }), a
}

// hearings are the two ways a replica knows that a holder it heard of
// completed: the Lease's completion count, or a watch of each hold.
var hearings = []struct {
	name    string
	counted bool
}{{"counted", true}, {"watched", false}}

// While A's load holds the lease, B, which heard A's hold announced, makes
// no lease attempt at all over four seconds of stale reads (where a B that
// hears nothing makes one: TestFleetOneLeaseAttemptWhileHeld), and is
// served the stale value at once; A's notice then hands B the new value
// without a load or an attempt.
func TestHeardHoldNoLeaseAttempt(t *testing.T) {
	for _, h := range hearings {
		t.Run(h.name, func(t *testing.T) { testHeardHoldNoLeaseAttempt(t, h.counted) })
	}
}

func testHeardHoldNoLeaseAttempt(t *testing.T, counted bool) {
	synctest.Test(t, func(t *testing.T) {
		r := memory.New()
		a := fleetReplica(t, r, nil)
		b, acq := hearingReplica(t, r, counted)
		fleetStaleSetup(t, a, b, "k")
		setup := b.Stats()
		release, resA := fleetHold(t, a, "k", 2, herd.NoStale())
		acq.n.Store(0)
		before := b.Stats()

		for range 400 {
			fleetMustGet(t, b, "k", fleetNoLoad(t, "B"), 1)
			time.Sleep(10 * time.Millisecond)
			synctest.Wait()
		}
		if n := acq.n.Load(); n != 0 {
			t.Errorf("B made %d lease attempts after hearing A's hold; want 0", n)
		}
		if st := b.Stats(); st.LeaseContended != before.LeaseContended || st.Loads != 0 || st.WokenByPush+st.WokenByPoll != before.WokenByPush+before.WokenByPoll {
			t.Errorf("B's Stats: LeaseContended +%d, Loads %d, woken +%d; want +0, 0, +0", st.LeaseContended-before.LeaseContended, st.Loads, st.WokenByPush+st.WokenByPoll-before.WokenByPush-before.WokenByPoll)
		}
		// One hold heard, and one attempt spared however many stale reads
		// met it: the one the first read's refresh would have made.
		if st := b.Stats(); st.LeaseHoldsHeard != setup.LeaseHoldsHeard+1 || st.LeaseAttemptsSkipped != setup.LeaseAttemptsSkipped+1 {
			t.Errorf("B's Stats: LeaseHoldsHeard +%d, LeaseAttemptsSkipped +%d; want +1, +1",
				st.LeaseHoldsHeard-setup.LeaseHoldsHeard, st.LeaseAttemptsSkipped-setup.LeaseAttemptsSkipped)
		}
		if st := a.Stats(); st.LeaseHoldsHeard != 0 || st.LeaseAttemptsSkipped != 0 {
			t.Errorf("A, the holder, counted LeaseHoldsHeard %d, LeaseAttemptsSkipped %d; want 0, 0", st.LeaseHoldsHeard, st.LeaseAttemptsSkipped)
		}

		release()
		if res := <-resA; res.err != nil || res.v != 2 {
			t.Fatalf("A got %d, %v; want 2, nil", res.v, res.err)
		}
		fleetNoticed(t, b, "k")
		fleetMustGet(t, b, "k", fleetNoLoad(t, "B"), 2)
		if n := acq.n.Load(); n != 0 {
			t.Errorf("B made %d lease attempts in all; want 0", n)
		}
	})
}

// A hold heard by a replica whose miss meets it spares that replica its
// lease attempt, counted once however many misses join it or follow it
// (each FailFast miss is a flight of its own); a replica that hears the
// hold and never reads the key counts the hold and no attempt.
func TestHeardHoldCounted(t *testing.T) {
	for _, h := range hearings {
		t.Run(h.name, func(t *testing.T) { testHeardHoldCounted(t, h.counted) })
	}
}

func testHeardHoldCounted(t *testing.T, counted bool) {
	synctest.Test(t, func(t *testing.T) {
		r := memory.New()
		a := fleetReplica(t, r, nil)
		b, acq := hearingReplica(t, r, counted)
		idle, _ := hearingReplica(t, r, counted)
		fast := fleetReplica(t, r, func(o *herd.Options[int]) {
			o.Lease = &hearingAcquires{Remote: r}
			o.OnLeaseHeld = herd.FailFast
		})
		release, resA := fleetHold(t, a, "k", 1)

		resB := make([]<-chan result, 5)
		for i := range resB {
			resB[i] = getAsync(t.Context(), b, "k", fleetNoLoad(t, "B"))
		}
		for range 3 {
			if _, err := fast.Get(t.Context(), "k", fleetNoLoad(t, "fast")); !errors.Is(err, herd.ErrLeaseHeld) {
				t.Fatalf("a FailFast replica's Get while the lease is heard held: %v; want ErrLeaseHeld", err)
			}
		}
		synctest.Wait()
		for _, c := range []struct {
			name           string
			c              *herd.Cache[int]
			heard, skipped int64
		}{{"A", a, 0, 0}, {"B", b, 1, 1}, {"idle", idle, 1, 0}, {"fast", fast, 1, 1}} {
			if st := c.c.Stats(); st.LeaseHoldsHeard != c.heard || st.LeaseAttemptsSkipped != c.skipped || st.LeaseContended != 0 {
				t.Errorf("%s's Stats: LeaseHoldsHeard %d, LeaseAttemptsSkipped %d, LeaseContended %d; want %d, %d, 0",
					c.name, st.LeaseHoldsHeard, st.LeaseAttemptsSkipped, st.LeaseContended, c.heard, c.skipped)
			}
		}
		release()
		if res := <-resA; res.err != nil || res.v != 1 {
			t.Fatalf("A got %d, %v; want 1, nil", res.v, res.err)
		}
		for _, ch := range resB {
			if res := <-ch; res.err != nil || res.v != 1 {
				t.Fatalf("B got %d, %v; want 1, nil", res.v, res.err)
			}
		}
		if n := acq.n.Load(); n != 0 {
			t.Errorf("B made %d lease attempts; want 0", n)
		}
		if st := b.Stats(); st.LeaseHoldsHeard != 1 || st.LeaseAttemptsSkipped != 1 {
			t.Errorf("B's Stats at the end: LeaseHoldsHeard %d, LeaseAttemptsSkipped %d; want 1, 1", st.LeaseHoldsHeard, st.LeaseAttemptsSkipped)
		}
	})
}

// sharedCounts is memory.Remote's Lease with holds announced, whose
// completion count moves at each call, as a count that another key shares
// may: every hold B heard looks completed to it.
type sharedCounts struct {
	*hearingAcquires
	n atomic.Uint64
}

func (s *sharedCounts) Completions(string) uint64 { return s.n.Add(1) }

// A completion count that moved for another key costs B a lease attempt,
// never a load or a stale answer: B, whose every heard hold looks
// completed, asks for the lease once, is told it is held, serves the stale
// value meanwhile, and takes A's value from its notice.
func TestHeardHoldSharedCount(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := memory.New()
		a := fleetReplica(t, r, nil)
		lease := &sharedCounts{hearingAcquires: &hearingAcquires{Remote: r}}
		b := fleetReplica(t, r, func(o *herd.Options[int]) { o.Lease = lease })
		fleetStaleSetup(t, a, b, "k")
		lease.n.Store(0)
		release, resA := fleetHold(t, a, "k", 2, herd.NoStale())
		lease.hearingAcquires.n.Store(0)
		before := b.Stats()

		for range 40 {
			fleetMustGet(t, b, "k", fleetNoLoad(t, "B"), 1)
			time.Sleep(10 * time.Millisecond)
			synctest.Wait()
		}
		if lease.n.Load() == 0 {
			t.Fatal("B never read the completion count of the hold it heard")
		}
		if n := lease.hearingAcquires.n.Load(); n != 1 {
			t.Errorf("B made %d lease attempts; want 1, the one its moved count cost", n)
		}
		if st := b.Stats(); st.LeaseContended != before.LeaseContended+1 || st.Loads != 0 {
			t.Errorf("B's Stats: LeaseContended +%d, Loads %d; want +1, 0", st.LeaseContended-before.LeaseContended, st.Loads)
		}
		release()
		if res := <-resA; res.err != nil || res.v != 2 {
			t.Fatalf("A got %d, %v; want 2, nil", res.v, res.err)
		}
		fleetNoticed(t, b, "k")
		fleetMustGet(t, b, "k", fleetNoLoad(t, "B"), 2)
		if st := b.Stats(); st.Loads != 0 {
			t.Errorf("B made %d loads; want 0", st.Loads)
		}
	})
}

// A holder that crashed (announced, then never extended nor released its
// lease) keeps B from trying for the announced time and no longer: once it
// has passed, B's next stale read takes the lease and refreshes. An
// announced time beyond B's LeaseTTL counts as LeaseTTL.
func TestHeardHoldCrashedHolder(t *testing.T) {
	for _, tt := range []struct {
		name      string
		announced time.Duration // the crashed holder's lease
		quiet     time.Duration // how long B makes no attempt
	}{
		{"announced", fleetLeaseTTL / 2, fleetLeaseTTL / 2},
		{"capped", 3 * fleetLeaseTTL, fleetLeaseTTL},
	} {
		t.Run(tt.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				r := memory.New()
				a := fleetReplica(t, r, nil)
				b, acq := hearingReplica(t, r, true)
				fleetStaleSetup(t, a, b, "k")
				g, err := r.Acquire(t.Context(), "k", tt.announced, time.Now())
				if err != nil || g.Token == "" {
					t.Fatalf("Acquire = %+v, %v; want a lease", g, err)
				}
				synctest.Wait() // B hears the hold
				acq.n.Store(0)
				end := time.Now().Add(tt.quiet)
				for time.Now().Before(end) {
					fleetMustGet(t, b, "k", fleetNoLoad(t, "B"), 1)
					time.Sleep(50 * time.Millisecond)
					synctest.Wait()
				}
				if n := acq.n.Load(); n != 0 {
					t.Fatalf("B made %d lease attempts in the %v it was told the lease was held for; want 0", n, tt.quiet)
				}
				if tt.announced > tt.quiet {
					// The lease is still held: B asks once, and is told.
					fleetMustGet(t, b, "k", fleetNoLoad(t, "B"), 1)
					time.Sleep(herd.MaxStagger)
					synctest.Wait()
					if n := acq.n.Load(); n != 1 {
						t.Fatalf("B made %d lease attempts once LeaseTTL had passed; want 1", n)
					}
					return
				}
				fleetMustGet(t, b, "k", fleetValue(2), 1) // starts the refresh
				time.Sleep(herd.MaxStagger)
				synctest.Wait()
				if n := acq.n.Load(); n != 1 {
					t.Fatalf("B made %d lease attempts after the holder's time; want 1", n)
				}
				fleetMustGet(t, b, "k", fleetNoLoad(t, "B"), 2)
				if st := b.Stats(); st.Loads != 1 {
					t.Errorf("B made %d loads; want 1, the takeover", st.Loads)
				}
			})
		})
	}
}

// rttLease is memory.Remote's Lease, holds announced, whose Acquire takes
// a round trip's time, as a lease over the network does.
type rttLease struct{ *memory.Remote }

// rtt is rttLease's round trip.
const rtt = time.Millisecond

func (l rttLease) Acquire(ctx context.Context, key string, ttl time.Duration, after time.Time) (remote.Grant, error) {
	time.Sleep(rtt)
	return l.Remote.Acquire(ctx, key, ttl, after)
}

// staggeredFleet returns n replicas over r (with lease, when not nil, as
// their Lease, else rttLease), each of which has loaded a key of its own under a lease,
// so that every replica that hears holds has heard another's; replica i
// staggers its refreshes by (i+1)/(n+1) of the most, all apart.
func staggeredFleet(t *testing.T, r *memory.Remote, n int, lease remote.Lease) []*herd.Cache[int] {
	t.Helper()
	cs := fleetReplicas(t, n, r, func(o *herd.Options[int]) {
		o.Lease = rttLease{r}
		if lease != nil {
			o.Lease = lease
		}
	})
	for i, c := range cs {
		herd.SetStaggerDraw(c, func() float64 { return float64(i+1) / float64(n+1) })
		fleetMustGet(t, c, "own"+string(rune('a'+i)), fleetValue(i), i)
	}
	synctest.Wait()
	return cs
}

// Every replica of a fleet reads a stale hot key at the same instant. Each
// starts a refresh, delayed by its stagger: the first to try takes the
// lease and announces it before the others' delays end (they are further
// apart than a round trip), so the fleet makes one lease attempt and one
// load, where without the stagger every replica would ask at once, every reader is served the stale value
// meanwhile, and the holder's notice hands every replica the new one.
func TestStaggeredRefreshOneAttempt(t *testing.T) {
	const n = 10
	synctest.Test(t, func(t *testing.T) {
		r := memory.New()
		cs := staggeredFleet(t, r, n, nil)
		fleetMustGet(t, cs[0], "k", fleetValue(1), 1)
		for _, c := range cs[1:] {
			fleetMustGet(t, c, "k", nil, 1)
		}
		time.Sleep(fleetSoft + time.Second)

		gate := make(chan struct{})
		var loads atomic.Int64
		load := func(context.Context) (int, error) {
			loads.Add(1)
			<-gate
			return 2, nil
		}
		before := r.Stats()
		heard, skipped := holdCounts(cs)
		for _, c := range cs {
			fleetMustGet(t, c, "k", load, 1) // served stale at once
		}
		time.Sleep(herd.MaxStagger) // every stagger has ended
		synctest.Wait()
		st := r.Stats()
		attempts := st.AcquireLease + st.AcquireHeld + st.AcquireValue - before.AcquireLease - before.AcquireHeld - before.AcquireValue
		if attempts != 1 || loads.Load() != 1 {
			t.Errorf("%d replicas refreshing one stale key made %d lease attempts and %d loads; want 1 and 1", n, attempts, loads.Load())
		}
		if h, s := holdCounts(cs); h-heard != n-1 || s-skipped != n-1 {
			t.Errorf("the fleet's Stats: LeaseHoldsHeard +%d, LeaseAttemptsSkipped +%d; want +%d, +%d (every replica but the holder)", h-heard, s-skipped, n-1, n-1)
		}
		close(gate)
		for _, c := range cs {
			fleetNoticed(t, c, "k")
			fleetMustGet(t, c, "k", fleetNoLoad(t, "a replica"), 2)
		}
		if loads.Load() != 1 {
			t.Errorf("%d loads in all; want 1", loads.Load())
		}
	})
}

// A fleet whose Lease announces no holds still loads a stale hot key once:
// each replica asks for the lease once, the first takes it, the others are
// told it is held, and no reader waits.
func TestNoAnnouncementsOneAttempt(t *testing.T) {
	const n = 10
	synctest.Test(t, func(t *testing.T) {
		r := memory.New()
		cs := staggeredFleet(t, r, n, noHolds(r))
		fleetMustGet(t, cs[0], "k", fleetValue(1), 1)
		for _, c := range cs[1:] {
			fleetMustGet(t, c, "k", nil, 1)
		}
		time.Sleep(fleetSoft + time.Second)

		gate := make(chan struct{})
		var loads atomic.Int64
		load := func(context.Context) (int, error) {
			loads.Add(1)
			<-gate
			return 2, nil
		}
		before := r.Stats()
		for _, c := range cs {
			fleetMustGet(t, c, "k", load, 1) // served stale at once
		}
		synctest.Wait() // no stagger: every refresh has asked
		st := r.Stats()
		if leases, held := st.AcquireLease-before.AcquireLease, st.AcquireHeld-before.AcquireHeld; leases != 1 || held != n-1 || loads.Load() != 1 {
			t.Errorf("%d replicas without hold announcements: %d leases taken, %d found held, %d loads; want 1, %d, 1", n, leases, held, loads.Load(), n-1)
		}
		if h, s := holdCounts(cs); h != 0 || s != 0 {
			t.Errorf("the fleet's Stats without announcements: LeaseHoldsHeard %d, LeaseAttemptsSkipped %d; want 0, 0", h, s)
		}
		close(gate)
		for _, c := range cs {
			fleetNoticed(t, c, "k")
			fleetMustGet(t, c, "k", fleetNoLoad(t, "a replica"), 2)
		}
		if loads.Load() != 1 {
			t.Errorf("%d loads in all; want 1", loads.Load())
		}
	})
}

// holdCounts sums the fleet's LeaseHoldsHeard and LeaseAttemptsSkipped.
func holdCounts(cs []*herd.Cache[int]) (heard, skipped int) {
	for _, c := range cs {
		st := c.Stats()
		heard += int(st.LeaseHoldsHeard)
		skipped += int(st.LeaseAttemptsSkipped)
	}
	return heard, skipped
}

// deafLease is a Lease that takes hold subscriptions and delivers nothing
// to them, with the leases it is asked for counted: a replica whose every
// announcement came while a load of the key ran on it, and was ignored.
type deafLease struct{ acquires }

func (d *deafLease) AcquireMany(ctx context.Context, reqs []remote.LeaseRequest, ttl time.Duration) []remote.Acquired {
	d.n.Add(int64(len(reqs)))
	return d.leaseOnly.AcquireMany(ctx, reqs, ttl)
}

func (*deafLease) SubscribeHolds(func(remote.Notice)) (stop func()) { return func() {} }

// A replica that has heard no announcement, but whose lease attempt found
// another's lease, knows it has company: its next due refresh is
// staggered like one of a replica that heard a hold. Without that, the
// replicas whose refreshes come due at the instant all replicas agree on
// keep asking at once, each too busy with its own attempt to hear the
// others' announcements, at every expiry.
func TestContendedAttemptStaggers(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := memory.New()
		a := fleetReplica(t, r, nil)
		deaf := &deafLease{acquires{leaseOnly: r}}
		b := fleetReplica(t, r, func(o *herd.Options[int]) { o.Lease = deaf })
		herd.SetStaggerDraw(b, func() float64 { return 0.5 })
		fleetStaleSetup(t, a, b, "k")

		// A crashed holder: B's refresh finds its lease held, unannounced.
		if g, err := r.Acquire(t.Context(), "k", fleetLeaseTTL, time.Now()); err != nil || g.Token == "" {
			t.Fatalf("Acquire = %+v, %v; want a lease", g, err)
		}
		// (B's read in the setup may have found A's lease held already.)
		deaf.n.Store(0)
		before := b.Stats()
		fleetMustGet(t, b, "k", fleetNoLoad(t, "B"), 1)
		time.Sleep(herd.MaxStagger)
		synctest.Wait()
		if n, st := deaf.n.Load(), b.Stats(); n != 1 || st.LeaseContended-before.LeaseContended != 1 || st.LeaseHoldsHeard != 0 {
			t.Fatalf("B: %d lease attempts, LeaseContended +%d, LeaseHoldsHeard %d; want 1, +1, 0", n, st.LeaseContended-before.LeaseContended, st.LeaseHoldsHeard)
		}

		// Once the holder's time has passed, B's next refresh waits its
		// stagger before it asks.
		time.Sleep(fleetLeaseTTL)
		fleetMustGet(t, b, "k", fleetValue(2), 1)
		synctest.Wait()
		if n := deaf.n.Load(); n != 1 {
			t.Fatalf("B asked for the lease %d times in all at once after the holder's time; want its refresh staggered, still 1", n)
		}
		time.Sleep(herd.MaxStagger)
		synctest.Wait()
		if n, st := deaf.n.Load(), b.Stats(); n != 2 || st.LeaseAcquired-before.LeaseAcquired != 1 {
			t.Fatalf("after the stagger: %d lease attempts, LeaseAcquired +%d; want 2, +1", n, st.LeaseAcquired-before.LeaseAcquired)
		}
		fleetMustGet(t, b, "k", nil, 2)
	})
}

// lateHolds hands memory.Remote's hold announcements on only when the test
// says so: a replica that hears them late, after their holders completed.
type lateHolds struct {
	*memory.Remote
	mu      sync.Mutex
	fn      func(remote.Notice)
	pending []remote.Notice
}

func (l *lateHolds) SubscribeHolds(fn func(remote.Notice)) (stop func()) {
	l.mu.Lock()
	l.fn = fn
	l.mu.Unlock()
	return l.Remote.SubscribeHolds(func(n remote.Notice) {
		l.mu.Lock()
		defer l.mu.Unlock()
		l.pending = append(l.pending, n)
	})
}

// deliver hands on the holds announced so far, and reports how many.
func (l *lateHolds) deliver() int {
	l.mu.Lock()
	ns, fn := l.pending, l.fn
	l.pending = nil
	l.mu.Unlock()
	for _, n := range ns {
		fn(n)
	}
	return len(ns)
}

// A hold that a replica hears only after its holder completed (memory.Remote
// announces on a goroutine of its own, so this may happen) is over: the
// completion count its Seq carries has moved. B records no hold, and its
// next miss takes the holder's value at once, where a B that believed the
// lease held would wait for a completion that came before it listened,
// until its first re-read of the Store 50 ms in.
func TestHoldHeardAfterCompletion(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := memory.New()
		a := fleetReplica(t, r, nil)
		late := &lateHolds{Remote: r}
		b := fleetReplica(t, r, func(o *herd.Options[int]) {
			o.Lease = late
			o.OnLeaseHeld = herd.Wait
		})
		release, resA := fleetHold(t, a, "k", 7)
		release()
		if res := <-resA; res.err != nil || res.v != 7 {
			t.Fatalf("A got %d, %v; want 7, nil", res.v, res.err)
		}
		synctest.Wait() // A's value is written and its lease released
		if n := late.deliver(); n != 1 {
			t.Fatalf("%d holds announced; want 1, A's", n)
		}
		start := time.Now()
		for i, it := range b.GetMany(t.Context(), []string{"k"}, noBatchLoad(t, "B")) {
			if it.Err != nil || it.Value != 7 {
				t.Fatalf("B's GetMany[%d] = %d, %v; want 7, nil", i, it.Value, it.Err)
			}
		}
		if d := time.Since(start); d != 0 {
			t.Errorf("B's miss took %v; want no wait", d)
		}
		if st := b.Stats(); st.LeaseHoldsHeard != 0 || st.WokenByPoll != 0 || st.WokenByPush != 0 {
			t.Errorf("B's Stats: LeaseHoldsHeard %d, WokenByPoll %d, WokenByPush %d; want 0, 0, 0", st.LeaseHoldsHeard, st.WokenByPoll, st.WokenByPush)
		}
	})
}

// reads counts the Store reads a replica makes through it.
type reads struct {
	*memory.Remote
	n atomic.Int64
}

func (s *reads) Load(ctx context.Context, key string) ([]byte, error) {
	s.n.Add(1)
	return s.Remote.Load(ctx, key)
}

func (s *reads) LoadMany(ctx context.Context, keys []string) []remote.Loaded {
	s.n.Add(int64(len(keys)))
	return s.Remote.LoadMany(ctx, keys)
}

// A miss that waits for the holder's value (OnLeaseHeld: Wait) and heard
// the lease held, with no copy of its own, reads nothing from the Store
// before it waits, when nothing it could serve is there. After the
// holder's completion it takes the value the completion carries, without a
// read, when the Lease is a remote.ValueWatcher, and reads the Store once
// otherwise.
func TestHeardHoldWaitReadsOnce(t *testing.T) {
	for _, tc := range []struct {
		name   string
		lease  func(*memory.Remote) remote.Lease
		reads  int64
		reason string
	}{
		{"value watcher", func(r *memory.Remote) remote.Lease { return r }, 0, "the completion carries A's value"},
		{"watcher", func(r *memory.Remote) remote.Lease { return &noValues{Remote: r} }, 1, "after A's completion"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				r := memory.New()
				a := fleetReplica(t, r, nil)
				store := &reads{Remote: r}
				b := fleetReplica(t, r, func(o *herd.Options[int]) {
					o.Store, o.Lease = store, tc.lease(r)
					o.OnLeaseHeld = herd.Wait
				})
				release, resA := fleetHold(t, a, "k", 5)
				synctest.Wait() // B hears A's hold
				got := make(chan herd.Item[int], 1)
				go func() {
					got <- b.GetMany(t.Context(), []string{"k"}, noBatchLoad(t, "B"))[0]
				}()
				synctest.Wait()
				if n := store.n.Load(); n != 0 {
					t.Errorf("B read the Store %d times before A's completion; want 0", n)
				}
				release()
				if res := <-resA; res.err != nil || res.v != 5 {
					t.Fatalf("A got %d, %v; want 5, nil", res.v, res.err)
				}
				if it := <-got; it.Err != nil || it.Value != 5 {
					t.Fatalf("B got %d, %v; want 5, nil", it.Value, it.Err)
				}
				if n := store.n.Load(); n != tc.reads {
					t.Errorf("B read the Store %d times; want %d, %s", n, tc.reads, tc.reason)
				}
				if st := b.Stats(); st.LeaseHoldsHeard != 1 || st.LeaseAttemptsSkipped != 1 || st.WokenByPush != 1 || st.WokenByPoll != 0 {
					t.Errorf("B's Stats: LeaseHoldsHeard %d, LeaseAttemptsSkipped %d, WokenByPush %d, WokenByPoll %d; want 1, 1, 1, 0",
						st.LeaseHoldsHeard, st.LeaseAttemptsSkipped, st.WokenByPush, st.WokenByPoll)
				}
			})
		})
	}
}

// noValues is a memory.Remote whose completions carry no value: it is no
// remote.ValueWatcher.
type noValues struct {
	*memory.Remote
	WatchValues struct{} // hides the Remote's
}

// noBatchLoad returns a batch load that fails the test when called.
func noBatchLoad(t *testing.T, who string) herd.BatchLoadFunc[int] {
	return func(context.Context, []string) (map[string]int, error) {
		t.Errorf("%s called its load", who)
		return nil, errors.New("unexpected load")
	}
}
