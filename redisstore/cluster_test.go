package redisstore

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/herdcache/herd/redisstore/internal/redistest"
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
