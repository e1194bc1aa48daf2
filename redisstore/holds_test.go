package redisstore

import (
	"testing"
	"time"

	"github.com/herdcache/herd/redisstore/internal/redistest"
	"github.com/herdcache/herd/remote"
	"github.com/herdcache/herd/remote/notify"
)

// holdsOf subscribes to r's hold announcements until the test ends.
func holdsOf(t *testing.T, r *Remote) <-chan notify.Notice {
	ch := make(chan notify.Notice, 1024)
	stop := r.SubscribeHolds(func(n remote.Notice) { ch <- notify.Notice(n) })
	t.Cleanup(stop)
	return ch
}

// TestLeasesAnnounced checks that every lease Acquire and AcquireMany take
// is announced, with the lease's time, to the hold subscribers of the
// other Remotes, whatever bytes the key holds; that a Remote's own leases
// are not announced to its own subscribers; and that ordinary change
// subscribers never see a hold. Notices of one channel are handed on in
// the order they were published, so a hold that reached the wrong
// subscriber would come before the notice that follows it.
func TestLeasesAnnounced(t *testing.T) {
	t.Parallel()
	node := redistest.Server(t)
	a := newRemote(t, node.Client(), Options{})
	b := newRemote(t, node.Client(), Options{})
	aHolds, bHolds := holdsOf(t, a), holdsOf(t, b)
	bChanges := subscribe(t, b)
	ctx := t.Context()
	const ttl = 3 * time.Second

	heard := func(ch <-chan notify.Notice, key string, sent time.Time) {
		t.Helper()
		n := next(t, ch)
		got := time.Now()
		if n.Key != key || n.Fence != 0 || n.Dropped || n.Tag != "" || !n.Live.IsZero() {
			t.Fatalf("hold notice %+v; want one for %q with only Key and Held set", n, key)
		}
		if n.Held.Before(sent.Add(ttl)) || n.Held.After(got.Add(ttl)) {
			t.Fatalf("hold of %q held until %v; want between %v and %v", key, n.Held, sent.Add(ttl), got.Add(ttl))
		}
	}

	const odd = "k:{}\x00\xff:l99:"
	sent := time.Now()
	g, err := a.Acquire(ctx, odd, ttl, time.Now())
	if err != nil || g.Token == "" {
		t.Fatalf("Acquire = %+v, %v; want a lease", g, err)
	}
	heard(bHolds, odd, sent)

	// A held lease is not taken, so not announced.
	if g2, err := b.Acquire(ctx, odd, ttl, time.Now()); err != nil || g2.HeldFor <= 0 {
		t.Fatalf("second Acquire = %+v, %v; want the lease held", g2, err)
	}
	sent = time.Now()
	got := a.AcquireMany(ctx, []remote.LeaseRequest{{Key: "m1", After: sent}, {Key: "", After: sent}}, ttl)
	for i, q := range got {
		if q.Err != nil || q.Token == "" {
			t.Fatalf("AcquireMany entry %d = %+v; want a lease", i, q)
		}
	}
	heard(bHolds, "m1", sent)
	heard(bHolds, "", sent)

	// The change that ends the load reaches b's change subscriber as the
	// first notice it gets: none of the holds before it.
	if wrote, err := a.WriteRelease(ctx, odd, fresh("v"), g.Fence, time.Minute, g.Token); err != nil || !wrote {
		t.Fatalf("WriteRelease = %v, %v; want a write", wrote, err)
	}
	if n := next(t, bChanges); n.Key != odd || n.Fence != g.Fence || !n.Held.IsZero() {
		t.Fatalf("b's change subscriber got %+v first; want the change of %q under %d", n, odd, g.Fence)
	}

	// b's own lease is announced to a, and is the first thing a hears:
	// none of a's own leases came before it.
	sent = time.Now()
	if g, err := b.Acquire(ctx, "b's", ttl, time.Now()); err != nil || g.Token == "" {
		t.Fatalf("Acquire by b = %+v, %v; want a lease", g, err)
	}
	heard(aHolds, "b's", sent)
	sent = time.Now()
	if g, err := a.Acquire(ctx, "a's", ttl, time.Now()); err != nil || g.Token == "" {
		t.Fatalf("Acquire by a = %+v, %v; want a lease", g, err)
	}
	heard(bHolds, "a's", sent) // not b's own, which was published before
}
