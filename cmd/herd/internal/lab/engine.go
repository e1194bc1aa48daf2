package lab

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/herdcache/herd"
	"github.com/herdcache/herd/limiter"
	"github.com/herdcache/herd/observe"
	"github.com/herdcache/herd/remote"
)

// Settings shared by every rung, so that only the layer changes between runs.
const (
	// nearTTL is how long a replica trusts its local copy before asking the
	// remote tier again (at most half the TTL). Small, so the shared remote
	// tier decides, as it would for replicas that are separate processes.
	nearTTL = 100 * time.Millisecond
	// breakerThreshold and breakerCooldown: the cache stops calling a dead
	// remote tier after five failures and probes it every 250ms (at most
	// half the TTL).
	breakerThreshold = 5
	breakerCooldown  = 250 * time.Millisecond
	// longTTLFactor: flush and cold-start keep values for this many run
	// lengths, so that nothing expires on its own during the run.
	longTTLFactor = 10
	// outageShare: node-kill keeps the node down for this share of the TTL,
	// so that each key expires at most once per replica while it is down.
	outageShare = 0.8
	// warmAttempts bounds the tries of hot-key's warm-up load.
	warmAttempts = 20
	// zipfS is the exponent of key popularity in the multi-key scenarios.
	zipfS = 1.1
)

// plan is one run of a suite.
type plan struct {
	scenario, layer, variant string
}

func (p plan) name() string {
	n := p.scenario + "/" + p.layer
	if p.variant != "" {
		n += "/" + p.variant
	}
	return n
}

// Request outcomes.
const (
	outcomeOK uint8 = iota
	outcomeShed
	outcomeOriginFailure
	outcomeError
)

// request is one client request as the lab recorded it; times are offsets
// from the run's start.
type request struct {
	start, end time.Duration
	key        int32
	replica    int32
	// call is the ID of the backing-store call that made the value served;
	// zero for an error or a value the lab seeded without a call.
	call    uint64
	outcome uint8
}

// replica is one cache replica: a process of the fleet.
type replica struct {
	id      int
	store   remote.Store
	lease   remote.Lease
	limiter *limiter.Limiter
	// cache is the cache requests go to now; a flush replaces it.
	cache atomic.Pointer[herd.Cache[string]]

	mu sync.Mutex
	// all holds every cache this replica has had, closed when the run ends.
	all []*herd.Cache[string]
	// gen is the generation of the caches made from now on: 0, then one
	// more per flush, which retires the caches made before it.
	gen int
}

// generation returns the generation of a cache made now.
func (r *replica) generation() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.gen
}

// retire makes the caches made from now on a generation newer.
func (r *replica) retire() {
	r.mu.Lock()
	r.gen++
	r.mu.Unlock()
}

func (r *replica) install(c *herd.Cache[string]) {
	r.mu.Lock()
	r.all = append(r.all, c)
	r.mu.Unlock()
	r.cache.Store(c)
}

func (r *replica) caches() []*herd.Cache[string] {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]*herd.Cache[string](nil), r.all...)
}

// runEnv is the state of one run.
type runEnv struct {
	o      *Options
	p      plan
	rung   int
	index  int
	origin *Origin
	back   runBackend
	keys   []string
	// ttl is the caches' SoftTTL: the configured TTL, or a long one.
	ttl time.Duration
	// hot is the number of hottest keys (0 … hot-1) cold-start warms.
	hot     int
	reps    []*replica
	closers []io.Closer

	wg   sync.WaitGroup // request goroutines
	mu   sync.Mutex
	reqs []request // guarded by mu
	// callGen is the generation of the cache that made each backing-store
	// call, by call ID; guarded by mu.
	callGen map[uint64]int
	// stale notes when each replica served a stale value at once.
	stale *staleLog
	// late is the most the traffic's timers woke after their time: how far
	// behind this machine ran the run's goroutines (nanoseconds).
	late atomic.Int64

	// countFrom is when the counted backing-store calls begin, measureFrom
	// when the measured requests begin, trafficEnd when arrivals stop.
	countFrom, measureFrom, trafficEnd time.Duration
	// event times: the flush, the kill and the restart (zero when none).
	flushAt, killAt, restartAt time.Duration
	// warmFrom is when cold-start's replicas began to warm (warm and
	// fleet); warmFailed counts the keys whose warming failed.
	warmFrom   time.Duration
	warmFailed int
	// fleet is what cold-start's fleet variant recorded, and veteran the
	// cache of the running fleet it warms from (closed with the
	// replicas'); nil otherwise.
	fleet   *fleetWarm
	veteran *herd.Cache[string]
}

// runOne runs one plan and measures it.
func runOne(ctx context.Context, o *Options, b backend, query func(context.Context, time.Duration) error, index int, p plan) (Run, *measures, error) {
	back, err := b.newRun(ctx, index)
	if err != nil {
		return Run{}, nil, err
	}
	e := &runEnv{
		o:     o,
		p:     p,
		rung:  rung(p.layer),
		index: index,
		back:  back,
		ttl:   o.TTL,
		origin: NewOrigin(OriginOptions{
			Latency:     o.Latency,
			Capacity:    o.Capacity,
			FailureRate: o.FailureRate,
			Seed:        o.Seed ^ uint64(index)*0x9e3779b97f4a7c15,
			Query:       query,
		}),
	}
	e.stale = &staleLog{origin: e.origin}
	e.callGen = map[uint64]int{}
	n := o.Keys
	switch p.scenario {
	case "hot-key":
		n = 1
	case "flush", "cold-start":
		e.ttl = longTTLFactor * (o.Duration + o.ClientTimeout)
	}
	e.keys = make([]string, n)
	for i := range e.keys {
		e.keys[i] = "k" + strconv.Itoa(i)
	}
	e.hot = max(1, n/5)

	runErr := e.run(ctx)
	closeErr := e.shutdown()
	if err := errors.Join(runErr, closeErr); err != nil {
		return Run{}, nil, fmt.Errorf("lab: %s: %w", p.name(), err)
	}
	if err := ctx.Err(); err != nil {
		return Run{}, nil, fmt.Errorf("lab: %s: %w", p.name(), err)
	}
	m := e.analyze()
	return m.run, m, nil
}

// run sets up the replicas, drives the scenario and waits for every request.
func (e *runEnv) run(ctx context.Context) error {
	if err := e.addReplicas(ctx); err != nil {
		return err
	}
	var event func(context.Context) error
	switch e.p.scenario {
	case "hot-key":
		// Warm-up: the key's first load (retried when the failure rate
		// draws a failure); the expiries that follow are measured.
		var err error
		for range warmAttempts {
			wctx, cancel := context.WithTimeout(ctx, e.o.ClientTimeout)
			_, err = e.reps[0].cache.Load().Get(wctx, e.keys[0], nil)
			cancel()
			if err == nil || ctx.Err() != nil {
				break
			}
		}
		if err != nil {
			return fmt.Errorf("warm-up: %w", err)
		}
	case "flush":
		if err := e.seed(ctx, e.reps[0].cache.Load(), false); err != nil {
			return err
		}
		event = func(ctx context.Context) error {
			if !sleepUntil(ctx, e.origin, e.measureFrom+e.o.Duration/4) {
				return nil
			}
			return e.flush(ctx)
		}
	case "node-kill":
		if err := e.seed(ctx, e.reps[0].cache.Load(), true); err != nil {
			return err
		}
		event = func(ctx context.Context) error {
			if !sleepUntil(ctx, e.origin, e.measureFrom+e.o.Duration/4) {
				return nil
			}
			e.killAt = e.origin.Since()
			if err := e.back.kill(ctx); err != nil {
				return err
			}
			outage := min(time.Duration(outageShare*float64(e.o.TTL)), e.o.Duration/2)
			sleepUntil(ctx, e.origin, e.killAt+outage)
			err := e.back.restart(context.WithoutCancel(ctx))
			e.restartAt = e.origin.Since()
			return err
		}
	case "cold-start":
		switch e.p.variant {
		case "warm":
			e.warmAll(ctx)
		case "fleet":
			if err := e.warmFromFleet(ctx); err != nil {
				return err
			}
		}
	}
	e.measureFrom = e.origin.Since()
	if e.p.scenario != "cold-start" {
		e.countFrom = e.measureFrom
	}
	d := e.o.Duration
	switch {
	case e.p.variant == "fleet":
		d /= 4 // nothing reaches the backing store: a shorter window shows it all
	case e.p.scenario == "cold-start":
		d /= 2
	}
	e.trafficEnd = e.measureFrom + d

	var eventErr error
	done := make(chan struct{})
	go func() {
		defer close(done)
		if event != nil {
			eventErr = event(ctx)
		}
	}()
	if e.o.ClosedLoop {
		e.closedLoop(ctx)
	} else {
		e.openLoop(ctx)
	}
	<-done
	e.wg.Wait()
	return eventErr
}

// shutdown closes every cache, waits for the backing-store calls they
// cancelled, and releases the run's remote tier.
func (e *runEnv) shutdown() error {
	ctx, cancel := context.WithTimeout(context.Background(), 4*e.o.ClientTimeout+5*time.Second)
	defer cancel()
	var errs []error
	var closing []*herd.Cache[string]
	if e.veteran != nil {
		closing = append(closing, e.veteran)
	}
	for _, r := range e.reps {
		closing = append(closing, r.caches()...)
	}
	for _, c := range closing {
		if err := c.Close(ctx); err != nil {
			errs = append(errs, err)
		}
	}
	if err := e.origin.WaitIdle(ctx); err != nil {
		errs = append(errs, fmt.Errorf("backing-store calls still running: %w", err))
	}
	for _, c := range e.closers {
		if err := c.Close(); err != nil {
			errs = append(errs, err)
		}
	}
	if err := e.back.close(ctx); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

func (e *runEnv) addReplicas(ctx context.Context) error {
	for i := range e.o.Replicas {
		st, ls, cl, err := e.back.remote(ctx, i)
		if err != nil {
			return err
		}
		if cl != nil {
			e.closers = append(e.closers, cl)
		}
		r := &replica{id: i, store: st, lease: ls}
		if e.rung >= rung("limiter") {
			r.limiter, err = limiter.New(limiter.Options{
				Limit:        limiterSlots,
				Reserve:      1,
				QueueTimeout: e.o.ClientTimeout / 2,
			})
			if err != nil {
				return err
			}
		}
		c, err := e.newCache(r)
		if err != nil {
			return err
		}
		r.install(c)
		e.reps = append(e.reps, r)
	}
	return nil
}

// cacheOptions returns the options of one replica's cache at the run's rung:
// every layer up to it, configured through herd's public options.
func (e *runEnv) cacheOptions(r *replica) *herd.Options[string] {
	mean := e.o.Latency.Mean()
	gen := r.generation()
	o := &herd.Options[string]{
		Name:             "replica-" + strconv.Itoa(r.id),
		MaxEntries:       max(1024, 2*len(e.keys)),
		SoftTTL:          e.ttl,
		LoadTimeout:      4 * e.o.ClientTimeout,
		Store:            r.store,
		NearTTL:          e.nearTTL(),
		BreakerThreshold: breakerThreshold,
		BreakerCooldown:  min(breakerCooldown, e.o.TTL/2),
		Recorder:         e.stale,
		Load: func(ctx context.Context, key string) (string, error) {
			k, _ := strconv.Atoi(key[1:])
			id, err := e.origin.Call(ctx, k, r.id)
			e.mu.Lock()
			e.callGen[id] = gen
			e.mu.Unlock()
			if err != nil {
				return "", err
			}
			return strconv.FormatUint(id, 10), nil
		},
	}
	if e.rung < rung("coalescing") {
		o.DisableCoalescing = true
	}
	if e.rung >= rung("lease") {
		o.Lease = r.lease
		o.LeaseTTL = max(200*time.Millisecond, 4*mean)
		o.OnLeaseHeld = herd.Wait
		o.LeaseWait = e.o.ClientTimeout
	}
	if e.rung >= rung("xfetch") {
		o.Beta = 1
	}
	if e.rung >= rung("swr") {
		o.HardTTL = 3 * e.ttl
		o.OnLeaseHeld = herd.ServeStale
	}
	if e.rung >= rung("jitter") {
		o.Jitter = 0.1
	}
	if e.rung >= rung("limiter") {
		o.Limiter = r.limiter
	}
	if e.rung >= rung("ahead") {
		// Refresh-ahead starts a refresh a load's duration plus a fifth
		// before soft expiry, XFetch at least that early: with both on, a
		// key read as often as these is refreshed by XFetch every time.
		o.Beta = 0
		o.MaxRefreshAhead = e.hot
		o.RefreshAheadHot = e.hot
	}
	if e.p.variant == "fleet" {
		o.ShareHotKeys = e.hot
		o.ShareHotKeysEvery = e.sharePeriod()
	}
	return o
}

// nearTTL is every replica's NearTTL: at most half the TTL.
func (e *runEnv) nearTTL() time.Duration { return min(nearTTL, e.o.TTL/2) }

func (e *runEnv) newCache(r *replica) (*herd.Cache[string], error) {
	return herd.New(e.cacheOptions(r))
}

// seed fills the remote tier through c with values that cost no
// backing-store call, as a cache in steady use would hold. With stagger,
// key i is fresh for a share of the TTL drawn for it, so that keys expire at
// spread-out times rather than all at once.
func (e *runEnv) seed(ctx context.Context, c *herd.Cache[string], stagger bool) error {
	rng := e.rng(1)
	ttls := make(map[string][2]time.Duration, len(e.keys))
	for _, k := range e.keys {
		soft := e.ttl
		if stagger {
			soft = time.Duration((0.2 + 0.8*rng.Float64()) * float64(e.ttl))
		}
		hard := soft // no stale window below swr
		if e.rung >= rung("swr") {
			hard = soft + 2*e.ttl
		}
		ttls[k] = [2]time.Duration{soft, hard}
	}
	wctx, cancel := context.WithTimeout(ctx, 4*e.o.ClientTimeout)
	defer cancel()
	rep := c.Warm(wctx, e.keys, func(ctx context.Context, key string) (string, error) {
		t := ttls[key]
		herd.SetTTL(ctx, t[0], t[1])
		return "0", nil
	})
	if rep.Failed > 0 {
		for k, err := range rep.Errors {
			return fmt.Errorf("seeding %d keys: %d failed, e.g. %s: %w", len(e.keys), rep.Failed, k, err)
		}
	}
	return nil
}

// warmAll has every replica warm the hottest keys at once, through the
// backing store, as replicas starting together would.
func (e *runEnv) warmAll(ctx context.Context) {
	e.warmFrom = e.origin.Since()
	wctx, cancel := context.WithTimeout(ctx, 4*e.o.ClientTimeout)
	defer cancel()
	var wg sync.WaitGroup
	var failed atomic.Int64
	for _, r := range e.reps {
		wg.Go(func() {
			rep := r.cache.Load().Warm(wctx, e.keys[:e.hot], nil)
			failed.Add(int64(rep.Failed))
		})
	}
	wg.Wait()
	e.warmFailed = int(failed.Load())
}

// flush empties the remote tier, then gives every replica a fresh cache: a
// flush that left the replicas' local tiers alive would hide the stampede.
// The caches it replaces are retired first: the calls they still make
// (their local copies drop once the remote tier has lost the values) stand
// for no process of a fleet, and the promises after the flush do not count
// them.
func (e *runEnv) flush(ctx context.Context) error {
	for _, r := range e.reps {
		r.retire()
	}
	e.flushAt = e.origin.Since()
	if err := e.back.flush(ctx); err != nil {
		return err
	}
	for _, r := range e.reps {
		c, err := e.newCache(r)
		if err != nil {
			return err
		}
		r.install(c)
	}
	return nil
}

// rng returns a random source for one purpose of this run, from the seed.
func (e *runEnv) rng(stream uint64) *rand.Rand {
	return rand.New(rand.NewPCG(e.o.Seed, uint64(e.index)<<16|stream))
}

// picker returns a function choosing keys with r: the one key of hot-key,
// or Zipf popularity (key 0 the hottest) over the keys.
func (e *runEnv) picker(r *rand.Rand) func() int {
	if len(e.keys) == 1 {
		return func() int { return 0 }
	}
	z := rand.NewZipf(r, zipfS, 1, uint64(len(e.keys)-1))
	return func() int { return int(z.Uint64()) }
}

// openLoop starts requests at Poisson arrival times, each on its own
// goroutine, whether or not earlier ones have been answered. A late
// dispatcher starts every overdue request at once, so the offered load does
// not depend on how fast answers come.
func (e *runEnv) openLoop(ctx context.Context) {
	r := e.rng(2)
	pick := e.picker(r)
	total := e.o.Rate * float64(len(e.reps))
	limit := int(total*(e.trafficEnd-e.measureFrom).Seconds()*3) + 1000
	gap := func() time.Duration { return time.Duration(r.ExpFloat64() / total * float64(time.Second)) }
	next := e.measureFrom + gap()
	for n := 0; n < limit; {
		now := e.origin.Since()
		for ; next <= now && next < e.trafficEnd && n < limit; n++ {
			rep, key := e.reps[r.IntN(len(e.reps))], pick()
			e.wg.Go(func() { e.get(ctx, rep, key) })
			next += gap()
		}
		if next >= e.trafficEnd || !e.sleepUntil(ctx, next) {
			return
		}
	}
}

// closedLoop runs Clients clients per replica, each sending a request,
// waiting for its answer, then waiting the think time.
func (e *runEnv) closedLoop(ctx context.Context) {
	think := e.o.thinkTime()
	var wg sync.WaitGroup
	for _, rep := range e.reps {
		for c := range e.o.Clients {
			r := e.rng(uint64(3 + rep.id*e.o.Clients + c))
			pick := e.picker(r)
			wg.Go(func() {
				// Spread the clients' first requests over one think time.
				start := e.measureFrom + time.Duration(r.Float64()*float64(think))
				if !e.sleepUntil(ctx, start) {
					return
				}
				limit := int((e.trafficEnd-e.measureFrom)/max(think, time.Millisecond)) + 2
				for range limit {
					if e.origin.Since() >= e.trafficEnd {
						return
					}
					e.get(ctx, rep, pick())
					if !e.sleepUntil(ctx, e.origin.Since()+think) {
						return
					}
				}
			})
		}
	}
	wg.Wait()
}

// get makes one request and records it.
func (e *runEnv) get(ctx context.Context, rep *replica, key int) {
	cctx, cancel := context.WithTimeout(ctx, e.o.ClientTimeout)
	start := e.origin.Since()
	v, err := rep.cache.Load().Get(cctx, e.keys[key], nil)
	end := e.origin.Since()
	cancel()
	q := request{start: start, end: end, key: int32(key), replica: int32(rep.id)}
	switch {
	case err == nil:
		q.call, _ = strconv.ParseUint(v, 10, 64)
	case errors.Is(err, herd.ErrOverloaded):
		q.outcome = outcomeShed
	case errors.Is(err, ErrOriginFailure):
		q.outcome = outcomeOriginFailure
	default:
		q.outcome = outcomeError
	}
	e.mu.Lock()
	e.reqs = append(e.reqs, q)
	e.mu.Unlock()
}

// staleLog is a observe.Recorder that notes when a stale value was served at
// once, from the local tier or the Store, on any replica of a run. (A lease
// loser served stale inside a load's flight is not reported to a Recorder
// as stale; a load of the key is running then.)
type staleLog struct {
	observe.NopRecorder
	origin *Origin
	mu     sync.Mutex
	at     []time.Duration // offsets from the run's start; guarded by mu
}

func (l *staleLog) RecordGet(r observe.GetResult) {
	if r != observe.ResultStale {
		return
	}
	t := l.origin.Since()
	l.mu.Lock()
	l.at = append(l.at, t)
	l.mu.Unlock()
}

func (l *staleLog) times() []time.Duration {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.at)
}

// sleepUntil is the traffic's sleepUntil: it notes how late it woke.
func (e *runEnv) sleepUntil(ctx context.Context, t time.Duration) bool {
	if !sleepUntil(ctx, e.origin, t) {
		return false
	}
	late := int64(e.origin.Since() - t)
	for {
		old := e.late.Load()
		if late <= old || e.late.CompareAndSwap(old, late) {
			return true
		}
	}
}

// sleepUntil waits until the origin's clock reads t; it reports false if
// ctx ended first.
func sleepUntil(ctx context.Context, o *Origin, t time.Duration) bool {
	return sleepFor(ctx, t-o.Since())
}

// sleepFor waits d; it reports false if ctx ended first.
func sleepFor(ctx context.Context, d time.Duration) bool {
	if d <= 0 {
		return ctx.Err() == nil
	}
	tm := time.NewTimer(d)
	defer tm.Stop()
	select {
	case <-tm.C:
		return true
	case <-ctx.Done():
		return false
	}
}
