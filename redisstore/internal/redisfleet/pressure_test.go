package redisfleet_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/herdcache/herd"
	"github.com/herdcache/herd/limiter"
	"github.com/herdcache/herd/observe"
	"github.com/herdcache/herd/redisstore"
	"github.com/herdcache/herd/redisstore/internal/redistest"
	"github.com/herdcache/herd/remote/keyspace"
)

// roundTrips is a go-redis hook that counts what a client sends to Redis:
// each command sent alone and each pipeline is one round trip. The pub/sub
// connection's traffic (SUBSCRIBE and the notices it receives) does not pass
// the hooks; only its handshake does, once, when the Remote subscribes.
type roundTrips struct {
	trips atomic.Int64

	mu     sync.Mutex
	byName map[string]int64 // commands by name, pipelined ones included; guarded by mu

	// done, when not nil, is called after each command sent alone, with
	// how long it took and its error. It is set before the client is used.
	done func(cmd redis.Cmder, took time.Duration, err error)
}

func (h *roundTrips) add(cmds ...redis.Cmder) {
	h.trips.Add(1)
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.byName == nil {
		h.byName = map[string]int64{}
	}
	for _, cmd := range cmds {
		h.byName[cmd.Name()]++
	}
}

// count returns how many commands named name the client has sent.
func (h *roundTrips) count(name string) int64 {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.byName[name]
}

func (*roundTrips) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h *roundTrips) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		h.add(cmd)
		start := time.Now()
		err := next(ctx, cmd)
		if h.done != nil {
			h.done(cmd, time.Since(start), err)
		}
		return err
	}
}

func (h *roundTrips) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		h.add(cmds...)
		return next(ctx, cmds)
	}
}

func sumTrips(hs []*roundTrips) (n int64) {
	for _, h := range hs {
		n += h.trips.Load()
	}
	return n
}

// commandstats returns how many calls of each command the server has
// served (INFO commandstats), commands run inside scripts included, and
// their total.
func commandstats(t *testing.T, c redis.UniversalClient) (map[string]int64, int64) {
	t.Helper()
	info, err := c.Info(t.Context(), "commandstats").Result()
	if err != nil {
		t.Fatal(err)
	}
	calls, total := map[string]int64{}, int64(0)
	for line := range strings.SplitSeq(info, "\n") {
		name, rest, ok := strings.Cut(strings.TrimSpace(line), ":calls=")
		name, found := strings.CutPrefix(name, "cmdstat_")
		if !ok || !found {
			continue
		}
		n, err := strconv.ParseInt(rest[:strings.IndexByte(rest, ',')], 10, 64)
		if err != nil {
			t.Fatal(err)
		}
		calls[name] = n
		total += n
	}
	return calls, total
}

// scriptKeys returns the keys an EVALSHA or EVAL command hands its script,
// and whether cmd is such a command.
func scriptKeys(cmd redis.Cmder) ([]string, bool) {
	switch cmd.Name() {
	case "evalsha", "eval":
	default:
		return nil, false
	}
	args := cmd.Args() // name, script or SHA, number of keys, keys, arguments
	if len(args) < 3 {
		return nil, false
	}
	var n int
	switch v := args[2].(type) {
	case int:
		n = v
	case int64:
		n = int(v)
	default:
		return nil, false
	}
	if n < 0 || len(args) < 3+n {
		return nil, false
	}
	keys := make([]string, n)
	for i := range keys {
		keys[i], _ = args[3+i].(string)
	}
	return keys, true
}

// isAcquire reports whether cmd runs the acquire script on the key named n:
// it alone is handed the value, lease and fence keys in that order.
func isAcquire(cmd redis.Cmder, n keyspace.Names) bool {
	keys, ok := scriptKeys(cmd)
	return ok && slices.Equal(keys, []string{n.Value, n.Lease, n.Fence})
}

// Outcomes of the acquire script: it returns {kind, ...}.
const (
	acquireFound   = 1 // a fresh value
	acquireGranted = 2 // the lease and a new fence
	acquireHeld    = 3 // another holder has the lease
)

// acquireOutcome returns the kind of reply an acquire script call got, or 0
// when it failed.
func acquireOutcome(cmd redis.Cmder) int64 {
	c, ok := cmd.(*redis.Cmd)
	if !ok {
		return 0
	}
	res, err := c.Slice()
	if err != nil || len(res) == 0 {
		return 0
	}
	kind, _ := res[0].(int64)
	return kind
}

// troubled reports whether err, returned by a Redis command, is a failure
// a busy machine can cause (a deadline, a dropped connection): not a miss,
// and not the NOSCRIPT reply that makes go-redis send a script in full.
func troubled(err error) bool {
	return err != nil && !errors.Is(err, redis.Nil) && !redis.HasErrorPrefix(err, "NOSCRIPT")
}

// TestLeaseAttemptsPerExpiry offers 20 replicas an open-loop load on one hot
// key, 50 Gets a second each, through several soft expiries, and measures
// what each expiry costs: loads, lease acquisitions and round trips to
// Redis. The physical limit is one load and one acquisition per expiry:
// the replica that takes the lease announces it, and the others, whose
// refreshes wait a random stagger below 100 ms, hear it before they ask.
// The rest of the time a replica serves from memory.
func TestLeaseAttemptsPerExpiry(t *testing.T) { leaseAttemptsPerExpiry(t) }

// TestLeaseAttemptsPerExpiryLive is TestLeaseAttemptsPerExpiry with the
// Remotes' heartbeats on (LivePeriod 1s): the copies are trusted past
// NearTTL, so the replicas read Redis for the changes alone.
func TestLeaseAttemptsPerExpiryLive(t *testing.T) {
	remoteLive.Store(t.Name(), redisstore.DefaultLivePeriod)
	leaseAttemptsPerExpiry(t)
}

func leaseAttemptsPerExpiry(t *testing.T) {
	const (
		replicas  = 20
		rate      = 50 // Gets per second offered to each replica
		run       = 8 * time.Second
		soft      = 2 * time.Second
		recompute = 400 * time.Millisecond
		// inFlight bounds the Gets of one replica running at once, so a
		// stuck replica cannot start more goroutines than the race
		// detector allows; a tick that finds them all running is skipped.
		inFlight = 100
		// maxAcquiresPerExpiry bounds the mean lease acquire calls of a
		// clean expiry: one where announcements arrive in time.
		maxAcquiresPerExpiry = 5
	)
	node := redistest.Server(t)
	key := herd.Key("hot", "attempts")
	n := names(t, key)
	log := &expiryLog{}
	hooks := make([]*roundTrips, 0, replicas)
	rs := fleet(t, replicas, func() redis.UniversalClient {
		c := node.Client()
		h := &roundTrips{done: func(cmd redis.Cmder, _ time.Duration, err error) {
			log.command(cmd, n, err)
		}}
		c.AddHook(h)
		hooks = append(hooks, h)
		return c
	}, func(o *herd.Options[string]) {
		o.SoftTTL, o.HardTTL = soft, 10*time.Second // an 8s stale window
		o.Beta, o.Jitter = 0, 0
		o.NearTTL = time.Second
		o.OnLeaseHeld = herd.ServeStale
		o.LeaseTTL = 2 * time.Second
		o.RefreshBackoff = time.Second
		o.Recorder = log
	})
	loads := make([]herd.LoadFunc[string], replicas)
	for i := range loads {
		loads[i] = func(ctx context.Context) (string, error) {
			start := time.Now()
			select {
			case <-time.After(recompute): // the database
			case <-ctx.Done():
				log.load(i, start, time.Now(), false, recompute)
				return "", ctx.Err()
			}
			end := time.Now()
			log.load(i, start, end, true, recompute)
			return strconv.FormatInt(end.UnixNano(), 10), nil
		}
	}

	// One load fills Redis, every replica reads it once: the run begins
	// with the value fresh everywhere and the connections made.
	for i, r := range rs {
		if _, err := getWithin(t, r.cache, key, loads[i]); err != nil {
			t.Fatalf("warming replica %d: %v", i, err)
		}
	}
	before := make([]observe.Stats, replicas)
	for i, r := range rs {
		before[i] = r.cache.Stats()
	}
	_, serverBefore := commandstats(t, node.Client())
	tripsBefore := sumTrips(hooks)
	from := time.Now()
	log.begin(from)

	var issued, skipped, failed atomic.Int64
	var firstErr atomic.Value
	var gets, pacers sync.WaitGroup
	done := make(chan struct{})
	maxTicks := int((run+soft)/time.Second)*rate + rate
	for i, r := range rs {
		pacers.Add(1)
		go func() {
			defer pacers.Done()
			slots := make(chan struct{}, inFlight)
			tick := time.NewTicker(time.Second / rate)
			defer tick.Stop()
			for range maxTicks {
				select {
				case <-done:
					return
				case <-tick.C:
				}
				select {
				case slots <- struct{}{}:
				default:
					skipped.Add(1)
					continue
				}
				issued.Add(1)
				gets.Add(1)
				go func() {
					defer gets.Done()
					defer func() { <-slots }()
					ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
					defer cancel()
					if _, err := r.cache.Get(ctx, key, loads[i]); err != nil {
						failed.Add(1)
						firstErr.CompareAndSwap(nil, err)
					}
				}()
			}
		}()
	}
	// The run lasts 8s, and longer when an expiry came in its last soft TTL:
	// every expiry judged gets a soft TTL of traffic, time for each
	// replica's refresh and its retries after RefreshBackoff. No expiry can
	// come meanwhile: the value of the last one's load is fresh that long.
	<-time.After(run)
	if es := log.expiries(soft, from, time.Now()); len(es) > 0 {
		if wait := time.Until(es[len(es)-1].Add(soft)); wait > 0 {
			<-time.After(wait)
		}
	}
	stop := time.Now()
	close(done)
	pacers.Wait()
	gets.Wait()
	// Close waits for the refreshes and write-backs still running, so that
	// their Redis calls are counted.
	for i, r := range rs {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		if err := r.cache.Close(ctx); err != nil {
			t.Errorf("closing replica %d: %v", i, err)
		}
		cancel()
	}
	end := time.Now()
	_, serverAfter := commandstats(t, node.Client())
	trips := sumTrips(hooks) - tripsBefore
	server := serverAfter - serverBefore - 1 // less the first INFO
	if n := failed.Load(); n > 0 {
		t.Errorf("%d of %d Gets failed, e.g. %v", n, issued.Load(), firstErr.Load())
	}

	rounds := log.rounds(replicas, soft, from, stop, end)
	if len(rounds) == 0 {
		t.Fatalf("no soft expiry in %v of traffic", stop.Sub(from))
	}
	var leased, waited, revalidated int64
	for i, r := range rs {
		s := r.cache.Stats()
		leased += s.LeaseAcquired + s.LeaseContended - before[i].LeaseAcquired - before[i].LeaseContended
		waited += s.RemoteWaits - before[i].RemoteWaits
		revalidated += s.Revalidations - before[i].Revalidations
	}
	requests := issued.Load()
	totalLoads, totalAcquires := 0, 0
	for _, r := range rounds {
		totalLoads += int(sum(r.loads))
		totalAcquires += r.acquires
	}
	expiries := float64(len(rounds))
	t.Logf("%d replicas, %v of open-loop traffic: %d Gets (%.0f/s offered per replica, %d ticks skipped), %d soft expiries",
		replicas, stop.Sub(from).Round(time.Millisecond), requests, float64(rate), skipped.Load(), len(rounds))
	t.Logf("loads per expiry: %.2f (%d loads)", float64(totalLoads)/expiries, totalLoads)
	out := log.acquireOutcomes()
	t.Logf("lease acquire calls per expiry: %.1f counted by the clients (%d: %d granted, %d found a fresh value, %d found the lease held); %.1f counted by the caches (LeaseAcquired+LeaseContended: %d)",
		float64(totalAcquires)/expiries, totalAcquires, out[acquireGranted], out[acquireFound], out[acquireHeld],
		float64(leased)/expiries, leased)
	t.Logf("Redis round trips per Get: %.4f counted by the clients (%d); server commands per Get: %.4f (INFO commandstats, commands inside scripts included: %d)",
		float64(trips)/float64(requests), trips, float64(server)/float64(requests), server)
	t.Logf("Gets that waited on a Store read: %d; copies replaced by a background read: %d", waited, revalidated)
	if waited != 0 {
		t.Errorf("%d Gets waited on a Store read after warm-up, want 0: past NearTTL and after a notice, copies are replaced in the background", waited)
	}

	clean, degraded, cleanAcquires := 0, 0, 0
	for k, r := range rounds {
		name := fmt.Sprintf("expiry %d (at %v)", k, r.start.Sub(from).Round(time.Millisecond))
		t.Logf("%s: %d loads (per replica: %v), %d acquire calls", name, sum(r.loads), r.loads, r.acquires)
		if !r.degraded {
			clean++
			cleanAcquires += r.acquires
			if got := sum(r.loads); got > 1 {
				t.Errorf("%s: %d loads across %d replicas, want at most 1 (per replica: %v)", name, got, replicas, r.loads)
			}
			continue
		}
		degraded++
		t.Logf("%s: a Redis call failed, a lease was lost, a breaker opened or a load ran late: judged by the degraded bound", name)
		for i, n := range r.loads {
			if n > 1 {
				t.Errorf("%s (degraded): replica %d loaded %d times, want at most 1", name, i, n)
			}
		}
	}
	// At most one expiry in ten, and at least one, may be degraded by a
	// busy machine; one must run clean.
	if allowed := (len(rounds) + 9) / 10; degraded > allowed {
		t.Errorf("%d of %d expiries degraded, want at most %d", degraded, len(rounds), allowed)
	}
	if clean == 0 {
		t.Fatal("every expiry was degraded: nothing judged one load per expiry")
	}
	// On a busy machine an announcement may come late, after a few more
	// staggers have ended; without announcements every replica asked.
	if per := float64(cleanAcquires) / float64(clean); per > maxAcquiresPerExpiry {
		t.Errorf("%.1f lease acquire calls per expiry (clean expiries), want at most %d of the %d replicas", per, maxAcquiresPerExpiry, replicas)
	}
	if per := float64(trips) / float64(requests); per > 0.05 {
		t.Errorf("%.4f Redis round trips per Get, want at most 0.05", per)
	}
}

// expiryLog records, each with the time it happened, what
// TestLeaseAttemptsPerExpiry judges per expiry. It is the fleet's Recorder,
// and its clients' hooks report to it. Safe for concurrent use.
type expiryLog struct {
	observe.NopRecorder
	mu       sync.Mutex
	from     time.Time   // the start of the measured run; zero before
	loads    []loadSpan  // every load of the hot key
	acquires []time.Time // acquire script calls on the hot key, as the clients sent them
	outcomes [4]int      // acquires by outcome (0: failed)
	trouble  []time.Time // failed Redis calls, lost leases, opened breakers, slow loads
}

type loadSpan struct {
	replica    int
	start, end time.Time
	ok         bool // the load returned a value, fresh for the soft TTL from end
}

func (l *expiryLog) begin(from time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.from = from
}

func (l *expiryLog) load(replica int, start, end time.Time, ok bool, recompute time.Duration) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.loads = append(l.loads, loadSpan{replica, start, end, ok})
	if end.Sub(start) >= 2*recompute {
		l.trouble = append(l.trouble, end)
	}
}

func (l *expiryLog) command(cmd redis.Cmder, n keyspace.Names, err error) {
	acquire := isAcquire(cmd, n)
	if !acquire && !troubled(err) {
		return
	}
	now := time.Now()
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.from.IsZero() {
		return // warming up
	}
	if troubled(err) {
		l.trouble = append(l.trouble, now)
	}
	if acquire {
		l.acquires = append(l.acquires, now)
		l.outcomes[acquireOutcome(cmd)]++
	}
}

func (l *expiryLog) acquireOutcomes() [4]int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.outcomes
}

func (l *expiryLog) troubleNow() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.trouble = append(l.trouble, time.Now())
}

func (l *expiryLog) RecordEvent(e observe.Event) {
	if e.Kind == observe.EventBreakerOpened {
		l.troubleNow()
	}
}
func (l *expiryLog) RecordLease(e observe.LeaseEvent, _ time.Duration) {
	if e == observe.LeaseLost || e == observe.LeaseWaitTimeout {
		l.troubleNow()
	}
}

// expiries returns the instants in [from, to) at which the newest loaded
// value went past its soft TTL with no fresher one loaded: the soft
// expiries that each call for one refresh.
func (l *expiryLog) expiries(soft time.Duration, from, to time.Time) []time.Time {
	l.mu.Lock()
	var ends []time.Time
	for _, s := range l.loads {
		if s.ok {
			ends = append(ends, s.end)
		}
	}
	l.mu.Unlock()
	slices.SortFunc(ends, time.Time.Compare)
	var out []time.Time
	var freshUntil time.Time
	gap := func(at time.Time) {
		// Redis holds a soft expiry to the millisecond, truncated, so a
		// replica that read the value finds it stale up to a millisecond
		// before the loader's clock says: an expiry begins expirySlack early.
		at = at.Add(-expirySlack)
		if !at.Before(from) && at.Before(to) {
			out = append(out, at)
		}
	}
	for _, end := range ends {
		if !freshUntil.IsZero() && end.After(freshUntil) {
			gap(freshUntil)
		}
		if f := end.Add(soft); f.After(freshUntil) {
			freshUntil = f
		}
	}
	if !freshUntil.IsZero() {
		gap(freshUntil) // expired, and no value loaded since
	}
	return out
}

// expirySlack is how much earlier than the loader's end plus the soft TTL
// an expiry is taken to begin: more than the millisecond Redis truncates.
const expirySlack = 5 * time.Millisecond

// expiryRound is what happened from one soft expiry to the next.
type expiryRound struct {
	start    time.Time
	loads    []int64 // loads started, per replica
	acquires int     // acquire calls sent
	degraded bool    // a Redis call failed, a lease was lost, a breaker opened or a load ran late
}

// rounds splits what was logged from from to end into rounds, one per soft
// expiry before stop; what came before the first expiry counts in the
// first round. Trouble counts until stop: closing the caches after it may
// cancel calls.
func (l *expiryLog) rounds(replicas int, soft time.Duration, from, stop, end time.Time) []expiryRound {
	es := l.expiries(soft, from, stop)
	rs := make([]expiryRound, len(es))
	for k := range rs {
		rs[k] = expiryRound{start: es[k], loads: make([]int64, replicas)}
	}
	at := func(t time.Time) *expiryRound {
		if len(rs) == 0 || t.Before(from) || t.After(end) {
			return nil
		}
		k, found := slices.BinarySearchFunc(es, t, time.Time.Compare)
		if !found {
			k--
		}
		return &rs[max(k, 0)]
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, s := range l.loads {
		if r := at(s.start); r != nil {
			r.loads[s.replica]++
		}
	}
	for _, a := range l.acquires {
		if r := at(a); r != nil {
			r.acquires++
		}
	}
	for _, tr := range l.trouble {
		if r := at(tr); r != nil && tr.Before(stop) {
			r.degraded = true
		}
	}
	return rs
}

// TestHotKeyNotStarved runs one hot key among cold misses that hold every
// slot of a shared limiter: the hot key's background refreshes are shed
// (they may not take the reserved slots), yet it must not stay stale much
// past half its stale window, nor to its hard TTL, and a shed refresh must
// cost no Redis call.
//
// The run lasts 20s, enough for the hot key to go past its soft TTL three
// times when refreshes land at the half-stale-window point, and twice when
// the key is left stale to its hard TTL.
func TestHotKeyNotStarved(t *testing.T) {
	const (
		workers   = 100
		run       = 20 * time.Second
		soft      = 2 * time.Second
		hard      = 10 * time.Second
		recompute = 100 * time.Millisecond
		// maxRequests bounds each worker's loop in count as run bounds it
		// in time.
		maxRequests = 1_000_000
	)
	node := redistest.Server(t)
	lim, err := limiter.New(limiter.Options{Limit: 32, Reserve: 8, QueueTimeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	hot := herd.Key("hot")
	hotNames := names(t, hot)
	tasks := &refreshTasks{running: map[uint64]*refreshTask{}}
	var hotAcquires [4]atomic.Int64 // by outcome
	h := &roundTrips{done: func(cmd redis.Cmder, took time.Duration, _ error) {
		tasks.command(took)
		if isAcquire(cmd, hotNames) {
			hotAcquires[acquireOutcome(cmd)].Add(1)
		}
	}}
	r := fleet(t, 1, func() redis.UniversalClient {
		c := node.Client()
		c.AddHook(h)
		return c
	}, func(o *herd.Options[string]) {
		o.SoftTTL, o.HardTTL = soft, hard
		o.NearTTL = time.Second
		o.Limiter = lim
		o.OnLeaseHeld = herd.ServeStale
		o.RefreshBackoff = time.Second
		o.Executor = tasks.run
		o.Recorder = tasks
	})[0]

	var versions hotVersions
	loadHot := func(ctx context.Context) (string, error) {
		tasks.loading()
		select {
		case <-time.After(recompute): // the database
		case <-ctx.Done():
			return "", ctx.Err()
		}
		return versions.add(time.Now()), nil
	}
	loadCold := func(ctx context.Context) (string, error) {
		select {
		case <-time.After(recompute): // the database
		case <-ctx.Done():
			return "", ctx.Err()
		}
		return "cold", nil
	}

	// Before the workload, while the limiter is idle, one refresh of a key
	// stale at once must be admitted and be seen making its Redis calls:
	// else a shed refresh would be seen making none whatever it made.
	probe := herd.Key("probe")
	staleAtOnce := func(ctx context.Context) (string, error) {
		herd.SetTTL(ctx, time.Nanosecond, time.Minute)
		tasks.loading()
		return "probe", nil
	}
	// A miss, then stale reads, each refreshing in the background, until a
	// refresh loads. Redis holds the soft expiry to the millisecond: a
	// refresh may find that copy newer than the local one and take it
	// instead of loading, and it is fresh for up to a millisecond, so the
	// reads are paced a millisecond apart.
	var p refreshSummary
	tick := time.NewTicker(time.Millisecond)
	defer tick.Stop()
	for i := 0; i < 1000 && p.loaded == 0; i++ {
		if _, err := getWithin(t, r.cache, probe, staleAtOnce); err != nil {
			t.Fatal(err)
		}
		tasks.wg.Wait()
		p = tasks.summary()
		<-tick.C
	}
	if p.loaded != 1 || p.loadedCommands == 0 {
		t.Fatalf("probe refreshes: %d of %d loaded, %d Redis commands before the load; want 1 seen calling Redis", p.loaded, p.tasks, p.loadedCommands)
	}
	t.Logf("probe: %d refreshes, 1 loaded after %d Redis commands", p.tasks, p.loadedCommands)
	tasks.reset()
	before := r.cache.Stats()

	reads := &hotReads{soft: soft, hard: hard}
	var coldIDs, coldGets, coldFailed atomic.Int64
	start := time.Now()
	stop := start.Add(run)
	var wg sync.WaitGroup
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(w), 1))
			for i := 0; i < maxRequests && time.Now().Before(stop); i++ {
				if rng.IntN(10) == 0 {
					// A key never asked for before: a miss that holds a
					// limiter slot for the whole load.
					key := herd.Key("cold", strconv.FormatInt(coldIDs.Add(1), 10))
					ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
					_, err := r.cache.Get(ctx, key, loadCold)
					cancel()
					coldGets.Add(1)
					if err != nil {
						coldFailed.Add(1)
					}
					continue
				}
				ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
				t0 := time.Now()
				v, err := r.cache.Get(ctx, hot, loadHot)
				reads.add(t0, time.Now(), v, err)
				cancel()
			}
		}()
	}
	wg.Wait()
	end := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := r.cache.Close(ctx); err != nil {
		t.Errorf("Close: %v", err)
	}
	tasks.wg.Wait() // the refreshes Close waited for have ended

	s := r.cache.Stats()
	ls := lim.Stats() // the probe's few slots included; it waited for none and was not shed
	loaded := versions.times()
	if len(loaded) == 0 {
		t.Fatal("the hot key was never loaded")
	}
	gap, gaps := staleGaps(loaded, soft, end)
	if gaps == 0 {
		t.Fatalf("the hot key never went past its soft TTL in %v: nothing was judged", end.Sub(start))
	}
	tk := tasks.summary()
	highWait, took, measured := tk.longestWait, tk.longestRun, tk.loaded > 0
	if !measured {
		// The limiter's QueueTimeout, a load, and a load's time again for
		// the Redis commands around it.
		highWait = time.Second
		took = highWait + 2*recompute
	}
	// From half its stale window on, the first read starts a refresh that
	// waits for a slot at High priority; the key is fresh again once that
	// refresh has run. What a refresh takes is measured, not assumed: on a
	// busy machine its wait, its Redis commands and its load (a 100 ms
	// timer) each come late. One load's time more covers the read that
	// starts it and the copy's way into the local tier.
	bound := (hard-soft)/2 + took + recompute

	t.Logf("%d workers for %v: %d hot Gets (%d failed: %d overloaded), %d cold Gets (%d failed)",
		workers, end.Sub(start).Round(time.Millisecond), reads.n, reads.failed, reads.overloaded, coldGets.Load(), coldFailed.Load())
	t.Logf("hot key: %d loads, %d soft expiries; served stale %d times, longest %v past its soft TTL (measured from before each Get); fresh again at most %v after a soft expiry; longest hot Get %v",
		len(loaded), gaps, reads.stale, reads.longestStale.Round(time.Millisecond), gap.Round(time.Millisecond), reads.longestGet.Round(time.Millisecond))
	t.Logf("background refreshes: %d started, %d shed (Stats.Shed %d in all, limiter ShedBackground %d), %d ran a load",
		tk.tasks, tk.shed, s.Shed-before.Shed, ls.ShedBackground, tk.loaded)
	t.Logf("shed refreshes sent %d Redis commands; refreshes that loaded sent %d before their load",
		tk.shedCommands, tk.loadedCommands)
	t.Logf("hot-key acquire calls (client): %d granted, %d found a fresh value, %d found the lease held, %d failed; all keys: LeaseAcquired+LeaseContended %d, Loads %d",
		hotAcquires[acquireGranted].Load(), hotAcquires[acquireFound].Load(), hotAcquires[acquireHeld].Load(), hotAcquires[0].Load(),
		s.LeaseAcquired+s.LeaseContended-before.LeaseAcquired-before.LeaseContended, s.Loads-before.Loads)
	if measured {
		t.Logf("longest limiter wait of a refresh that loaded: %v, longest run: %v (of %d)", highWait.Round(time.Millisecond), took.Round(time.Millisecond), tk.loaded)
	} else {
		t.Logf("no refresh loaded, so none measured a limiter wait: the bound uses the limiter's QueueTimeout, %v, as the longest High-priority wait", highWait)
	}
	t.Logf("limiter: max in use %d, %d acquired, shed %d (queue timeout %d, reserve %d; high %d, normal %d, background %d), %d waits averaging %v",
		ls.MaxInUse, ls.Acquired, ls.Shed(), ls.ShedQueueTimeout, ls.ShedReserve, ls.ShedHigh, ls.ShedNormal, ls.ShedBackground,
		ls.QueueWaits, avg(ls.QueueWait, ls.QueueWaits).Round(time.Millisecond))

	if reads.unexpected != nil {
		t.Errorf("a hot Get failed other than by the limiter: %v", reads.unexpected)
	}
	if tk.shed == 0 {
		t.Error("no background refresh was shed: the cold misses did not hold the limiter")
	}
	if reads.longestStale > bound {
		t.Errorf("the hot key was served %v past its soft TTL, want at most %v ((hard-soft)/2 %v + longest refresh run %v + one load %v)",
			reads.longestStale.Round(time.Millisecond), bound.Round(time.Millisecond), (hard-soft)/2, took.Round(time.Millisecond), recompute)
	}
	if highWait > time.Second {
		t.Errorf("a refresh waited %v for a limiter slot at High priority, past the limiter's QueueTimeout (1s)", highWait.Round(time.Millisecond))
	}
	if gap >= hard-soft {
		t.Errorf("the hot key stayed stale to its hard TTL: no fresh value until %v past its soft TTL (stale window %v)",
			gap.Round(time.Millisecond), hard-soft)
	}
	if reads.pastHard > 0 {
		t.Errorf("%d hot Gets were served a value past its hard TTL", reads.pastHard)
	}
	if tk.shedCommands > 0 {
		t.Errorf("shed refreshes sent %d Redis commands, want none", tk.shedCommands)
	}
	// Counted without telling refreshes apart: one replica finds no other
	// holder, so every lease call on the hot key is one of its loads, and
	// the shed refreshes made none.
	if n := hotAcquires[0].Load() + hotAcquires[acquireGranted].Load() + hotAcquires[acquireFound].Load() + hotAcquires[acquireHeld].Load(); n != int64(len(loaded)) {
		t.Errorf("%d lease calls on the hot key for %d loads of it (%d refreshes shed); want one per load", n, len(loaded), tk.shed)
	}
}

func avg(d time.Duration, n uint64) time.Duration {
	if n == 0 {
		return 0
	}
	return d / time.Duration(n)
}

// hotVersions records when each load of the hot key returned, in order;
// the value a load returns is that instant, so that a reader knows how old
// what it was served is.
type hotVersions struct {
	mu   sync.Mutex
	ends []time.Time
}

func (v *hotVersions) add(end time.Time) string {
	v.mu.Lock()
	defer v.mu.Unlock()
	v.ends = append(v.ends, end)
	return strconv.FormatInt(end.UnixNano(), 10)
}

func (v *hotVersions) times() []time.Time {
	v.mu.Lock()
	defer v.mu.Unlock()
	return slices.Clone(v.ends)
}

// staleGaps returns the longest time from a soft expiry of the hot key to
// the end of the next load, the moment readers could have a fresh value (or
// to end, for an expiry not yet followed by one), and how many soft
// expiries there were. Loads of one key in one process never overlap.
func staleGaps(loaded []time.Time, soft time.Duration, end time.Time) (time.Duration, int) {
	var longest time.Duration
	n := 0
	for i, l := range loaded {
		expiry := l.Add(soft)
		next := end
		if i+1 < len(loaded) {
			next = loaded[i+1]
		}
		if next.After(expiry) {
			n++
			longest = max(longest, next.Sub(expiry))
		}
	}
	return longest, n
}

// hotReads measures what Gets of the hot key were served.
type hotReads struct {
	soft, hard time.Duration

	mu           sync.Mutex
	n, stale     int
	failed       int
	overloaded   int
	unexpected   error // the first failure not by the limiter
	pastHard     int   // values served past their hard TTL
	longestStale time.Duration
	longestGet   time.Duration
}

// add records a Get that began at t0, returned at t1 with v or err. A
// value is judged by t0: it was served no earlier, so how stale it was is
// never overstated, however late a busy machine ran the reader after.
func (r *hotReads) add(t0, t1 time.Time, v string, err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.n++
	r.longestGet = max(r.longestGet, t1.Sub(t0))
	if err != nil {
		r.failed++
		if errors.Is(err, herd.ErrOverloaded) {
			r.overloaded++
		} else if r.unexpected == nil {
			r.unexpected = err
		}
		return
	}
	ns, perr := strconv.ParseInt(v, 10, 64)
	if perr != nil {
		if r.unexpected == nil {
			r.unexpected = fmt.Errorf("hot value %q: %w", v, perr)
		}
		return
	}
	loaded := time.Unix(0, ns)
	if age := t0.Sub(loaded); age > r.soft {
		r.stale++
		r.longestStale = max(r.longestStale, age-r.soft)
		if age >= r.hard {
			r.pastHard++
		}
	}
}

// refreshTasks runs a cache's background refreshes (Options.Executor),
// each on a goroutine of its own, and is the cache's Recorder: it
// attributes to each refresh the Redis commands, limiter sheds and load
// that happen on its goroutine. A refresh runs its flight on the goroutine
// that starts it, since its context never ends, and go-redis runs its hooks
// on the caller's goroutine; nothing in a refresh's context tells it apart
// from the Get that started it.
type refreshTasks struct {
	observe.NopRecorder
	wg sync.WaitGroup

	mu      sync.Mutex
	running map[uint64]*refreshTask // by goroutine id; guarded by mu
	ended   []*refreshTask          // guarded by mu
}

// refreshTask is one background refresh. Its fields are written only on
// its own goroutine, and read once it has ended.
type refreshTask struct {
	queued    time.Time // when the cache handed it to the Executor
	start     time.Time
	end       time.Time
	loadStart time.Time // zero when the refresh made no load
	commands  int       // Redis commands sent
	preLoad   int       // of those, sent before the load
	atShed    int       // sent before it was first shed
	shed      bool
	redis     time.Duration // time in Redis commands before the load
}

func (r *refreshTasks) run(fn func()) {
	r.wg.Add(1)
	queued := time.Now()
	go func() {
		defer r.wg.Done()
		id, task := goid(), &refreshTask{queued: queued, start: time.Now()}
		r.mu.Lock()
		r.running[id] = task
		r.mu.Unlock()
		defer func() {
			task.end = time.Now()
			r.mu.Lock()
			delete(r.running, id)
			r.ended = append(r.ended, task)
			r.mu.Unlock()
		}()
		fn()
	}()
}

// current returns the refresh running on this goroutine, or nil.
func (r *refreshTasks) current() *refreshTask {
	id := goid()
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.running[id]
}

func (r *refreshTasks) command(took time.Duration) {
	if task := r.current(); task != nil {
		task.commands++
		if task.loadStart.IsZero() {
			task.preLoad++
			task.redis += took
		}
	}
}

func (r *refreshTasks) loading() {
	if task := r.current(); task != nil && task.loadStart.IsZero() {
		task.loadStart = time.Now()
	}
}

func (r *refreshTasks) RecordShed(_ string, _ bool) {
	if task := r.current(); task != nil && !task.shed {
		task.shed, task.atShed = true, task.commands
	}
}

type refreshSummary struct {
	tasks, shed, loaded int
	// shedCommands counts the Redis commands of refreshes before they were
	// shed, and all of those of shed refreshes that never loaded.
	shedCommands int
	// loadedCommands counts the Redis commands of refreshes that loaded,
	// sent before their load.
	loadedCommands int
	// longestWait is the longest time a refresh that loaded waited for a
	// limiter slot: from its start to its load, less its Redis commands
	// (and so with whatever time a busy machine kept it from running).
	longestWait time.Duration
	// longestRun is the longest time a refresh that loaded ran, from when
	// the cache handed it to the Executor to its end: its goroutine's
	// start, limiter wait, Redis commands, load and write-back, with
	// whatever time a busy machine kept it from running.
	longestRun time.Duration
}

// reset forgets the refreshes that have ended.
func (r *refreshTasks) reset() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.ended = nil
}

// summary sums up the refreshes that have ended.
func (r *refreshTasks) summary() refreshSummary {
	r.mu.Lock()
	defer r.mu.Unlock()
	var s refreshSummary
	for _, task := range r.ended {
		s.tasks++
		if task.shed {
			s.shed++
			if task.loadStart.IsZero() {
				s.shedCommands += task.commands
			} else {
				s.shedCommands += task.atShed
			}
		}
		if task.loadStart.IsZero() {
			continue
		}
		s.loaded++
		s.loadedCommands += task.preLoad
		s.longestWait = max(s.longestWait, task.loadStart.Sub(task.start)-task.redis)
		s.longestRun = max(s.longestRun, task.end.Sub(task.queued))
	}
	return s
}

// goid returns the id of the calling goroutine, from the header of its
// stack trace ("goroutine 42 [running]:").
func goid() uint64 {
	var buf [64]byte
	b := bytes.TrimPrefix(buf[:runtime.Stack(buf[:], false)], []byte("goroutine "))
	if i := bytes.IndexByte(b, ' '); i >= 0 {
		b = b[:i]
	}
	id, _ := strconv.ParseUint(string(b), 10, 64)
	return id
}
