package redisfleet_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/herdcache/herd"
	"github.com/herdcache/herd/redisstore/internal/redistest"
	"github.com/herdcache/herd/remote"
	"github.com/herdcache/herd/remote/keyspace"
)

// errClock is a go-redis hook that notes when commands fail, as the
// caller of the client sees them (after go-redis' own redirections and
// retries). A NOSCRIPT reply, which redis.Script answers by sending the
// script, is not a failure, nor is a missing key, nor the end of the
// caller's context (the test's load stopping with commands in flight; a
// command that the tier gives up on ends at its own deadline, which
// counts).
type errClock struct {
	base  time.Time
	count atomic.Int64
	last  atomic.Int64 // time.Since(base) at the last failure
	err   atomic.Value // the last failure's error text
}

func (h *errClock) note(err error) {
	if err == nil || errors.Is(err, redis.Nil) || redis.HasErrorPrefix(err, "NOSCRIPT") || errors.Is(err, context.Canceled) {
		return
	}
	h.count.Add(1)
	h.last.Store(int64(time.Since(h.base)))
	h.err.Store(err.Error())
}

func (h *errClock) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h *errClock) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		err := next(ctx, cmd)
		h.note(err)
		return err
	}
}

func (h *errClock) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		err := next(ctx, cmds)
		for _, c := range cmds {
			h.note(c.Err())
		}
		return err
	}
}

// The bounds of TestClusterMasterKilled, after the replica's promotion.
// About a second is the aim; these hold on two busy cores under the race
// detector too. A client that waited for go-redis' own reload (once a
// minute) would keep failing for the whole run.
const (
	errorsStopWithin  = 3 * time.Second
	noticesBackWithin = 3 * time.Second
	// afterPromotion is how long the load runs past the promotion.
	afterPromotion = 6 * time.Second
)

// A master of a Cluster with replicas dies (SIGKILL) under the reads of
// several herd caches, each with its own ClusterClient and Remote, and
// while a prober changes keys: the master holds the notice channel's slot
// and shard channels, so every Remote's subscriptions to them break with
// it. Once its replica is promoted, the Remotes' calls stop failing within
// errorsStopWithin, and every Remote hears again, within
// noticesBackWithin, the notices of changes made after the promotion to
// keys of the dead master's slots, which travel on its shard channels.
func TestClusterMasterKilled(t *testing.T) {
	c := redistest.ReplicatedCluster(t)
	remoteTimeouts.Store(t.Name(), 250*time.Millisecond) // calls to the dead master fail fast
	clock := &errClock{base: time.Now()}
	newClient := func() redis.UniversalClient {
		cl := c.Client()
		cl.AddHook(clock)
		return cl
	}
	const replicas = 4
	rs := fleet(t, replicas+1, newClient, func(o *herd.Options[string]) {
		o.SoftTTL = 500 * time.Millisecond
		o.LeaseWait = 2 * time.Second
	})
	prober, rs := rs[replicas], rs[:replicas]

	// The master of the notice channel's slot is the one to die.
	ctx := t.Context()
	channelMaster, err := c.Client().MasterForKey(ctx, fmt.Sprintf("fleet:%s:events", t.Name()))
	if err != nil {
		t.Fatal(err)
	}
	victim := -1
	for i, n := range c.Nodes {
		if n.Addr == channelMaster.Options().Addr {
			victim = i
		}
	}
	if victim < 0 {
		t.Fatalf("the channel's master %s is none of %v", channelMaster.Options().Addr, c.Addrs())
	}
	// onVictim reports whether the Redis names of the encoded key k are on
	// a slot of the master that dies, which its replica takes over.
	shards, err := c.Nodes[victim].Client().ClusterShards(ctx).Result()
	if err != nil {
		t.Fatal(err)
	}
	var victimSlots []redis.SlotRange
	for _, sh := range shards {
		for _, n := range sh.Nodes {
			if n.Role == "master" && fmt.Sprint(n.IP, ":", n.Port) == c.Nodes[victim].Addr {
				victimSlots = sh.Slots
			}
		}
	}
	if len(victimSlots) == 0 {
		t.Fatalf("CLUSTER SHARDS gives %s no slots: %+v", c.Nodes[victim].Addr, shards)
	}
	space, err := keyspace.New(fmt.Sprintf("fleet:%s:", t.Name()))
	if err != nil {
		t.Fatal(err)
	}
	onVictim := func(k string) bool {
		slot := int64(keyspace.Slot(space.Names(k).Value))
		for _, r := range victimSlots {
			if r.Start <= slot && slot <= r.End {
				return true
			}
		}
		return false
	}

	// Every replica notes when it first hears of a change made after the
	// promotion (promoted: time.Since(clock.base), 0 before).
	var (
		promoted atomic.Int64
		setAt    sync.Map // probe key -> time.Since(clock.base) when its Set was sent
		heard    = make([]atomic.Int64, replicas)
	)
	for i, r := range rs {
		stop := r.remote.Subscribe(func(n remote.Notice) {
			sent, ok := setAt.Load(n.Key)
			if p := promoted.Load(); ok && p != 0 && sent.(int64) >= p && heard[i].Load() == 0 && onVictim(n.Key) {
				heard[i].Store(int64(time.Since(clock.base)))
			}
		})
		t.Cleanup(stop)
	}

	run, stopRun := context.WithCancel(ctx)
	var wg sync.WaitGroup
	var getErrs atomic.Int64
	const keys = 24
	for _, r := range rs {
		for g := range 3 {
			wg.Go(func() {
				for i := g; run.Err() == nil; i++ {
					k := fmt.Sprint("read:", i%keys)
					if _, err := r.cache.Get(run, k, func(context.Context) (string, error) { return k, nil }); err != nil && run.Err() == nil {
						getErrs.Add(1)
					}
					time.Sleep(time.Millisecond) // paces the reader
				}
			})
		}
	}
	wg.Go(func() {
		for n := 0; run.Err() == nil; n++ {
			k := fmt.Sprint("probe:", n)
			setAt.Store(k, int64(time.Since(clock.base)))
			_ = prober.cache.Set(run, k, "v")
			time.Sleep(5 * time.Millisecond) // paces the prober
		}
	})

	time.Sleep(time.Second) // reads under way, on every master
	before := clock.count.Load()
	killed := time.Since(clock.base)
	c.Nodes[victim].Kill()
	c.AwaitPromotion(victim)
	p := time.Since(clock.base)
	promoted.Store(int64(p))
	time.Sleep(afterPromotion) // the load runs on past the promotion
	stopRun()
	wg.Wait()

	last := time.Duration(clock.last.Load())
	t.Logf("master %s killed; replica promoted %v later; %d command errors before the kill, %d after; last error %v after the promotion (%v); %d Gets failed",
		c.Nodes[victim].Addr, p-killed, before, clock.count.Load()-before, last-p, clock.err.Load(), getErrs.Load())
	if last-p > errorsStopWithin {
		t.Errorf("commands failed until %v after the promotion, want none past %v", last-p, errorsStopWithin)
	}
	for i := range heard {
		h := time.Duration(heard[i].Load())
		if h == 0 {
			t.Errorf("replica %d heard no notice of a change to the dead master's keys made in the %v after the promotion", i, afterPromotion)
			continue
		}
		t.Logf("replica %d heard a change made after the promotion %v after it", i, h-p)
		if h-p > noticesBackWithin {
			t.Errorf("replica %d heard notices again %v after the promotion, want within %v", i, h-p, noticesBackWithin)
		}
	}
}
