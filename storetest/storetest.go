// Package storetest checks that a remote tier keeps the remote.Store, remote.Lease and remote.Notifier contracts, remote.LiveNotifier's and remote.HoldNotifier's included.
package storetest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/herdcache/herd/remote"
	"github.com/herdcache/herd/remote/envelope"
)

// Timing of the suite. It runs on wall time because a real server has no fake
// clock: expiries are checked by polling with a generous deadline.
const (
	longTTL   = time.Minute            // a TTL that never ends during a test
	shortTTL  = 300 * time.Millisecond // a TTL that a test waits out
	deadline  = 5 * time.Second        // how long an expected event may take
	pollEvery = 10 * time.Millisecond
)

// Run checks the remote tier that newFleet returns against the contracts of
// [remote.Store] and [remote.Lease], and of [remote.Notifier] when the Store also
// implements it. Each subtest calls newFleet once, from parallel subtests, for
// a remote that may be shared with other subtests: every key a subtest uses
// holds its name, so they never collide.
//
// Beyond what the interfaces say, Run holds a tier to these rules: the empty
// key is a key like any other; a ttl that is not positive and an envelope
// that does not decode are errors that wrap [remote.ErrRejected] and change
// nothing; a Write under the fence of a key that was never fenced (fence 0)
// stores; a lease that expires leaves its fence current, so its holder can
// still write until the fence advances (a tier may expire a fence, but not
// sooner than its lease). When the Lease is a [remote.WriteReleaser], Run checks WriteRelease
// too, and when the Store is a [remote.HotSet] or a [remote.Staler], those.
//
// The batch contracts are checked when implemented: LoadMany when the Store
// is a [remote.BatchStore], and AcquireMany, ExtendMany and WriteReleaseMany
// when the Lease is a [remote.BatchLease], each entry against what its
// single-key call does. Run calls newFleet once more itself to find out which
// the tier implements; it adds no batch subtest for a contract the tier
// lacks, rather than one that passes without checking anything. When the
// Store is a [remote.Clearer], InvalidateAll is checked last, alone; when it
// is a [remote.Tagger], its tag versions. When the Lease is a
// [remote.HoldNotifier], its hold announcements are checked, heard by this
// replica or by another that a second call of newFleet gives. A change
// notice that carries a value ([remote.Notice] Value) must carry the
// envelope its change stored, fence field set to the notice's fence, and a
// deletion's none; a Store may carry values for some changes or none.
func Run(t *testing.T, newFleet func(t *testing.T) (remote.Store, remote.Lease)) {
	tests := []subtest{
		{"LoadMissing", testLoadMissing},
		{"WriteUnderAcquiredFence", testWriteUnderAcquiredFence},
		{"StaleFenceRefused", testStaleFenceRefused},
		{"SetAdvancesFence", testSetAdvancesFence},
		{"InvalidateDeletesAndAdvances", testInvalidate},
		{"AcquireFreshValue", testAcquireFreshValue},
		{"AcquireAfter", testAcquireAfter},
		{"AcquireSoftExpired", testAcquireSoftExpired},
		{"AcquireHeld", testAcquireHeld},
		{"FencesIncrease", testFencesIncrease},
		{"ExtendReleaseToken", testExtendReleaseToken},
		{"LeaseExpires", testLeaseExpires},
		{"FenceOutlivesLease", testFenceOutlivesLease},
		{"WaitWakesOnRelease", testWaitWakesOnRelease},
		{"WaitContextEnds", testWaitContextEnds},
		{"HardExpiry", testHardExpiry},
		{"ConcurrentAcquire", testConcurrentAcquire},
		{"CorruptEnvelope", testCorruptEnvelope},
		{"BadInput", testBadInput},
		{"EmptyKey", testEmptyKey},
		{"WriteRelease", testWriteRelease},
		{"Notifier", testNotifier},
		{"LiveNotifier", testLiveNotifier},
		{"HotSet", testHotSet},
		{"MarkStale", testMarkStale},
	}
	probeS, probeL := newFleet(t)
	tests = append(tests, batchTests(probeS, probeL)...)
	if _, ok := probeS.(remote.Tagger); ok {
		tests = append(tests, subtest{"Tagger", testTagger})
	}
	if _, ok := probeL.(remote.Watcher); ok {
		tests = append(tests, subtest{"Watcher", testWatcher})
	}
	if _, ok := probeL.(remote.BatchWatcher); ok {
		tests = append(tests, subtest{"BatchWatcher", testBatchWatcher})
	}
	if _, ok := probeL.(remote.ValueWatcher); ok {
		tests = append(tests, subtest{"ValueWatcher", testValueWatcher})
	}
	if _, ok := probeL.(remote.CompletionCounter); ok {
		tests = append(tests, subtest{"CompletionCounter", testCompletionCounter})
	}
	if _, ok := probeL.(remote.HoldNotifier); ok {
		tests = append(tests, subtest{"HoldNotifier", func(t *testing.T, _ remote.Store, _ remote.Lease) {
			testHoldNotifier(t, newFleet)
		}})
	}
	// The subtests run in parallel within one group, which returns once
	// they have all ended; InvalidateAll, which retires every key of the
	// tier, runs after it.
	t.Run("Parallel", func(t *testing.T) {
		for _, tc := range tests {
			t.Run(tc.name, func(t *testing.T) {
				t.Parallel()
				s, l := newFleet(t)
				tc.fn(t, s, l)
			})
		}
	})
	if _, ok := probeS.(remote.Clearer); ok {
		t.Run("InvalidateAll", func(t *testing.T) {
			s, l := newFleet(t)
			testInvalidateAll(t, s, l)
		})
	}
}

// key returns a key unique to the running subtest.
func key(t *testing.T, suffix string) string {
	return "storetest/" + t.Name() + "/" + suffix
}

// env encodes an envelope holding value whose soft and hard expiries are soft
// and hard from now.
func env(value string, soft, hard time.Duration) []byte {
	now := time.Now()
	return envelope.Append(nil, &envelope.Envelope{
		Soft:  now.Add(soft).UnixMilli(),
		Hard:  now.Add(hard).UnixMilli(),
		Delta: 10 * time.Millisecond,
		Value: []byte(value),
	})
}

// fresh encodes a value fresh for a minute.
func fresh(value string) []byte { return env(value, longTTL, 2*longTTL) }

// fenced returns a copy of b with its fence field set to fence.
func fenced(t *testing.T, b []byte, fence uint64) []byte {
	t.Helper()
	c := bytes.Clone(b)
	if err := envelope.SetFence(c, fence); err != nil {
		t.Fatalf("SetFence: %v", err)
	}
	return c
}

// decode decodes b, which must be a valid envelope.
func decode(t *testing.T, b []byte) envelope.Envelope {
	t.Helper()
	e, err := envelope.Decode(b)
	if err != nil {
		t.Fatalf("stored envelope does not decode: %v", err)
	}
	return e
}

func load(t *testing.T, s remote.Store, k string) []byte {
	t.Helper()
	b, err := s.Load(t.Context(), k)
	if err != nil {
		t.Fatalf("Load(%q): %v", k, err)
	}
	return b
}

// wantLoad checks that k holds exactly want.
func wantLoad(t *testing.T, s remote.Store, k string, want []byte) {
	t.Helper()
	if got := load(t, s, k); !bytes.Equal(got, want) {
		t.Fatalf("Load(%q) = %s, want %s", k, show(got), show(want))
	}
}

func show(b []byte) string {
	if b == nil {
		return "nil"
	}
	e, err := envelope.Decode(b)
	if err != nil {
		return fmt.Sprintf("%q (%v)", b, err)
	}
	return fmt.Sprintf("{value %q fence %d soft %d hard %d}", e.Value, e.Fence, e.Soft, e.Hard)
}

func write(t *testing.T, s remote.Store, k string, b []byte, fence uint64, ttl time.Duration) bool {
	t.Helper()
	ok, err := s.Write(t.Context(), k, b, fence, ttl)
	if err != nil {
		t.Fatalf("Write(%q, fence %d): %v", k, fence, err)
	}
	return ok
}

func set(t *testing.T, s remote.Store, k string, b []byte, ttl time.Duration) uint64 {
	t.Helper()
	fence, err := s.Set(t.Context(), k, b, ttl)
	if err != nil {
		t.Fatalf("Set(%q): %v", k, err)
	}
	if fence == 0 || fence > envelope.MaxFence {
		t.Fatalf("Set(%q) returned fence %d, want one in [1, 2^53)", k, fence)
	}
	return fence
}

func invalidate(t *testing.T, s remote.Store, k string) {
	t.Helper()
	if err := s.Invalidate(t.Context(), k); err != nil {
		t.Fatalf("Invalidate(%q): %v", k, err)
	}
}

func acquire(t *testing.T, l remote.Lease, k string, ttl time.Duration) remote.Grant {
	t.Helper()
	return acquireAfter(t, l, k, ttl, time.Time{})
}

func acquireAfter(t *testing.T, l remote.Lease, k string, ttl time.Duration, after time.Time) remote.Grant {
	t.Helper()
	g, err := l.Acquire(t.Context(), k, ttl, after)
	if err != nil {
		t.Fatalf("Acquire(%q): %v", k, err)
	}
	n := 0
	if g.Value != nil {
		n++
	}
	if g.Token != "" {
		n++
	}
	if g.HeldFor != 0 {
		n++
	}
	if n != 1 || (g.Token == "") != (g.Fence == 0) || g.Fence > envelope.MaxFence {
		t.Fatalf("Acquire(%q) = %+v: want exactly one of Value, Token (with Fence) or HeldFor", k, g)
	}
	return g
}

// lease acquires k, which must not be held nor hold a fresh value.
func lease(t *testing.T, l remote.Lease, k string, ttl time.Duration) remote.Grant {
	t.Helper()
	g := acquire(t, l, k, ttl)
	if g.Token == "" {
		t.Fatalf("Acquire(%q) = %+v, want a lease", k, g)
	}
	return g
}

func release(t *testing.T, l remote.Lease, k, token string) {
	t.Helper()
	if err := l.Release(t.Context(), k, token); err != nil {
		t.Fatalf("Release(%q): %v", k, err)
	}
}

func extend(t *testing.T, l remote.Lease, k, token string, ttl time.Duration) bool {
	t.Helper()
	ok, err := l.Extend(t.Context(), k, token, ttl)
	if err != nil {
		t.Fatalf("Extend(%q): %v", k, err)
	}
	return ok
}

// eventually calls cond every pollEvery until it reports true, and fails the
// test if that takes longer than deadline.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	end := time.Now().Add(deadline)
	for !cond() {
		if time.Now().After(end) {
			t.Fatalf("%s: not within %v", what, deadline)
		}
		time.Sleep(pollEvery)
	}
}

// listen subscribes to n, the Notifier of s, keeping the notices keep
// accepts, and returns once the subscription hears notices: a probe key
// is invalidated until its own notice comes.
func listen(t *testing.T, s remote.Store, n remote.Notifier, keep func(remote.Notice) bool) (<-chan remote.Notice, func()) {
	t.Helper()
	kept := make(chan remote.Notice, 1024)
	heard := make(chan struct{}, 1024)
	probe := key(t, "listen")
	stop := n.Subscribe(func(n remote.Notice) {
		switch {
		case n.Key == probe:
			heard <- struct{}{}
		case keep(n):
			kept <- n
		}
	})
	t.Cleanup(stop) // stop may be called more than once
	eventually(t, "the subscription's first notice", func() bool {
		invalidate(t, s, probe)
		select {
		case <-heard:
			return true
		default:
			return false
		}
	})
	return kept, stop
}

func testLoadMissing(t *testing.T, s remote.Store, _ remote.Lease) {
	b, err := s.Load(t.Context(), key(t, "missing"))
	if b != nil || err != nil {
		t.Fatalf("Load(missing) = %q, %v; want nil, nil", b, err)
	}
}

func testWriteUnderAcquiredFence(t *testing.T, s remote.Store, l remote.Lease) {
	k := key(t, "k")
	g := lease(t, l, k, longTTL)
	v := fresh("v1")
	if !write(t, s, k, v, g.Fence, longTTL) {
		t.Fatalf("Write under the fence %d from Acquire was refused", g.Fence)
	}
	got := load(t, s, k)
	wantLoad(t, s, k, fenced(t, v, g.Fence))
	if e := decode(t, got); e.Fence != g.Fence || string(e.Value) != "v1" {
		t.Fatalf("stored envelope = %s, want value v1 under fence %d", show(got), g.Fence)
	}
	release(t, l, k, g.Token)
}

func testStaleFenceRefused(t *testing.T, s remote.Store, l remote.Lease) {
	t.Run("AfterAcquire", func(t *testing.T) {
		k := key(t, "k")
		g1 := lease(t, l, k, longTTL)
		release(t, l, k, g1.Token)
		g2 := lease(t, l, k, longTTL)
		if write(t, s, k, fresh("old"), g1.Fence, longTTL) {
			t.Fatalf("Write under fence %d accepted after a later Acquire gave fence %d", g1.Fence, g2.Fence)
		}
		if b := load(t, s, k); b != nil {
			t.Fatalf("refused write stored %s", show(b))
		}
		v := fresh("new")
		if !write(t, s, k, v, g2.Fence, longTTL) {
			t.Fatalf("Write under the current fence %d refused", g2.Fence)
		}
		if write(t, s, k, fresh("old"), g1.Fence, longTTL) {
			t.Fatalf("Write under stale fence %d accepted over a newer value", g1.Fence)
		}
		wantLoad(t, s, k, fenced(t, v, g2.Fence))
	})
	t.Run("AfterSet", func(t *testing.T) {
		k := key(t, "k")
		g := lease(t, l, k, longTTL)
		set(t, s, k, fresh("set"), longTTL)
		want := load(t, s, k)
		if write(t, s, k, fresh("old"), g.Fence, longTTL) {
			t.Fatalf("Write under fence %d accepted after Set", g.Fence)
		}
		wantLoad(t, s, k, want)
	})
	t.Run("AfterInvalidate", func(t *testing.T) {
		k := key(t, "k")
		g := lease(t, l, k, longTTL)
		invalidate(t, s, k)
		if write(t, s, k, fresh("old"), g.Fence, longTTL) {
			t.Fatalf("Write under fence %d accepted after Invalidate", g.Fence)
		}
		wantLoad(t, s, k, nil)
	})
}

func testSetAdvancesFence(t *testing.T, s remote.Store, l remote.Lease) {
	t.Run("NeverFenced", func(t *testing.T) {
		k := key(t, "k")
		if !write(t, s, k, fresh("zero"), 0, longTTL) {
			t.Fatal("Write under fence 0 refused on a key that was never fenced")
		}
		v := fresh("set")
		f := set(t, s, k, v, longTTL)
		wantLoad(t, s, k, fenced(t, v, f))
		if write(t, s, k, fresh("zero"), 0, longTTL) {
			t.Fatal("Write under fence 0 accepted after Set")
		}
		// The fence Set returns is current: writing under it succeeds.
		v2 := fresh("again")
		if !write(t, s, k, v2, f, longTTL) {
			t.Fatalf("Write under the fence %d that Set returned was refused", f)
		}
		wantLoad(t, s, k, fenced(t, v2, f))
	})
	t.Run("InFlightHolder", func(t *testing.T) {
		k := key(t, "k")
		g := lease(t, l, k, longTTL)
		v := fresh("set")
		f := set(t, s, k, v, longTTL)
		if f <= g.Fence {
			t.Fatalf("Set returned fence %d, not above the holder's %d", f, g.Fence)
		}
		if write(t, s, k, fresh("holder"), g.Fence, longTTL) {
			t.Fatalf("holder's Write under fence %d accepted after Set", g.Fence)
		}
		wantLoad(t, s, k, fenced(t, v, f))
		release(t, l, k, g.Token)
		f2 := set(t, s, k, env("stale", -time.Second, longTTL), longTTL)
		g2 := lease(t, l, k, longTTL)
		if f2 <= f || g2.Fence <= f2 {
			t.Fatalf("fences: Set %d, Set %d, Acquire %d; want them increasing", f, f2, g2.Fence)
		}
	})
}

func testInvalidate(t *testing.T, s remote.Store, l remote.Lease) {
	k := key(t, "k")
	g := lease(t, l, k, longTTL)
	if !write(t, s, k, fresh("v"), g.Fence, longTTL) {
		t.Fatal("Write under the acquired fence refused")
	}
	release(t, l, k, g.Token)
	invalidate(t, s, k)
	wantLoad(t, s, k, nil)
	if write(t, s, k, fresh("v"), g.Fence, longTTL) {
		t.Fatalf("Write under fence %d accepted after Invalidate", g.Fence)
	}
	g2 := lease(t, l, k, longTTL)
	if g2.Fence <= g.Fence+1 {
		t.Fatalf("fences: Acquire %d, Invalidate, Acquire %d; want Invalidate to advance the fence", g.Fence, g2.Fence)
	}

	// Invalidating a key that holds nothing is fine and still fences.
	k2 := key(t, "never")
	invalidate(t, s, k2)
	wantLoad(t, s, k2, nil)
	if write(t, s, k2, fresh("v"), 0, longTTL) {
		t.Fatal("Write under fence 0 accepted after Invalidate")
	}
}

func testAcquireFreshValue(t *testing.T, s remote.Store, l remote.Lease) {
	k := key(t, "k")
	set(t, s, k, fresh("v"), longTTL)
	want := load(t, s, k)
	g := acquire(t, l, k, longTTL)
	if !bytes.Equal(g.Value, want) {
		t.Fatalf("Acquire over a fresh value = %+v, want Value %s", g, show(want))
	}
	soft := time.UnixMilli(decode(t, want).Soft)
	if g := acquireAfter(t, l, k, longTTL, soft.Add(-time.Millisecond)); !bytes.Equal(g.Value, want) {
		t.Fatalf("Acquire after a time before the soft expiry = %+v, want Value %s", g, show(want))
	}
}

// testAcquireAfter: an early refresh passes the soft expiry of the value it
// replaces; a value that is not fresher than that does not stop it.
func testAcquireAfter(t *testing.T, s remote.Store, l remote.Lease) {
	k := key(t, "k")
	set(t, s, k, fresh("v"), longTTL)
	soft := time.UnixMilli(decode(t, load(t, s, k)).Soft)
	for _, after := range []time.Time{soft, soft.Add(time.Millisecond), soft.Add(time.Hour)} {
		g := acquireAfter(t, l, k, longTTL, after)
		if g.Token == "" {
			t.Fatalf("Acquire(after %v, soft expiry %v) = %+v, want a lease", after, soft, g)
		}
		release(t, l, k, g.Token)
	}
}

func testAcquireSoftExpired(t *testing.T, s remote.Store, l remote.Lease) {
	k := key(t, "k")
	v := env("stale", -time.Second, longTTL)
	set(t, s, k, v, longTTL)
	g := acquire(t, l, k, longTTL)
	if g.Token == "" {
		t.Fatalf("Acquire over a soft-expired value = %+v, want a lease", g)
	}
	if e := decode(t, load(t, s, k)); string(e.Value) != "stale" {
		t.Fatalf("Acquire changed the stale value to %q", e.Value)
	}
}

func testAcquireHeld(t *testing.T, _ remote.Store, l remote.Lease) {
	k := key(t, "k")
	const ttl = 10 * time.Second
	lease(t, l, k, ttl)
	g := acquire(t, l, k, ttl)
	if g.HeldFor <= 0 || g.HeldFor > ttl {
		t.Fatalf("second Acquire = %+v, want HeldFor in (0, %v]", g, ttl)
	}
}

func testFencesIncrease(t *testing.T, _ remote.Store, l remote.Lease) {
	k := key(t, "k")
	var last uint64
	for i := range 5 {
		g := lease(t, l, k, longTTL)
		if g.Fence <= last {
			t.Fatalf("acquisition %d: fence %d, not above the previous %d", i, g.Fence, last)
		}
		last = g.Fence
		release(t, l, k, g.Token)
	}
}

func testExtendReleaseToken(t *testing.T, _ remote.Store, l remote.Lease) {
	k := key(t, "k")
	const ttl = 2 * time.Second
	g := lease(t, l, k, ttl)

	if extend(t, l, k, g.Token+"x", longTTL) {
		t.Fatal("Extend with a wrong token reported true")
	}
	if extend(t, l, k, "", longTTL) {
		t.Fatal("Extend with an empty token reported true")
	}
	if h := acquire(t, l, k, ttl); h.HeldFor <= 0 || h.HeldFor > ttl {
		t.Fatalf("after Extend with a wrong token: Acquire = %+v, want HeldFor in (0, %v]", h, ttl)
	}
	if !extend(t, l, k, g.Token, longTTL) {
		t.Fatal("Extend with the holder's token reported false")
	}
	if h := acquire(t, l, k, ttl); h.HeldFor <= ttl || h.HeldFor > longTTL {
		t.Fatalf("after Extend to %v: Acquire = %+v, want HeldFor in (%v, %v]", longTTL, h, ttl, longTTL)
	}

	release(t, l, k, g.Token+"x")
	if h := acquire(t, l, k, ttl); h.HeldFor <= 0 {
		t.Fatalf("after Release with a wrong token: Acquire = %+v, want the lease still held", h)
	}
	release(t, l, k, g.Token)
	g2 := lease(t, l, k, ttl)
	if g2.Token == g.Token {
		t.Fatalf("two acquisitions got the same token %q", g.Token)
	}
	if extend(t, l, k, g.Token, longTTL) {
		t.Fatal("Extend with a released token reported true")
	}
}

func testLeaseExpires(t *testing.T, _ remote.Store, l remote.Lease) {
	k := key(t, "k")
	g := lease(t, l, k, shortTTL)
	var next remote.Grant
	eventually(t, "lease expiry", func() bool {
		next = acquire(t, l, k, longTTL)
		return next.Token != ""
	})
	if next.Fence <= g.Fence {
		t.Fatalf("fence after expiry %d, not above %d", next.Fence, g.Fence)
	}
	if extend(t, l, k, g.Token, longTTL) {
		t.Fatal("Extend with an expired token reported true")
	}
	release(t, l, k, g.Token)
	if h := acquire(t, l, k, longTTL); h.HeldFor <= 0 {
		t.Fatalf("after Release with an expired token: Acquire = %+v, want the new holder's lease kept", h)
	}
}

func testFenceOutlivesLease(t *testing.T, s remote.Store, l remote.Lease) {
	k := key(t, "k")
	g := lease(t, l, k, longTTL)
	if !extend(t, l, k, g.Token, time.Millisecond) {
		t.Fatal("Extend with the holder's token reported false")
	}
	eventually(t, "lease expiry", func() bool { return !extend(t, l, k, g.Token, time.Millisecond) })
	v := fresh("late")
	if !write(t, s, k, v, g.Fence, longTTL) {
		t.Fatalf("Write under fence %d refused after its lease expired, with no newer fence", g.Fence)
	}
	wantLoad(t, s, k, fenced(t, v, g.Fence))
	// The value is fresh: ask for a newer one, as a refresh does.
	next := acquireAfter(t, l, k, longTTL, time.Now().Add(2*longTTL))
	if next.Token == "" || next.Fence <= g.Fence {
		t.Fatalf("Acquire after the lease expired = %+v, want a lease with a fence above %d", next, g.Fence)
	}
	if write(t, s, k, fresh("later"), g.Fence, longTTL) {
		t.Fatalf("Write under fence %d accepted after a newer acquisition", g.Fence)
	}
}

func testWaitWakesOnRelease(t *testing.T, _ remote.Store, l remote.Lease) {
	k := key(t, "k")
	g := lease(t, l, k, longTTL)
	ctx, cancel := context.WithTimeout(t.Context(), deadline)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- l.Wait(ctx, k) }()
	// An announcement made before Wait subscribes is not seen, and the
	// suite cannot tell when it has: release until Wait returns. The first
	// Release drops the lease; the later ones are by a stale token, which
	// still announce.
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		release(t, l, k, g.Token)
		select {
		case err := <-done:
			if err != nil {
				t.Fatalf("Wait after Release: %v", err)
			}
			return
		case <-tick.C:
		}
	}
}

// testWatcher: a watch registered before a completion is notified by it,
// once, and one registered after is not; stop may be called more than
// once, and after the notification.
func testWatcher(t *testing.T, _ remote.Store, l remote.Lease) {
	w := l.(remote.Watcher)
	k := key(t, "k")
	g := lease(t, l, k, longTTL)
	var calls atomic.Int32
	done := make(chan struct{}, 2)
	stop := w.Watch(k, func() {
		calls.Add(1)
		done <- struct{}{}
	})
	defer stop()
	release(t, l, k, g.Token) // announced before anyone waits on done
	select {
	case <-done:
	case <-time.After(deadline):
		t.Fatal("a completion announced after Watch did not notify it")
	}
	stop()
	later := make(chan struct{}, 1)
	stopLater := w.Watch(k, func() { later <- struct{}{} })
	defer stopLater()
	g = lease(t, l, k, longTTL)
	release(t, l, k, g.Token) // a second completion: the first watch is done
	select {
	case <-later:
	case <-time.After(deadline):
		t.Fatal("a completion announced after the second Watch did not notify it")
	}
	if n := calls.Load(); n != 1 {
		t.Fatalf("the first watch was notified %d times, want once", n)
	}
	stopLater()
	never := make(chan struct{}, 1)
	stopNever := w.Watch(k, func() { never <- struct{}{} })
	stopNever()
	stopNever()
	g = lease(t, l, k, longTTL)
	release(t, l, k, g.Token)
	select {
	case <-never:
		t.Fatal("a watch taken back was notified")
	case <-time.After(100 * time.Millisecond):
	}
}

// testCompletionCounter: a key's completion count has moved by the time a
// Watch registered with it is notified of the key's completion, once for
// each completion.
func testCompletionCounter(t *testing.T, _ remote.Store, l remote.Lease) {
	cc := l.(remote.CompletionCounter)
	w, ok := l.(remote.Watcher)
	if !ok {
		t.Fatal("a CompletionCounter must be a Watcher")
	}
	k := key(t, "k")
	for i := range 2 {
		g := lease(t, l, k, longTTL)
		done := make(chan struct{}, 1)
		stop := w.Watch(k, func() { done <- struct{}{} })
		before := cc.Completions(k)
		release(t, l, k, g.Token)
		select {
		case <-done:
		case <-time.After(deadline):
			t.Fatalf("completion %d announced after Watch did not notify it", i+1)
		}
		stop()
		if cc.Completions(k) == before {
			t.Fatalf("completion %d was announced and the key's count did not move", i+1)
		}
	}
}

// testBatchWatcher: each key registered by one WatchMany is notified by
// its own completion, once, and not by another key's; a registration
// taken back is not notified, and stop may be called twice.
func testBatchWatcher(t *testing.T, _ remote.Store, l remote.Lease) {
	w := l.(remote.BatchWatcher)
	keys := []string{key(t, "a"), key(t, "b"), key(t, "c")}
	calls := make([]atomic.Int32, len(keys))
	done := make(chan int, 2*len(keys))
	grants := make([]remote.Grant, len(keys))
	for i, k := range keys {
		grants[i] = lease(t, l, k, longTTL)
	}
	stop := w.WatchMany(keys, func(i int) {
		calls[i].Add(1)
		done <- i
	})
	stop(2)
	stop(2)
	for _, i := range []int{1, 0, 2} {
		release(t, l, keys[i], grants[i].Token)
	}
	for range 2 {
		select {
		case <-done:
		case <-time.After(deadline):
			t.Fatal("a completion announced after WatchMany did not notify its key")
		}
	}
	g := lease(t, l, keys[0], longTTL)
	release(t, l, keys[0], g.Token) // a second completion: key 0's watch is done
	select {
	case i := <-done:
		t.Fatalf("key %d notified again", i)
	case <-time.After(100 * time.Millisecond):
	}
	for i, want := range []int32{1, 1, 0} {
		if n := calls[i].Load(); n != want {
			t.Errorf("key %d notified %d times, want %d", i, n, want)
		}
	}
	for i := range keys {
		stop(i)
	}
}

// testValueWatcher: a completion that stored a value (WriteRelease)
// notifies its key's WatchValues registration with the envelope stored,
// fenced, and one that stored none (Release, a refused write) with nil.
func testValueWatcher(t *testing.T, _ remote.Store, l remote.Lease) {
	w := l.(remote.ValueWatcher)
	wr, ok := l.(remote.WriteReleaser)
	if !ok {
		t.Fatalf("%T is a remote.ValueWatcher but no remote.WriteReleaser: no completion stores a value", l)
	}
	ctx := t.Context()
	keys := []string{key(t, "wrote"), key(t, "released"), key(t, "refused")}
	grants := make([]remote.Grant, len(keys))
	for i, k := range keys {
		grants[i] = lease(t, l, k, longTTL)
	}
	type note struct {
		i   int
		env []byte
	}
	notes := make(chan note, 2*len(keys))
	stop := w.WatchValues(keys, func(i int, env []byte) { notes <- note{i, env} })
	defer func() {
		for i := range keys {
			stop(i)
		}
	}()
	v := fresh("v")
	if wrote, err := wr.WriteRelease(ctx, keys[0], v, grants[0].Fence, longTTL, grants[0].Token); err != nil || !wrote {
		t.Fatalf("WriteRelease under the held fence = %v, %v; want true", wrote, err)
	}
	release(t, l, keys[1], grants[1].Token)
	if wrote, err := wr.WriteRelease(ctx, keys[2], fresh("late"), grants[2].Fence+1, longTTL, grants[2].Token); err != nil || wrote {
		t.Fatalf("WriteRelease under a fence not held = %v, %v; want false", wrote, err)
	}
	want := [][]byte{fenced(t, v, grants[0].Fence), nil, nil}
	got := make([]bool, len(keys))
	for range keys {
		select {
		case n := <-notes:
			if got[n.i] {
				t.Fatalf("key %d notified twice", n.i)
			}
			got[n.i] = true
			if !bytes.Equal(n.env, want[n.i]) {
				t.Errorf("key %d notified with %q, want %q", n.i, n.env, want[n.i])
			}
		case <-time.After(deadline):
			t.Fatalf("completions notified keys %v of 3", got)
		}
	}
}

func testWaitContextEnds(t *testing.T, _ remote.Store, l remote.Lease) {
	k := key(t, "k")
	// A completion announced before Wait is called does not end it.
	g := lease(t, l, k, longTTL)
	release(t, l, k, g.Token)
	ctx, cancel := context.WithTimeout(t.Context(), 100*time.Millisecond)
	defer cancel()
	if err := l.Wait(ctx, k); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Wait with no announcement = %v, want context.DeadlineExceeded", err)
	}

	ctx, cancel = context.WithCancel(t.Context())
	cancel()
	if err := l.Wait(ctx, k); !errors.Is(err, context.Canceled) {
		t.Fatalf("Wait with a cancelled context = %v, want context.Canceled", err)
	}
}

func testHardExpiry(t *testing.T, s remote.Store, l remote.Lease) {
	// The ttl argument, not the envelope's own hard expiry, bounds the value.
	t.Run("Write", func(t *testing.T) {
		k := key(t, "k")
		g := lease(t, l, k, longTTL)
		if !write(t, s, k, fresh("v"), g.Fence, shortTTL) {
			t.Fatal("Write under the acquired fence refused")
		}
		release(t, l, k, g.Token)
		if load(t, s, k) == nil {
			t.Fatal("value gone at once")
		}
		eventually(t, "hard expiry after Write", func() bool { return load(t, s, k) == nil })
		if g := acquire(t, l, k, longTTL); g.Token == "" {
			t.Fatalf("Acquire after hard expiry = %+v, want a lease", g)
		}
	})
	t.Run("Set", func(t *testing.T) {
		k := key(t, "k")
		set(t, s, k, fresh("v"), shortTTL)
		if load(t, s, k) == nil {
			t.Fatal("value gone at once")
		}
		eventually(t, "hard expiry after Set", func() bool { return load(t, s, k) == nil })
	})
}

func testConcurrentAcquire(t *testing.T, _ remote.Store, l remote.Lease) {
	k := key(t, "k")
	const n = 50
	start := make(chan struct{})
	grants := make([]remote.Grant, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			<-start
			grants[i], errs[i] = l.Acquire(t.Context(), k, longTTL, time.Time{})
		})
	}
	close(start)
	wg.Wait()
	holders := 0
	for i, g := range grants {
		if errs[i] != nil {
			t.Fatalf("Acquire %d: %v", i, errs[i])
		}
		switch {
		case g.Token != "":
			holders++
		case g.HeldFor <= 0 || g.HeldFor > longTTL:
			t.Errorf("Acquire %d = %+v, want a lease or HeldFor in (0, %v]", i, g, longTTL)
		}
	}
	if holders != 1 {
		t.Fatalf("%d concurrent Acquires took the lease, want exactly 1", holders)
	}
}

func testCorruptEnvelope(t *testing.T, s remote.Store, l remote.Lease) {
	k := key(t, "k")
	g := lease(t, l, k, longTTL)
	v := fresh("good")
	if !write(t, s, k, v, g.Fence, longTTL) {
		t.Fatal("Write under the acquired fence refused")
	}
	want := fenced(t, v, g.Fence)
	future := bytes.Clone(v)
	future[0]++ // a format version this build does not know
	now := time.Now().UnixMilli()
	for name, bad := range map[string][]byte{
		"nil":     nil,
		"garbage": []byte("not an envelope"),
		"short":   v[:len(v)-len("good")-1],
		"version": future,
		"fields":  envelope.Append(nil, &envelope.Envelope{Soft: now + 2000, Hard: now + 1000}),
	} {
		if ok, err := s.Write(t.Context(), k, bad, g.Fence, longTTL); err == nil {
			t.Errorf("Write(%s envelope) = %v, nil; want an error", name, ok)
		}
		if f, err := s.Set(t.Context(), k, bad, longTTL); err == nil {
			t.Errorf("Set(%s envelope) = %d, nil; want an error", name, f)
		}
	}
	wantLoad(t, s, k, want)
	// A refused Set did not advance the fence: the holder can still write.
	if !write(t, s, k, v, g.Fence, longTTL) {
		t.Fatal("a Set of a corrupt envelope advanced the fence")
	}
}

func testBadInput(t *testing.T, s remote.Store, l remote.Lease) {
	ctx := t.Context()
	k := key(t, "k")
	v := fresh("v")
	rejected := func(call string, err error) {
		t.Helper()
		if !errors.Is(err, remote.ErrRejected) {
			t.Errorf("%s = %v, want an error wrapping remote.ErrRejected", call, err)
		}
	}
	for _, ttl := range []time.Duration{0, -time.Second} {
		_, err := s.Write(ctx, k, v, 0, ttl)
		rejected(fmt.Sprintf("Write(ttl %v)", ttl), err)
		_, err = s.Set(ctx, k, v, ttl)
		rejected(fmt.Sprintf("Set(ttl %v)", ttl), err)
		_, err = l.Acquire(ctx, k, ttl, time.Time{})
		rejected(fmt.Sprintf("Acquire(ttl %v)", ttl), err)
	}
	wantLoad(t, s, k, nil)
	g := lease(t, l, k, longTTL)
	_, err := l.Extend(ctx, k, g.Token, 0)
	rejected("Extend(ttl 0)", err)
	_, err = s.Write(ctx, k, []byte("junk"), g.Fence, longTTL)
	rejected("Write(junk)", err)
	if !write(t, s, k, v, g.Fence, longTTL) {
		t.Fatal("a rejected call advanced the fence")
	}
}

// testEmptyKey checks that "" is a key like any other: it may be what
// herd.Key returns.
func testEmptyKey(t *testing.T, s remote.Store, l remote.Lease) {
	const k = ""
	invalidate(t, s, k) // another run may have left a value
	wantLoad(t, s, k, nil)
	g := lease(t, l, k, longTTL)
	v := fresh("empty")
	if !write(t, s, k, v, g.Fence, longTTL) {
		t.Fatal("Write(\"\") under its fence refused")
	}
	release(t, l, k, g.Token)
	wantLoad(t, s, k, fenced(t, v, g.Fence))
	if got := acquire(t, l, k, longTTL); !bytes.Equal(got.Value, fenced(t, v, g.Fence)) {
		t.Fatalf("Acquire(\"\") = %+v, want the fresh value", got)
	}
	f := set(t, s, k, fresh("set"), longTTL)
	if f <= g.Fence {
		t.Fatalf("Set(\"\") fence %d, want above %d", f, g.Fence)
	}
	invalidate(t, s, k)
	wantLoad(t, s, k, nil)
}

func testWriteRelease(t *testing.T, s remote.Store, l remote.Lease) {
	wr, ok := l.(remote.WriteReleaser)
	if !ok {
		t.Logf("%T does not implement remote.WriteReleaser: nothing to check", l)
		return
	}
	ctx := t.Context()
	k := key(t, "k")
	v := fresh("v")
	g := lease(t, l, k, longTTL)
	wctx, cancel := context.WithTimeout(ctx, deadline)
	defer cancel()
	woken := make(chan error, 1)
	go func() { woken <- l.Wait(wctx, k) }()
	// Wait may start listening after the call below: an announcement it
	// misses leaves it to time out, which fails the test only if none came.
	if wrote, err := wr.WriteRelease(ctx, k, v, g.Fence, longTTL, g.Token); err != nil || !wrote {
		t.Fatalf("WriteRelease under the held fence = %v, %v; want true", wrote, err)
	}
	wantLoad(t, s, k, fenced(t, v, g.Fence))
	// The lease is gone: past the value's soft expiry, the next Acquire
	// takes it rather than finding it held.
	if next := acquireAfter(t, l, k, longTTL, time.Now().Add(time.Hour)); next.Token == "" {
		t.Fatalf("Acquire after WriteRelease = %+v, want the lease: WriteRelease did not release", next)
	} else if wrote, err := wr.WriteRelease(ctx, k, fresh("late"), g.Fence, longTTL, g.Token); err != nil || wrote {
		t.Fatalf("WriteRelease under a stale fence = %v, %v; want false", wrote, err)
	} else {
		wantLoad(t, s, k, fenced(t, v, g.Fence))
		// A refused write still releases its own lease, and only its own.
		if held := acquireAfter(t, l, k, longTTL, time.Now().Add(time.Hour)); held.HeldFor == 0 {
			t.Fatalf("Acquire = %+v: a stale token's WriteRelease dropped another holder's lease", held)
		}
		release(t, l, k, next.Token)
	}
	for {
		select {
		case err := <-woken:
			if err != nil {
				t.Fatalf("Wait during WriteRelease: %v", err)
			}
			return
		case <-time.After(20 * time.Millisecond):
			release(t, l, k, "announce") // a missed announcement: announce again
		}
	}
}

func testNotifier(t *testing.T, s remote.Store, l remote.Lease) {
	n, ok := s.(remote.Notifier)
	if !ok {
		t.Logf("%T does not implement remote.Notifier: nothing to check", s)
		return
	}
	t.Logf("%T implements remote.Notifier", s)
	prefix := key(t, "")
	notices := make(chan remote.Notice, 1024)
	stop := n.Subscribe(func(n remote.Notice) {
		// Other subtests may share the remote: keep only this one's keys.
		if n.Fence == 0 || strings.HasPrefix(n.Key, prefix) {
			notices <- n
		}
	})
	defer stop()

	// A subscription may start listening a little after Subscribe returns:
	// touch a key until its notice arrives.
	first := key(t, "first")
	eventually(t, "first notice", func() bool {
		invalidate(t, s, first)
		for {
			select {
			case n := <-notices:
				if n.Key == first {
					return true
				}
			default:
				return false
			}
		}
	})
	// Drain the notices of the extra touches: they end with the marker.
	mark := key(t, "mark")
	invalidate(t, s, mark)
	expect(t, notices, mark, first)

	kSet, kWrite, kInv := key(t, "set"), key(t, "write"), key(t, "invalidate")
	fSet := set(t, s, kSet, fresh("v"), longTTL)
	g := lease(t, l, kWrite, longTTL)
	if !write(t, s, kWrite, fresh("v"), g.Fence, longTTL) {
		t.Fatal("Write under the acquired fence refused")
	}
	if write(t, s, kWrite, fresh("v"), g.Fence-1, longTTL) {
		t.Fatal("Write under a stale fence accepted")
	}
	fBefore := set(t, s, kInv, fresh("v"), longTTL)
	invalidate(t, s, kInv)
	invalidate(t, s, mark)

	// Notices of keys that live on different servers (a Cluster's masters)
	// may arrive in any order; each key's arrive in order.
	got := collect(t, notices, map[string]int{kSet: 1, kWrite: 1, kInv: 2, mark: 1})
	if n := got[kSet][0]; n.Fence != fSet || n.Dropped {
		t.Errorf("notice of Set: %+v, want the fence %d Set returned, not Dropped", n, fSet)
	}
	if ns := got[kWrite]; len(ns) != 1 {
		t.Errorf("notices of Write: %+v, want one: a refused write announces nothing", ns)
	} else if n := ns[0]; n.Fence != g.Fence || n.Dropped {
		t.Errorf("notice of Write: %+v, want the fence %d it was written under, not Dropped", n, g.Fence)
	}
	if n := got[kInv][0]; n.Fence != fBefore || n.Dropped {
		t.Errorf("notice of Set: %+v, want the fence %d Set returned, not Dropped", n, fBefore)
	}
	inv := got[kInv][1]
	if after := lease(t, l, kInv, longTTL); inv.Fence <= fBefore || inv.Fence >= after.Fence {
		t.Errorf("fences: Set %d, Invalidate notice %d, Acquire %d; want them increasing", fBefore, inv.Fence, after.Fence)
	}
	if !inv.Dropped {
		t.Errorf("notice of Invalidate: %+v, want Dropped", inv)
	}
	checkCarried(t, "Set", got[kSet][0], load(t, s, kSet))
	checkCarried(t, "Write", got[kWrite][0], load(t, s, kWrite))
	checkCarried(t, "Set before Invalidate", got[kInv][0], nil)
	if inv.Value != "" {
		t.Errorf("notice of Invalidate carries %q, want no value", inv.Value)
	}

	stop()
	stop() // stop is idempotent
}

// checkCarried checks the value that n, the notice of a change that
// stored a value, carries, if any: an envelope that decodes, under n's
// fence, the one the Store holds (stored) when the test knows it.
func checkCarried(t *testing.T, what string, n remote.Notice, stored []byte) {
	t.Helper()
	if n.Value == "" {
		return // a Store need not carry values
	}
	ev, err := envelope.Decode([]byte(n.Value))
	switch {
	case err != nil:
		t.Errorf("notice of %s carries %s, which does not decode: %v", what, show([]byte(n.Value)), err)
	case ev.Fence != n.Fence:
		t.Errorf("notice of %s under fence %d carries an envelope of fence %d", what, n.Fence, ev.Fence)
	case stored != nil && n.Value != string(stored):
		t.Errorf("notice of %s carries %s, want the stored envelope %s", what, show([]byte(n.Value)), show(stored))
	}
}

// collect reads notices until it holds want[k] of them for each key k,
// and returns them by key, in the order each key's came; it also keeps
// those that come for a key in want meanwhile beyond its count, and
// ignores the others.
func collect(t *testing.T, notices <-chan remote.Notice, want map[string]int) map[string][]remote.Notice {
	t.Helper()
	got := make(map[string][]remote.Notice)
	done := func() bool {
		for k, n := range want {
			if len(got[k]) < n {
				return false
			}
		}
		return true
	}
	timeout := time.After(deadline)
	for !done() {
		select {
		case n := <-notices:
			if _, ok := want[n.Key]; ok && n.Fence != 0 {
				got[n.Key] = append(got[n.Key], n)
			}
		case <-timeout:
			t.Fatalf("notices by key after %v: %v, want %v of each", deadline, got, want)
		}
	}
	// What is queued already for these keys, a refused write's notice
	// among it, is kept too.
	for {
		select {
		case n := <-notices:
			if _, ok := want[n.Key]; ok && n.Fence != 0 {
				got[n.Key] = append(got[n.Key], n)
			}
		default:
			return got
		}
	}
}

// expect reads notices until one for want and returns it. It fails on a
// notice for any other key except the zero Notice (it may stand for missed
// ones) and those in skip.
func expect(t *testing.T, notices <-chan remote.Notice, want string, skip ...string) remote.Notice {
	t.Helper()
	timeout := time.After(deadline)
	for {
		select {
		case n := <-notices:
			switch {
			case n.Fence != 0 && n.Key == want:
				return n
			case n.Fence == 0 || slices.Contains(skip, n.Key):
			default:
				t.Fatalf("notice %q, want %q (a refused write notified, or notices out of order)", n.Key, want)
			}
		case <-timeout:
			t.Fatalf("no notice for %q within %v", want, deadline)
		}
	}
}

func testHotSet(t *testing.T, s remote.Store, _ remote.Lease) {
	h, ok := s.(remote.HotSet)
	if !ok {
		t.Logf("%T does not implement remote.HotSet: nothing to check", s)
		return
	}
	t.Logf("%T implements remote.HotSet", s)
	ctx := context.Background()
	hot := func(n int, period time.Duration) []string {
		t.Helper()
		keys, err := h.Hot(ctx, n, period)
		if err != nil {
			t.Fatalf("Hot(%d, %v): %v", n, period, err)
		}
		return keys
	}
	add := func(reads map[string]uint64, limit int, period time.Duration) {
		t.Helper()
		if err := h.AddHot(ctx, reads, limit, period); err != nil {
			t.Fatalf("AddHot(%v, %d, %v): %v", reads, limit, period, err)
		}
	}
	// samePeriods runs fn until it ran within one period boundary (so that
	// every count it added is in the current or the last period).
	samePeriods := func(period time.Duration, fn func(period time.Duration)) {
		t.Helper()
		for range 10 {
			start := time.Now().UnixNano() / int64(period)
			fn(period)
			if time.Now().UnixNano()/int64(period)-start <= 1 {
				return
			}
			period += time.Millisecond // counts of its own
		}
		t.Fatalf("ten tries each spanned more than one period of about %v", period)
	}
	// Every case has a period of its own, so its counts are its own.
	t.Run("SumsReplicas", func(t *testing.T) {
		samePeriods(2*time.Second+time.Millisecond, func(p time.Duration) {
			add(map[string]uint64{"a": 5, "b": 3, "c": 1}, 10, p)
			add(map[string]uint64{"b": 4, "d": 2}, 10, p)
			if got, want := hot(10, p), []string{"b", "a", "d", "c"}; !slices.Equal(got, want) {
				t.Errorf("Hot(10) = %q, want %q", got, want)
			}
			if got, want := hot(2, p), []string{"b", "a"}; !slices.Equal(got, want) {
				t.Errorf("Hot(2) = %q, want %q", got, want)
			}
		})
	})
	t.Run("KeepsLimit", func(t *testing.T) {
		samePeriods(2*time.Second+20*time.Millisecond, func(p time.Duration) {
			add(map[string]uint64{"x1": 1, "x2": 2, "x3": 3, "x4": 4, "x5": 5}, 3, p)
			if got, want := hot(10, p), []string{"x5", "x4", "x3"}; !slices.Equal(got, want) {
				t.Errorf("Hot(10) after a limit of 3 = %q, want %q", got, want)
			}
		})
	})
	t.Run("Expires", func(t *testing.T) {
		const p = shortTTL
		for len(hot(1, p)) == 0 {
			add(map[string]uint64{"old": 1}, 1, p)
		}
		// Two periods on, the period it was added in is no longer read.
		eventually(t, "hot key forgotten", func() bool { return len(hot(1, p)) == 0 })
	})
	t.Run("BadInput", func(t *testing.T) {
		for _, err := range []error{
			h.AddHot(ctx, map[string]uint64{"k": 1}, 0, time.Second),
			h.AddHot(ctx, map[string]uint64{"k": 1}, 1, 0),
			func() error { _, err := h.Hot(ctx, 0, time.Second); return err }(),
			func() error { _, err := h.Hot(ctx, 1, -time.Second); return err }(),
		} {
			if !errors.Is(err, remote.ErrRejected) {
				t.Errorf("bad argument: %v, want an error wrapping remote.ErrRejected", err)
			}
		}
	})
}

func testMarkStale(t *testing.T, s remote.Store, l remote.Lease) {
	st, ok := s.(remote.Staler)
	if !ok {
		t.Logf("%T does not implement remote.Staler: nothing to check", s)
		return
	}
	t.Logf("%T implements remote.Staler", s)
	markStale := func(k string) uint64 {
		t.Helper()
		fence, err := st.MarkStale(t.Context(), k)
		if err != nil {
			t.Fatalf("MarkStale(%q): %v", k, err)
		}
		return fence
	}
	t.Run("Fresh", func(t *testing.T) {
		k := key(t, "k")
		b := fresh("v")
		f1 := set(t, s, k, b, longTTL)
		before := time.Now().UnixMilli()
		f2 := markStale(k)
		after := time.Now().UnixMilli()
		if f2 <= f1 {
			t.Fatalf("MarkStale returned fence %d after Set's %d, want a larger one", f2, f1)
		}
		got := decode(t, load(t, s, k))
		want := decode(t, b)
		if string(got.Value) != "v" || got.Hard != want.Hard || got.Fence != f2 {
			t.Errorf("after MarkStale Load = %s, want the value, its hard expiry %d and fence %d", show(load(t, s, k)), want.Hard, f2)
		}
		// The tier's clock may run a little off the test's: allow a second.
		if got.Soft > after+1000 || got.Soft < before-1000 {
			t.Errorf("after MarkStale the soft expiry is %d, want about now (%d to %d)", got.Soft, before, after)
		}
		if g := acquire(t, l, k, longTTL); g.Token == "" {
			t.Errorf("Acquire after MarkStale = %+v, want the lease: the value is no longer fresh", g)
		}
		if write(t, s, k, fresh("old"), f1, longTTL) {
			t.Error("a Write under the fence before MarkStale stored")
		}
	})
	t.Run("AlreadyStale", func(t *testing.T) {
		k := key(t, "k")
		b := env("v", -time.Hour, longTTL)
		set(t, s, k, b, longTTL)
		markStale(k)
		if got, want := decode(t, load(t, s, k)).Soft, decode(t, b).Soft; got != want {
			t.Errorf("MarkStale moved an older soft expiry from %d to %d", want, got)
		}
	})
	t.Run("Missing", func(t *testing.T) {
		k := key(t, "k")
		f1 := markStale(k)
		if b := load(t, s, k); b != nil {
			t.Errorf("MarkStale of a missing key stored %s", show(b))
		}
		if f2 := markStale(k); f2 <= f1 {
			t.Errorf("a second MarkStale returned fence %d after %d, want a larger one", f2, f1)
		}
	})
}
