package lab

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/herdcache/herd/memory"
	"github.com/herdcache/herd/redisstore"
	"github.com/herdcache/herd/redisstore/redisproc"
	"github.com/herdcache/herd/remote"
)

// errNodeKilled is the error of every call to an embedded store that the
// node-kill scenario took down.
var errNodeKilled = errors.New("lab: node killed")

// backend is the remote tier of a suite; each run gets a fresh one from
// newRun, so that runs do not see each other's keys.
type backend interface {
	newRun(ctx context.Context, index int) (runBackend, error)
	// describe is Suite.Backend.
	describe() string
	close() error
}

// runBackend is the remote tier of one run.
type runBackend interface {
	// remote returns the Store and Lease of one replica, and what to close
	// when the run ends (nil when nothing).
	remote(ctx context.Context, replica int) (remote.Store, remote.Lease, io.Closer, error)
	// flush drops every value and lease of the run.
	flush(ctx context.Context) error
	// kill makes the node die; restart brings it back.
	kill(ctx context.Context) error
	restart(ctx context.Context) error
	// close releases the run's resources and deletes its keys.
	close(ctx context.Context) error
}

// embedded is the in-process remote tier: one memory.Remote per run, shared
// by the replicas as a Redis would be.
type embedded struct{}

func (embedded) describe() string { return "embedded (memory.Remote shared by the replicas)" }
func (embedded) close() error     { return nil }

func (embedded) newRun(context.Context, int) (runBackend, error) {
	return &memRun{r: memory.New()}, nil
}

type memRun struct{ r *memory.Remote }

func (m *memRun) remote(context.Context, int) (remote.Store, remote.Lease, io.Closer, error) {
	return m.r, m.r, nil, nil
}
func (m *memRun) flush(context.Context) error   { m.r.Flush(); return nil }
func (m *memRun) kill(context.Context) error    { m.r.SetDown(errNodeKilled); return nil }
func (m *memRun) restart(context.Context) error { m.r.SetDown(nil); return nil }
func (m *memRun) close(context.Context) error   { return nil }

// redisBackend is a real Redis: one the user runs (addr) or one the lab
// spawned (server). Each replica has a client and a redisstore.Remote of its
// own, as separate processes would.
type redisBackend struct {
	addr   string
	server *redisproc.Server // nil for a Redis the lab did not start
	// suite marks this suite's keys: each run's prefix is herdlab:<suite>:<run>:.
	suite string
	admin *redis.Client
}

// quietLogger is go-redis's logger in the lab: it drops every line (pool
// dial failures and the like), as the lab reports what goes wrong with Redis
// itself, once, in its own words.
type quietLogger struct{}

func (quietLogger) Printf(context.Context, string, ...any) {}

func newRedisBackend(ctx context.Context, addr string, spawn bool) (*redisBackend, error) {
	redis.SetLogger(quietLogger{})
	b := &redisBackend{addr: addr}
	if spawn {
		s, err := redisproc.Start(ctx)
		if err != nil {
			return nil, fmt.Errorf("lab: --spawn-redis: %w", err)
		}
		b.server, b.addr = s, s.Addr()
	}
	var id [4]byte
	_, _ = rand.Read(id[:])
	b.suite = hex.EncodeToString(id[:])
	b.admin = redis.NewClient(clientOptions(b.addr).Simple())
	pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if err := b.admin.Ping(pctx).Err(); err != nil {
		_ = b.close()
		return nil, fmt.Errorf("lab: redis at %s does not answer: %w", b.addr, err)
	}
	return b, nil
}

// clientOptions are the options of every client of the lab: one that fails
// at once on a dead node (one dial attempt, no retry of a failed command),
// as the embedded store does when node-kill takes it down. go-redis's
// defaults retry a refused dial four more times 100ms apart, longer than a
// Redis call's deadline (redisstore.DefaultTimeout), so every call would
// wait out its deadline: a --quick outage would end before the cache's
// breaker had seen a failure, and no replica would load while it lasted.
func clientOptions(addr string) *redis.UniversalOptions {
	return &redis.UniversalOptions{
		Addrs:                 []string{addr},
		DialerRetries:         1,
		MaxRetries:            -1,
		ContextTimeoutEnabled: true,
	}
}

func (b *redisBackend) describe() string {
	if b.server != nil {
		return "spawned redis-server " + b.addr + " (persistence off)"
	}
	return "redis " + b.addr
}

func (b *redisBackend) close() error {
	err := b.admin.Close()
	if b.server != nil {
		err = errors.Join(err, b.server.Stop())
	}
	return err
}

func (b *redisBackend) newRun(_ context.Context, index int) (runBackend, error) {
	return &redisRun{b: b, prefix: fmt.Sprintf("herdlab:%s:%d:", b.suite, index)}, nil
}

type redisRun struct {
	b      *redisBackend
	prefix string
}

// replicaConn is one replica's Redis connection: its Remote and client.
type replicaConn struct {
	r *redisstore.Remote
	c redis.UniversalClient
}

func (rc replicaConn) Close() error { return errors.Join(rc.r.Close(), rc.c.Close()) }

func (r *redisRun) remote(context.Context, int) (remote.Store, remote.Lease, io.Closer, error) {
	c := redisstore.NewClient(clientOptions(r.b.addr))
	rem, err := redisstore.New(redisstore.Options{Client: c, Prefix: r.prefix})
	if err != nil {
		_ = c.Close()
		return nil, nil, nil, fmt.Errorf("lab: %w", err)
	}
	return rem, rem, replicaConn{rem, c}, nil
}

// flush deletes every key of the run (SCAN + UNLINK of its prefix): a user's
// Redis is never flushed whole.
func (r *redisRun) flush(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	iter := r.b.admin.Scan(ctx, 0, r.prefix+"*", 1000).Iterator()
	var batch []string
	for iter.Next(ctx) {
		batch = append(batch, iter.Val())
		if len(batch) == 1000 {
			if err := r.b.admin.Unlink(ctx, batch...).Err(); err != nil {
				return fmt.Errorf("lab: flush: %w", err)
			}
			batch = batch[:0]
		}
	}
	if err := iter.Err(); err != nil {
		return fmt.Errorf("lab: flush: %w", err)
	}
	if len(batch) > 0 {
		if err := r.b.admin.Unlink(ctx, batch...).Err(); err != nil {
			return fmt.Errorf("lab: flush: %w", err)
		}
	}
	return nil
}

func (r *redisRun) kill(context.Context) error {
	if r.b.server == nil {
		return errors.New("lab: cannot kill a Redis the lab did not start")
	}
	r.b.server.Kill()
	return nil
}

func (r *redisRun) restart(ctx context.Context) error {
	if r.b.server == nil {
		return errors.New("lab: cannot restart a Redis the lab did not start")
	}
	return r.b.server.Restart(ctx)
}

func (r *redisRun) close(ctx context.Context) error {
	return r.flush(ctx)
}
