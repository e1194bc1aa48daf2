package storetest

import (
	"context"
	"testing"
	"time"

	"github.com/herdcache/herd/remote"
)

// testInvalidateAll checks [remote.Clearer]: every value is gone, no write
// under a fence or lease taken before is accepted, the leases are free,
// Wait-ers wake and subscribers get the Notice of an InvalidateAll. It
// retires every key of the tier, so Run runs it alone, after the others.
func testInvalidateAll(t *testing.T, s remote.Store, l remote.Lease) {
	cl := s.(remote.Clearer)
	a, b, c := key(t, "a"), key(t, "b"), key(t, "c")
	set(t, s, a, fresh("A"), longTTL)
	gb := lease(t, l, b, longTTL)
	if !write(t, s, b, fresh("B"), gb.Fence, longTTL) {
		t.Fatal("a write under a fresh lease was refused")
	}
	gc := lease(t, l, c, longTTL) // held, nothing written yet

	var cleared <-chan remote.Notice
	if n, ok := s.(remote.Notifier); ok {
		var stop func()
		cleared, stop = listen(t, s, n, func(n remote.Notice) bool { return n.Dropped && n.Fence == 0 && n.Key == "" })
		defer stop()
	}

	ctx, cancel := context.WithTimeout(t.Context(), deadline)
	defer cancel()
	woke := make(chan error, 1)
	go func() { woke <- l.Wait(ctx, c) }()
	// A Wait may start listening after the call that would wake it:
	// invalidate everything until it wakes.
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for waiting := true; waiting; {
		if err := cl.InvalidateAll(t.Context()); err != nil {
			t.Fatalf("InvalidateAll: %v", err)
		}
		select {
		case err := <-woke:
			if err != nil {
				t.Fatalf("Wait during InvalidateAll: %v", err)
			}
			waiting = false
		case <-tick.C:
		}
	}
	if cleared != nil {
		select {
		case <-cleared:
		case <-time.After(deadline):
			t.Error("no Notice of the InvalidateAll (Dropped, no key, fence 0) reached a subscriber")
		}
	}

	wantLoad(t, s, a, nil)
	wantLoad(t, s, b, nil)
	if write(t, s, c, fresh("late"), gc.Fence, longTTL) {
		t.Error("a write under a lease taken before InvalidateAll was accepted")
	}
	if write(t, s, b, fresh("later"), gb.Fence, longTTL) {
		t.Error("a write under a fence taken before InvalidateAll was accepted")
	}
	wantLoad(t, s, c, nil)
	g := lease(t, l, c, longTTL) // the old holder's lease is gone
	if g.Fence <= gc.Fence {
		t.Errorf("the fence after InvalidateAll is %d, not above the %d before", g.Fence, gc.Fence)
	}
	v := fresh("new")
	if !write(t, s, c, v, g.Fence, longTTL) {
		t.Error("a write under a lease taken after InvalidateAll was refused")
	}
	wantLoad(t, s, c, fenced(t, v, g.Fence))
	set(t, s, a, fresh("A2"), longTTL)
	if got := load(t, s, a); got == nil {
		t.Error("a Set after InvalidateAll stored nothing")
	}
}
