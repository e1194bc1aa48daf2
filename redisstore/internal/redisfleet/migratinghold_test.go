package redisfleet_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/herdcache/herd"
	"github.com/herdcache/herd/observe"
	"github.com/herdcache/herd/redisstore"
	"github.com/herdcache/herd/redisstore/internal/redistest"
	"github.com/herdcache/herd/remote"
)

// keyCommands is a go-redis hook that counts the commands a client sends
// that name the Redis key name, by name ("set nx" for a SET with NX),
// pipelined ones included.
type keyCommands struct {
	name string
	mu   sync.Mutex
	n    map[string]int // guarded by mu
}

func (h *keyCommands) note(cmds ...redis.Cmder) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, cmd := range cmds {
		args := cmd.Args()
		if !slices.ContainsFunc(args, func(a any) bool { return fmt.Sprint(a) == h.name }) {
			continue
		}
		what := cmd.Name()
		if what == "set" && slices.ContainsFunc(args[1:], func(a any) bool { return strings.EqualFold(fmt.Sprint(a), "nx") }) {
			what = "set nx"
		}
		if h.n == nil {
			h.n = map[string]int{}
		}
		h.n[what]++
	}
}

// counts returns the commands counted so far.
func (h *keyCommands) counts() map[string]int {
	h.mu.Lock()
	defer h.mu.Unlock()
	out := make(map[string]int, len(h.n))
	for k, v := range h.n {
		out[k] = v
	}
	return out
}

func (h *keyCommands) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h *keyCommands) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		h.note(cmd)
		return next(ctx, cmd)
	}
}

func (h *keyCommands) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		h.note(cmds...)
		return next(ctx, cmds)
	}
}

// holdsHeard is a Remote whose cache's hold announcements are handed on to
// heard once the cache has handled each.
type holdsHeard struct {
	*redisstore.Remote
	heard chan remote.Notice
}

func (h *holdsHeard) SubscribeHolds(fn func(remote.Notice)) (stop func()) {
	return h.Remote.SubscribeHolds(func(n remote.Notice) {
		fn(n)
		select {
		case h.heard <- n:
		default:
		}
	})
}

// waitStarts is a Recorder whose Tracer signals each lease wait of its
// cache as it starts, before the loser waits.
type waitStarts struct {
	observe.NopRecorder
	started chan string
}

func (w waitStarts) StartSpan(ctx context.Context, op, key string) (context.Context, func(error)) {
	if op == "herd.lease_wait" {
		select {
		case w.started <- key:
		default:
		}
	}
	return ctx, func(error) {}
}

// receive returns what ch brings, failing the test if nothing comes within
// a bound far above what the step takes.
func receive[T any](t *testing.T, ch <-chan T, what string) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(10 * time.Second):
		t.Fatalf("no %s within 10s", what)
		panic("unreachable")
	}
}

// While a key's slot is held MIGRATING (its fence key on the source
// master, its value and lease keys on neither), the acquire script meets
// TRYAGAIN and A's lease is taken through the one-key fallback (SET NX on
// the lease key). The fallback still announces the hold: B, with its own
// client and subscription, hears it (Notice.Held) and, when its callers
// miss the key, makes no lease attempt (no command on the lease key) but
// waits for A's notice, which brings it A's value: one load for the fleet.
func TestMigratingSlotHoldHeard(t *testing.T) {
	c := redistest.Cluster(t)
	key := "held"
	lease := names(t, key).Lease
	tryAgain := &replyCount{prefix: "TRYAGAIN"}
	hooks := []*keyCommands{{name: lease}, {name: lease}}
	var made atomic.Int32
	newClient := func() redis.UniversalClient {
		cl := c.Client()
		cl.AddHook(hooks[made.Add(1)-1])
		cl.AddHook(tryAgain)
		return cl
	}
	heard := make(chan remote.Notice, 16)
	waits := make(chan string, 16)
	var tuned atomic.Int32
	rs := fleet(t, 2, newClient, func(o *herd.Options[string]) {
		o.SoftTTL, o.LeaseTTL = time.Minute, 5*time.Second
		if tuned.Add(1) == 2 { // B
			o.Lease = &holdsHeard{Remote: o.Lease.(*redisstore.Remote), heard: heard}
			o.Recorder = waitStarts{started: waits}
		}
	})
	a, b := rs[0], rs[1]
	ctx := t.Context()

	// The key was written and invalidated before the migration: its fence
	// key is on the source, its value and lease keys nowhere.
	if err := a.cache.Set(ctx, key, "old"); err != nil {
		t.Fatal(err)
	}
	if err := a.cache.Invalidate(ctx, key); err != nil {
		t.Fatal(err)
	}
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
	sourceID, err := source.Client().ClusterMyID(ctx).Result()
	if err != nil {
		t.Fatal(err)
	}
	targetID, err := target.Client().ClusterMyID(ctx).Result()
	if err != nil {
		t.Fatal(err)
	}
	if err := target.Client().Do(ctx, "CLUSTER", "SETSLOT", slot, "IMPORTING", sourceID).Err(); err != nil {
		t.Fatal(err)
	}
	if err := source.Client().Do(ctx, "CLUSTER", "SETSLOT", slot, "MIGRATING", targetID).Err(); err != nil {
		t.Fatal(err)
	}

	var loads atomic.Int64
	gate, started := make(chan struct{}), make(chan struct{})
	load := func(who string) herd.LoadFunc[string] {
		return func(ctx context.Context) (string, error) {
			loads.Add(1)
			if who == "A" {
				close(started)
				select {
				case <-gate:
				case <-ctx.Done():
					return "", ctx.Err()
				}
			}
			return "from " + who, nil
		}
	}
	type result struct {
		v   string
		err error
	}
	get := func(r *replica, who string) <-chan result {
		ch := make(chan result, 1)
		go func() {
			v, err := r.cache.Get(context.WithoutCancel(ctx), key, load(who))
			ch <- result{v, err}
		}()
		return ch
	}
	sent := time.Now()
	resA := get(a, "A")
	receive(t, started, "load on A")
	if n := tryAgain.n.Load(); n == 0 {
		t.Fatal("no TRYAGAIN while the slot was MIGRATING: A's lease was not taken through the one-key fallback")
	}
	if n := hooks[0].counts()["set nx"]; n != 1 {
		t.Fatalf("A sent SET NX on the lease key %d times, want 1: the fallback takes the lease", n)
	}
	n := receive(t, heard, "hold announcement on B")
	if n.Key != key || n.Held.Before(sent.Add(5*time.Second)) || n.Held.After(time.Now().Add(5*time.Second)) {
		t.Fatalf("B heard %+v; want the hold of %q for A's 5s lease", n, key)
	}

	// B's callers miss the key while A holds the lease: B waits for A's
	// notice and asks for no lease.
	resB := make([]<-chan result, 3)
	for i := range resB {
		resB[i] = get(b, "B")
	}
	receive(t, waits, "lease wait on B")
	if got := hooks[1].counts(); len(got) != 0 {
		t.Errorf("B sent %v on the lease key while A held it; want nothing", got)
	}
	if st := b.cache.Stats(); st.LeaseHoldsHeard != 1 || st.LeaseAttemptsSkipped != 1 || st.LeaseAcquired+st.LeaseContended != 0 {
		t.Errorf("B's Stats while A holds the lease: LeaseHoldsHeard %d, LeaseAttemptsSkipped %d, LeaseAcquired %d, LeaseContended %d; want 1, 1, 0, 0",
			st.LeaseHoldsHeard, st.LeaseAttemptsSkipped, st.LeaseAcquired, st.LeaseContended)
	}

	close(gate)
	if res := receive(t, resA, "A's Get"); res.err != nil || res.v != "from A" {
		t.Fatalf("A's Get = %q, %v; want \"from A\"", res.v, res.err)
	}
	for _, ch := range resB {
		if res := receive(t, ch, "B's Get"); res.err != nil || res.v != "from A" {
			t.Fatalf("B's Get = %q, %v; want A's value", res.v, res.err)
		}
	}
	if got := hooks[1].counts(); len(got) != 0 {
		t.Errorf("B sent %v on the lease key in all; want nothing", got)
	}
	st := b.cache.Stats()
	if st.LeaseAcquired+st.LeaseContended != 0 || st.WokenByPush+st.WokenByPoll != 1 {
		t.Errorf("B's Stats: LeaseAcquired %d, LeaseContended %d, woken by push %d, by poll %d; want 0, 0, and one wake",
			st.LeaseAcquired, st.LeaseContended, st.WokenByPush, st.WokenByPoll)
	}
	if n := loads.Load(); n != 1 {
		t.Errorf("%d loads of %q across the replicas, want 1", n, key)
	}
	t.Logf("TRYAGAIN replies %d; A's commands on the lease key %v; B woken by push %d, by poll %d",
		tryAgain.n.Load(), hooks[0].counts(), st.WokenByPush, st.WokenByPoll)
}
