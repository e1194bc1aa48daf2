package redisfleet_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/herdcache/herd"
	"github.com/herdcache/herd/redisstore/internal/redistest"
)

// replyCount is a go-redis hook that counts the replies starting with
// prefix that commands end with, as the client's caller sees them.
type replyCount struct {
	prefix string
	n      atomic.Int64
}

func (h *replyCount) note(err error) {
	if err != nil && strings.Contains(err.Error(), h.prefix) {
		h.n.Add(1)
	}
}

func (h *replyCount) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h *replyCount) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		err := next(ctx, cmd)
		h.note(err)
		return err
	}
}

func (h *replyCount) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		err := next(ctx, cmds)
		for _, c := range cmds {
			h.note(c.Err())
		}
		return err
	}
}

// slotOf returns the Cluster hash slot of a cache key's Redis keys: that of
// its hash tag, the first 8 bytes of the key's SHA-256 in hex.
func slotOf(ctx context.Context, t *testing.T, cl *redis.ClusterClient, key string) int64 {
	t.Helper()
	slot, err := cl.ClusterKeySlot(ctx, "{"+tagOf(key)+"}").Result()
	if err != nil {
		t.Fatal(err)
	}
	return slot
}

// expiries groups load start times (sorted) into expiries: a load that
// starts more than gap after the one before starts a new expiry. It
// returns the number of loads in each.
func expiries(starts []time.Duration, gap time.Duration) []int {
	var out []int
	for i, s := range starts {
		if i == 0 || s-starts[i-1] > gap {
			out = append(out, 0)
		}
		out[len(out)-1]++
	}
	return out
}

// A hot key's slot migrates to another master, in three phases of two
// expiries each, while several caches, each with its own ClusterClient and
// Remote, read the key: the slot held MIGRATING on its master and
// IMPORTING on the target with every key still on the source (the lease
// key, absent while no load runs, makes the three-key scripts meet
// TRYAGAIN), then with the keys moved to the target (MIGRATE), then
// assigned to the target (SETSLOT NODE). Each expiry makes one load
// fleet-wide, and no Get fails.
func TestMigratingSlotOneLoadPerExpiry(t *testing.T) {
	c := redistest.Cluster(t)
	hook := &replyCount{prefix: "TRYAGAIN"}
	newClient := func() redis.UniversalClient {
		cl := c.Client()
		cl.AddHook(hook)
		return cl
	}
	const (
		ttl     = time.Second
		load    = 100 * time.Millisecond
		caches  = 4
		readers = 3
		phase   = 2 * ttl
	)
	rs := fleet(t, caches, newClient, func(o *herd.Options[string]) {
		o.SoftTTL = ttl
		o.HardTTL = 2 * ttl
	})
	ctx := t.Context()
	key := "hot"
	admin := c.Client()
	slot := slotOf(ctx, t, admin, key)
	master, err := admin.MasterForKey(ctx, fmt.Sprintf("{%s}", tagOf(key)))
	if err != nil {
		t.Fatal(err)
	}
	var source, target *redistest.Node
	for _, n := range c.Nodes {
		switch {
		case n.Addr == master.Options().Addr:
			source = n
		case target == nil:
			target = n
		}
	}
	id := func(n *redistest.Node) string {
		s, err := n.Client().ClusterMyID(ctx).Result()
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	sourceID, targetID := id(source), id(target)

	var (
		mu     sync.Mutex
		starts []time.Duration
		begin  = time.Now()
	)
	loadFn := func(ctx context.Context) (string, error) {
		mu.Lock()
		starts = append(starts, time.Since(begin))
		n := len(starts)
		mu.Unlock()
		select {
		case <-time.After(load):
		case <-ctx.Done():
			return "", ctx.Err()
		}
		return fmt.Sprint("v", n), nil
	}
	// The key is cached before the migration starts.
	if _, err := rs[0].cache.Get(ctx, key, loadFn); err != nil {
		t.Fatal(err)
	}
	if err := target.Client().Do(ctx, "CLUSTER", "SETSLOT", slot, "IMPORTING", sourceID).Err(); err != nil {
		t.Fatal(err)
	}
	if err := source.Client().Do(ctx, "CLUSTER", "SETSLOT", slot, "MIGRATING", targetID).Err(); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	starts = starts[:0]
	begin = time.Now()
	mu.Unlock()

	run, stop := context.WithCancel(ctx)
	var wg sync.WaitGroup
	var getErrs atomic.Int64
	for _, r := range rs {
		for range readers {
			wg.Go(func() {
				for run.Err() == nil {
					if _, err := r.cache.Get(run, key, loadFn); err != nil && run.Err() == nil {
						getErrs.Add(1)
					}
					time.Sleep(time.Millisecond) // paces the reader
				}
			})
		}
	}
	time.Sleep(phase) // MIGRATING, every key on the source
	tryAgainBefore := hook.n.Load()
	keys, err := source.Client().ClusterGetKeysInSlot(ctx, int(slot), 100).Result()
	if err != nil {
		t.Fatal(err)
	}
	host, port, _ := strings.Cut(target.Addr, ":")
	args := []any{"MIGRATE", host, port, "", 0, 5000, "KEYS"}
	for _, k := range keys {
		args = append(args, k)
	}
	if err := source.Client().Do(ctx, args...).Err(); err != nil {
		t.Fatal(err)
	}
	time.Sleep(phase) // MIGRATING, the keys moved
	for _, n := range c.Nodes {
		if err := n.Client().Do(ctx, "CLUSTER", "SETSLOT", slot, "NODE", targetID).Err(); err != nil {
			t.Fatal(err)
		}
	}
	time.Sleep(phase) // moved
	stop()
	wg.Wait()

	mu.Lock()
	defer mu.Unlock()
	slices.Sort(starts)
	loads := expiries(starts, ttl/2)
	t.Logf("loads per expiry through the migration: %v (load start times %v); %d keys moved; TRYAGAIN replies %d with the keys on the source, %d after; %d Gets failed",
		loads, starts, len(keys), tryAgainBefore, hook.n.Load()-tryAgainBefore, getErrs.Load())
	if tryAgainBefore == 0 {
		t.Error("no TRYAGAIN while the slot was MIGRATING: the migration did not reach the key's scripts")
	}
	for i, n := range loads {
		if n > 1 {
			t.Errorf("expiry %d made %d loads, want 1", i, n)
		}
	}
	if len(loads) < 4 {
		t.Errorf("%d expiries with a load in %v, want at least 4", len(loads), 3*phase)
	}
	if n := getErrs.Load(); n != 0 {
		t.Errorf("%d Gets failed", n)
	}
}

// tagOf returns the hash tag of a cache key's Redis keys.
func tagOf(key string) string {
	sum := sha256.Sum256([]byte(key))
	return hex.EncodeToString(sum[:8])
}
