package lab

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/herdcache/herd/redisstore/redisproc"
)

// redisSmall is a short suite for a real Redis: real time, so kept brief.
func redisSmall() Options {
	o := small()
	o.Replicas = 2
	o.Keys = 10
	o.Latency = Latency{Kind: "fixed", A: 20 * time.Millisecond}
	o.TTL = 400 * time.Millisecond
	o.Duration = time.Second
	o.Layers = []string{"lease"}
	return o
}

// TestSpawnedRedis runs node-kill and flush on a redis-server the lab
// starts, kills with SIGKILL and restarts, and checks the lease's promises
// there.
func TestSpawnedRedis(t *testing.T) {
	o := redisSmall()
	o.SpawnRedis = true
	o.Scenarios = []string{"flush", "node-kill"}
	s, err := RunSuite(context.Background(), o)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(s.Backend, "spawned redis-server 127.0.0.1:") {
		t.Errorf("backend %q", s.Backend)
	}
	for _, c := range s.Checks {
		if !c.OK || c.Observations == 0 {
			t.Errorf("check failed or judged nothing: %+v", c)
		}
	}
	if len(s.Checks) != 4 {
		t.Errorf("%d checks, want 4 (flush: per replica and per key; node-kill: per replica while down and errors)", len(s.Checks))
	}
	for _, r := range s.Runs {
		// The clients fail at once on the dead node, so the breaker opens
		// and the replicas load on their own while it is down.
		if r.Scenario == "node-kill" && (r.Extra["down_ms"] <= 0 || r.Extra["calls_while_down"] == 0) {
			t.Errorf("node-kill: %v backing-store calls while the node was down %vms; want some",
				r.Extra["calls_while_down"], r.Extra["down_ms"])
		}
		if r.Scenario == "flush" && (r.OriginCalls == 0 || r.Extra["max_calls_per_key"] != 1) {
			t.Errorf("flush: %d calls, at most %v per key; want the keys reloaded once each", r.OriginCalls, r.Extra["max_calls_per_key"])
		}
	}
}

// TestSpawnedRedisFleet runs cold-start warm from the fleet on a real
// Redis: the veteran's ShareHotKeys fills the hot set with ZINCRBY from its
// own connection, and each replica, on a connection of its own, warms the
// hottest keys from Redis with no backing-store call.
func TestSpawnedRedisFleet(t *testing.T) {
	o := redisSmall()
	o.SpawnRedis = true
	o.Scenarios = []string{"cold-start"}
	s, err := RunSuite(context.Background(), o)
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, c := range s.Checks {
		if !c.OK {
			t.Errorf("check failed: %+v", c)
		}
		if c.Layer == "lease (fleet)" {
			n++
		}
	}
	if n != 3 {
		t.Errorf("%d checks of lease (fleet), want the fleet's 3", n)
	}
	for _, r := range s.Runs {
		if r.Variant == "fleet" && (r.OriginCalls != 0 || r.Extra["hot_set_keys"] != 2 || r.Extra["warmed_keys"] != 2) {
			t.Errorf("fleet: %d calls, a hot set of %v, %v keys warmed per replica; want none and the hottest 2 of 10",
				r.OriginCalls, r.Extra["hot_set_keys"], r.Extra["warmed_keys"])
		}
	}
}

// TestUserRedisLeftClean runs on a Redis the lab did not start, as with
// --redis, and checks that the lab deletes every key it wrote (values,
// leases, the hot set) and nothing else.
func TestUserRedisLeftClean(t *testing.T) {
	ctx := context.Background()
	srv, err := redisproc.Start(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Stop()
	c := redis.NewClient(&redis.Options{Addr: srv.Addr()})
	defer c.Close()
	if err := c.Set(ctx, "users:1", "keep me", 0).Err(); err != nil {
		t.Fatal(err)
	}

	o := redisSmall()
	o.RedisAddr = srv.Addr()
	o.Scenarios = []string{"hot-key", "flush", "cold-start"}
	s, err := RunSuite(ctx, o)
	if err != nil {
		t.Fatal(err)
	}
	if s.Backend != "redis "+srv.Addr() {
		t.Errorf("backend %q", s.Backend)
	}
	for _, r := range s.Runs {
		// Warm from the fleet, cold-start makes no call.
		if (r.OriginCalls == 0) != (r.Variant == "fleet") || r.Errors != 0 {
			t.Errorf("%s %s: %d calls, %d errors", r.Scenario, r.Variant, r.OriginCalls, r.Errors)
		}
	}
	keys, err := c.Keys(ctx, "*").Result()
	if err != nil {
		t.Fatal(err)
	}
	if len(keys) != 1 || keys[0] != "users:1" {
		t.Errorf("keys left in Redis: %q, want only the user's users:1", keys)
	}
}
