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
	sum := sha256.Sum256([]byte(key))
	slot, err := cl.ClusterKeySlot(ctx, "{"+hex.EncodeToString(sum[:8])+"}").Result()
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

// migrating holds the hot key's slot MIGRATING on its master and
// IMPORTING on another while several caches read the key over several
// expiries, and returns the loads of each expiry and the TRYAGAIN replies
// the clients saw.
func migrating(t *testing.T) (loads []int, tryAgain int64) {
	c := redistest.Cluster(t)
	hook := &replyCount{prefix: "TRYAGAIN"}
	newClient := func() redis.UniversalClient {
		cl := c.Client()
		cl.AddHook(hook)
		return cl
	}
	const (
		ttl      = time.Second
		load     = 100 * time.Millisecond
		caches   = 4
		readers  = 3
		duration = 5 * ttl
	)
	rs := fleet(t, caches, newClient, func(o *herd.Options[string]) {
		o.SoftTTL = ttl
		o.HardTTL = 2 * ttl
	})
	ctx := t.Context()
	key := "hot"

	admin := c.Client()
	slot := slotOf(ctx, t, admin, key)
	var source, target *redistest.Node
	for _, n := range c.Nodes {
		slots, err := n.Client().ClusterSlots(ctx).Result()
		if err != nil {
			t.Fatal(err)
		}
		for _, s := range slots {
			if int64(s.Start) <= slot && slot <= int64(s.End) && s.Nodes[0].Addr == n.Addr {
				source = n
			}
		}
	}
	if source == nil {
		t.Fatalf("no master holds slot %d", slot)
	}
	for _, n := range c.Nodes {
		if n != source {
			target = n
			break
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

	run, stop := context.WithTimeout(ctx, duration)
	defer stop()
	var wg sync.WaitGroup
	for _, r := range rs {
		for range readers {
			wg.Go(func() {
				for run.Err() == nil {
					_, _ = r.cache.Get(run, key, loadFn)
					time.Sleep(time.Millisecond) // paces the reader
				}
			})
		}
	}
	wg.Wait()
	mu.Lock()
	defer mu.Unlock()
	slices.Sort(starts)
	return expiries(starts, ttl/2), hook.n.Load()
}

func TestMigratingSlotLoads(t *testing.T) {
	loads, tryAgain := migrating(t)
	t.Logf("loads per expiry with the hot key's slot MIGRATING: %v; TRYAGAIN replies: %d", loads, tryAgain)
}
