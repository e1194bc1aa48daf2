package herd_test

import (
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/herdcache/herd"
	"github.com/herdcache/herd/memory"
	"github.com/herdcache/herd/remote"
)

// liveRemote is a memory.Remote that is a remote.LiveNotifier whose proofs
// the test makes: prove hands every live subscriber a proof, lose hands it
// the zero Notice, and while drop is set the changes of memory.Remote reach
// no live subscriber (lost notices).
type liveRemote struct {
	*memory.Remote
	drop atomic.Bool

	mu  sync.Mutex
	fns map[int]func(remote.Notice)
	n   int
}

var _ remote.LiveNotifier = (*liveRemote)(nil)

func newLiveRemote() *liveRemote {
	return &liveRemote{Remote: memory.New(), fns: map[int]func(remote.Notice){}}
}

func (l *liveRemote) SubscribeLive(fn func(remote.Notice)) (stop func()) {
	l.mu.Lock()
	id := l.n
	l.n++
	l.fns[id] = fn
	l.mu.Unlock()
	stopChanges := l.Subscribe(func(n remote.Notice) {
		if !l.drop.Load() {
			fn(n)
		}
	})
	return func() {
		stopChanges()
		l.mu.Lock()
		delete(l.fns, id)
		l.mu.Unlock()
	}
}

// send hands n to every live subscriber, after the changes notified so
// far: the caller is in a synctest bubble, and waits for them first.
func (l *liveRemote) send(n remote.Notice) {
	synctest.Wait()
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, fn := range l.fns {
		fn(n)
	}
}

func (l *liveRemote) prove(until time.Time) { l.send(remote.Notice{Live: until}) }
func (l *liveRemote) lose()                 { l.send(remote.Notice{}) }

// liveOptions are the options of a replica over s: NearTTL 1s, values
// fresh for a minute.
func liveOptions(s remote.Store) *herd.Options[int] {
	return &herd.Options[int]{
		NoBreaker:  true,
		MaxEntries: 10, SoftTTL: time.Minute, HardTTL: 2 * time.Minute,
		Store: s, NearTTL: time.Second,
	}
}

// TestLiveTrust checks that while proofs of liveness cover it, a copy is
// served with no read of the Store long past NearTTL, that a notice still
// replaces it, and that once the proofs end the copy falls back to NearTTL
// revalidation, counted from the end of the last proof.
func TestLiveTrust(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := newLiveRemote()
		a, b := newCache(t, liveOptions(s)), newCache(t, liveOptions(s))
		t0 := time.Now()
		fleetMustGet(t, a, "k", fleetValue(1), 1)
		synctest.Wait() // the write-back
		fleetMustGet(t, b, "k", nil, 1)
		loads := s.Stats().Loads

		// Proofs every second, each good for two: ten NearTTLs pass and
		// b reads nothing.
		for i := range 10 {
			s.prove(t0.Add(time.Duration(i+2) * time.Second))
			sleepUntil(t0.Add(time.Duration(i)*time.Second + 900*time.Millisecond))
			fleetMustGet(t, b, "k", fleetNoLoad(t, "a trusted read"), 1)
		}
		synctest.Wait()
		if got := s.Stats().Loads - loads; got != 0 {
			t.Fatalf("%d Store reads while proofs covered the copy, want 0", got)
		}
		if st := b.Stats(); st.Revalidations != 0 || st.RemoteWaits != 1 {
			t.Fatalf("b's Stats: Revalidations %d, RemoteWaits %d; want 0 and 1 (its first read)", st.Revalidations, st.RemoteWaits)
		}

		// A change's notice still replaces the copy.
		if err := a.Set(t.Context(), "k", 2); err != nil {
			t.Fatal(err)
		}
		fleetNoticed(t, b, "k")
		fleetMustGet(t, b, "k", nil, 2)

		// The proofs end at t0+11s: until then the copy is trusted; past
		// it, it is served while one read replaces it, for NearTTL.
		loads = s.Stats().Loads
		sleepUntil(t0.Add(11*time.Second - time.Millisecond))
		fleetMustGet(t, b, "k", nil, 2)
		synctest.Wait()
		if got := s.Stats().Loads - loads; got != 0 {
			t.Fatalf("%d Store reads before the last proof ended, want 0", got)
		}
		sleepUntil(t0.Add(11*time.Second + 500*time.Millisecond))
		fleetMustGet(t, b, "k", nil, 2)
		synctest.Wait()
		if got := s.Stats().Loads - loads; got != 1 {
			t.Fatalf("%d Store reads after the last proof ended, want 1 (a revalidation)", got)
		}
		if st := b.Stats(); st.Revalidations != 2 || st.RemoteWaits != 1 {
			t.Fatalf("b's Stats: Revalidations %d, RemoteWaits %d; want 2 (after the notice, after the lapse) and 1", st.Revalidations, st.RemoteWaits)
		}
	})
}

// TestLiveLapseBoundsStaleness checks the bound after a lost notice: the
// copy is served stale until the last proof ends and then, at most
// NearTTL longer, only while one read replaces it; a copy no read asked
// for within that NearTTL is read on the reader's path.
func TestLiveLapseBoundsStaleness(t *testing.T) {
	for _, read := range []bool{true, false} {
		name := map[bool]string{true: "read in the window", false: "no read in the window"}[read]
		t.Run(name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				s := newLiveRemote()
				a, b := newCache(t, liveOptions(s)), newCache(t, liveOptions(s))
				t0 := time.Now()
				fleetMustGet(t, a, "k", fleetValue(1), 1)
				synctest.Wait() // the write-back
				fleetMustGet(t, b, "k", nil, 1)
				until := t0.Add(5 * time.Second)
				s.prove(until)

				// The notice of the change is lost, and so are the proofs
				// after it.
				sleepUntil(t0.Add(3 * time.Second))
				s.drop.Store(true)
				if err := a.Set(t.Context(), "k", 2); err != nil {
					t.Fatal(err)
				}
				synctest.Wait()
				sleepUntil(until.Add(-time.Millisecond))
				fleetMustGet(t, b, "k", nil, 1) // within the bound: stale, trusted

				if read {
					sleepUntil(until.Add(time.Millisecond))
					fleetMustGet(t, b, "k", nil, 1) // served while one read replaces it
					synctest.Wait()
					fleetMustGet(t, b, "k", nil, 2)
					if st := b.Stats(); st.RemoteWaits != 1 || st.Revalidations != 1 {
						t.Fatalf("b's Stats: RemoteWaits %d, Revalidations %d; want 1 (its first read) and 1", st.RemoteWaits, st.Revalidations)
					}
					return
				}
				sleepUntil(until.Add(time.Second)) // the last proof's end + NearTTL
				fleetMustGet(t, b, "k", nil, 2)
				if st := b.Stats(); st.RemoteWaits != 2 || st.Revalidations != 0 {
					t.Fatalf("b's Stats: RemoteWaits %d, Revalidations %d; want 2 (its first read, this one) and 0", st.RemoteWaits, st.Revalidations)
				}
			})
		})
	}
}

// TestLiveLostNoticesEndTrust checks that the zero Notice (notices may have
// been lost) ends the trust a proof gave: copies put since are trusted for
// NearTTL alone until the next proof.
func TestLiveLostNoticesEndTrust(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := newLiveRemote()
		b := newCache(t, liveOptions(s))
		t0 := time.Now()
		fleetMustGet(t, b, "k", fleetValue(1), 1)
		s.prove(t0.Add(time.Minute))
		time.Sleep(time.Millisecond)
		s.lose()
		time.Sleep(time.Millisecond) // a copy put at the instant of the loss is not trusted

		fleetMustGet(t, b, "k", nil, 1) // put before the loss: read again
		if st := b.Stats(); st.RemoteWaits != 2 {
			t.Fatalf("RemoteWaits %d after the zero Notice, want 2 (the miss's, this one)", st.RemoteWaits)
		}
		sleepUntil(t0.Add(1500 * time.Millisecond))
		fleetMustGet(t, b, "k", nil, 1)
		synctest.Wait()
		if st := b.Stats(); st.Revalidations != 1 {
			t.Fatalf("Revalidations %d past NearTTL with no proof since the zero Notice, want 1", st.Revalidations)
		}

		// The next proof trusts the copies again.
		s.prove(t0.Add(time.Minute))
		loads := s.Stats().Loads
		sleepUntil(t0.Add(10 * time.Second))
		fleetMustGet(t, b, "k", nil, 1)
		synctest.Wait()
		if got := s.Stats().Loads - loads; got != 0 {
			t.Fatalf("%d Store reads under a new proof, want 0", got)
		}
	})
}

// TestNoLiveNotifierRevalidates checks that a Store that is no
// LiveNotifier keeps the NearTTL re-read: a copy past NearTTL is read
// again once per NearTTL.
func TestNoLiveNotifierRevalidates(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := memory.New()
		if _, ok := any(s).(remote.LiveNotifier); ok {
			t.Fatal("memory.Remote is a LiveNotifier: nothing checked")
		}
		a, b := newCache(t, liveOptions(s)), newCache(t, liveOptions(s))
		t0 := time.Now()
		fleetMustGet(t, a, "k", fleetValue(1), 1)
		synctest.Wait() // the write-back
		fleetMustGet(t, b, "k", nil, 1)
		for i := range 5 {
			sleepUntil(t0.Add(time.Duration(i+1)*time.Second + 100*time.Millisecond))
			fleetMustGet(t, b, "k", nil, 1)
			synctest.Wait()
		}
		if st := b.Stats(); st.Revalidations != 5 {
			t.Fatalf("Revalidations %d over five NearTTLs, want 5", st.Revalidations)
		}
	})
}
