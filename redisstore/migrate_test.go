package redisstore

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/herdcache/herd/redisstore/internal/redistest"
	"github.com/herdcache/herd/remote"
	"github.com/herdcache/herd/remote/envelope"
	"github.com/herdcache/herd/remote/keyspace"
)

// splitKey stores value under key through r, takes key's lease (its after
// in the future, so that the fresh value does not stop it) and returns the
// key's names and the lease, then puts the key's slot in MIGRATING with
// its fence key moved to the target and its value and lease left on the
// source: every script on the value or the lease and the fence meets
// TRYAGAIN.
func splitKey(ctx context.Context, t *testing.T, c *redistest.ClusterNodes, r *Remote, key, value string) (keyspace.Names, remote.Grant, *redis.Client, *redis.Client, string) {
	t.Helper()
	if _, err := r.Set(ctx, key, fresh(value), time.Hour); err != nil {
		t.Fatal(err)
	}
	g, err := r.Acquire(ctx, key, time.Minute, time.Now().Add(3*time.Hour))
	if err != nil || g.Token == "" {
		t.Fatalf("Acquire before the migration: %+v, %v; want the lease", g, err)
	}
	n, err := r.names(ctx, "test", key)
	if err != nil {
		t.Fatal(err)
	}
	source, target, targetID := migrate(ctx, t, c, n.Value)
	moveKeys(ctx, t, source, target, n.Fence)
	return n, g, source, target, targetID
}

// loaded returns the value of the envelope stored under key, and whether
// one is stored; it fails the test on an envelope that does not decode.
func loaded(ctx context.Context, t *testing.T, r *Remote, key string) (envelope.Envelope, bool) {
	t.Helper()
	b, err := r.Load(ctx, key)
	if err != nil {
		t.Fatalf("Load: %v", err)
	}
	if b == nil {
		return envelope.Envelope{}, false
	}
	e, err := envelope.Decode(b)
	if err != nil {
		t.Fatalf("Load: %v", err)
	}
	return e, true
}

// While a key's slot migrates with its value and lease on the source
// master and its fence key on the target, the two-key scripts meet
// TRYAGAIN. Set, MarkStale and Invalidate fall back to one-key steps and
// do what they promise; Extend, which has no such steps, is sent again a
// bounded number of times and fails with ErrSlotMigrating (which the
// breaker does not count). Once the slot has moved, Extend works again.
func TestSlotMigratingBoundedRetries(t *testing.T) {
	c := redistest.Cluster(t)
	calls := &callCounter{}
	client := c.Client()
	client.AddHook(calls.hook("cluster"))
	r := newRemote(t, client, Options{Prefix: "migrating:", Timeout: time.Second})
	ctx := t.Context()
	const key = "k"
	n, g, source, target, targetID := splitKey(ctx, t, c, r, key, "a")

	calls.reset()
	start := time.Now()
	_, err := r.Extend(ctx, key, g.Token, time.Minute)
	took := time.Since(start)
	if !errors.Is(err, ErrSlotMigrating) || !errors.Is(err, remote.ErrRejected) {
		t.Fatalf("Extend with the key's fence on the target and its lease on the source: %v; want ErrSlotMigrating and remote.ErrRejected", err)
	}
	sent := calls.counted().alone
	t.Logf("Extend gave up after %v and %v: %v", took, sent, err)
	if tries := sent["evalsha"]; tries < 2 || tries > migratingTries {
		t.Errorf("Extend sent its script %d times, want 2 to %d", tries, migratingTries)
	}

	fence, err := r.Set(ctx, key, fresh("b"), time.Hour)
	if err != nil {
		t.Fatalf("Set on the migrating slot: %v", err)
	}
	if fence <= g.Fence {
		t.Errorf("Set's fence %d, want above the lease's %d", fence, g.Fence)
	}
	if e, ok := loaded(ctx, t, r, key); !ok || string(e.Value) != "b" || e.Fence != fence {
		t.Fatalf("after Set: %q under fence %d (stored %v), want \"b\" under %d", e.Value, e.Fence, ok, fence)
	}
	stale, err := r.MarkStale(ctx, key)
	if err != nil {
		t.Fatalf("MarkStale on the migrating slot: %v", err)
	}
	if e, ok := loaded(ctx, t, r, key); !ok || e.Fence != stale || e.Soft > time.Now().UnixMilli() || string(e.Value) != "b" {
		t.Fatalf("after MarkStale (fence %d): %q, soft %v, fence %d (stored %v); want \"b\" stale under %d", stale, e.Value, time.UnixMilli(e.Soft), e.Fence, ok, stale)
	}
	if err := r.Invalidate(ctx, key); err != nil {
		t.Fatalf("Invalidate on the migrating slot: %v", err)
	}
	if e, ok := loaded(ctx, t, r, key); ok {
		t.Fatalf("after Invalidate: %q is stored", e.Value)
	}

	moveKeys(ctx, t, source, target, n.Lease)
	slot, err := c.Client().ClusterKeySlot(ctx, n.Value).Result()
	if err != nil {
		t.Fatal(err)
	}
	for _, node := range c.Nodes {
		if err := node.Client().Do(ctx, "CLUSTER", "SETSLOT", slot, "NODE", targetID).Err(); err != nil {
			t.Fatal(err)
		}
	}
	if ok, err := r.Extend(ctx, key, g.Token, time.Minute); err != nil || !ok {
		t.Fatalf("Extend once the slot has moved: %v, %v", ok, err)
	}
}

// interleave is a go-redis hook that runs fn once, before the first
// command that runs the script s on the Redis key name is sent.
type interleave struct {
	s    *redis.Script
	name string
	fn   func()
	done atomic.Bool
}

func (h *interleave) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h *interleave) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		args := cmd.Args()
		if len(args) > 3 && fmt.Sprint(args[1]) == h.s.Hash() && fmt.Sprint(args[3]) == h.name && h.done.CompareAndSwap(false, true) {
			h.fn()
		}
		return next(ctx, cmd)
	}
}

func (h *interleave) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

// A write-back split into one-key steps on a migrating slot reads the
// fence, then stores. An Invalidate (itself in one-key steps) that lands
// in between deletes the old value before the write-back stores the one
// it retired: the write-back, reading the fence again, deletes that
// value, reports that it did not write and still releases the lease. An
// undisturbed split write-back writes.
func TestSplitWriteBackRetiredByInvalidate(t *testing.T) {
	c := redistest.Cluster(t)
	ctx := t.Context()
	const key = "k"
	other := newRemote(t, c.Client(), Options{Prefix: "split:"})
	client := c.Client()
	h := &interleave{s: putNewerScript}
	client.AddHook(h)
	r := newRemote(t, client, Options{Prefix: "split:"})
	n, g, _, _, _ := splitKey(ctx, t, c, r, key, "a")
	h.name = n.Value
	h.done.Store(true) // the first write-back is left alone

	wrote, err := r.WriteRelease(ctx, key, fresh("b"), g.Fence, time.Hour, g.Token)
	if err != nil || !wrote {
		t.Fatalf("WriteRelease on the migrating slot: %v, %v; want a write", wrote, err)
	}
	if e, ok := loaded(ctx, t, r, key); !ok || string(e.Value) != "b" || e.Fence != g.Fence {
		t.Fatalf("after the write-back: %q under fence %d (stored %v), want \"b\" under %d", e.Value, e.Fence, ok, g.Fence)
	}

	g, err = r.Acquire(ctx, key, time.Minute, time.Now().Add(3*time.Hour))
	if err != nil || g.Token == "" {
		t.Fatalf("Acquire on the migrating slot: %+v, %v; want the lease", g, err)
	}
	var invalidated error
	h.fn = func() { invalidated = other.Invalidate(ctx, key) }
	h.done.Store(false)
	wrote, err = r.WriteRelease(ctx, key, fresh("c"), g.Fence, time.Hour, g.Token)
	if !h.done.Load() {
		t.Fatal("the write-back stored without the one-key steps")
	}
	if invalidated != nil {
		t.Fatalf("Invalidate between the write-back's fence read and its store: %v", invalidated)
	}
	if err != nil || wrote {
		t.Errorf("WriteRelease with an Invalidate between its fence read and its store: %v, %v; want no write", wrote, err)
	}
	if e, ok := loaded(ctx, t, r, key); ok {
		t.Errorf("after the Invalidate and the write-back it retired: %q under fence %d is stored", e.Value, e.Fence)
	}
	if held, err := c.Client().Exists(ctx, n.Lease).Result(); err != nil || held != 0 {
		t.Errorf("the lease key exists (%d, %v) after the write-back", held, err)
	}
}

// With AckReplicas, a change on a migrating slot waits for the replica of
// the master that holds each key it touches: split into one-key steps
// while the keys are on both masters (TRYAGAIN), and sent after ASKING to
// the target that ASK names once they are all there.
func TestAckSlotMigrating(t *testing.T) {
	c := redistest.ReplicatedCluster(t)
	cc := redis.NewClusterClient(&redis.ClusterOptions{Addrs: c.Addrs(), ContextTimeoutEnabled: true, ReadTimeout: -1})
	t.Cleanup(func() { _ = cc.Close() })
	calls := &callCounter{}
	cc.OnNewNode(func(n *redis.Client) { n.AddHook(calls.hook(n.Options().Addr)) })
	r := newRemote(t, cc, Options{Prefix: "ack:", AckReplicas: 1, AckTimeout: 2 * time.Second})
	ctx := t.Context()
	const key = "k"
	if _, err := r.Set(ctx, key, fresh("a"), time.Hour); err != nil {
		t.Fatal(err)
	}
	n, err := r.names(ctx, "test", key)
	if err != nil {
		t.Fatal(err)
	}
	source, target, _ := migrate(ctx, t, c, n.Value)
	moveKeys(ctx, t, source, target, n.Fence)

	calls.reset()
	fence, err := r.Set(ctx, key, fresh("b"), time.Hour)
	if err != nil {
		t.Fatalf("Set with the value on the source and the fence on the target: %v", err)
	}
	if e, ok := loaded(ctx, t, r, key); !ok || string(e.Value) != "b" || e.Fence != fence {
		t.Fatalf("after Set: %q under fence %d (stored %v), want \"b\" under %d", e.Value, e.Fence, ok, fence)
	}
	got := calls.counted().pipelines
	if got[source.Options().Addr] < 2 || got[target.Options().Addr] < 1 {
		t.Errorf("pipelines (a step and its WAIT each) by node: %v; want the script and the value step on the source %s, the fence step on the target %s", got, source.Options().Addr, target.Options().Addr)
	}
	if _, err := r.MarkStale(ctx, key); err != nil {
		t.Fatalf("MarkStale on the split keys: %v", err)
	}
	if err := r.Invalidate(ctx, key); err != nil {
		t.Fatalf("Invalidate on the split keys: %v", err)
	}
	if e, ok := loaded(ctx, t, r, key); ok {
		t.Fatalf("after Invalidate: %q is stored", e.Value)
	}

	// The value step of this Set stores on the target (ASK): every key is
	// there now, so the next change is sent whole after ASKING.
	if _, err := r.Set(ctx, key, fresh("c"), time.Hour); err != nil {
		t.Fatalf("Set with the fence on the target and no value: %v", err)
	}
	slot, err := cc.ClusterKeySlot(ctx, n.Value).Result()
	if err != nil {
		t.Fatal(err)
	}
	if left, err := source.ClusterCountKeysInSlot(ctx, int(slot)).Result(); err != nil || left != 0 {
		t.Fatalf("%d keys of the slot on the source (%v), want none", left, err)
	}
	calls.reset()
	fence, err = r.Set(ctx, key, fresh("d"), time.Hour)
	if err != nil {
		t.Fatalf("Set with every key on the target: %v", err)
	}
	// One pipeline on the source, answered ASK; one on the target
	// (ASKING, the script, WAIT), and a second if it did not know the
	// script.
	if got := calls.counted().pipelines; got[source.Options().Addr] != 1 || got[target.Options().Addr] < 1 || got[target.Options().Addr] > 2 {
		t.Errorf("pipelines by node: %v; want one on the source %s and one or two on the target %s", got, source.Options().Addr, target.Options().Addr)
	}
	if e, ok := loaded(ctx, t, r, key); !ok || string(e.Value) != "d" || e.Fence != fence {
		t.Fatalf("after Set: %q under fence %d (stored %v), want \"d\" under %d", e.Value, e.Fence, ok, fence)
	}
}

// Batch calls on a migrating slot: AcquireMany and WriteReleaseMany fall
// back to one-key steps for the entries that meet TRYAGAIN, ExtendMany
// retries them a bounded number of times and fails them with
// ErrSlotMigrating; the entries of other slots are answered as usual.
func TestBatchSlotMigrating(t *testing.T) {
	c := redistest.Cluster(t)
	r := newRemote(t, c.Client(), Options{Prefix: "batch:", Timeout: time.Second})
	ctx := t.Context()
	const key = "k"
	// calm is a key of another slot, whose lease r holds.
	calm := ""
	n, g, _, _, _ := splitKey(ctx, t, c, r, key, "a")
	for i := 0; calm == ""; i++ {
		k := fmt.Sprint("calm", i)
		m, err := r.names(ctx, "test", k)
		if err != nil {
			t.Fatal(err)
		}
		a, err1 := c.Client().ClusterKeySlot(ctx, m.Value).Result()
		b, err2 := c.Client().ClusterKeySlot(ctx, n.Value).Result()
		if err := errors.Join(err1, err2); err != nil {
			t.Fatal(err)
		}
		if a != b {
			calm = k
		}
	}
	cg, err := r.Acquire(ctx, calm, time.Minute, time.Time{})
	if err != nil || cg.Token == "" {
		t.Fatalf("Acquire %q: %+v, %v", calm, cg, err)
	}

	ext := r.ExtendMany(ctx, []remote.HeldKey{{Key: key, Token: g.Token}, {Key: calm, Token: cg.Token}}, time.Minute)
	if err := ext[0].Err; !errors.Is(err, ErrSlotMigrating) || !errors.Is(err, remote.ErrRejected) {
		t.Errorf("ExtendMany of the migrating key: %+v; want ErrSlotMigrating and remote.ErrRejected", ext[0])
	}
	if !ext[1].OK || ext[1].Err != nil {
		t.Errorf("ExtendMany of a key of another slot: %+v; want OK", ext[1])
	}

	out := r.WriteReleaseMany(ctx, []remote.HeldWrite{
		{HeldKey: remote.HeldKey{Key: key, Token: g.Token}, Env: fresh("b"), Fence: g.Fence, TTL: time.Hour},
		{HeldKey: remote.HeldKey{Key: calm, Token: cg.Token}, Env: fresh("calm"), Fence: cg.Fence, TTL: time.Hour},
	})
	for i, o := range out {
		if !o.OK || o.Err != nil {
			t.Errorf("WriteReleaseMany entry %d: %+v; want a write", i, o)
		}
	}
	if e, ok := loaded(ctx, t, r, key); !ok || string(e.Value) != "b" {
		t.Fatalf("after WriteReleaseMany: %q (stored %v), want \"b\"", e.Value, ok)
	}

	// The lease was released: a fresh value is found, and an acquisition
	// that wants a fresher one takes the lease, once for the fleet.
	acq := r.AcquireMany(ctx, []remote.LeaseRequest{{Key: key}}, time.Minute)
	if a := acq[0]; a.Err != nil || a.Value == nil {
		t.Fatalf("AcquireMany of the written key: %+v; want its fresh value", a)
	}
	later := time.Now().Add(3 * time.Hour)
	acq = r.AcquireMany(ctx, []remote.LeaseRequest{{Key: key, After: later}, {Key: calm, After: later}}, time.Minute)
	for i, a := range acq {
		if a.Err != nil || a.Token == "" || a.Fence <= g.Fence && i == 0 {
			t.Errorf("AcquireMany entry %d, wanting a newer value: %+v; want the lease under a new fence", i, a)
		}
	}
	again := r.AcquireMany(ctx, []remote.LeaseRequest{{Key: key, After: later}}, time.Minute)
	if a := again[0]; a.Err != nil || a.HeldFor <= 0 {
		t.Errorf("AcquireMany of the migrating key whose lease is held: %+v; want HeldFor", a)
	}
}
