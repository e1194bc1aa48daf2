package redisstore

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/herdcache/herd/redisstore/internal/redistest"
	"github.com/herdcache/herd/remote/envelope"
)

// wrapped is a UniversalClient of a type New does not know.
type wrapped struct{ *redis.Client }

func TestAckOptions(t *testing.T) {
	t.Parallel()
	single := NewClient(&redis.UniversalOptions{Addrs: []string{"127.0.0.1:1"}})
	cluster := NewClient(&redis.UniversalOptions{Addrs: []string{"127.0.0.1:1", "127.0.0.1:2"}})
	failover := NewClient(&redis.UniversalOptions{Addrs: []string{"127.0.0.1:1"}, MasterName: "m"})
	short := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1", ContextTimeoutEnabled: true, ReadTimeout: 400 * time.Millisecond})
	unbounded := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1", ContextTimeoutEnabled: true, ReadTimeout: -1})
	other := wrapped{redis.NewClient(&redis.Options{Addr: "127.0.0.1:1", ContextTimeoutEnabled: true})}
	for _, c := range []redis.UniversalClient{single, cluster, failover, short, unbounded, other} {
		t.Cleanup(func() { _ = c.Close() })
	}
	const timeout = 100 * time.Millisecond // Redis is not there: New waits this long for it
	for _, tc := range []struct {
		name string
		o    Options
		want string
	}{
		{"NegativeReplicas", Options{Client: single, AckReplicas: -1}, "AckReplicas -1 is negative"},
		{"NegativeTimeout", Options{Client: single, AckReplicas: 1, AckTimeout: -time.Second}, "AckTimeout -1s is negative"},
		{"TimeoutAlone", Options{Client: single, AckTimeout: time.Second}, "AckTimeout 1s is set but AckReplicas is 0"},
		{"OtherClient", Options{Client: other, AckReplicas: 1}, "redisstore.wrapped"},
		{"ShortReadTimeout", Options{Client: short, AckReplicas: 1, AckTimeout: 350 * time.Millisecond}, "ReadTimeout 400ms is shorter than AckTimeout 350ms plus Timeout 100ms"},
	} {
		tc.o.Timeout = timeout
		r, err := New(tc.o)
		if err == nil {
			_ = r.Close()
			t.Errorf("%s: New succeeded, want an error", tc.name)
			continue
		}
		if !strings.HasPrefix(err.Error(), "redisstore: ") || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: New error %q, want one prefixed \"redisstore: \" that mentions %q", tc.name, err, tc.want)
		}
	}

	for _, tc := range []struct {
		name     string
		o        Options
		replicas int
		wait     time.Duration
	}{
		{"Off", Options{Client: other}, 0, 0},
		{"Default", Options{Client: single, AckReplicas: 1}, 1, DefaultAckTimeout},
		{"RoundedUp", Options{Client: failover, AckReplicas: 2, AckTimeout: 1500 * time.Microsecond}, 2, 2 * time.Millisecond},
		{"Cluster", Options{Client: cluster, AckReplicas: 1, AckTimeout: time.Second}, 1, time.Second},
		{"ReadTimeoutJustEnough", Options{Client: short, AckReplicas: 1, AckTimeout: 300 * time.Millisecond}, 1, 300 * time.Millisecond},
		{"NoReadTimeout", Options{Client: unbounded, AckReplicas: 1, AckTimeout: time.Hour}, 1, time.Hour},
	} {
		tc.o.Timeout = timeout
		r, err := New(tc.o)
		if err != nil {
			t.Errorf("%s: New: %v", tc.name, err)
			continue
		}
		if r.ackReplicas != tc.replicas || r.ackTimeout != tc.wait {
			t.Errorf("%s: a Remote that waits for %d replicas for %v, want %d for %v", tc.name, r.ackReplicas, r.ackTimeout, tc.replicas, tc.wait)
		}
		_ = r.Close()
	}
}

// ackClient returns a client of n without a read timeout of its own (the
// calls' deadlines bound them), so that any AckTimeout fits. It is closed
// when the test ends.
func ackClient(t *testing.T, n *redistest.Node) *redis.Client {
	c := redis.NewClient(&redis.Options{Addr: n.Addr, ContextTimeoutEnabled: true, ReadTimeout: -1})
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// changes calls each change a Remote makes on behalf of a cache once, on
// key k, and returns their errors by name.
func changes(ctx context.Context, r *Remote, k string) map[string]error {
	errs := make(map[string]error)
	_, errs["Set"] = r.Set(ctx, k, fresh("v"), time.Hour)
	_, errs["MarkStale"] = r.MarkStale(ctx, k)
	errs["Invalidate"] = r.Invalidate(ctx, k)
	_, errs["InvalidateTag"] = r.InvalidateTag(ctx, "tag-"+k)
	errs["InvalidateAll"] = r.InvalidateAll(ctx)
	return errs
}

// With AckReplicas, each change that returns has reached the replica: a
// read of the replica right after it sees it.
func TestAckReplicated(t *testing.T) {
	t.Parallel()
	master := redistest.Server(t)
	replica := redistest.Replica(t, master).Client()
	r := newRemote(t, ackClient(t, master), Options{AckReplicas: 1, AckTimeout: 10 * time.Second})
	ctx := t.Context()
	for i := range 100 {
		k := fmt.Sprint("k", i)
		f, err := r.Set(ctx, k, fresh(k), time.Hour)
		if err != nil {
			t.Fatalf("Set: %v", err)
		}
		n, _ := r.names(ctx, "test", k)
		got, err := replica.Get(ctx, n.Value).Bytes()
		if err != nil {
			t.Fatalf("the replica holds nothing for %q right after Set returned: %v", k, err)
		}
		if e, err := envelope.Decode(got); err != nil || string(e.Value) != k || e.Fence != f {
			t.Fatalf("the replica holds %+v, %v for %q right after Set returned; want its value under fence %d", e, err, k, f)
		}
		if err := r.Invalidate(ctx, k); err != nil {
			t.Fatalf("Invalidate: %v", err)
		}
		if got, err := replica.Get(ctx, n.Value).Result(); !errors.Is(err, redis.Nil) {
			t.Fatalf("the replica holds %q, %v for %q right after Invalidate returned; want nothing", got, err, k)
		}
	}
	for name, err := range changes(ctx, r, "all") {
		if err != nil {
			t.Errorf("%s with a replica in sync: %v", name, err)
		}
	}
	gen, err := replica.Get(ctx, r.space.Generation()).Uint64()
	if err != nil || gen != r.gen.Load() {
		t.Errorf("the replica's generation = %d, %v right after InvalidateAll returned; want %d", gen, err, r.gen.Load())
	}

	// One replica cannot acknowledge for two.
	r2 := newRemote(t, ackClient(t, master), Options{AckReplicas: 2, AckTimeout: 50 * time.Millisecond})
	_, err = r2.Set(ctx, "two", fresh("v"), time.Hour)
	if !errors.Is(err, ErrNotAcknowledged) || !strings.Contains(err.Error(), "1 of 2 within 50ms") {
		t.Fatalf("Set waiting for 2 replicas of 1: %v; want ErrNotAcknowledged, 1 of 2 within 50ms", err)
	}
}

// With the replica frozen (SIGSTOP), every change fails with
// ErrNotAcknowledged once AckTimeout has passed, not at the call's
// deadline; once the replica runs again, changes succeed.
func TestAckReplicaFrozen(t *testing.T) {
	t.Parallel()
	master := redistest.Server(t)
	replica := redistest.Replica(t, master)
	const ackTimeout = 300 * time.Millisecond
	r := newRemote(t, ackClient(t, master), Options{AckReplicas: 1, AckTimeout: ackTimeout})
	ctx := t.Context()
	replica.Pause()
	for name, err := range timedChanges(t, ctx, r, ackTimeout) {
		if !errors.Is(err, ErrNotAcknowledged) || !strings.Contains(err.Error(), "0 of 1 within 300ms") {
			t.Errorf("%s with the replica frozen: %v; want ErrNotAcknowledged, 0 of 1 within 300ms", name, err)
		}
	}
	replica.Resume()
	// The resumed replica first catches up on what it missed; on a loaded
	// machine that can take longer than AckTimeout. WAIT on the master,
	// with a generous timeout, returns once it has.
	if n, err := ackClient(t, master).Do(ctx, "WAIT", 1, 30_000).Int(); err != nil || n != 1 {
		t.Fatalf("WAIT for the resumed replica = %d, %v; want 1", n, err)
	}
	for name, err := range changes(ctx, r, "k") {
		if err != nil {
			t.Errorf("%s with the replica running again: %v", name, err)
		}
	}
}

// timedChanges is changes, checking that each took at least ackTimeout
// (WAIT waited) and logging how long.
func timedChanges(t *testing.T, ctx context.Context, r *Remote, ackTimeout time.Duration) map[string]error {
	t.Helper()
	errs := make(map[string]error)
	for name, call := range map[string]func() error{
		"Set":           func() error { _, err := r.Set(ctx, "k", fresh("v"), time.Hour); return err },
		"MarkStale":     func() error { _, err := r.MarkStale(ctx, "k"); return err },
		"Invalidate":    func() error { return r.Invalidate(ctx, "k") },
		"InvalidateTag": func() error { _, err := r.InvalidateTag(ctx, "tag"); return err },
		"InvalidateAll": func() error { return r.InvalidateAll(ctx) },
	} {
		began := time.Now()
		errs[name] = call()
		took := time.Since(began)
		if took < ackTimeout {
			t.Errorf("%s returned after %v, before AckTimeout %v", name, took, ackTimeout)
		}
		t.Logf("%s: %v after %v", name, errs[name], took)
	}
	return errs
}

// On a Cluster, each change waits for the replica of the master of its
// key's slot: with one master's replica frozen, the changes of keys that
// master holds fail with ErrNotAcknowledged, and those of keys the others
// hold succeed.
func TestAckCluster(t *testing.T) {
	t.Parallel()
	c := redistest.ReplicatedCluster(t)
	cc := redis.NewClusterClient(&redis.ClusterOptions{Addrs: c.Addrs(), ContextTimeoutEnabled: true, ReadTimeout: -1})
	t.Cleanup(func() { _ = cc.Close() })
	// A running replica acknowledges as soon as it gets the CPU, which a
	// loaded machine may not give it within a short AckTimeout: the
	// changes that must succeed wait long (r), those of the master whose
	// replica is frozen, which must fail, wait briefly (short).
	r := newRemote(t, cc, Options{AckReplicas: 1, AckTimeout: 10 * time.Second})
	short := newRemote(t, cc, Options{AckReplicas: 1, AckTimeout: 300 * time.Millisecond})
	ctx := t.Context()

	// owner returns the index of the master that holds name.
	owner := func(name string) int {
		t.Helper()
		m, err := cc.MasterForKey(ctx, name)
		if err != nil {
			t.Fatalf("MasterForKey(%q): %v", name, err)
		}
		for i, n := range c.Nodes {
			if n.Addr == m.Options().Addr {
				return i
			}
		}
		t.Fatalf("%q is on %s, not a master of the cluster", name, m.Options().Addr)
		return -1
	}
	// One key and one tag on each master.
	keys, tags := make([]string, len(c.Nodes)), make([]string, len(c.Nodes))
	for i := 0; slices.Contains(keys, "") || slices.Contains(tags, ""); i++ {
		k := fmt.Sprint("k", i)
		if n, _ := r.names(ctx, "test", k); keys[owner(n.Value)] == "" {
			keys[owner(n.Value)] = k
		}
		if tags[owner(r.space.TagName(k))] == "" {
			tags[owner(r.space.TagName(k))] = k
		}
	}
	perMaster := func(r *Remote, i int) map[string]error {
		errs := make(map[string]error)
		_, errs["Set"] = r.Set(ctx, keys[i], fresh("v"), time.Hour)
		_, errs["MarkStale"] = r.MarkStale(ctx, keys[i])
		errs["Invalidate"] = r.Invalidate(ctx, keys[i])
		_, errs["InvalidateTag"] = r.InvalidateTag(ctx, tags[i])
		if i == owner(r.space.Generation()) {
			errs["InvalidateAll"] = r.InvalidateAll(ctx)
		}
		return errs
	}
	for i := range c.Nodes {
		for name, err := range perMaster(r, i) {
			if err != nil {
				t.Errorf("%s on master %d with every replica running: %v", name, i, err)
			}
		}
	}

	frozen := owner(r.space.Generation()) // InvalidateAll's key is there too
	c.Replicas[frozen].Pause()
	t.Cleanup(c.Replicas[frozen].Resume)
	for i := range c.Nodes {
		rr := r
		if i == frozen {
			rr = short
		}
		for name, err := range perMaster(rr, i) {
			switch {
			case i == frozen && !errors.Is(err, ErrNotAcknowledged):
				t.Errorf("%s on master %d, whose replica is frozen: %v; want ErrNotAcknowledged", name, i, err)
			case i != frozen && err != nil:
				t.Errorf("%s on master %d, whose replica runs: %v", name, i, err)
			}
		}
	}
	c.Replicas[frozen].Resume()

	// A manual failover moves a master's slots to its replica: a change
	// sent to the old master meets MOVED and fails with it, and go-redis
	// reloads its slot map, so that a later change reaches the new one.
	moved := (frozen + 1) % len(c.Nodes)
	promoted := c.Replicas[moved].Client()
	if err := promoted.Do(ctx, "CLUSTER", "FAILOVER").Err(); err != nil {
		t.Fatalf("CLUSTER FAILOVER: %v", err)
	}
	for i := 0; ; i++ {
		info, err := promoted.Info(ctx, "replication").Result()
		if err == nil && strings.Contains(info, "role:master") {
			break
		}
		if i == 1000 {
			t.Fatalf("the replica of master %d is no master 10s after CLUSTER FAILOVER: %v\n%s", moved, err, info)
		}
		time.Sleep(10 * time.Millisecond) // polls the replica
	}
	for i := 0; ; i++ {
		_, err := r.Set(ctx, keys[moved], fresh("v"), time.Hour)
		if err == nil {
			t.Logf("Set succeeded at attempt %d after the failover", i+1)
			break
		}
		t.Logf("Set %d after the failover: %v", i, err)
		if !strings.Contains(err.Error(), "MOVED") || i == 100 {
			t.Fatalf("Set %d after the failover: %v; want MOVED until go-redis has reloaded its slot map, then success", i, err)
		}
		time.Sleep(100 * time.Millisecond) // go-redis reloads in the background
	}
}
