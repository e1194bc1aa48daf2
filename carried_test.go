package herd_test

import (
	"bytes"
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/herdcache/herd"
	"github.com/herdcache/herd/memory"
	"github.com/herdcache/herd/remote"
	"github.com/herdcache/herd/remote/envelope"
)

// A change notice that carries the stored envelope replaces the copy of a
// replica that holds the key with no read of the Store, after a Set and
// after a refresh's write-back under a lease; a replica that does not hold
// the key stores nothing.
func TestNoticeValueReplacesHeldCopyWithoutARead(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := memory.New()
		r.SetNoticeValues(1024)
		bs := &tap{Remote: r}
		a, c := fleetReplica(t, r, nil), fleetReplica(t, r, nil)
		b := fleetReplica(t, r, func(o *herd.Options[int]) { o.Store = bs })
		fleetMustGet(t, a, "k", fleetValue(1), 1)
		fleetMustGet(t, b, "k", nil, 1)
		synctest.Wait()

		loads := bs.loads.Load()
		if err := a.Set(t.Context(), "k", 2); err != nil {
			t.Fatal(err)
		}
		synctest.Wait()
		if v, ok := b.GetIfPresent("k"); !ok || v != 2 {
			t.Errorf("B's copy after the Set's notice = %d, %v; want 2, true", v, ok)
		}
		fleetMustGet(t, b, "k", nil, 2)
		if _, ok := c.GetIfPresent("k"); ok {
			t.Error("C, which never read k, holds it after the notice")
		}

		// A refresh: past the soft expiry, A serves stale and reloads under
		// the lease; its write-back's notice carries 3 to B.
		time.Sleep(fleetSoft)
		fleetMustGet(t, a, "k", fleetValue(3), 2)
		synctest.Wait()
		if v, ok := b.GetIfPresent("k"); !ok || v != 3 {
			t.Errorf("B's copy after the refresh's notice = %d, %v; want 3, true", v, ok)
		}
		if n := bs.loads.Load() - loads; n != 0 {
			t.Errorf("replacing B's copy twice made %d Store reads, want 0", n)
		}
		if st := b.Stats(); st.Revalidations != 0 || st.NoticeValuesAdopted != 2 || st.NoticeValuesRefused != 0 {
			t.Errorf("B's Stats: Revalidations %d, NoticeValuesAdopted %d, NoticeValuesRefused %d; want 0, 2, 0", st.Revalidations, st.NoticeValuesAdopted, st.NoticeValuesRefused)
		}
		if st := c.Stats(); st.NoticeValuesAdopted != 0 || st.NoticeValuesRefused != 0 {
			t.Errorf("C, which holds no copy, counted NoticeValuesAdopted %d, NoticeValuesRefused %d; want 0, 0", st.NoticeValuesAdopted, st.NoticeValuesRefused)
		}
		if _, ok := c.GetIfPresent("k"); ok {
			t.Error("C, which never read k, holds it after the notices")
		}
	})
}

// A value too large for the notice is read once by each replica that holds
// the key, as with a Store that carries no values, and by none that does
// not.
func TestNoticeValueTooLargeIsReadOncePerHolder(t *testing.T) {
	for _, tc := range []struct {
		name string
		max  int
	}{{"too large", 8}, {"no values", 0}} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				r := memory.New()
				r.SetNoticeValues(tc.max)
				a := fleetReplica(t, r, nil)
				holders := fleetReplicas(t, 3, r, nil)
				idle := fleetReplica(t, r, nil)
				fleetMustGet(t, a, "k", fleetValue(1), 1)
				for _, h := range holders {
					fleetMustGet(t, h, "k", nil, 1)
				}
				synctest.Wait()
				loads := r.Stats().Loads
				if err := a.Set(t.Context(), "k", 2); err != nil {
					t.Fatal(err)
				}
				synctest.Wait()
				var wg sync.WaitGroup
				for _, h := range holders {
					for range 20 {
						wg.Go(func() {
							if v, err := h.Get(t.Context(), "k", fleetNoLoad(t, "a holder")); err != nil || v != 1 && v != 2 {
								t.Errorf("a holder's Get = %d, %v; want 1 or 2", v, err)
							}
						})
					}
				}
				wg.Wait()
				synctest.Wait()
				for _, h := range holders {
					fleetMustGet(t, h, "k", nil, 2)
				}
				if n := r.Stats().Loads - loads; n != uint64(len(holders)) {
					t.Errorf("%d holders made %d Store reads, want one each", len(holders), n)
				}
				for _, h := range holders {
					if st := h.Stats(); st.NoticeValuesAdopted != 0 || st.NoticeValuesRefused != 0 {
						t.Errorf("a holder of a notice without a value counted NoticeValuesAdopted %d, NoticeValuesRefused %d; want 0, 0", st.NoticeValuesAdopted, st.NoticeValuesRefused)
					}
				}
				if _, ok := idle.GetIfPresent("k"); ok {
					t.Error("a replica that never read k holds it")
				}
			})
		})
	}
}

// tap is a Store whose Notifier hands the test the subscriber, so that it
// can deliver notices of its own making, and that counts its Loads.
type tap struct {
	*memory.Remote
	loads atomic.Int64
	mu    sync.Mutex
	fn    func(remote.Notice)
}

func (s *tap) Load(ctx context.Context, key string) ([]byte, error) {
	s.loads.Add(1)
	return s.Remote.Load(ctx, key)
}

func (s *tap) Subscribe(fn func(remote.Notice)) (stop func()) {
	s.mu.Lock()
	s.fn = fn
	s.mu.Unlock()
	stop = s.Remote.Subscribe(fn)
	return stop
}

func (s *tap) deliver(n remote.Notice) {
	s.mu.Lock()
	fn := s.fn
	s.mu.Unlock()
	fn(n)
}

// Fences order carried values as they order change notices: an older value
// never replaces a newer copy, a value whose envelope does not decode or
// names another fence is a plain change notice (one read), and a replica
// gains no key from a notice.
func TestNoticeValueFences(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := memory.New()
		tp := &tap{Remote: r}
		a := fleetReplica(t, r, nil)
		b := fleetReplica(t, r, func(o *herd.Options[int]) { o.Store = tp })
		fleetMustGet(t, a, "k", fleetValue(1), 1)
		fleetMustGet(t, b, "k", nil, 1)
		old, err := r.Load(t.Context(), "k")
		if err != nil || old == nil {
			t.Fatalf("Load = %v, %v", old, err)
		}
		if err := a.Set(t.Context(), "k", 2); err != nil {
			t.Fatal(err)
		}
		synctest.Wait()
		if _, err := b.Get(t.Context(), "k", fleetNoLoad(t, "B")); err != nil { // starts the one read: r carries no values
			t.Fatal(err)
		}
		synctest.Wait()
		fleetMustGet(t, b, "k", nil, 2)
		cur, err := r.Load(t.Context(), "k")
		if err != nil || cur == nil {
			t.Fatalf("Load = %v, %v", cur, err)
		}
		newFence := fenceOf(t, cur)
		loads := r.Stats().Loads

		// The older value, as a later notice might deliver it: ignored.
		tp.deliver(remote.Notice{Key: "k", Fence: fenceOf(t, old), Value: string(old)})
		if v, ok := b.GetIfPresent("k"); !ok || v != 2 {
			t.Errorf("after an older carried value B holds %d, %v; want 2, true", v, ok)
		}
		// A key B does not hold: nothing stored.
		tp.deliver(remote.Notice{Key: "other", Fence: newFence + 1, Value: string(cur)})
		if _, ok := b.GetIfPresent("other"); ok {
			t.Error("a carried value gave B a key it did not hold")
		}
		if n := r.Stats().Loads - loads; n != 0 {
			t.Errorf("ignored notices made %d Store reads, want 0", n)
		}
		if st := b.Stats(); st.NoticeValuesAdopted != 0 || st.NoticeValuesRefused != 0 {
			t.Errorf("after ignored notices B counted NoticeValuesAdopted %d, NoticeValuesRefused %d; want 0, 0", st.NoticeValuesAdopted, st.NoticeValuesRefused)
		}

		// Unusable values, newer by fence: each is a plain change notice,
		// the copy served while one read replaces it.
		for _, bad := range []struct {
			name  string
			value string
		}{
			{"corrupt", "\x01garbage"},
			{"truncated", string(cur[:len(cur)-1])},
			{"another fence", string(cur)}, // its fence field is newFence, not the notice's
		} {
			loads := r.Stats().Loads
			tp.deliver(remote.Notice{Key: "k", Fence: newFence + 1, Value: bad.value})
			fleetMustGet(t, b, "k", nil, 2)
			synctest.Wait()
			if n := r.Stats().Loads - loads; n != 1 {
				t.Errorf("%s: %d Store reads, want 1", bad.name, n)
			}
		}
		if st := b.Stats(); st.NoticeValuesAdopted != 0 || st.NoticeValuesRefused != 3 {
			t.Errorf("after three unusable values B counted NoticeValuesAdopted %d, NoticeValuesRefused %d; want 0, 3", st.NoticeValuesAdopted, st.NoticeValuesRefused)
		}
	})
}

// fenceOf returns the fence of the envelope env.
func fenceOf(t *testing.T, env []byte) uint64 {
	t.Helper()
	ev, err := envelope.Decode(env)
	if err != nil {
		t.Fatal(err)
	}
	return ev.Fence
}

// FuzzNoticeValue hands a replica holding a key change notices carrying
// any bytes: it never panics, and it replaces its copy only with an
// envelope that decodes under the notice's fence.
func FuzzNoticeValue(f *testing.F) {
	r := memory.New()
	tp := &tap{Remote: r}
	o := fleetOptions(r)
	o.Store = tp
	c, err := herd.New(o)
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(func() { _ = c.Close(context.Background()) })
	if err := c.Set(context.Background(), "seed", 7); err != nil {
		f.Fatal(err)
	}
	good, err := r.Load(context.Background(), "seed")
	if err != nil || good == nil {
		f.Fatalf("Load = %q, %v", good, err)
	}
	f.Add(good) // re-fenced below: adopted
	one := bytes.Clone(good)
	if err := envelope.SetFence(one, 1); err != nil {
		f.Fatal(err)
	}
	f.Add(one) // under another fence: not adopted
	f.Add(good[:len(good)-1])
	f.Add([]byte{})
	f.Add([]byte("\x01garbage"))
	f.Fuzz(func(t *testing.T, value []byte) {
		if err := c.Set(t.Context(), "k", 1); err != nil {
			t.Fatal(err)
		}
		env, err := r.Load(t.Context(), "k")
		if err != nil {
			t.Fatal(err)
		}
		fence := fenceOf(t, env) + 1
		// Under the notice's fence when its header allows, the fuzzer's
		// bytes reach the decoding of the value; odd ones are left as they
		// are, as are those whose fence field the fuzzer set (1 above).
		if ev, err := envelope.Decode(value); err != nil || ev.Fence != 1 {
			value = bytes.Clone(value)
			_ = envelope.SetFence(value, fence)
		}
		tp.deliver(remote.Notice{Key: "k", Fence: fence, Value: string(value)})
		if v, ok := c.GetIfPresent("k"); ok && v != 1 {
			if ev, err := envelope.Decode(value); err != nil || ev.Fence != fence {
				t.Fatalf("a notice carrying %q (fence %d) replaced the copy with %d", value, fence, v)
			}
		}
	})
}
