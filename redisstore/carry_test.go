package redisstore

import (
	"bytes"
	"context"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/herdcache/herd"
	"github.com/herdcache/herd/redisstore/internal/redistest"
	"github.com/herdcache/herd/remote"
	"github.com/herdcache/herd/remote/envelope"
)

// TestNoticeCarriesValue checks that the notices of a Set, a Write and a
// WriteRelease carry the envelope they stored, fence field set, up to
// NoticeValueMax bytes, and that a longer one is announced as a plain
// change: on one node, and on a Cluster's shard channels for keys on
// every master.
func TestNoticeCarriesValue(t *testing.T) {
	t.Parallel()
	t.Run("Single", func(t *testing.T) {
		t.Parallel()
		c := redistest.Server(t).Client()
		testNoticeCarriesValue(t, c, []string{"k"})
	})
	t.Run("Cluster", func(t *testing.T) {
		t.Parallel()
		c := redistest.Cluster(t)
		cc := c.Client()
		r := newRemote(t, cc, Options{})
		testNoticeCarriesValue(t, cc, keysOnEveryMaster(t, c, cc, r, "k/", 12))
	})
}

func testNoticeCarriesValue(t *testing.T, c redis.UniversalClient, keys []string) {
	w := newRemote(t, c, Options{})
	r := newRemote(t, c, Options{})
	notices := subscribe(t, r)
	ctx := t.Context()

	overhead := len(fresh(""))
	fits := fresh(strings.Repeat("x", NoticeValueMax-overhead))
	tooLong := fresh(strings.Repeat("x", NoticeValueMax-overhead+1))
	if len(fits) != NoticeValueMax || len(tooLong) != NoticeValueMax+1 {
		t.Fatalf("envelopes of %d and %d bytes, want %d and %d", len(fits), len(tooLong), NoticeValueMax, NoticeValueMax+1)
	}
	check := func(what, key string, fence uint64, carried bool) {
		t.Helper()
		n := next(t, notices)
		if n.Key != key || n.Fence != fence || n.Dropped {
			t.Fatalf("%s: notice %q under %d, dropped %v; want %q under %d", what, n.Key, n.Fence, n.Dropped, key, fence)
		}
		if !carried {
			if n.Value != "" {
				t.Fatalf("%s: notice carries %d bytes, want none", what, len(n.Value))
			}
			return
		}
		stored, err := w.Load(ctx, key)
		if err != nil || n.Value != string(stored) {
			t.Fatalf("%s: notice carries %q, want the stored envelope %q (%v)", what, n.Value, stored, err)
		}
		if ev, err := envelope.Decode([]byte(n.Value)); err != nil || ev.Fence != fence {
			t.Fatalf("%s: carried envelope decodes as fence %d, %v; want %d", what, ev.Fence, err, fence)
		}
	}

	for _, k := range keys {
		carries(t, w, k, fresh("v"), true, check)
		carries(t, w, k, fits, true, check)
		carries(t, w, k, tooLong, false, check)
	}
}

// carries Sets, WriteReleases and Writes env under k through w, and checks
// each one's notice with check.
func carries(t *testing.T, w *Remote, k string, env []byte, carried bool, check func(what, key string, fence uint64, carried bool)) {
	t.Helper()
	ctx := t.Context()
	f, err := w.Set(ctx, k, env, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	check("Set", k, f, carried)

	g, err := w.Acquire(ctx, k, time.Minute, time.Now().Add(24*time.Hour))
	if err != nil || g.Token == "" {
		t.Fatalf("Acquire(%q) = %+v, %v; want the lease", k, g, err)
	}
	if wrote, err := w.WriteRelease(ctx, k, env, g.Fence, time.Minute, g.Token); err != nil || !wrote {
		t.Fatalf("WriteRelease(%q) = %v, %v", k, wrote, err)
	}
	check("WriteRelease", k, g.Fence, carried)

	g, err = w.Acquire(ctx, k, time.Minute, time.Now().Add(24*time.Hour))
	if err != nil || g.Token == "" {
		t.Fatalf("Acquire(%q) = %+v, %v; want the lease", k, g, err)
	}
	if wrote, err := w.Write(ctx, k, env, g.Fence, time.Minute); err != nil || !wrote {
		t.Fatalf("Write(%q) = %v, %v", k, wrote, err)
	}
	check("Write", k, g.Fence, carried)
	if err := w.Release(ctx, k, g.Token); err != nil {
		t.Fatal(err)
	}
}

// getCounter is a go-redis hook that counts the GETs a client sends.
type getCounter struct{ n atomic.Int64 }

func (c *getCounter) DialHook(next redis.DialHook) redis.DialHook { return next }
func (c *getCounter) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if cmd.Name() == "get" {
			c.n.Add(1)
		}
		return next(ctx, cmd)
	}
}
func (c *getCounter) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		for _, cmd := range cmds {
			if cmd.Name() == "get" {
				c.n.Add(1)
			}
		}
		return next(ctx, cmds)
	}
}

// heardStore is a Remote that tells the test when its cache has handled
// each change notice.
type heardStore struct {
	*Remote
	heard chan remote.Notice
}

// hand passes n on without blocking the notices: the channel holds more
// than the test makes.
func hand(ch chan remote.Notice, n remote.Notice) {
	select {
	case ch <- n:
	default:
	}
}

func (s heardStore) Subscribe(fn func(remote.Notice)) (stop func()) {
	return s.Remote.Subscribe(func(n remote.Notice) { fn(n); hand(s.heard, n) })
}

func (s heardStore) SubscribeLive(fn func(remote.Notice)) (stop func()) {
	return s.Remote.SubscribeLive(func(n remote.Notice) { fn(n); hand(s.heard, n) })
}

// carryReplica is one replica of TestReplicasRefreshedByNotice: a cache
// over its own client, whose GETs are counted, and its own Remote.
type carryReplica struct {
	cache *herd.Cache[[]byte]
	gets  *getCounter
	store heardStore
}

func newCarryReplica(t *testing.T, node *redistest.Node) *carryReplica {
	t.Helper()
	client := node.Client()
	gets := &getCounter{}
	client.AddHook(gets)
	s := heardStore{Remote: newRemote(t, client, Options{}), heard: make(chan remote.Notice, 1024)}
	c, err := herd.New(&herd.Options[[]byte]{
		NoBreaker:  true,
		MaxEntries: 100,
		SoftTTL:    time.Hour,
		NearTTL:    time.Hour, // only notices change a copy during the test
		Store:      s, Lease: s.Remote, LeaseTTL: time.Minute,
		Codec: herd.Bytes(),
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close(context.Background()) })
	return &carryReplica{cache: c, gets: gets, store: s}
}

// heard waits until the replica's cache has handled the change notice of
// key under a fence of at least fence.
func (p *carryReplica) heard(t *testing.T, key string, fence uint64) {
	t.Helper()
	for {
		select {
		case n := <-p.store.heard:
			if n.Key == key && n.Fence >= fence && n.Tag == "" && n.Live.IsZero() {
				return
			}
		case <-time.After(deadline):
			t.Fatalf("no notice of %q under %d within %v", key, fence, deadline)
		}
	}
}

// TestReplicasRefreshedByNotice checks, over one redis-server with one
// client and Remote per replica, that a small value a Set or a write-back
// under a lease stores reaches the replicas holding the key with no GET,
// that a large one is read once by each of them, and that a replica not
// holding the key reads and stores nothing.
func TestReplicasRefreshedByNotice(t *testing.T) {
	t.Parallel()
	node := redistest.Server(t)
	ctx := t.Context()
	writer := newCarryReplica(t, node)
	holders := []*carryReplica{newCarryReplica(t, node), newCarryReplica(t, node)}
	idle := newCarryReplica(t, node)
	all := append([]*carryReplica{idle}, holders...)
	leaser := newRemote(t, node.Client(), Options{})

	stored := func(t *testing.T) uint64 {
		t.Helper()
		env, err := leaser.Load(ctx, "k")
		if err != nil || env == nil {
			t.Fatalf("Load = %q, %v", env, err)
		}
		ev, err := envelope.Decode(env)
		if err != nil {
			t.Fatal(err)
		}
		return ev.Fence
	}
	if err := writer.cache.Set(ctx, "k", []byte("v1")); err != nil {
		t.Fatal(err)
	}
	f := stored(t)
	for _, p := range all {
		p.heard(t, "k", f)
	}
	for _, p := range holders {
		if v, err := p.cache.Get(ctx, "k", nil); err != nil || string(v) != "v1" {
			t.Fatalf("holder's first Get = %q, %v; want v1", v, err)
		}
	}
	gets := func() []int64 {
		n := make([]int64, len(all))
		for i, p := range all {
			n[i] = p.gets.n.Load()
		}
		return n
	}
	before := gets()
	expect := func(t *testing.T, what string, want string) {
		t.Helper()
		for _, p := range holders {
			if v, ok := p.cache.GetIfPresent("k"); !ok || string(v) != want {
				t.Errorf("%s: a holder's copy is %q, %v; want %q", what, v, ok, want)
			}
		}
		if v, ok := idle.cache.GetIfPresent("k"); ok {
			t.Errorf("%s: the idle replica holds %q", what, v)
		}
		if now := gets(); !slices.Equal(now, before) {
			t.Errorf("%s: GETs by the idle replica and the holders went from %v to %v; want none", what, before, now)
		}
	}

	t.Run("Set", func(t *testing.T) {
		if err := writer.cache.Set(ctx, "k", []byte("v2")); err != nil {
			t.Fatal(err)
		}
		f := stored(t)
		for _, p := range all {
			p.heard(t, "k", f)
		}
		expect(t, "after a Set", "v2")
	})
	t.Run("WriteBack", func(t *testing.T) {
		// A refresh's write-back, as the lease holder makes it.
		g, err := leaser.Acquire(ctx, "k", time.Minute, time.Now().Add(24*time.Hour))
		if err != nil || g.Token == "" {
			t.Fatalf("Acquire = %+v, %v; want the lease", g, err)
		}
		if wrote, err := leaser.WriteRelease(ctx, "k", fresh("v3"), g.Fence, time.Minute, g.Token); err != nil || !wrote {
			t.Fatalf("WriteRelease = %v, %v", wrote, err)
		}
		for _, p := range all {
			p.heard(t, "k", g.Fence)
		}
		expect(t, "after a write-back", "v3")
	})
	t.Run("Large", func(t *testing.T) {
		large := bytes.Repeat([]byte("L"), 2*NoticeValueMax)
		if err := writer.cache.Set(ctx, "k", large); err != nil {
			t.Fatal(err)
		}
		f := stored(t)
		for _, p := range all {
			p.heard(t, "k", f)
		}
		var wg sync.WaitGroup
		for _, p := range holders {
			for range 20 {
				wg.Go(func() {
					if v, err := p.cache.Get(ctx, "k", nil); err != nil || string(v) != "v3" && !bytes.Equal(v, large) {
						t.Errorf("a holder's Get = %d bytes, %v; want v3 or the large value", len(v), err)
					}
				})
			}
		}
		wg.Wait()
		for _, p := range all {
			if err := p.cache.Close(ctx); err != nil { // waits for the background reads
				t.Fatal(err)
			}
		}
		now := gets()
		if now[0] != before[0] {
			t.Errorf("the idle replica made %d GETs, want 0", now[0]-before[0])
		}
		for i := range holders {
			if n := now[i+1] - before[i+1]; n != 1 {
				t.Errorf("holder %d made %d GETs for the large value, want 1", i, n)
			}
		}
	})
}
