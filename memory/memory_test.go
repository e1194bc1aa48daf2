package memory

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/herdcache/herd/remote"
	"github.com/herdcache/herd/remote/envelope"
	"github.com/herdcache/herd/storetest"
)

func TestConformance(t *testing.T) {
	storetest.Run(t, func(t *testing.T) (remote.Store, remote.Lease) {
		r := New()
		return r, r
	})
}

// TestConformanceNoticeValues runs the suite over a Remote whose notices
// carry the envelopes they store.
func TestConformanceNoticeValues(t *testing.T) {
	storetest.Run(t, func(t *testing.T) (remote.Store, remote.Lease) {
		r := New()
		r.SetNoticeValues(1 << 20)
		return r, r
	})
}

// envAt encodes value with soft and hard expiries soft and hard from now.
func envAt(value string, soft, hard time.Duration) []byte {
	now := time.Now()
	return envelope.Append(nil, &envelope.Envelope{
		Soft:  now.Add(soft).UnixMilli(),
		Hard:  now.Add(hard).UnixMilli(),
		Value: []byte(value),
	})
}

func mustLease(t *testing.T, r *Remote, key string, ttl time.Duration) remote.Grant {
	t.Helper()
	g, err := r.Acquire(t.Context(), key, ttl, time.Time{})
	if err != nil || g.Token == "" {
		t.Fatalf("Acquire(%q) = %+v, %v; want a lease", key, g, err)
	}
	return g
}

func mustWrite(t *testing.T, r *Remote, key string, env []byte, fence uint64, ttl time.Duration) {
	t.Helper()
	if ok, err := r.Write(t.Context(), key, env, fence, ttl); !ok || err != nil {
		t.Fatalf("Write(%q, fence %d) = %v, %v; want true, nil", key, fence, ok, err)
	}
}

func loadValue(t *testing.T, r *Remote, key string) string {
	t.Helper()
	b, err := r.Load(t.Context(), key)
	if err != nil {
		t.Fatalf("Load(%q): %v", key, err)
	}
	if b == nil {
		return "<nil>"
	}
	e, err := envelope.Decode(b)
	if err != nil {
		t.Fatalf("Load(%q): %v", key, err)
	}
	return string(e.Value)
}

func TestSetDown(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ctx := t.Context()
		r := New()
		g := mustLease(t, r, "k", time.Minute)
		mustWrite(t, r, "k", envAt("v", time.Minute, time.Hour), g.Fence, time.Hour)

		waited := make(chan error, 1)
		go func() { waited <- r.Wait(ctx, "k") }()
		synctest.Wait()

		boom := errors.New("node killed")
		r.SetDown(boom)
		synctest.Wait()
		select {
		case err := <-waited:
			if !errors.Is(err, boom) {
				t.Fatalf("blocked Wait after SetDown = %v, want %v", err, boom)
			}
		default:
			t.Fatal("SetDown did not wake a blocked Wait")
		}

		env := envAt("w", time.Minute, time.Hour)
		calls := map[string]func() error{
			"Load":       func() error { _, err := r.Load(ctx, "k"); return err },
			"Write":      func() error { _, err := r.Write(ctx, "k", env, g.Fence, time.Hour); return err },
			"Set":        func() error { _, err := r.Set(ctx, "k", env, time.Hour); return err },
			"Invalidate": func() error { return r.Invalidate(ctx, "k") },
			"Acquire":    func() error { _, err := r.Acquire(ctx, "other", time.Minute, time.Time{}); return err },
			"Extend":     func() error { _, err := r.Extend(ctx, "k", g.Token, time.Minute); return err },
			"Release":    func() error { return r.Release(ctx, "k", g.Token) },
			"Wait":       func() error { return r.Wait(ctx, "k") },
		}
		for name, call := range calls {
			if err := call(); !errors.Is(err, boom) {
				t.Errorf("%s while down = %v, want an error wrapping %v", name, err, boom)
			}
		}
		if got := r.Stats().Failures; got != uint64(len(calls))+1 {
			t.Errorf("Failures = %d, want %d", got, len(calls)+1)
		}

		r.SetDown(nil)
		if got := loadValue(t, r, "k"); got != "v" {
			t.Fatalf("after recovery Load = %q, want the value kept", got)
		}
		if h, err := r.Acquire(ctx, "k2", time.Minute, time.Time{}); err != nil || h.Token == "" {
			t.Fatalf("after recovery Acquire = %+v, %v", h, err)
		}
		if ok, err := r.Extend(ctx, "k", g.Token, time.Minute); !ok || err != nil {
			t.Fatalf("after recovery Extend = %v, %v; want the lease kept", ok, err)
		}
		mustWrite(t, r, "k", env, g.Fence, time.Hour)
	})
}

func TestFlush(t *testing.T) {
	r := New()
	g := mustLease(t, r, "k", time.Minute)
	mustWrite(t, r, "k", envAt("v", time.Minute, time.Hour), g.Fence, time.Hour)
	inFlight := mustLease(t, r, "held", time.Minute)

	r.Flush()
	if got := loadValue(t, r, "k"); got != "<nil>" {
		t.Fatalf("Load after Flush = %q, want nil", got)
	}
	g2 := mustLease(t, r, "held", time.Minute) // the lease was dropped
	if g2.Fence <= inFlight.Fence {
		t.Fatalf("fence after Flush %d, not above %d: fences were dropped", g2.Fence, inFlight.Fence)
	}
	env := envAt("old", time.Minute, time.Hour)
	if ok, err := r.Write(t.Context(), "held", env, inFlight.Fence, time.Hour); ok || err != nil {
		t.Fatalf("Write under the pre-flush fence = %v, %v; want refused", ok, err)
	}
	if ok, err := r.Write(t.Context(), "k", env, 0, time.Hour); ok || err != nil {
		t.Fatalf("Write under fence 0 after Flush = %v, %v; want refused", ok, err)
	}
}

func TestStats(t *testing.T) {
	ctx := t.Context()
	r := New()
	env := envAt("v", time.Minute, time.Hour)

	g := mustLease(t, r, "k", time.Minute)                       // AcquireLease
	_, _ = r.Acquire(ctx, "k", time.Minute, time.Time{})         // AcquireHeld
	_, _ = r.Extend(ctx, "k", g.Token, time.Minute)              // Extends
	_, _ = r.Extend(ctx, "k", "wrong", time.Minute)              // nothing
	mustWrite(t, r, "k", env, g.Fence, time.Hour)                // Writes
	_, _ = r.Write(ctx, "k", env, g.Fence-1, time.Hour)          // RefusedWrites
	_, _ = r.Write(ctx, "k", []byte("junk"), g.Fence, time.Hour) // Failures
	_, _ = r.Acquire(ctx, "k", time.Minute, time.Time{})         // AcquireValue
	_ = r.Release(ctx, "k", g.Token)                             // Releases, Announces
	_ = r.Release(ctx, "k", g.Token)                             // Announces
	_, _ = r.Load(ctx, "k")                                      // Loads
	_, _ = r.Set(ctx, "k", env, time.Hour)                       // Sets
	_ = r.Invalidate(ctx, "k")                                   // Invalidates
	_, _ = r.Load(ctx, "")                                       // Loads: "" is a key
	_, _ = r.Set(ctx, "k", env, 0)                               // Failures

	want := Stats{
		Loads: 2, Writes: 1, RefusedWrites: 1, Sets: 1, Invalidates: 1,
		AcquireValue: 1, AcquireLease: 1, AcquireHeld: 1,
		Extends: 1, Releases: 1, Announces: 2, Failures: 2,
	}
	if diff := cmp.Diff(want, r.Stats()); diff != "" {
		t.Fatalf("Stats (-want +got):\n%s", diff)
	}
}

// recorder collects the notices a subscription delivers, as "key@fence",
// with a trailing "-" for a Dropped one.
type recorder struct {
	mu   sync.Mutex
	keys []string
}

func (c *recorder) add(n remote.Notice) {
	c.mu.Lock()
	defer c.mu.Unlock()
	s := fmt.Sprintf("%s@%d", n.Key, n.Fence)
	if n.Dropped {
		s += "-"
	}
	c.keys = append(c.keys, s)
}

func (c *recorder) get() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Clone(c.keys)
}

func TestSubscribeOrder(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ctx := t.Context()
		r := New()
		var a, b recorder
		stopA := r.Subscribe(a.add)
		defer stopA()
		stopB := r.Subscribe(b.add)
		defer stopB()

		env := envAt("v", time.Minute, time.Hour)
		g := mustLease(t, r, "w", time.Minute)
		_, _ = r.Set(ctx, "s1", env, time.Hour)
		mustWrite(t, r, "w", env, g.Fence, time.Hour)
		if ok, _ := r.Write(ctx, "w", env, g.Fence-1, time.Hour); ok {
			t.Fatal("stale Write accepted")
		}
		_, _ = r.Write(ctx, "w", []byte("junk"), g.Fence, time.Hour)
		_ = r.Invalidate(ctx, "i")
		_, _ = r.Set(ctx, "s2", env, time.Hour)
		_ = r.Release(ctx, "w", g.Token)
		_, _ = r.Acquire(ctx, "x", time.Minute, time.Time{})
		_, _ = r.Set(ctx, "s1", env, time.Hour)
		_ = r.Invalidate(ctx, "w")
		synctest.Wait()

		// The fake clock stands still: each key's first fence is the clock
		// in microseconds, the next one above it.
		us := time.Now().UnixMicro()
		want := []string{}
		for _, n := range []struct {
			key     string
			plus    int64
			dropped string
		}{{"s1", 0, ""}, {"w", 0, ""}, {"i", 0, "-"}, {"s2", 0, ""}, {"s1", 1, ""}, {"w", 1, "-"}} {
			want = append(want, fmt.Sprintf("%s@%d%s", n.key, us+n.plus, n.dropped))
		}
		if diff := cmp.Diff(want, a.get()); diff != "" {
			t.Errorf("first subscription (-want +got):\n%s", diff)
		}
		if diff := cmp.Diff(want, b.get()); diff != "" {
			t.Errorf("second subscription (-want +got):\n%s", diff)
		}
	})
}

func TestSubscribeStop(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ctx := t.Context()
		r := New()
		gate := make(chan struct{})
		var c recorder
		stop := r.Subscribe(func(n remote.Notice) {
			c.add(n)
			<-gate
		})
		env := envAt("v", time.Minute, time.Hour)
		_, _ = r.Set(ctx, "a", env, time.Hour)
		_, _ = r.Set(ctx, "b", env, time.Hour) // queued behind a, dropped by stop
		synctest.Wait()

		stopped := make(chan struct{})
		go func() {
			stop()
			close(stopped)
		}()
		synctest.Wait()
		select {
		case <-stopped:
			t.Fatal("stop returned while fn was still running")
		default:
		}
		close(gate)
		synctest.Wait()
		select {
		case <-stopped:
		default:
			t.Fatal("stop did not return after fn did")
		}

		_, _ = r.Set(ctx, "c", env, time.Hour)
		synctest.Wait()
		if diff := cmp.Diff([]string{fmt.Sprintf("a@%d", time.Now().UnixMicro())}, c.get()); diff != "" {
			t.Fatalf("keys delivered (-want +got):\n%s", diff)
		}
		stop() // idempotent: returns at once
		if n := len(r.subs); n != 0 {
			t.Fatalf("%d subscriptions left after stop", n)
		}
	})
}

func TestSubscribeOverflow(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ctx := t.Context()
		r := New()
		gate := make(chan struct{})
		var c recorder
		stop := r.Subscribe(func(n remote.Notice) {
			c.add(n)
			if n.Key == "first" {
				<-gate
			}
		})
		defer stop()

		env := envAt("v", time.Minute, time.Hour)
		_ = r.Invalidate(ctx, "first")
		synctest.Wait() // fn is blocked on "first"
		for i := range subscribeQueue + 10 {
			if _, err := r.Set(ctx, fmt.Sprint("k", i), env, time.Hour); err != nil {
				t.Fatal(err) // a writer blocked on the subscriber would hang here
			}
		}
		close(gate)
		synctest.Wait()
		_ = r.Invalidate(ctx, "after")
		synctest.Wait()

		us := time.Now().UnixMicro() // each key's first fence
		want := []string{fmt.Sprintf("first@%d-", us), "@0", fmt.Sprintf("after@%d-", us)}
		if diff := cmp.Diff(want, c.get()); diff != "" {
			t.Fatalf("keys delivered (-want +got):\n%s", diff)
		}
	})
}

func TestExpiryFakeClock(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ctx := t.Context()
		r := New()

		// Hard expiry comes from the ttl argument.
		_, _ = r.Set(ctx, "v", envAt("v", time.Hour, 2*time.Hour), time.Second)
		time.Sleep(time.Second - time.Millisecond)
		if got := loadValue(t, r, "v"); got != "v" {
			t.Fatalf("Load just before the hard expiry = %q", got)
		}
		time.Sleep(time.Millisecond)
		if got := loadValue(t, r, "v"); got != "<nil>" {
			t.Fatalf("Load at the hard expiry = %q, want nil", got)
		}

		// Soft expiry decides between a value and a lease.
		_, _ = r.Set(ctx, "s", envAt("s", time.Second, time.Hour), time.Hour)
		if g, _ := r.Acquire(ctx, "s", time.Minute, time.Time{}); g.Value == nil {
			t.Fatalf("Acquire before soft expiry = %+v, want the value", g)
		}
		// A refresh passes the soft expiry it replaces: only a later one stops it.
		soft := time.Now().Add(time.Second)
		if g, _ := r.Acquire(ctx, "s", time.Minute, soft.Add(-time.Millisecond)); g.Value == nil {
			t.Fatalf("Acquire after a time before the soft expiry = %+v, want the value", g)
		}
		if g, _ := r.Acquire(ctx, "s", time.Minute, soft); g.Token == "" {
			t.Fatalf("Acquire after the soft expiry itself = %+v, want a lease", g)
		} else {
			_ = r.Release(ctx, "s", g.Token)
		}
		time.Sleep(time.Second - time.Millisecond)
		if g, _ := r.Acquire(ctx, "s", time.Minute, time.Time{}); g.Value == nil {
			t.Fatalf("Acquire 1ms before soft expiry = %+v, want the value", g)
		}
		time.Sleep(time.Millisecond)
		g, _ := r.Acquire(ctx, "s", 2*time.Second, time.Time{})
		if g.Token == "" {
			t.Fatalf("Acquire at soft expiry = %+v, want a lease", g)
		}

		// A lease lasts exactly its ttl, Extend restarts it.
		time.Sleep(time.Second)
		if ok, _ := r.Extend(ctx, "s", g.Token, 2*time.Second); !ok {
			t.Fatal("Extend of a live lease refused")
		}
		time.Sleep(2*time.Second - time.Millisecond)
		if h, _ := r.Acquire(ctx, "s", time.Minute, time.Time{}); h.HeldFor != time.Millisecond {
			t.Fatalf("Acquire 1ms before lease expiry = %+v, want HeldFor 1ms", h)
		}
		time.Sleep(time.Millisecond)
		if ok, _ := r.Extend(ctx, "s", g.Token, time.Minute); ok {
			t.Fatal("Extend of an expired lease accepted")
		}
		if h, _ := r.Acquire(ctx, "s", time.Minute, time.Time{}); h.Token == "" || h.Fence != uint64(time.Now().UnixMicro()) {
			t.Fatalf("Acquire after lease expiry = %+v, want a lease with fence %d (the clock in µs)", h, time.Now().UnixMicro())
		}
	})
}

func TestWaitFakeClock(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ctx := t.Context()
		r := New()

		// A completion announced before Wait does not count.
		_ = r.Release(ctx, "k", "nobody")
		tctx, cancel := context.WithTimeout(ctx, time.Second)
		defer cancel()
		if err := r.Wait(tctx, "k"); !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("Wait with only an earlier announcement = %v, want DeadlineExceeded", err)
		}
		if n := r.waits.Len(); n != 0 {
			t.Fatalf("an abandoned Wait left %d generations behind", n)
		}

		// One Release, even by a stale token, wakes every waiter of its key
		// and no other.
		done := make(chan error, 3)
		for _, k := range []string{"k", "k", "other"} {
			go func() { done <- r.Wait(ctx, k) }()
		}
		synctest.Wait()
		_ = r.Release(ctx, "k", "stale")
		synctest.Wait()
		for range 2 {
			select {
			case err := <-done:
				if err != nil {
					t.Fatalf("Wait = %v", err)
				}
			default:
				t.Fatal("Release did not wake a waiter")
			}
		}
		select {
		case err := <-done:
			t.Fatalf("Release of k woke a waiter of another key (%v)", err)
		default:
		}
		_ = r.Release(ctx, "other", "")
		if err := <-done; err != nil {
			t.Fatalf("Wait = %v", err)
		}
		if n := r.waits.Len(); n != 0 {
			t.Fatalf("%d generations left after every waiter woke", n)
		}
	})
}

func TestCorruptStoredValue(t *testing.T) {
	r := New()
	r.keys["k"] = &entry{value: []byte("junk"), hard: time.Now().Add(time.Hour)}
	g, err := r.Acquire(t.Context(), "k", time.Minute, time.Time{})
	if err != nil || g.Token == "" {
		t.Fatalf("Acquire over a corrupt value = %+v, %v; want a lease", g, err)
	}
}

func TestCopies(t *testing.T) {
	ctx := t.Context()
	r := New()
	env := envAt("value", time.Hour, 2*time.Hour)
	_, _ = r.Set(ctx, "k", env, time.Hour)
	env[len(env)-1] = 'X'
	if got := loadValue(t, r, "k"); got != "value" {
		t.Fatalf("changing the written slice changed the store: %q", got)
	}
	b, _ := r.Load(ctx, "k")
	b[len(b)-1] = 'X'
	g, _ := r.Acquire(ctx, "k", time.Minute, time.Time{})
	g.Value[len(g.Value)-1] = 'X'
	if got := loadValue(t, r, "k"); got != "value" {
		t.Fatalf("changing a returned slice changed the store: %q", got)
	}
}

func TestContextEnded(t *testing.T) {
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	r := New()
	env := envAt("v", time.Hour, 2*time.Hour)
	_, err1 := r.Write(ctx, "k", env, 0, time.Hour)
	_, err2 := r.Set(ctx, "k", env, time.Hour)
	_, err3 := r.Acquire(ctx, "k", time.Minute, time.Time{})
	for i, err := range []error{err1, err2, err3} {
		if !errors.Is(err, context.Canceled) {
			t.Errorf("call %d with an ended context = %v, want context.Canceled", i, err)
		}
	}
	if len(r.keys) != 0 {
		t.Fatalf("calls with an ended context changed the store: %d keys", len(r.keys))
	}
}

func TestFenceLimit(t *testing.T) {
	ctx := t.Context()
	r := New()
	r.keys["k"] = &entry{fence: envelope.MaxFence, fenceEnd: time.Now().Add(time.Hour)}
	env := envAt("v", time.Hour, 2*time.Hour)
	if g, err := r.Acquire(ctx, "k", time.Minute, time.Time{}); err == nil {
		t.Errorf("Acquire at the fence limit = %+v, want an error", g)
	}
	if _, err := r.Set(ctx, "k", env, time.Hour); err == nil {
		t.Error("Set at the fence limit succeeded")
	}
	if err := r.Invalidate(ctx, "k"); err == nil {
		t.Error("Invalidate at the fence limit succeeded")
	}
	if f := r.keys["k"].fence; f != envelope.MaxFence {
		t.Fatalf("fence = %d, want %d", f, uint64(envelope.MaxFence))
	}
	mustWrite(t, r, "k", env, envelope.MaxFence, time.Hour)
	if !bytes.Equal(r.keys["k"].value[envelope.FenceOffset:envelope.HeaderSize], []byte{0, 0x1f, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff}) {
		t.Fatal("Write did not set the fence field")
	}
}

// fenceOf returns key's fence as a call would see it now, and whether the
// Remote holds key at all.
func fenceOf(r *Remote, key string) (uint64, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	e := r.entry(key, time.Now(), false)
	if e == nil || r.keys[key] != e { // never held, or forgotten just now
		return 0, false
	}
	return e.fence, true
}

func TestFenceFromClock(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ctx := t.Context()
		r := New()
		env := envAt("v", time.Hour, 2*time.Hour)
		us := uint64(time.Now().UnixMicro())
		f1, _ := r.Set(ctx, "k", env, time.Hour)
		f2, _ := r.Set(ctx, "k", env, time.Hour) // the same microsecond
		time.Sleep(time.Second)
		f3, _ := r.Set(ctx, "k", env, time.Hour)
		if want := []uint64{us, us + 1, us + 1e6}; !slices.Equal([]uint64{f1, f2, f3}, want) {
			t.Fatalf("fences %d, %d, %d; want %v: max(the previous + 1, the clock in µs)", f1, f2, f3, want)
		}
	})
}

func TestFenceExpiry(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ctx := t.Context()
		r := New()
		env := envAt("v", time.Hour, 2*time.Hour)
		fenceTTL := time.Minute + 10*time.Second // for a ttl under a minute

		// A fence left alone expires fenceTTL after the last change: its
		// holder can no longer write, and the key is forgotten.
		paused := mustLease(t, r, "alone", time.Second)
		time.Sleep(fenceTTL - time.Millisecond)
		if f, _ := fenceOf(r, "alone"); f != paused.Fence {
			t.Fatalf("fence 1ms before it expires = %d, want %d", f, paused.Fence)
		}
		time.Sleep(time.Millisecond)
		if f, held := fenceOf(r, "alone"); f != 0 || held {
			t.Fatalf("an expired fence with nothing else = %d, held %v; want the key forgotten", f, held)
		}
		if ok, err := r.Write(ctx, "alone", env, paused.Fence, time.Hour); ok || err != nil {
			t.Fatalf("Write under an expired fence = %v, %v; want refused", ok, err)
		}
		// Another writer's fence starts again from the clock, above the old.
		g := mustLease(t, r, "alone", time.Second)
		if g.Fence <= paused.Fence {
			t.Fatalf("fence after expiry %d, not above %d", g.Fence, paused.Fence)
		}
		if ok, err := r.Write(ctx, "alone", env, paused.Fence, time.Hour); ok || err != nil {
			t.Fatalf("Write under the fence before expiry = %v, %v; want refused", ok, err)
		}
		mustWrite(t, r, "alone", env, g.Fence, time.Hour)

		// A lease kept by Extend keeps its fence, long past fenceTTL.
		long := mustLease(t, r, "long", time.Second)
		for range 4 * int(fenceTTL/(500*time.Millisecond)) {
			time.Sleep(500 * time.Millisecond)
			if ok, err := r.Extend(ctx, "long", long.Token, time.Second); !ok || err != nil {
				t.Fatalf("Extend = %v, %v; want true", ok, err)
			}
		}
		mustWrite(t, r, "long", env, long.Fence, time.Hour)

		// The longest ttl wins, whatever comes after it.
		f, _ := r.Set(ctx, "kept", env, 2*time.Hour)
		_ = r.Invalidate(ctx, "kept")
		h := mustLease(t, r, "kept", time.Second)
		if h.Fence <= f {
			t.Fatalf("fence after Set %d and Invalidate = %d, want it above", f, h.Fence)
		}
		_ = r.Release(ctx, "kept", h.Token)
		time.Sleep(2*time.Hour + 10*time.Second - time.Millisecond)
		if got, _ := fenceOf(r, "kept"); got != h.Fence {
			t.Fatalf("fence 1ms before the Set's fence TTL ends = %d, want %d", got, h.Fence)
		}
		time.Sleep(time.Millisecond)
		if got, held := fenceOf(r, "kept"); got != 0 || held {
			t.Fatalf("fence after the Set's fence TTL = %d, held %v; want the key forgotten", got, held)
		}
	})
}

// TestBoundedByLiveKeys writes rounds of distinct keys, each round after
// the last has expired: the keys held stay in proportion to one round.
func TestBoundedByLiveKeys(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ctx := t.Context()
		r := New()
		const perRound = 10_000
		most := 0
		for round := range 5 {
			for i := range perRound {
				k := fmt.Sprintf("r%d/k%d", round, i)
				if i%2 == 0 {
					_, _ = r.Set(ctx, k, envAt("v", time.Second, time.Second), time.Second)
				} else {
					g := mustLease(t, r, k, time.Second)
					mustWrite(t, r, k, envAt("v", time.Second, time.Second), g.Fence, time.Second)
				}
				most = max(most, len(r.keys))
			}
			time.Sleep(time.Minute + 10*time.Second) // every fence has expired
		}
		if most > 2*perRound {
			t.Fatalf("%d keys held at most, over 5 rounds of %d keys each living 70 s", most, perRound)
		}
		t.Logf("at most %d keys held, over 5 rounds of %d", most, perRound)
	})
}

// Holds reach a subscriber on a goroutine of its own, in order: an Acquire
// and an AcquireMany that take leases return while the subscriber is still
// busy with an earlier hold, and the lease's holder completes meanwhile.
// Each hold carries its lease's fence and Seq, the key's completion count
// when the lease was taken plus one, by which a subscriber that hears it
// late knows that the holder completed.
func TestSubscribeHoldsDoesNotBlockTheHolder(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ctx := t.Context()
		r := New()
		gate := make(chan struct{})
		var (
			mu   sync.Mutex
			got  []remote.Notice
			seqs []uint64 // the count when each hold reached fn
		)
		stop := r.SubscribeHolds(func(n remote.Notice) {
			<-gate
			mu.Lock()
			defer mu.Unlock()
			got = append(got, n)
			seqs = append(seqs, r.Completions(n.Key))
		})
		defer stop()

		before := r.Completions("a")
		g, err := r.Acquire(ctx, "a", time.Minute, time.Time{})
		if err != nil || g.Token == "" {
			t.Fatalf("Acquire(a) = %+v, %v; want a lease", g, err)
		}
		many := r.AcquireMany(ctx, []remote.LeaseRequest{{Key: "b"}, {Key: "a"}}, time.Minute)
		if many[0].Token == "" || many[1].Token != "" {
			t.Fatalf("AcquireMany(b, a) = %+v; want b's lease, a held", many)
		}
		if err := r.Release(ctx, "a", g.Token); err != nil {
			t.Fatal(err) // a's holder completes before its hold is heard
		}
		close(gate)
		synctest.Wait()

		mu.Lock()
		defer mu.Unlock()
		if len(got) != 2 || got[0].Key != "a" || got[1].Key != "b" {
			t.Fatalf("holds heard %+v; want a's, then b's", got)
		}
		a, b := got[0], got[1]
		if a.Fence != g.Fence || b.Fence != many[0].Fence {
			t.Errorf("holds' fences %d, %d; want the leases' %d, %d", a.Fence, b.Fence, g.Fence, many[0].Fence)
		}
		if a.Seq != before+1 || seqs[0] == a.Seq-1 {
			t.Errorf("a's hold: Seq %d, count when heard %d; want %d, and a count moved on by its completion", a.Seq, seqs[0], before+1)
		}
		if seqs[1] != b.Seq-1 {
			t.Errorf("b's hold: Seq %d, count when heard %d; want the count plus one (b's holder has not completed)", b.Seq, seqs[1])
		}
		if want := time.Now().Add(time.Minute); !a.Held.Equal(want) || !b.Held.Equal(want) {
			t.Errorf("holds until %v, %v; want %v", a.Held, b.Held, want)
		}
	})
}
