package redisfleet_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/herdcache/herd"
	"github.com/herdcache/herd/redisstore"
	"github.com/herdcache/herd/redisstore/internal/redistest"
	"github.com/herdcache/herd/remote"
)

// watched is a Remote whose cache's notices are watched: after the cache
// has handled each, a zero Notice is counted and signalled on zero, and a
// drop of marker is signalled on marked.
type watched struct {
	*redisstore.Remote
	marker       string
	zeros        atomic.Int64
	zero, marked chan struct{}
}

func (w *watched) Subscribe(fn func(remote.Notice)) (stop func()) {
	return w.Remote.Subscribe(w.wrap(fn))
}

// SubscribeLive is the cache's subscription when the Remote proves its
// notices live; it must be wrapped as Subscribe is, or the cache bypasses
// the watch.
func (w *watched) SubscribeLive(fn func(remote.Notice)) (stop func()) {
	return w.Remote.SubscribeLive(w.wrap(fn))
}

func (w *watched) wrap(fn func(remote.Notice)) func(remote.Notice) {
	return func(n remote.Notice) {
		fn(n)
		switch {
		case n == remote.Notice{}:
			w.zeros.Add(1)
			signal(w.zero)
		case n.Key == w.marker && n.Dropped:
			signal(w.marked)
		}
	}
}

func signal(ch chan struct{}) {
	select {
	case ch <- struct{}{}:
	default:
	}
}

// Large GetManys on one replica do not make another replica drop what it
// holds: their notices reach it targeted, not as the zero Notice of a
// queue that overflowed; a lost subscription still does.
func TestBatchNoticesStayTargeted(t *testing.T) {
	node := redistest.Server(t)
	prefix := fmt.Sprintf("fleet:%s:", t.Name())
	opts := func(r remote.Store, l remote.Lease) *herd.Options[string] {
		return &herd.Options[string]{
			NoBreaker:  true,
			MaxEntries: 20_000, SoftTTL: time.Hour, NearTTL: time.Minute,
			Store: r, Lease: l, LeaseTTL: time.Minute,
		}
	}
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()

	ra, err := redisstore.New(redisstore.Options{Client: node.Client(), Prefix: prefix, Timeout: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer ra.Close()
	a, err := herd.New(opts(ra, ra))
	if err != nil {
		t.Fatal(err)
	}

	bClient := node.Client()
	trips := &roundTrips{}
	bClient.AddHook(trips)
	rb, err := redisstore.New(redisstore.Options{Client: bClient, Prefix: prefix, Timeout: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer rb.Close()
	w := &watched{Remote: rb, marker: "marker", zero: make(chan struct{}, 1), marked: make(chan struct{}, 1)}
	b, err := herd.New(opts(w, w))
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close(context.Background())

	var bLoads atomic.Int64
	warm := make([]string, 50)
	for i := range warm {
		warm[i] = herd.Key("warm", fmt.Sprint(i))
		v, err := b.Get(ctx, warm[i], func(context.Context) (string, error) {
			bLoads.Add(1)
			return "b", nil
		})
		if err != nil || v != "b" {
			t.Fatalf("b.Get(%q) = %q, %v", warm[i], v, err)
		}
	}

	load := func(_ context.Context, ks []string) (map[string]string, error) {
		m := make(map[string]string, len(ks))
		for _, k := range ks {
			m[k] = "a"
		}
		return m, nil
	}
	for _, n := range []int{1_500, 10_000} {
		keys := make([]string, n)
		for i := range keys {
			keys[i] = herd.Key("batch", fmt.Sprint(n), fmt.Sprint(i))
		}
		for i, it := range a.GetMany(ctx, keys, load) {
			if it.Err != nil {
				t.Fatalf("a.GetMany of %d: %q: %v", n, keys[i], it.Err)
			}
		}
	}
	if err := a.Close(ctx); err != nil { // its write-backs, notices included, are done
		t.Fatal(err)
	}
	// A notice published after all of a's reaches b after them.
	if err := ra.Invalidate(ctx, w.marker); err != nil {
		t.Fatal(err)
	}
	await(t, w.marked, 10*time.Second, "notice of the marker")

	if z := w.zeros.Load(); z != 0 {
		t.Errorf("b was told %d times to drop everything", z)
	}
	kept := 0
	for _, k := range warm {
		if _, ok := b.GetIfPresent(k); ok {
			kept++
		}
	}
	if kept != len(warm) {
		t.Errorf("b still trusts %d of the %d keys it warmed; want all", kept, len(warm))
	}
	before := trips.trips.Load()
	for _, k := range warm {
		v, err := b.Get(ctx, k, func(context.Context) (string, error) {
			bLoads.Add(1)
			return "b", nil
		})
		if err != nil || v != "b" {
			t.Fatalf("b.Get(%q) again = %q, %v", k, v, err)
		}
	}
	if n := trips.trips.Load() - before; n != 0 {
		t.Errorf("b's Gets of the keys it warmed sent %d commands to Redis; want none", n)
	}
	if n := bLoads.Load(); n != int64(len(warm)) {
		t.Errorf("b loaded %d times; want %d (one per warmed key)", n, len(warm))
	}

	// A lost subscription is still a loss: b drops everything.
	select {
	case <-w.zero: // counted above
	default:
	}
	if err := node.Client().Do(ctx, "CLIENT", "KILL", "TYPE", "pubsub").Err(); err != nil {
		t.Fatal(err)
	}
	await(t, w.zero, 10*time.Second, "zero Notice after the subscription was dropped")
	for _, k := range warm {
		if _, ok := b.GetIfPresent(k); ok {
			t.Errorf("b still trusts %q after its subscription was dropped", k)
		}
	}
}
