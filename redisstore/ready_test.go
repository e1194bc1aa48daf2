package redisstore

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/herdcache/herd"
	"github.com/herdcache/herd/redisstore/internal/redistest"
)

// sendCounter is a go-redis hook that counts the commands and pipelines
// a client sends (or tries to).
type sendCounter struct{ n atomic.Int64 }

func (c *sendCounter) DialHook(next redis.DialHook) redis.DialHook { return next }
func (c *sendCounter) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		c.n.Add(1)
		return next(ctx, cmd)
	}
}
func (c *sendCounter) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		c.n.Add(1)
		return next(ctx, cmds)
	}
}

// closedPort returns a loopback address that nothing listens on.
func closedPort(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	return addr
}

// readyCache is a herd cache over r whose breaker, once open, stays open
// for the test.
func readyCache(t *testing.T, r *Remote) *herd.Cache[int] {
	t.Helper()
	c, err := herd.New(&herd.Options[int]{
		NoNearCache: true,
		MaxEntries:  100, SoftTTL: time.Minute,
		Store: r, Lease: r, LeaseTTL: time.Second,
		BreakerThreshold: 5, BreakerCooldown: time.Hour,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close(context.Background()) })
	return c
}

// checkDown checks r, made while Redis could not be reached: it has not
// reached Redis, Ping says so, and a cache over it starts degraded, so
// that after the first Get, which probes Redis, Gets make no Redis call.
func checkDown(t *testing.T, r *Remote, calls *sendCounter) {
	t.Helper()
	if r.Reached() {
		t.Error("Reached() = true for a Remote made while Redis was down")
	}
	if err := r.Ping(t.Context()); err == nil || !strings.HasPrefix(err.Error(), "redisstore: ping: ") {
		t.Errorf("Ping = %v, want an error prefixed redisstore: ping: ", err)
	}
	c := readyCache(t, r)
	if st := c.Stats(); !st.Degraded || st.BreakerOpens != 1 {
		t.Fatalf("a cache over an unreached Remote: Degraded %v, BreakerOpens %d; want open once", st.Degraded, st.BreakerOpens)
	}
	load := func(context.Context) (int, error) { return 7, nil }
	if v, err := c.Get(t.Context(), "first", load); err != nil || v != 7 {
		t.Fatalf("first Get = %d, %v; want 7 from its load", v, err)
	}
	before := calls.n.Load()
	for i := range 20 {
		if v, err := c.Get(t.Context(), fmt.Sprint("k", i), load); err != nil || v != 7 {
			t.Fatalf("Get %d = %d, %v; want 7 from its load", i, v, err)
		}
	}
	if n := calls.n.Load() - before; n != 0 {
		t.Errorf("20 Gets after the first made %d Redis calls, want none: the breaker is open", n)
	}
	if st := c.Stats(); st.RemoteErrors > 1 {
		t.Errorf("%d failed remote calls, want at most the first Get's probe", st.RemoteErrors)
	}
}

// A Remote over a loopback port where nothing listens: it has not reached
// Redis, Ping fails, and a cache over it does not make each Get wait.
func TestUnreachableRemote(t *testing.T) {
	t.Parallel()
	client := NewClient(&redis.UniversalOptions{Addrs: []string{closedPort(t)}})
	defer client.Close()
	calls := &sendCounter{}
	client.AddHook(calls)
	checkDown(t, newRemote(t, client, Options{}), calls)
}

// A real redis-server: a Remote made while it runs has reached it and its
// cache starts closed; once the server is killed Ping fails, and a Remote
// made then is as one over an unreachable address; when the server is back,
// Ping succeeds again.
func TestRemoteOfKilledServer(t *testing.T) {
	t.Parallel()
	n := redistest.Server(t)
	up := newRemote(t, n.Client(), Options{})
	if !up.Reached() {
		t.Error("Reached() = false for a Remote made while Redis ran")
	}
	if err := up.Ping(t.Context()); err != nil {
		t.Fatalf("Ping of a running server: %v", err)
	}
	c := readyCache(t, up)
	if st := c.Stats(); st.Degraded {
		t.Fatal("a cache over a Remote that reached Redis starts degraded")
	}
	if v, err := c.Get(t.Context(), "k", func(context.Context) (int, error) { return 1, nil }); err != nil || v != 1 {
		t.Fatalf("Get = %d, %v", v, err)
	}

	n.Kill()
	if err := up.Ping(t.Context()); err == nil {
		t.Error("Ping of a killed server succeeded")
	}
	client := redis.NewClient(&redis.Options{Addr: n.Addr, ContextTimeoutEnabled: true})
	defer client.Close()
	calls := &sendCounter{}
	client.AddHook(calls)
	down := newRemote(t, client, Options{})
	checkDown(t, down, calls)

	n.Restart()
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for err := down.Ping(ctx); err != nil; err = down.Ping(ctx) {
		select {
		case <-ctx.Done():
			t.Fatalf("Ping after the server restarted: %v", err)
		case <-tick.C:
		}
	}
	if !down.Reached() {
		t.Error("Reached() = false after a Ping succeeded")
	}
}

// Ping of a closed Remote fails with ErrClosed.
func TestPingClosed(t *testing.T) {
	t.Parallel()
	client := NewClient(&redis.UniversalOptions{Addrs: []string{closedPort(t)}})
	defer client.Close()
	r, err := New(Options{Client: client, Timeout: testTimeout})
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Close(); err != nil {
		t.Fatal(err)
	}
	if err := r.Ping(t.Context()); !errors.Is(err, ErrClosed) {
		t.Errorf("Ping after Close = %v, want ErrClosed", err)
	}
}
