package herd_test

import (
	"context"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/herdcache/herd"
	"github.com/herdcache/herd/memory"
)

// A holder whose load outlived its lease (paused past LeaseTTL: its
// connection frozen, a long GC) must not serve its late value from its own
// local tier once another replica took the lease over or a Set fenced it:
// past the instant its lease could have lapsed, its value waits for the
// Store's answer before it enters the local tier. Its own waiting callers
// still get the value they loaded.

// frozenLease is a holder's Lease whose connection froze: extensions never
// answer (each ends at its own deadline), and write-backs wait until
// thawed, so that the window between a late value and the Store's refusal
// stays open while the test reads.
type frozenLease struct {
	*memory.Remote
	mu     sync.Mutex
	frozen bool
	thawed chan struct{}
}

func newFrozenLease(r *memory.Remote) *frozenLease {
	return &frozenLease{Remote: r, thawed: make(chan struct{})}
}

func (l *frozenLease) freeze() {
	l.mu.Lock()
	l.frozen = true
	l.mu.Unlock()
}

func (l *frozenLease) isFrozen() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.frozen
}

func (l *frozenLease) thaw() { close(l.thawed) }

func (l *frozenLease) Extend(ctx context.Context, key, token string, ttl time.Duration) (bool, error) {
	if l.isFrozen() {
		<-ctx.Done()
		return false, ctx.Err()
	}
	return l.Remote.Extend(ctx, key, token, ttl)
}

func (l *frozenLease) WriteRelease(ctx context.Context, key string, env []byte, fence uint64, ttl time.Duration, token string) (bool, error) {
	if l.isFrozen() {
		select {
		case <-l.thawed:
		case <-ctx.Done():
			return false, ctx.Err()
		}
	}
	return l.Remote.WriteRelease(ctx, key, env, fence, ttl, token)
}

func TestPausedHolderServesNoLateValue(t *testing.T) {
	takeovers := map[string]func(t *testing.T, b *herd.Cache[int]){
		"lease taken over": func(t *testing.T, b *herd.Cache[int]) {
			fleetMustGet(t, b, "k", fleetValue(2), 2, herd.NoStale())
		},
		"fenced by Set": func(t *testing.T, b *herd.Cache[int]) {
			if err := b.Set(t.Context(), "k", 2); err != nil {
				t.Fatalf("Set on B: %v", err)
			}
		},
	}
	for name, takeover := range takeovers {
		t.Run(name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				r := memory.New()
				fl := newFrozenLease(r)
				a := fleetReplica(t, r, func(o *herd.Options[int]) { o.Lease = fl })
				b := fleetReplica(t, r, nil)
				release, resA := fleetHold(t, a, "k", 1)
				fl.freeze()
				time.Sleep(fleetLeaseTTL + time.Second) // A's lease lapses unextended
				takeover(t, b)

				release()
				if res := recv(t, resA); res.err != nil || res.v != 1 {
					t.Fatalf("A's waiting caller got %d, %v; want its own load's 1", res.v, res.err)
				}
				synctest.Wait() // A's write-back waits on its frozen connection
				if v, ok := a.GetIfPresent("k"); ok {
					t.Errorf("A's local tier holds %d while its write-back is unanswered", v)
				}
				fleetMustGet(t, a, "k", fleetNoLoad(t, "A"), 2)
				fl.thaw()
				synctest.Wait() // the Store refuses A's write
				fleetMustGet(t, a, "k", fleetNoLoad(t, "A"), 2)
				if st := a.Stats(); st.FencedWrites != 1 {
					t.Errorf("A's FencedWrites = %d; want 1", st.FencedWrites)
				}
			})
		})
	}
}

// A holder whose lease is provably held (extended in time) puts its value
// in the local tier at once, before the Store answers its write.
func TestHolderWithinLeasePublishesAtOnce(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := memory.New()
		fl := newFrozenLease(r)
		a := fleetReplica(t, r, func(o *herd.Options[int]) { o.Lease = fl })
		release, resA := fleetHold(t, a, "k", 1)
		time.Sleep(2 * fleetLeaseTTL) // the watchdog keeps extending it
		fl.freeze()                   // now the write-back waits
		release()
		if res := recv(t, resA); res.err != nil || res.v != 1 {
			t.Fatalf("A's Get = %d, %v; want 1, nil", res.v, res.err)
		}
		synctest.Wait()
		if v, ok := a.GetIfPresent("k"); !ok || v != 1 {
			t.Errorf("A's local tier: %d, %v; want 1 at once", v, ok)
		}
		fl.thaw()
	})
}
