package redisstore

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/herdcache/herd/redisstore/internal/redistest"
	"github.com/herdcache/herd/remote"
	"github.com/herdcache/herd/remote/envelope"
)

// migrate puts the slot of the Redis key name in MIGRATING on its master
// and IMPORTING on another, and returns clients of both and the target's
// node id.
func migrate(ctx context.Context, t *testing.T, c *redistest.ClusterNodes, name string) (source, target *redis.Client, targetID string) {
	t.Helper()
	cl := c.Client()
	slot, err := cl.ClusterKeySlot(ctx, name).Result()
	if err != nil {
		t.Fatal(err)
	}
	master, err := cl.MasterForKey(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range c.Nodes {
		switch {
		case n.Addr == master.Options().Addr:
			source = n.Client()
		case target == nil:
			target = n.Client()
		}
	}
	sourceID, err := source.ClusterMyID(ctx).Result()
	if err != nil {
		t.Fatal(err)
	}
	if targetID, err = target.ClusterMyID(ctx).Result(); err != nil {
		t.Fatal(err)
	}
	if err := target.Do(ctx, "CLUSTER", "SETSLOT", slot, "IMPORTING", sourceID).Err(); err != nil {
		t.Fatal(err)
	}
	if err := source.Do(ctx, "CLUSTER", "SETSLOT", slot, "MIGRATING", targetID).Err(); err != nil {
		t.Fatal(err)
	}
	return source, target, targetID
}

// moveKeys moves the Redis keys names from source to target with MIGRATE.
func moveKeys(ctx context.Context, t *testing.T, source, target *redis.Client, names ...string) {
	t.Helper()
	host, port, err := net.SplitHostPort(target.Options().Addr)
	if err != nil {
		t.Fatal(err)
	}
	args := []any{"MIGRATE", host, port, "", 0, 5000, "KEYS"}
	for _, n := range names {
		args = append(args, n)
	}
	if err := source.Do(ctx, args...).Err(); err != nil {
		t.Fatal(err)
	}
}

// While a key's slot migrates with its value on the source master and its
// fence key already on the target, its two-key scripts meet TRYAGAIN: Set
// and Invalidate fail, after their bounded retries, with ErrSlotMigrating
// (which the breaker does not count), while Acquire, in one-key steps,
// still finds the fresh value. Once the slot has moved, Set works again.
func TestSlotMigratingBoundedRetries(t *testing.T) {
	c := redistest.Cluster(t)
	r := newRemote(t, c.Client(), Options{Prefix: "migrating:", Timeout: time.Second})
	ctx := t.Context()
	const key = "k"
	if _, err := r.Set(ctx, key, fresh("a"), time.Hour); err != nil {
		t.Fatal(err)
	}
	n, err := r.names(ctx, "test", key)
	if err != nil {
		t.Fatal(err)
	}
	source, target, targetID := migrate(ctx, t, c, n.Value)
	moveKeys(ctx, t, source, target, n.Fence)

	start := time.Now()
	_, err = r.Set(ctx, key, fresh("b"), time.Hour)
	took := time.Since(start)
	if !errors.Is(err, ErrSlotMigrating) || !errors.Is(err, remote.ErrRejected) {
		t.Fatalf("Set with the key's fence on the target and its value on the source: %v; want ErrSlotMigrating and remote.ErrRejected", err)
	}
	t.Logf("Set gave up after %v: %v", took, err)
	if err := r.Invalidate(ctx, key); !errors.Is(err, ErrSlotMigrating) {
		t.Fatalf("Invalidate: %v; want ErrSlotMigrating", err)
	}
	g, err := r.Acquire(ctx, key, time.Second, time.Time{})
	if err != nil {
		t.Fatalf("Acquire: %v; want the fresh value stored before the migration", err)
	}
	if e, err := envelope.Decode(g.Value); err != nil || string(e.Value) != "a" {
		t.Fatalf("Acquire: %+v (%+v, %v); want the fresh value stored before the migration", g, e, err)
	}

	moveKeys(ctx, t, source, target, n.Value)
	slot, err := c.Client().ClusterKeySlot(ctx, n.Value).Result()
	if err != nil {
		t.Fatal(err)
	}
	for _, node := range c.Nodes {
		if err := node.Client().Do(ctx, "CLUSTER", "SETSLOT", slot, "NODE", targetID).Err(); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := r.Set(ctx, key, fresh("c"), time.Hour); err != nil {
		t.Fatalf("Set once the slot has moved: %v", err)
	}
}

// reply is an error reply from Redis.
type reply string

func (e reply) Error() string { return string(e) }
func (reply) RedisError()     {}

func TestStaleMap(t *testing.T) {
	for _, c := range []struct {
		err  error
		want bool
	}{
		{nil, false},
		{redis.Nil, false},
		{context.Canceled, false},
		{redis.ErrClosed, false},
		{context.DeadlineExceeded, true},
		{&net.OpError{Op: "dial", Err: errors.New("connection refused")}, true},
		{io.EOF, true},
		{reply("MOVED 3999 127.0.0.1:6381"), true},
		{reply("ASK 3999 127.0.0.1:6381"), true},
		{reply("CLUSTERDOWN The cluster is down"), true},
		{reply("TRYAGAIN Multiple keys request during rehashing of slot"), true},
		{reply("READONLY You can't write against a read only replica."), true},
		{reply("WRONGTYPE Operation against a key holding the wrong kind of value"), false},
		{reply("NOSCRIPT No matching script."), false},
		{fmt.Errorf("set: %w", reply("MOVED 1 127.0.0.1:1")), true},
	} {
		if got := staleMap(c.err); got != c.want {
			t.Errorf("staleMap(%v) = %v, want %v", c.err, got, c.want)
		}
	}
}
