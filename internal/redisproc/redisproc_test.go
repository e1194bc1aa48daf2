package redisproc

import (
	"context"
	"errors"
	"os"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

func client(t *testing.T, addr string) *redis.Client {
	t.Helper()
	c := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1, ContextTimeoutEnabled: true})
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// TestKillRestartStop proves the lifecycle the node-kill scenario relies on:
// a started server answers on a loopback address, Kill makes it unreachable,
// Restart brings it back empty on the same address, and Stop removes it and
// its directory for good.
func TestKillRestartStop(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	s, err := Start(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Stop()
	addr := s.Addr()
	if host := addr[:len("127.0.0.1:")]; host != "127.0.0.1:" {
		t.Fatalf("Addr() = %q, want a 127.0.0.1 address", addr)
	}
	c := client(t, addr)
	if err := c.Set(ctx, "k", "v", 0).Err(); err != nil {
		t.Fatalf("SET on a started server: %v", err)
	}

	s.Kill()
	if s.Running() {
		t.Fatal("Running() after Kill")
	}
	pctx, pcancel := context.WithTimeout(ctx, time.Second)
	err = c.Ping(pctx).Err()
	pcancel()
	if err == nil {
		t.Fatal("PING answered after Kill")
	}
	s.Kill() // killing a dead server does nothing

	if err := s.Restart(ctx); err != nil {
		t.Fatal(err)
	}
	if s.Addr() != addr {
		t.Fatalf("Addr() after Restart = %q, want %q", s.Addr(), addr)
	}
	if _, err := c.Get(ctx, "k").Result(); !errors.Is(err, redis.Nil) {
		t.Fatalf("GET after Restart: err %v, want redis.Nil (a restarted server is empty)", err)
	}

	dir := s.dir
	if err := s.Stop(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Fatalf("directory %s after Stop: %v, want it removed", dir, err)
	}
	if err := s.Restart(ctx); err == nil {
		t.Fatal("Restart after Stop succeeded")
	}
	if err := s.Stop(); err != nil {
		t.Fatalf("second Stop: %v", err)
	}
}

// TestStartCanceled proves a start bounded by an ended context fails rather
// than hanging, and leaves no directory behind.
func TestStartCanceled(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if s, err := Start(ctx); err == nil {
		s.Stop()
		t.Fatal("Start with an ended context succeeded")
	}
}
