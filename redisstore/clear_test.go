package redisstore

import (
	"testing"
	"time"

	"github.com/herdcache/herd/redisstore/internal/redistest"
	"github.com/herdcache/herd/remote/notify"
)

// A Remote that missed an InvalidateAll's notice learns the generation
// again once its subscription reconnects: it then reads nothing stored
// before.
func TestGenerationReadAfterReconnect(t *testing.T) {
	t.Parallel()
	n := redistest.Server(t)
	c := n.Client()
	r := newRemote(t, c, Options{})
	ctx := t.Context()
	notices := subscribe(t, r)
	if _, err := r.Set(ctx, "k", fresh("v"), time.Minute); err != nil {
		t.Fatal(err)
	}
	if got := next(t, notices); got.Key != "k" {
		t.Fatalf("notice = %+v, want k's", got)
	}
	// Another generation, announced to nobody: as if r missed its notice.
	if err := c.Set(ctx, r.space.Generation(), "7", 0).Err(); err != nil {
		t.Fatal(err)
	}
	if env, err := r.Load(ctx, "k"); err != nil || env == nil {
		t.Fatalf("Load before the reconnect = %q, %v; want the value of the generation r knows", env, err)
	}
	if err := c.Do(ctx, "CLIENT", "KILL", "TYPE", "pubsub").Err(); err != nil {
		t.Fatal(err)
	}
	if got := next(t, notices); got != (notify.Notice{}) {
		t.Fatalf("first notice after the reconnect = %+v, want the zero Notice", got)
	}
	if env, err := r.Load(ctx, "k"); err != nil || env != nil {
		t.Fatalf("Load after the reconnect = %q, %v; want nothing: generation 7 holds no value", env, err)
	}
	if g := r.gen.Load(); g != 7 {
		t.Errorf("generation after the reconnect = %d, want 7", g)
	}
	// A generation never goes back: the key lost, r keeps 7.
	if err := c.Del(ctx, r.space.Generation()).Err(); err != nil {
		t.Fatal(err)
	}
	r.genKnown.Store(false)
	if _, err := r.Load(ctx, "k"); err != nil {
		t.Fatal(err)
	}
	if g := r.gen.Load(); g != 7 {
		t.Errorf("generation after its key was lost = %d, want 7 still", g)
	}
}

// A notice of a generation parses only in its canonical form.
func TestParseClearNotice(t *testing.T) {
	for p, ok := range map[string]bool{
		"g1": true, "g1796193311518878": true, "g9007199254740991": true,
		"g": false, "g0": false, "g01": false, "g-1": false, "g+1": false, "g1x": false, "g9007199254740992": false,
	} {
		m, got := parseNotice(p)
		if got != ok || ok && m.kind != clearNotice {
			t.Errorf("parseNotice(%q) = %+v, %v; want ok %v", p, m, got, ok)
		}
	}
}
