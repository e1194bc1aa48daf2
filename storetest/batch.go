package storetest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/herdcache/herd/remote"
	"github.com/herdcache/herd/remote/envelope"
)

// subtest is one check of Run, given the Store and Lease of a new fleet.
type subtest struct {
	name string
	fn   func(*testing.T, remote.Store, remote.Lease)
}

// batchTests returns the subtests of the batch contracts that s and l
// implement, and none for those they do not.
func batchTests(s remote.Store, l remote.Lease) []subtest {
	var tests []subtest
	if _, ok := s.(remote.BatchStore); ok {
		tests = append(tests, subtest{"LoadMany", testLoadMany})
	}
	if _, ok := l.(remote.BatchLease); !ok {
		return tests
	}
	tests = append(tests,
		subtest{"AcquireMany", testAcquireMany},
		subtest{"AcquireManyBadTTL", testAcquireManyBadTTL},
		subtest{"ExtendMany", testExtendMany},
		subtest{"WriteReleaseMany", testWriteReleaseMany},
		subtest{"WriteReleaseManyEntryErrors", testWriteReleaseManyEntryErrors},
		subtest{"WriteReleaseManyWakes", testWriteReleaseManyWakes},
		subtest{"Batch100", testBatch100},
	)
	if _, ok := s.(remote.Notifier); ok {
		tests = append(tests, subtest{"WriteReleaseManyNotifies", testWriteReleaseManyNotifies})
	}
	return tests
}

func loadMany(t *testing.T, s remote.Store, keys ...string) []remote.Loaded {
	t.Helper()
	got := s.(remote.BatchStore).LoadMany(t.Context(), keys)
	if len(got) != len(keys) {
		t.Fatalf("LoadMany of %d keys returned %d entries", len(keys), len(got))
	}
	return got
}

// acquireMany calls AcquireMany and checks the shape of each entry without
// an error, as acquireAfter does for Acquire, and that Stale is nil when
// Value is set.
func acquireMany(t *testing.T, l remote.Lease, ttl time.Duration, reqs ...remote.LeaseRequest) []remote.Acquired {
	t.Helper()
	got := l.(remote.BatchLease).AcquireMany(t.Context(), reqs, ttl)
	if len(got) != len(reqs) {
		t.Fatalf("AcquireMany of %d requests returned %d entries", len(reqs), len(got))
	}
	for i, a := range got {
		if a.Err != nil {
			continue
		}
		g, n := a.Grant, 0
		for _, set := range []bool{g.Value != nil, g.Token != "", g.HeldFor != 0} {
			if set {
				n++
			}
		}
		if n != 1 || (g.Token == "") != (g.Fence == 0) || g.Fence > envelope.MaxFence {
			t.Fatalf("AcquireMany entry %d (%q) = %+v: want exactly one of Value, Token (with Fence) or HeldFor", i, reqs[i].Key, g)
		}
		if g.Value != nil && a.Stale != nil {
			t.Fatalf("AcquireMany entry %d (%q) has both Value and Stale", i, reqs[i].Key)
		}
	}
	return got
}

func extendMany(t *testing.T, l remote.Lease, ttl time.Duration, leases ...remote.HeldKey) []remote.Outcome {
	t.Helper()
	got := l.(remote.BatchLease).ExtendMany(t.Context(), leases, ttl)
	if len(got) != len(leases) {
		t.Fatalf("ExtendMany of %d leases returned %d entries", len(leases), len(got))
	}
	return got
}

func writeReleaseMany(t *testing.T, l remote.Lease, writes ...remote.HeldWrite) []remote.Outcome {
	t.Helper()
	got := l.(remote.BatchLease).WriteReleaseMany(t.Context(), writes)
	if len(got) != len(writes) {
		t.Fatalf("WriteReleaseMany of %d writes returned %d entries", len(writes), len(got))
	}
	return got
}

// wantOutcomes checks a batch's outcomes: none is an error, and OK as want.
func wantOutcomes(t *testing.T, call string, got []remote.Outcome, want ...bool) {
	t.Helper()
	for i, o := range got {
		if o.Err != nil || o.OK != want[i] {
			t.Errorf("%s entry %d = %v, %v; want %v, nil", call, i, o.OK, o.Err, want[i])
		}
	}
}

// heldWrite is the write of env under g's lease and fence, for longTTL.
func heldWrite(k string, g remote.Grant, env []byte) remote.HeldWrite {
	return remote.HeldWrite{HeldKey: remote.HeldKey{Key: k, Token: g.Token}, Env: env, Fence: g.Fence, TTL: longTTL}
}

// wantReleased checks that k's lease is free: an Acquire that asks for a
// value newer than any stored takes it.
func wantReleased(t *testing.T, l remote.Lease, k string) {
	t.Helper()
	if g := acquireAfter(t, l, k, longTTL, time.Now().Add(time.Hour)); g.Token == "" {
		t.Errorf("Acquire(%q) after WriteReleaseMany = %+v, want the lease: it was not released", k, g)
	}
}

func testLoadMany(t *testing.T, s remote.Store, _ remote.Lease) {
	present, missing := key(t, "present"), key(t, "missing")
	set(t, s, present, fresh("v"), longTTL)
	keys := []string{present, missing, "", missing, present}
	got := loadMany(t, s, keys...)
	for i, k := range keys {
		switch {
		case got[i].Err != nil:
			t.Errorf("LoadMany entry %d (%q): %v", i, k, got[i].Err)
		case k == "":
			// Other subtests may be changing the empty key: it only has
			// to be a key, holding nothing or an envelope.
			if got[i].Value != nil {
				decode(t, got[i].Value)
			}
		case !bytes.Equal(got[i].Value, load(t, s, k)):
			t.Errorf("LoadMany entry %d (%q) = %s, want what Load returns: %s", i, k, show(got[i].Value), show(load(t, s, k)))
		}
	}
	if got[0].Value == nil || got[1].Value != nil {
		t.Errorf("LoadMany(present, missing) = %s, %s; want a value, then nil", show(got[0].Value), show(got[1].Value))
	}
	if n := len(loadMany(t, s)); n != 0 {
		t.Errorf("LoadMany of no keys returned %d entries", n)
	}

	// Many keys, each with a value of its own, come back in order.
	keys = make([]string, 100)
	for i := range keys {
		keys[i] = key(t, fmt.Sprint("many", i))
		set(t, s, keys[i], fresh(fmt.Sprint("v", i)), longTTL)
	}
	for i, got := range loadMany(t, s, keys...) {
		if got.Err != nil || got.Value == nil || string(decode(t, got.Value).Value) != fmt.Sprint("v", i) {
			t.Fatalf("LoadMany of 100 keys: entry %d = %s, %v; want value v%d", i, show(got.Value), got.Err, i)
		}
	}
}

func testAcquireMany(t *testing.T, s remote.Store, l remote.Lease) {
	kFresh, kMissing, kStale := key(t, "fresh"), key(t, "missing"), key(t, "stale")
	kAfter, kHeld, kHeldStale := key(t, "after"), key(t, "held"), key(t, "held-stale")
	set(t, s, kFresh, fresh("fresh"), longTTL)
	fStale := set(t, s, kStale, env("stale", -time.Second, longTTL), longTTL)
	set(t, s, kAfter, fresh("after"), longTTL)
	set(t, s, kHeldStale, env("held-stale", -time.Second, longTTL), longTTL)
	lease(t, l, kHeld, longTTL)
	lease(t, l, kHeldStale, longTTL)

	now := time.Now()
	got := acquireMany(t, l, longTTL,
		remote.LeaseRequest{Key: kFresh, After: now}, // after before the soft expiry
		remote.LeaseRequest{Key: kMissing},
		remote.LeaseRequest{Key: kStale},
		remote.LeaseRequest{Key: kAfter, After: now.Add(2 * longTTL)}, // after past it
		remote.LeaseRequest{Key: kHeld},
		remote.LeaseRequest{Key: kHeldStale},
	)
	for i, a := range got {
		if a.Err != nil {
			t.Fatalf("AcquireMany entry %d: %v", i, a.Err)
		}
	}
	if a := got[0]; !bytes.Equal(a.Value, load(t, s, kFresh)) {
		t.Errorf("AcquireMany(fresh) = %+v, want the stored value", a)
	}
	if a := got[1]; a.Token == "" || a.Stale != nil {
		t.Errorf("AcquireMany(missing) = %+v, want a lease and no Stale", a)
	}
	if a := got[2]; a.Token == "" || a.Fence <= fStale || !bytes.Equal(a.Stale, load(t, s, kStale)) {
		t.Errorf("AcquireMany(soft-expired, fence %d) = %+v, want a lease with a fence above it and Stale the stored value", fStale, a)
	}
	if a := got[3]; a.Token == "" || !bytes.Equal(a.Stale, load(t, s, kAfter)) {
		t.Errorf("AcquireMany(fresh, after its soft expiry) = %+v, want a lease and Stale the stored value", a)
	}
	if a := got[4]; a.HeldFor <= 0 || a.HeldFor > longTTL || a.Stale != nil {
		t.Errorf("AcquireMany(held, nothing stored) = %+v, want HeldFor in (0, %v] and no Stale", a, longTTL)
	}
	if a := got[5]; a.HeldFor <= 0 || a.HeldFor > longTTL || !bytes.Equal(a.Stale, load(t, s, kHeldStale)) {
		t.Errorf("AcquireMany(held, soft-expired) = %+v, want HeldFor and Stale the stored value", a)
	}
	// The leases were taken, and a later acquisition advances the fence.
	for _, k := range []string{kMissing, kStale, kAfter} {
		if g := acquireAfter(t, l, k, longTTL, now.Add(time.Hour)); g.HeldFor == 0 {
			t.Errorf("Acquire(%q) after AcquireMany took its lease = %+v, want it held", k, g)
		}
	}
	release(t, l, kMissing, got[1].Token)
	if again := acquireMany(t, l, longTTL, remote.LeaseRequest{Key: kMissing})[0]; again.Err != nil || again.Fence <= got[1].Fence {
		t.Errorf("AcquireMany after Release = %+v, want a lease with a fence above %d", again, got[1].Fence)
	}
}

func testAcquireManyBadTTL(t *testing.T, s remote.Store, l remote.Lease) {
	k1, k2 := key(t, "k1"), key(t, "k2")
	set(t, s, k2, env("stale", -time.Second, longTTL), longTTL)
	stored := load(t, s, k2)
	for _, ttl := range []time.Duration{0, -time.Second} {
		for i, a := range acquireMany(t, l, ttl, remote.LeaseRequest{Key: k1}, remote.LeaseRequest{Key: k2}) {
			if !errors.Is(a.Err, remote.ErrRejected) || a.Value != nil || a.Token != "" || a.HeldFor != 0 || a.Stale != nil {
				t.Errorf("AcquireMany(ttl %v) entry %d = %+v, want only an error wrapping remote.ErrRejected", ttl, i, a)
			}
		}
	}
	// Nothing changed: no lease was taken and no fence advanced.
	if !write(t, s, k1, fresh("v"), 0, longTTL) {
		t.Error("a rejected AcquireMany advanced the fence of a key never fenced")
	}
	wantLoad(t, s, k2, stored)
	lease(t, l, k2, longTTL)
}

func testExtendMany(t *testing.T, _ remote.Store, l remote.Lease) {
	kOK, kWrong, kMissing := key(t, "ok"), key(t, "wrong"), key(t, "missing")
	g := lease(t, l, kOK, longTTL)
	lease(t, l, kWrong, longTTL)
	got := extendMany(t, l, 10*longTTL,
		remote.HeldKey{Key: kOK, Token: g.Token},
		remote.HeldKey{Key: kWrong, Token: "wrong"},
		remote.HeldKey{Key: kMissing, Token: "none"},
	)
	wantOutcomes(t, "ExtendMany", got, true, false, false)
	if h := acquire(t, l, kOK, longTTL); h.HeldFor <= longTTL {
		t.Errorf("Acquire after ExtendMany by its token = %+v, want HeldFor above %v", h, longTTL)
	}
	if h := acquire(t, l, kWrong, longTTL); h.HeldFor == 0 || h.HeldFor > longTTL {
		t.Errorf("Acquire after ExtendMany by a wrong token = %+v, want HeldFor in (0, %v]", h, longTTL)
	}
	lease(t, l, kMissing, longTTL) // ExtendMany took no lease
	for _, ttl := range []time.Duration{0, -time.Second} {
		if o := extendMany(t, l, ttl, remote.HeldKey{Key: kOK, Token: g.Token})[0]; !errors.Is(o.Err, remote.ErrRejected) {
			t.Errorf("ExtendMany(ttl %v) = %+v, want an error wrapping remote.ErrRejected", ttl, o)
		}
	}
}

func testWriteReleaseMany(t *testing.T, s remote.Store, l remote.Lease) {
	kWrite, kStale, kRelease := key(t, "write"), key(t, "stale"), key(t, "release")
	gW, gS, gR := lease(t, l, kWrite, longTTL), lease(t, l, kStale, longTTL), lease(t, l, kRelease, longTTL)
	set(t, s, kStale, fresh("set"), longTTL) // gS's fence is stale now
	setValue := load(t, s, kStale)
	v := fresh("v")
	got := writeReleaseMany(t, l,
		heldWrite(kWrite, gW, v),
		heldWrite(kStale, gS, fresh("late")),
		remote.HeldWrite{HeldKey: remote.HeldKey{Key: kRelease, Token: gR.Token}}, // release only
	)
	wantOutcomes(t, "WriteReleaseMany(current fence, stale fence, nil Env)", got, true, false, false)
	wantLoad(t, s, kWrite, fenced(t, v, gW.Fence))
	wantLoad(t, s, kStale, setValue)
	wantLoad(t, s, kRelease, nil)
	for _, k := range []string{kWrite, kStale, kRelease} {
		wantReleased(t, l, k)
	}
}

func testWriteReleaseManyEntryErrors(t *testing.T, s remote.Store, l remote.Lease) {
	k1, kTTL, kJunk, k2 := key(t, "k1"), key(t, "ttl"), key(t, "junk"), key(t, "k2")
	g1, gT, gJ, g2 := lease(t, l, k1, longTTL), lease(t, l, kTTL, longTTL), lease(t, l, kJunk, longTTL), lease(t, l, k2, longTTL)
	v1, v2 := fresh("v1"), fresh("v2")
	badTTL := heldWrite(kTTL, gT, fresh("ttl"))
	badTTL.TTL = 0
	got := writeReleaseMany(t, l,
		heldWrite(k1, g1, v1),
		badTTL,
		heldWrite(kJunk, gJ, []byte("junk")),
		heldWrite(k2, g2, v2),
	)
	for i, o := range got {
		rejected := i == 1 || i == 2
		if errors.Is(o.Err, remote.ErrRejected) != rejected || o.OK == rejected || (!rejected && o.Err != nil) {
			t.Errorf("WriteReleaseMany entry %d = %+v; want an error wrapping remote.ErrRejected: %v", i, o, rejected)
		}
	}
	wantLoad(t, s, k1, fenced(t, v1, g1.Fence))
	wantLoad(t, s, kTTL, nil)
	wantLoad(t, s, kJunk, nil)
	wantLoad(t, s, k2, fenced(t, v2, g2.Fence))
	wantReleased(t, l, k1)
	wantReleased(t, l, k2)
}

func testWriteReleaseManyWakes(t *testing.T, _ remote.Store, l remote.Lease) {
	kWrite, kRelease := key(t, "write"), key(t, "release")
	gW, gR := lease(t, l, kWrite, longTTL), lease(t, l, kRelease, longTTL)
	writes := []remote.HeldWrite{
		heldWrite(kWrite, gW, fresh("v")),
		{HeldKey: remote.HeldKey{Key: kRelease, Token: gR.Token}},
	}
	ctx, cancel := context.WithTimeout(t.Context(), deadline)
	defer cancel()
	woken := make(chan error, 2)
	for _, k := range []string{kWrite, kRelease} {
		go func() { woken <- l.Wait(ctx, k) }()
	}
	wantOutcomes(t, "WriteReleaseMany", writeReleaseMany(t, l, writes...), true, false)
	// A Wait may start listening after the call: repeat it until both
	// woke. A repeat writes the same value under the same fence and
	// releases by tokens that no longer hold a lease, which still announces.
	for n := 0; n < 2; {
		select {
		case err := <-woken:
			if err != nil {
				t.Fatalf("Wait during WriteReleaseMany: %v", err)
			}
			n++
		case <-time.After(20 * time.Millisecond):
			for i, o := range writeReleaseMany(t, l, writes...) {
				if o.Err != nil {
					t.Fatalf("repeated WriteReleaseMany entry %d: %v", i, o.Err)
				}
			}
		}
	}
}

func testBatch100(t *testing.T, s remote.Store, l remote.Lease) {
	reqs := make([]remote.LeaseRequest, 100)
	for i := range reqs {
		reqs[i].Key = key(t, fmt.Sprint("k", i))
	}
	grants := acquireMany(t, l, longTTL, reqs...)
	leases := make([]remote.HeldKey, len(reqs))
	writes := make([]remote.HeldWrite, len(reqs))
	for i, a := range grants {
		if a.Err != nil || a.Token == "" {
			t.Fatalf("AcquireMany of 100 new keys: entry %d = %+v, want a lease", i, a)
		}
		leases[i] = remote.HeldKey{Key: reqs[i].Key, Token: a.Token}
		writes[i] = heldWrite(reqs[i].Key, a.Grant, fresh(fmt.Sprint("v", i)))
	}
	for i, o := range extendMany(t, l, longTTL, leases...) {
		if o.Err != nil || !o.OK {
			t.Fatalf("ExtendMany of 100 leases: entry %d = %+v, want OK", i, o)
		}
	}
	for i, o := range writeReleaseMany(t, l, writes...) {
		if o.Err != nil || !o.OK {
			t.Fatalf("WriteReleaseMany of 100 keys: entry %d = %+v, want OK", i, o)
		}
	}
	for i, a := range acquireMany(t, l, longTTL, reqs...) {
		want := fenced(t, writes[i].Env, writes[i].Fence)
		if a.Err != nil || !bytes.Equal(a.Value, want) {
			t.Fatalf("AcquireMany of 100 written keys: entry %d = %+v, want value %s", i, a, show(want))
		}
		wantLoad(t, s, reqs[i].Key, want)
	}
}

func testWriteReleaseManyNotifies(t *testing.T, s remote.Store, l remote.Lease) {
	prefix := key(t, "")
	notices, stop := listen(t, s, s.(remote.Notifier), func(n remote.Notice) bool {
		return n.Fence == 0 || strings.HasPrefix(n.Key, prefix)
	})
	defer stop()
	mark := key(t, "mark")

	k1, k2, kStale, kRelease := key(t, "k1"), key(t, "k2"), key(t, "stale"), key(t, "release")
	g1, g2, gR := lease(t, l, k1, longTTL), lease(t, l, k2, longTTL), lease(t, l, kRelease, longTTL)
	gS := lease(t, l, kStale, longTTL)
	release(t, l, kStale, gS.Token)
	lease(t, l, kStale, longTTL) // gS's fence is stale now, and no notice told it
	got := writeReleaseMany(t, l,
		heldWrite(k1, g1, fresh("v1")),
		heldWrite(kStale, gS, fresh("late")),
		remote.HeldWrite{HeldKey: remote.HeldKey{Key: kRelease, Token: gR.Token}},
		heldWrite(k2, g2, fresh("v2")),
	)
	wantOutcomes(t, "WriteReleaseMany", got, true, false, false, true)

	// The notices of one call may come in any order.
	want := map[string]uint64{k1: g1.Fence, k2: g2.Fence}
	timeout := time.After(deadline)
	for len(want) > 0 {
		select {
		case n := <-notices:
			switch f, ok := want[n.Key]; {
			case n.Fence == 0:
			case !ok:
				t.Fatalf("notice %+v: only the written keys %q and %q notify", n, k1, k2)
			case n.Fence != f || n.Dropped:
				t.Fatalf("notice %+v, want fence %d, the one written under, not Dropped", n, f)
			default:
				delete(want, n.Key)
			}
		case <-timeout:
			t.Fatalf("no notice for %v within %v", want, deadline)
		}
	}
	invalidate(t, s, mark)
	expect(t, notices, mark) // and none for the refused write or the release
}
