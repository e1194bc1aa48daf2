package memory

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"testing"
	"testing/synctest"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/herdcache/herd/remote"
	"github.com/herdcache/herd/remote/envelope"
)

// grantString describes g without its token, which is random: two remotes
// given the same calls under synctest's still clock give the same string.
func grantString(g remote.Grant, err error) string {
	switch {
	case err != nil:
		return "error " + err.Error()
	case g.Value != nil:
		return fmt.Sprintf("value %q", g.Value)
	case g.Token != "":
		return fmt.Sprintf("lease, fence %d", g.Fence)
	}
	return fmt.Sprintf("held for %v", g.HeldFor)
}

// TestAcquireManyMatchesAcquire checks that acquire decides as Acquire does,
// from every state of a key, and sets Stale exactly when the stored value
// was not returned and the lease was taken or found held.
func TestAcquireManyMatchesAcquire(t *testing.T) {
	ctx := context.Background()
	fresh := func(r *Remote) { _, _ = r.Set(ctx, "k", envAt("v", time.Minute, time.Hour), time.Hour) }
	stale := func(r *Remote) { _, _ = r.Set(ctx, "k", envAt("v", -time.Second, time.Hour), time.Hour) }
	held := func(r *Remote) { _, _ = r.Acquire(ctx, "k", time.Minute, time.Time{}) }
	for _, tc := range []struct {
		name  string
		setup []func(r *Remote)
		ttl   time.Duration // 0 for a minute
		after time.Duration // from now; 0 for the zero time
		ended bool          // the call's context has ended
		stale bool          // Stale holds the stored value
	}{
		{name: "Missing"},
		{name: "Fresh", setup: []func(*Remote){fresh}},
		{name: "FreshAfterPast", setup: []func(*Remote){fresh}, after: -time.Hour},
		{name: "FreshAfterBeyond", setup: []func(*Remote){fresh}, after: 2 * time.Minute, stale: true},
		{name: "SoftExpired", setup: []func(*Remote){stale}, stale: true},
		{name: "Corrupt", setup: []func(*Remote){func(r *Remote) {
			r.keys["k"] = &entry{value: []byte("junk"), hard: time.Now().Add(time.Hour)}
		}}, stale: true},
		{name: "HardExpired", setup: []func(*Remote){func(r *Remote) {
			_, _ = r.Set(ctx, "k", envAt("v", -time.Second, time.Hour), time.Second)
			time.Sleep(time.Second)
		}}},
		{name: "Held", setup: []func(*Remote){held}},
		{name: "HeldOverStale", setup: []func(*Remote){stale, held}, stale: true},
		{name: "HeldOverFresh", setup: []func(*Remote){fresh, held}},
		{name: "BadTTL", setup: []func(*Remote){stale}, ttl: -time.Second},
		{name: "Down", setup: []func(*Remote){stale, func(r *Remote) { r.SetDown(errors.New("boom")) }}},
		{name: "ContextEnded", setup: []func(*Remote){stale}, ended: true},
		{name: "FenceLimit", setup: []func(*Remote){func(r *Remote) {
			r.keys["k"] = &entry{fence: envelope.MaxFence, fenceEnd: time.Now().Add(time.Hour)}
		}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				single, batch := New(), New()
				for _, r := range []*Remote{single, batch} {
					for _, fn := range tc.setup {
						fn(r)
					}
				}
				ctx, cancel := context.WithCancel(t.Context())
				defer cancel()
				if tc.ended {
					cancel()
				}
				ttl := tc.ttl
				if ttl == 0 {
					ttl = time.Minute
				}
				var after time.Time
				if tc.after != 0 {
					after = time.Now().Add(tc.after)
				}
				var stored []byte
				if e := batch.keys["k"]; e != nil && time.Now().Before(e.hard) {
					stored = bytes.Clone(e.value)
				}

				g, err := single.Acquire(ctx, "k", ttl, after)
				got := batch.AcquireMany(ctx, []remote.LeaseRequest{{Key: "k", After: after}}, ttl)
				if len(got) != 1 {
					t.Fatalf("AcquireMany of one request returned %d entries", len(got))
				}
				a := got[0]
				if want, got := grantString(g, err), grantString(a.Grant, a.Err); got != want {
					t.Errorf("AcquireMany entry = %s, Acquire = %s", got, want)
				}
				bs := batch.Stats()
				if bs.Batches != 1 {
					t.Errorf("Stats.Batches = %d after one AcquireMany, want 1", bs.Batches)
				}
				bs.Batches = 0
				if diff := cmp.Diff(single.Stats(), bs); diff != "" {
					t.Errorf("Stats (-Acquire +AcquireMany):\n%s", diff)
				}
				var want []byte
				if tc.stale {
					want = stored
				}
				if !bytes.Equal(a.Stale, want) || (a.Stale == nil) != (want == nil) {
					t.Errorf("Stale = %q, want %q", a.Stale, want)
				}
			})
		})
	}
}

// TestBatchMatchesSingleCalls makes the same calls of a load's life on two
// remotes, one call per key on one and batches on the other: the outcomes,
// the values stored, the notices and the Stats are the same.
func TestBatchMatchesSingleCalls(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ctx := t.Context()
		single, batch := New(), New()
		var singleNotices, batchNotices recorder
		defer single.Subscribe(singleNotices.add)()
		defer batch.Subscribe(batchNotices.add)()
		keys := []string{"fresh", "stale", "held", "missing", "missing", ""}
		tokens := make(map[*Remote]map[string]string)
		for _, r := range []*Remote{single, batch} {
			_, _ = r.Set(ctx, "fresh", envAt("fresh", time.Minute, time.Hour), time.Hour)
			_, _ = r.Set(ctx, "stale", envAt("stale", -time.Second, time.Hour), time.Hour)
			g := mustLease(t, r, "held", time.Minute)
			tokens[r] = map[string]string{"held": g.Token}
		}
		var singleOut, batchOut []string
		record := func(out *[]string, r *Remote, key string, g remote.Grant, err error) {
			*out = append(*out, key+": "+grantString(g, err))
			if g.Token != "" {
				tokens[r][key] = g.Token
			}
		}
		fence := func(r *Remote, key string) uint64 { f, _ := fenceOf(r, key); return f }
		writes := func(r *Remote) []remote.HeldWrite {
			tok := tokens[r]
			return []remote.HeldWrite{
				{HeldKey: remote.HeldKey{Key: "stale", Token: tok["stale"]}, Env: envAt("new", time.Minute, time.Hour), Fence: fence(r, "stale"), TTL: time.Hour},
				{HeldKey: remote.HeldKey{Key: "missing", Token: tok["missing"]}}, // release only
				{HeldKey: remote.HeldKey{Key: "held", Token: "wrong"}, Env: envAt("late", time.Minute, time.Hour), Fence: fence(r, "held") - 1, TTL: time.Hour},
				{HeldKey: remote.HeldKey{Key: "", Token: tok[""]}, Env: []byte("junk"), Fence: fence(r, ""), TTL: time.Hour},
				{HeldKey: remote.HeldKey{Key: "other", Token: "none"}, Env: envAt("other", time.Minute, time.Hour), TTL: 0},
			}
		}

		for _, k := range keys {
			g, err := single.Acquire(ctx, k, time.Minute, time.Time{})
			record(&singleOut, single, k, g, err)
		}
		reqs := make([]remote.LeaseRequest, len(keys))
		for i, k := range keys {
			reqs[i].Key = k
		}
		for i, a := range batch.AcquireMany(ctx, reqs, time.Minute) {
			record(&batchOut, batch, keys[i], a.Grant, a.Err)
		}

		for _, k := range keys {
			ok, err := single.Extend(ctx, k, tokens[single][k], 2*time.Minute)
			singleOut = append(singleOut, fmt.Sprintf("extend %s: %v %v", k, ok, err))
		}
		held := make([]remote.HeldKey, len(keys))
		for i, k := range keys {
			held[i] = remote.HeldKey{Key: k, Token: tokens[batch][k]}
		}
		for i, o := range batch.ExtendMany(ctx, held, 2*time.Minute) {
			batchOut = append(batchOut, fmt.Sprintf("extend %s: %v %v", keys[i], o.OK, o.Err))
		}

		for _, w := range writes(single) {
			var ok bool
			var err error
			if w.Env == nil {
				err = single.Release(ctx, w.Key, w.Token)
			} else {
				ok, err = single.WriteRelease(ctx, w.Key, w.Env, w.Fence, w.TTL, w.Token)
			}
			singleOut = append(singleOut, fmt.Sprintf("write %s: %v %v", w.Key, ok, err))
		}
		batchWrites := writes(batch)
		for i, o := range batch.WriteReleaseMany(ctx, batchWrites) {
			batchOut = append(batchOut, fmt.Sprintf("write %s: %v %v", batchWrites[i].Key, o.OK, o.Err))
		}

		for _, k := range keys {
			b, err := single.Load(ctx, k)
			singleOut = append(singleOut, fmt.Sprintf("load %s: %q %v", k, b, err))
		}
		for i, l := range batch.LoadMany(ctx, keys) {
			batchOut = append(batchOut, fmt.Sprintf("load %s: %q %v", keys[i], l.Value, l.Err))
		}
		synctest.Wait()

		if diff := cmp.Diff(singleOut, batchOut); diff != "" {
			t.Errorf("outcomes (-single calls +batches):\n%s", diff)
		}
		if diff := cmp.Diff(singleNotices.get(), batchNotices.get()); diff != "" {
			t.Errorf("notices (-single calls +batches):\n%s", diff)
		}
		bs := batch.Stats()
		if bs.Batches == 0 {
			t.Error("Stats.Batches = 0 after batch calls")
		}
		bs.Batches = 0
		if diff := cmp.Diff(single.Stats(), bs); diff != "" {
			t.Errorf("Stats (-single calls +batches):\n%s", diff)
		}
		if n := len(batchNotices.get()); n != 3 { // two Sets and the write of "stale"
			t.Errorf("%d notices, want 3: %q", n, batchNotices.get())
		}
	})
}

// TestBatchFailsPerEntry checks that a down remote and an ended context
// fail every entry of a batch, each with its own error, and change nothing.
func TestBatchFailsPerEntry(t *testing.T) {
	boom := errors.New("node killed")
	cancelled, cancel := context.WithCancel(t.Context())
	cancel()
	for _, tc := range []struct {
		name string
		ctx  context.Context
		down error
		want error
	}{
		{"Down", t.Context(), boom, boom},
		{"ContextEnded", cancelled, nil, context.Canceled},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := New()
			g := mustLease(t, r, "a", time.Minute)
			mustWrite(t, r, "a", envAt("v", -time.Second, time.Hour), g.Fence, time.Hour)
			r.SetDown(tc.down)
			before := r.Stats()
			ctx := tc.ctx
			var errs []error
			for _, l := range r.LoadMany(ctx, []string{"a", "b"}) {
				errs = append(errs, l.Err)
			}
			for _, a := range r.AcquireMany(ctx, []remote.LeaseRequest{{Key: "a"}, {Key: "b"}}, time.Minute) {
				if a.Stale != nil {
					t.Errorf("AcquireMany entry that failed has Stale %q", a.Stale)
				}
				errs = append(errs, a.Err)
			}
			for _, o := range r.ExtendMany(ctx, []remote.HeldKey{{Key: "a", Token: g.Token}, {Key: "b"}}, time.Minute) {
				errs = append(errs, o.Err)
			}
			for _, o := range r.WriteReleaseMany(ctx, []remote.HeldWrite{
				{HeldKey: remote.HeldKey{Key: "a", Token: g.Token}, Env: envAt("w", time.Minute, time.Hour), Fence: g.Fence, TTL: time.Hour},
				{HeldKey: remote.HeldKey{Key: "b", Token: "t"}},
			}) {
				errs = append(errs, o.Err)
			}
			for i, err := range errs {
				if !errors.Is(err, tc.want) {
					t.Errorf("entry %d = %v, want an error wrapping %v", i, err, tc.want)
				}
			}
			// One failure per entry, and two for the WriteRelease: its write
			// and its release fail, as WriteRelease's do.
			want := before
			want.Failures += uint64(len(errs)) + 1
			want.Batches += 4
			if diff := cmp.Diff(want, r.Stats()); diff != "" {
				t.Errorf("Stats (-want +got):\n%s", diff)
			}
			r.SetDown(nil)
			if got := loadValue(t, r, "a"); got != "v" {
				t.Errorf("after the failed batches Load(a) = %q, want v", got)
			}
			if ok, err := r.Extend(t.Context(), "a", g.Token, time.Minute); !ok || err != nil {
				t.Errorf("Extend after the failed batches = %v, %v; want the lease kept", ok, err)
			}
			if _, held := fenceOf(r, "b"); held {
				t.Error("the failed batches created key b")
			}
		})
	}
}

// TestBatchCopies checks that batches hand out and keep copies.
func TestBatchCopies(t *testing.T) {
	ctx := t.Context()
	r := New()
	_, _ = r.Set(ctx, "fresh", envAt("value", time.Hour, 2*time.Hour), time.Hour)
	_, _ = r.Set(ctx, "stale", envAt("value", -time.Second, 2*time.Hour), time.Hour)
	r.keys["junk"] = &entry{value: []byte("junk"), hard: time.Now().Add(time.Hour)}

	loaded := r.LoadMany(ctx, []string{"fresh", "junk"})
	if got := loaded[1].Value; string(got) != "junk" {
		t.Fatalf("LoadMany of an undecodable value = %q, want it as stored", got)
	}
	acquired := r.AcquireMany(ctx, []remote.LeaseRequest{{Key: "fresh"}, {Key: "stale"}, {Key: "junk"}}, time.Minute)
	if got := acquired[2]; got.Token == "" || string(got.Stale) != "junk" {
		t.Fatalf("AcquireMany over an undecodable value = %+v, want a lease and Stale as stored", got)
	}
	for _, b := range [][]byte{loaded[0].Value, loaded[1].Value, acquired[0].Value, acquired[1].Stale, acquired[2].Stale} {
		b[len(b)-1] = 'X'
	}
	if got := loadValue(t, r, "fresh"); got != "value" {
		t.Fatalf("changing a returned slice changed the store: %q", got)
	}
	if got := loadValue(t, r, "stale"); got != "value" {
		t.Fatalf("changing a returned Stale changed the store: %q", got)
	}
	if b, _ := r.Load(ctx, "junk"); string(b) != "junk" {
		t.Fatalf("changing a returned Stale changed the store: %q", b)
	}

	env := envAt("value", time.Hour, 2*time.Hour)
	w := remote.HeldWrite{HeldKey: remote.HeldKey{Key: "stale", Token: acquired[1].Token}, Env: env, Fence: acquired[1].Fence, TTL: time.Hour}
	if o := r.WriteReleaseMany(ctx, []remote.HeldWrite{w})[0]; !o.OK || o.Err != nil {
		t.Fatalf("WriteReleaseMany = %+v, want OK", o)
	}
	env[len(env)-1] = 'X'
	if got := loadValue(t, r, "stale"); got != "value" {
		t.Fatalf("changing the written slice changed the store: %q", got)
	}
}
