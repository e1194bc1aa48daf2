package redisfleet_test

import (
	"bytes"
	"context"
	"errors"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/herdcache/herd"
	"github.com/herdcache/herd/redisstore/internal/redistest"
	"github.com/herdcache/herd/remote"
)

// proofs counts what a SubscribeLive subscription of a Remote gets: proofs
// of liveness and zero Notices, each also signalled on a channel.
type proofs struct {
	live, lost atomic.Int64
	liveC      chan struct{}
	lostC      chan struct{}
}

func watchProofs(t *testing.T, r remote.LiveNotifier) *proofs {
	p := &proofs{liveC: make(chan struct{}, 1024), lostC: make(chan struct{}, 1024)}
	stop := r.SubscribeLive(func(n remote.Notice) {
		switch {
		case !n.Live.IsZero():
			p.live.Add(1)
			select {
			case p.liveC <- struct{}{}:
			default:
			}
		case n == (remote.Notice{}):
			p.lost.Add(1)
			select {
			case p.lostC <- struct{}{}:
			default:
			}
		}
	})
	t.Cleanup(stop)
	return p
}

// next waits for the next proof of liveness, within bound.
func (p *proofs) next(t *testing.T, c chan struct{}, what string) {
	t.Helper()
	select {
	case <-c:
	case <-time.After(20 * time.Second):
		t.Fatalf("no %s within 20s", what)
	}
}

// getCounter counts the GETs a client sends (Store reads).
type getCounter struct{ n atomic.Int64 }

func (*getCounter) DialHook(next redis.DialHook) redis.DialHook { return next }
func (g *getCounter) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if cmd.Name() == "get" {
			g.n.Add(1)
		}
		return next(ctx, cmd)
	}
}
func (g *getCounter) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

// liveFleet returns one replica over node whose Remote has the given
// LivePeriod, with a GET counter on its client and its SubscribeLive
// watched, tuned by tune; replicas of one test share their keys and
// channel.
func liveFleet(t *testing.T, newClient func() redis.UniversalClient, live time.Duration, tune func(*herd.Options[string])) (*replica, *getCounter, *proofs) {
	t.Helper()
	remoteLive.Store(t.Name(), live)
	defer remoteLive.Delete(t.Name())
	g := &getCounter{}
	r := fleet(t, 1, func() redis.UniversalClient {
		c := newClient()
		c.AddHook(g)
		return c
	}, tune)[0]
	return r, g, watchProofs(t, r.remote)
}

func constant(v string) herd.LoadFunc[string] {
	return func(context.Context) (string, error) { return v, nil }
}

// TestLiveTrust reads one key on two replicas, one whose Remote publishes
// heartbeats (LivePeriod 250ms) and one whose does not, with NearTTL 50ms,
// every 10ms for eight heartbeats: the live replica reads Redis a few
// times at most (a late heartbeat on a loaded machine lapses its trust),
// the other about once per NearTTL.
func TestLiveTrust(t *testing.T) {
	node := redistest.Server(t)
	tune := func(o *herd.Options[string]) {
		o.SoftTTL, o.HardTTL = time.Minute, time.Minute
		o.NearTTL = 50 * time.Millisecond
	}
	live, liveGets, lp := liveFleet(t, func() redis.UniversalClient { return node.Client() }, 250*time.Millisecond, tune)
	plain, plainGets, pp := liveFleet(t, func() redis.UniversalClient { return node.Client() }, 0, tune)
	key := herd.Key("live", "trust")
	mustGet(t, live.cache, key, constant("v1"), "v1")
	waitStored(t, plain.cache, key)
	mustGet(t, live.cache, key, nil, "v1")
	lp.next(t, lp.liveC, "proof of liveness") // the copy is covered from here on
	liveBefore, plainBefore := liveGets.n.Load(), plainGets.n.Load()

	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for seen := lp.live.Load(); lp.live.Load() < seen+8; {
		select {
		case <-tick.C:
		case <-time.After(20 * time.Second):
			t.Fatalf("%d proofs of liveness in 20s, want 8", lp.live.Load()-seen)
		}
		mustGet(t, live.cache, key, nil, "v1")
		mustGet(t, plain.cache, key, nil, "v1")
	}
	lg, pg := liveGets.n.Load()-liveBefore, plainGets.n.Load()-plainBefore
	t.Logf("over 8 heartbeats: %d Redis reads by the live replica, %d by the other; %d zero Notices", lg, pg, lp.lost.Load())
	if lg > 3 {
		t.Errorf("the live replica read Redis %d times, want at most 3", lg)
	}
	if pg < 10 {
		t.Errorf("the replica without heartbeats read Redis %d times, want at least 10 (once per NearTTL): nothing compared", pg)
	}
	if n := pp.live.Load(); n != 0 {
		t.Errorf("a Remote without LivePeriod handed out %d proofs, want 0", n)
	}
}

// mustGet gets key from c and fails the test unless it is want. A nil load
// fails the test when called.
func mustGet(t *testing.T, c *herd.Cache[string], key string, load herd.LoadFunc[string], want string) {
	t.Helper()
	if load == nil {
		load = func(context.Context) (string, error) {
			t.Errorf("Get(%q) loaded, want %q from Redis", key, want)
			return "loaded", nil
		}
	}
	v, err := getWithin(t, c, key, load)
	if err != nil || v != want {
		t.Fatalf("Get(%q) = %q, %v; want %q", key, v, err, want)
	}
}

// waitStored waits until c reads key from Redis instead of loading it: the
// write-back of the first load has landed.
func waitStored(t *testing.T, c *herd.Cache[string], key string) {
	t.Helper()
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	deadline := time.After(20 * time.Second)
	for {
		var loaded atomic.Bool
		v, err := getWithin(t, c, key, func(context.Context) (string, error) {
			loaded.Store(true)
			return "", errNotYet
		})
		if err == nil && !loaded.Load() && v != "" {
			return
		}
		select {
		case <-tick.C:
		case <-deadline:
			t.Fatalf("%q was not in Redis within 20s", key)
		}
	}
}

var errNotYet = errors.New("not written back yet")

// subRelay forwards TCP connections to target and can freeze what Redis
// sends on the connections that subscribed (whose client sent SUBSCRIBE):
// a subscription that hears nothing more, while commands go through.
type subRelay struct {
	ln     net.Listener
	target string
	frozen atomic.Bool
	wg     sync.WaitGroup

	mu    sync.Mutex
	conns []net.Conn
}

func startSubRelay(t *testing.T, target string) *subRelay {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	r := &subRelay{ln: ln, target: target}
	r.wg.Go(r.accept)
	t.Cleanup(func() {
		_ = r.ln.Close()
		r.mu.Lock()
		for _, c := range r.conns {
			_ = c.Close()
		}
		r.mu.Unlock()
		r.wg.Wait()
	})
	return r
}

func (r *subRelay) accept() {
	for {
		down, err := r.ln.Accept()
		if err != nil {
			return
		}
		up, err := net.Dial("tcp", r.target)
		if err != nil {
			_ = down.Close()
			continue
		}
		r.mu.Lock()
		r.conns = append(r.conns, down, up)
		r.mu.Unlock()
		var subscribed atomic.Bool
		r.wg.Go(func() {
			r.pump(up, down, func(b []byte) { // client to Redis
				if bytes.Contains(bytes.ToLower(b), []byte("subscribe")) {
					subscribed.Store(true)
				}
			}, nil)
		})
		r.wg.Go(func() {
			r.pump(down, up, nil, func() bool { // Redis to client
				return subscribed.Load() && r.frozen.Load()
			})
		})
	}
}

// pump copies src to dst, showing what it reads to see, and dropping it
// while drop reports true.
func (r *subRelay) pump(dst, src net.Conn, see func([]byte), drop func() bool) {
	defer func() { _ = dst.Close() }()
	buf := make([]byte, 64<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			if see != nil {
				see(buf[:n])
			}
			if drop == nil || !drop() {
				if _, werr := dst.Write(buf[:n]); werr != nil {
					return
				}
			}
		}
		if err != nil {
			return
		}
	}
}

func (r *subRelay) addr() string { return r.ln.Addr().String() }

// staleness reads key on c every 5ms from the instant changed until it
// returns want, and returns how long after changed the last Get that
// returned something else began.
func staleness(t *testing.T, c *herd.Cache[string], key, want string, changed time.Time) time.Duration {
	t.Helper()
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	var last time.Duration
	for {
		begin := time.Now()
		v, err := getWithin(t, c, key, constant("loaded"))
		if err != nil {
			t.Fatal(err)
		}
		if v == want {
			return last
		}
		last = begin.Sub(changed)
		if last > 20*time.Second {
			t.Fatalf("Get(%q) still %q 20s after the change to %q", key, v, want)
		}
		<-tick.C
	}
}

// TestClusterNoProofs reads one key every 10ms, a hundred times, on a
// replica over the 3-master Cluster whose Remote is given LivePeriod 250ms,
// with NearTTL 50ms. A Cluster hands out no proof of liveness (see "A live
// channel" in the redisstore package doc), so the replica trusts its copy
// only until NearTTL, and reads Redis about once per NearTTL: twenty times
// in a second, at least ten here.
func TestClusterNoProofs(t *testing.T) {
	cluster := redistest.Cluster(t)
	r, gets, p := liveFleet(t, func() redis.UniversalClient { return cluster.Client() }, 250*time.Millisecond, func(o *herd.Options[string]) {
		o.SoftTTL, o.HardTTL = time.Minute, time.Minute
		o.NearTTL = 50 * time.Millisecond
	})
	key := herd.Key("live", "cluster")
	mustGet(t, r.cache, key, constant("v1"), "v1")
	before, began := gets.n.Load(), time.Now()
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for range 100 {
		<-tick.C
		mustGet(t, r.cache, key, nil, "v1")
	}
	n := gets.n.Load() - before
	t.Logf("%d Redis reads in %v of reads every 10ms; %d proofs of liveness, %d zero Notices", n, time.Since(began).Round(time.Millisecond), p.live.Load(), p.lost.Load())
	if n < 10 {
		t.Errorf("the replica read Redis %d times, want at least 10 (once per NearTTL)", n)
	}
	if m := p.live.Load(); m != 0 {
		t.Errorf("a Remote over a Cluster handed out %d proofs of liveness, want 0", m)
	}
}

// TestClusterFallbackOnDroppedNotices routes one replica's connections to
// each node of the 3-master Cluster through a relay, freezes what the nodes
// send its subscriptions once it has heard a notice of the key, and changes
// the key on another replica: the frozen replica hears nothing of the
// change, and no Get of it begun later than 2×NearTTL after the change
// returns the old value, the bound the redisstore package doc gives for a
// lost notice where no proof of liveness holds.
func TestClusterFallbackOnDroppedNotices(t *testing.T) {
	const (
		near  = 100 * time.Millisecond
		slack = 20 * time.Millisecond
	)
	cluster := redistest.Cluster(t)
	relays := make(map[string]*subRelay)
	for _, a := range cluster.Addrs() {
		relays[a] = startSubRelay(t, a)
	}
	tune := func(o *herd.Options[string]) {
		o.SoftTTL, o.HardTTL = time.Minute, time.Minute
		o.NearTTL = near
	}
	frozen := fleet(t, 1, func() redis.UniversalClient {
		c := redis.NewClusterClient(&redis.ClusterOptions{
			Addrs:                 cluster.Addrs(),
			ContextTimeoutEnabled: true,
			Dialer: func(ctx context.Context, network, addr string) (net.Conn, error) {
				if r, ok := relays[addr]; ok {
					addr = r.addr()
				}
				var d net.Dialer
				return d.DialContext(ctx, network, addr)
			},
		})
		t.Cleanup(func() { _ = c.Close() })
		return c
	}, tune)[0]
	other := fleet(t, 1, func() redis.UniversalClient { return cluster.Client() }, tune)[0]
	key := herd.Key("live", "cluster-dropped")
	mustGet(t, other.cache, key, constant("v1"), "v1")
	waitStored(t, frozen.cache, key)
	mustGet(t, frozen.cache, key, nil, "v1")

	// The frozen replica's subscription of the key's channel is up once it
	// has taken a changed value from a notice.
	if err := other.cache.Set(context.Background(), key, "v1b"); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(20 * time.Second); frozen.cache.Stats().NoticeValuesAdopted == 0; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the replica behind the relays took no value from a notice within 20s")
		}
	}
	mustGet(t, frozen.cache, key, nil, "v1b")

	for _, r := range relays {
		r.frozen.Store(true)
	}
	adopted := frozen.cache.Stats().NoticeValuesAdopted
	changed := time.Now()
	if err := other.cache.Set(context.Background(), key, "v2"); err != nil {
		t.Fatal(err)
	}
	stale := staleness(t, frozen.cache, key, "v2", changed)
	t.Logf("the frozen replica served the old value to Gets begun up to %v after the change; bound %v", stale, 2*near)
	if stale > 2*near+slack {
		t.Errorf("a Get begun %v after the change returned the old value, want none past %v", stale, 2*near)
	}
	if n := frozen.cache.Stats().NoticeValuesAdopted - adopted; n != 0 {
		t.Errorf("the frozen replica took %d values from notices after the freeze, want 0: its notices were not dropped", n)
	}
}

// TestLiveFallbackOnDroppedNotices freezes what Redis sends to one
// replica's subscription, through a relay, after a proof of liveness, and
// changes the key on another replica: the frozen replica hears neither
// the notice nor any later heartbeat, and no Get of it that began later
// than the bound the docs give after the change (2P + 2×NearTTL) returns
// the old value.
func TestLiveFallbackOnDroppedNotices(t *testing.T) {
	const (
		period = 200 * time.Millisecond
		near   = 100 * time.Millisecond
		// slack covers the hit path's clock resolution and the
		// millisecond Redis' TIME is truncated to.
		slack = 20 * time.Millisecond
	)
	node := redistest.Server(t)
	rl := startSubRelay(t, node.Addr)
	tune := func(o *herd.Options[string]) {
		o.SoftTTL, o.HardTTL = time.Minute, time.Minute
		o.NearTTL = near
	}
	frozen, _, fp := liveFleet(t, func() redis.UniversalClient {
		c := redis.NewClient(&redis.Options{Addr: rl.addr(), ContextTimeoutEnabled: true})
		t.Cleanup(func() { _ = c.Close() })
		return c
	}, period, tune)
	other, _, _ := liveFleet(t, func() redis.UniversalClient { return node.Client() }, period, tune)
	key := herd.Key("live", "dropped")
	mustGet(t, other.cache, key, constant("v1"), "v1")
	waitStored(t, frozen.cache, key)
	fp.next(t, fp.liveC, "proof of liveness")

	rl.frozen.Store(true)
	seen := fp.live.Load()
	changed := time.Now()
	if err := other.cache.Set(context.Background(), key, "v2"); err != nil {
		t.Fatal(err)
	}
	stale := staleness(t, frozen.cache, key, "v2", changed)
	bound := 2*period + 2*near
	t.Logf("the frozen replica served the old value to Gets begun up to %v after the change; bound %v", stale, bound)
	if stale > bound+slack {
		t.Errorf("a Get begun %v after the change returned the old value, want none past %v", stale, bound)
	}
	if n := fp.live.Load() - seen; n > 1 { // one may have been on its way
		t.Errorf("%d proofs of liveness reached the frozen subscription", n)
	}
}

// TestLiveKilledSubscription kills the subscriptions' connections (CLIENT
// KILL TYPE pubsub) and changes the key before they come back: the
// reconnection hands the zero Notice, and the replica that missed the
// change serves it within the bound the docs give.
func TestLiveKilledSubscription(t *testing.T) {
	const (
		period = 200 * time.Millisecond
		near   = 100 * time.Millisecond
		slack  = 20 * time.Millisecond
	)
	node := redistest.Server(t)
	tune := func(o *herd.Options[string]) {
		o.SoftTTL, o.HardTTL = time.Minute, time.Minute
		o.NearTTL = near
	}
	killed, _, kp := liveFleet(t, func() redis.UniversalClient { return node.Client() }, period, tune)
	other, _, _ := liveFleet(t, func() redis.UniversalClient { return node.Client() }, period, tune)
	key := herd.Key("live", "killed")
	mustGet(t, other.cache, key, constant("v1"), "v1")
	waitStored(t, killed.cache, key)
	kp.next(t, kp.liveC, "proof of liveness")

	admin := node.Client()
	if err := admin.ClientKillByFilter(context.Background(), "TYPE", "pubsub").Err(); err != nil {
		t.Fatal(err)
	}
	changed := time.Now()
	if err := other.cache.Set(context.Background(), key, "v2"); err != nil {
		t.Fatal(err)
	}
	stale := staleness(t, killed.cache, key, "v2", changed)
	bound := 2*period + 2*near
	t.Logf("the replica whose subscription was killed served the old value to Gets begun up to %v after the change; bound %v", stale, bound)
	if stale > bound+slack {
		t.Errorf("a Get begun %v after the change returned the old value, want none past %v", stale, bound)
	}
	kp.next(t, kp.lostC, "zero Notice after the subscription was killed")
	kp.next(t, kp.liveC, "proof of liveness after the reconnection")
}
