package storetest

import (
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/herdcache/herd/remote"
)

// testHoldNotifier checks a [remote.HoldNotifier]: a lease Acquire takes
// is announced to a hold subscriber of the fleet (this replica's, or, for
// a tier that does not echo a replica's own leases, another replica's,
// from a second call of newFleet) with Key set and Held the lease's end,
// as seen between the acquisition and the hearing, and nothing else; a
// lease that was not taken is not announced; and no hold ever reaches a
// Subscribe subscriber.
func testHoldNotifier(t *testing.T, newFleet func(t *testing.T) (remote.Store, remote.Lease)) {
	s, l := newFleet(t)
	_, l2 := newFleet(t)
	hn, ok := l.(remote.HoldNotifier)
	if !ok {
		t.Logf("%T does not implement remote.HoldNotifier: nothing to check", l)
		return
	}
	prefix := key(t, "")
	var (
		mu    sync.Mutex
		heard = make(map[string][]remote.Notice) // this subtest's holds, by key
		when  = make(map[string]time.Time)       // when each key was first heard
	)
	collect := func(x remote.Notice) {
		if !strings.HasPrefix(x.Key, prefix) {
			return // another subtest's, on a shared tier; or a zero Notice
		}
		mu.Lock()
		defer mu.Unlock()
		if _, ok := when[x.Key]; !ok {
			when[x.Key] = time.Now()
		}
		heard[x.Key] = append(heard[x.Key], x)
	}
	defer hn.SubscribeHolds(collect)()
	if hn2, ok := l2.(remote.HoldNotifier); ok {
		defer hn2.SubscribeHolds(collect)()
	}
	var changesHeld sync.Map
	if n, ok := s.(remote.Notifier); ok {
		defer n.Subscribe(func(x remote.Notice) {
			if !x.Held.IsZero() {
				changesHeld.Store(x.Key, x)
			}
		})()
	}
	got := func(k string) ([]remote.Notice, time.Time) {
		mu.Lock()
		defer mu.Unlock()
		return append([]remote.Notice(nil), heard[k]...), when[k]
	}

	// A subscription may start listening a little after SubscribeHolds
	// returns: take leases of new keys until one is heard.
	i := 0
	eventually(t, "first hold", func() bool {
		i++
		k := key(t, "probe"+strconv.Itoa(i))
		g := lease(t, l, k, shortTTL)
		release(t, l, k, g.Token)
		for j := 1; j <= i; j++ {
			if ns, _ := got(key(t, "probe"+strconv.Itoa(j))); len(ns) > 0 {
				return true
			}
		}
		return false
	})

	const ttl = 4 * time.Second
	k := key(t, "held")
	cc, counted := l.(remote.CompletionCounter)
	var seq uint64
	if counted {
		seq = cc.Completions(k)
	}
	sent := time.Now()
	g := lease(t, l, k, ttl)
	eventually(t, "the hold of "+k, func() bool { ns, _ := got(k); return len(ns) > 0 })
	ns, at := got(k)
	x := ns[0]
	if x.Dropped || x.Tag != "" || !x.Live.IsZero() || x.Value != "" {
		t.Errorf("hold notice %+v carries more than Key, Held, Fence and Seq", x)
	}
	if x.Fence != 0 && x.Fence != g.Fence {
		t.Errorf("hold notice %+v: Fence %d, want the lease's %d (or none)", x, x.Fence, g.Fence)
	}
	switch {
	case x.Seq != 0 && !counted:
		t.Errorf("hold notice %+v carries Seq from a Lease that is no remote.CompletionCounter", x)
	case x.Seq != 0 && x.Seq != seq+1:
		t.Errorf("hold notice %+v: Seq %d, want the completion count when the lease was taken plus one, %d", x, x.Seq, seq+1)
	}
	// Expiries are kept at millisecond resolution.
	if lo, hi := sent.Add(ttl-time.Millisecond), at.Add(ttl+time.Millisecond); x.Held.Before(lo) || x.Held.After(hi) {
		t.Errorf("hold of %q until %v; want between %v and %v", k, x.Held, lo, hi)
	}

	// The lease is held: asking again takes nothing and announces nothing.
	if g2 := acquire(t, l, k, ttl); g2.HeldFor <= 0 {
		t.Fatalf("second Acquire(%q) = %+v; want the lease held", k, g2)
	}
	if err := l.Release(t.Context(), k, g.Token); err != nil {
		t.Fatalf("Release(%q): %v", k, err)
	}
	if _, err := s.Write(t.Context(), k, env("v", longTTL, longTTL), g.Fence, longTTL); err != nil {
		t.Fatalf("Write(%q): %v", k, err)
	}
	invalidate(t, s, k)
	// A lease of another key after those is heard after any announcement
	// they made, on a tier whose notices keep their order.
	after := key(t, "after")
	lease(t, l, after, shortTTL)
	eventually(t, "the hold of "+after, func() bool { ns, _ := got(after); return len(ns) > 0 })
	if ns, _ := got(k); len(ns) != 1 {
		t.Errorf("%d holds heard of %q; want 1 (only the lease taken)", len(ns), k)
	}
	changesHeld.Range(func(k, v any) bool {
		t.Errorf("a Subscribe subscriber got the hold %+v", v)
		return false
	})
}
