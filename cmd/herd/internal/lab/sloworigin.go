package lab

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/herdcache/herd"
	"github.com/herdcache/herd/limiter"
	"github.com/herdcache/herd/observe"
	"github.com/jackc/pgx/v5/pgxpool"
)

// The slow-origin scenario: a database whose latency grows with its
// concurrency beyond its capacity, under a hot key and a storm of cold-key
// misses twice what the database can serve, compared under three limiter
// rungs. Its run lasts slowRTTs mean latencies (at least --duration) in
// three phases: healthy (the first 40%), slow (base latency ×slowFactor, to
// 70%), recovered (the rest).
const (
	slowScenario = "slow-origin"
	slowRTTs     = 60
	slowFactor   = 5
	// stormLoad is the cold-key misses offered, in multiples of what the
	// healthy database serves at its capacity.
	stormLoad = 2
	// slowInflightBand and slowP99Factor are the adaptive rung's promises:
	// mean database in-flight calls within [1/band, band] × capacity and a
	// database p99 within the factor of the healthy p99, while overloaded.
	// The lower bound is of what the static-tuned rung (a limit at the
	// capacity) kept in flight when that is less: a machine too busy to
	// drive the database to its capacity drives no rung there.
	slowInflightBand = 2.0
	slowP99Factor    = 2.5
	// slowNoiseSigmas is the goodput check's tolerance, in standard errors
	// of the difference between two rungs' shares of requests answered in
	// time: the adaptive rung's share must be at least the best static
	// rung's less this many standard errors, over the same offered load.
	// slowSlices is how many slices of the run the error is measured over
	// (see goodputCheck).
	slowNoiseSigmas = 2
	slowSlices      = 30
)

// SlowRungs are the rungs of slow-origin, each a limiter per replica.
var SlowRungs = []string{"static-default", "static-tuned", "adaptive"}

// slowRungOptions returns the limiter of one replica at rung, for a
// database of capacity calls shared by replicas.
func slowRungOptions(rung string, capacity, replicas int, queueTimeout time.Duration) limiter.Options {
	var o limiter.Options
	switch rung {
	case "static-default":
		o = limiter.DefaultOptions(32)
	case "static-tuned":
		o = limiter.DefaultOptions(max(1, capacity/replicas))
	case "adaptive":
		o = limiter.DefaultOptions(32)
		o.Reserve = 1
		o.MinLimit = max(2, capacity/replicas/2)
		// A Low-priority miss is let in only while the queue's wait and
		// the store's latency together fit in three quarters of the
		// client's timeout (1.5× the queue timeout): once the database is
		// 5× slower, a cold miss that waited out most of the queue
		// timeout would reach it only to be answered after its client
		// gave up, and would take a call from one that can still be
		// answered in time. Any lower, and misses the database could still
		// answer in time are shed.
		o.ShedLatency = 3 * queueTimeout / 2
	}
	o.QueueTimeout = queueTimeout
	return o
}

// slowDB is the simulated database of slow-origin: a call that starts with
// n calls in flight (itself included) lasts a draw of the latency, ×slowFactor
// during the slow phase, ×(n/capacity)² when n exceeds the capacity: past
// its capacity the calls contend, and the database serves fewer calls per
// second the more it is given (capacity²/n per mean latency). With
// query set the call runs it instead of sleeping, with the duration before
// the contention factor, which the query applies from the database's own
// count of its active calls (see slowQuery).
type slowDB struct {
	lat              Latency
	capacity         int
	slowFrom, slowTo time.Duration
	query            func(context.Context, time.Duration) error
	epoch            time.Time

	mu       sync.Mutex
	rng      *rand.Rand // guarded by mu
	inflight int        // guarded by mu
	calls    []dbCall   // guarded by mu
}

// dbCall is one database call, its times offsets from the run's start.
type dbCall struct {
	start, end time.Duration
	inflight   int
	done       bool
}

func (db *slowDB) since() time.Duration { return time.Since(db.epoch) }

func (db *slowDB) call(ctx context.Context) error {
	db.mu.Lock()
	db.inflight++
	n := db.inflight
	d := db.lat.Draw(db.rng)
	now := db.since()
	if now >= db.slowFrom && now < db.slowTo {
		d *= slowFactor
	}
	if n > db.capacity && db.query == nil {
		f := float64(n) / float64(db.capacity)
		d = time.Duration(float64(d) * f * f)
	}
	i := len(db.calls)
	db.calls = append(db.calls, dbCall{start: now, inflight: n})
	db.mu.Unlock()

	var err error
	if db.query != nil {
		err = db.query(ctx, d)
	} else if !sleepFor(ctx, d) {
		err = ctx.Err()
	}
	db.mu.Lock()
	db.calls[i].end, db.calls[i].done = db.since(), true
	db.inflight--
	db.mu.Unlock()
	return err
}

// slowReq is one client request.
type slowReq struct {
	start, end time.Duration
	err        error
}

// staleCount counts stale values served.
type staleCount struct {
	observe.NopRecorder
	n atomic.Int64
}

func (s *staleCount) RecordGet(r observe.GetResult) {
	if r == observe.ResultStale {
		s.n.Add(1)
	}
}

// slowMeasures is what one rung measured, beside its Run.
type slowMeasures struct {
	rung          string
	goodput       float64 // requests answered within their timeout, per second
	offered, good int     // requests made, and answered within their timeout
	goodBy        []int   // requests answered within their timeout, by the slice of the run they started in
	inflight      float64 // time-weighted mean database in-flight calls while overloaded and healthy
	p99           time.Duration
	overloadCalls int64
	calm          []time.Duration // durations of the calls that found the database at or below capacity, not slowed
}

// runSlowOrigin runs slow-origin under every rung and returns its runs and,
// with o.Check, its checks. Over the simulated database the rungs run side
// by side, each with a database of its own, so that a busy machine delays
// them alike; over PostgreSQL, whose backends they would share, one after
// the other.
func runSlowOrigin(ctx context.Context, o *Options, b backend, index int) ([]Run, []Check, error) {
	o = slowScaled(o)
	runs := make([]Run, len(SlowRungs))
	ms := make([]slowMeasures, len(SlowRungs))
	errs := make([]error, len(SlowRungs))
	one := func(i int) {
		runs[i], ms[i], errs[i] = runSlowRung(ctx, o, b, index+i, SlowRungs[i])
		if errs[i] != nil {
			errs[i] = fmt.Errorf("lab: %s/%s: %w", slowScenario, SlowRungs[i], errs[i])
		}
	}
	if o.PostgresDSN == "" {
		var wg sync.WaitGroup
		for i := range SlowRungs {
			wg.Go(func() { one(i) })
		}
		wg.Wait()
	} else {
		for i := range SlowRungs {
			if one(i); errs[i] != nil {
				break
			}
		}
	}
	if err := errors.Join(errs...); err != nil {
		return slices.DeleteFunc(runs, func(r Run) bool { return r.Scenario == "" }), nil, err
	}
	var calm []time.Duration
	for _, m := range ms {
		calm = append(calm, m.calm...)
	}
	// The healthy p99 is the latency distribution's, or, when this machine
	// ran the calls late, the p99 of the calls that found the database at
	// or below its capacity and not slowed, in every rung.
	slices.Sort(calm)
	healthy := max(healthyP99(o.Latency, o.Seed), quantile(calm, 0.99))
	for i := range runs {
		runs[i].Extra["db_healthy_p99_ms"] = msOf(healthy)
	}
	if !o.Check {
		return runs, nil, nil
	}
	return runs, slowChecks(o, ms, healthy), nil
}

// slowPoolMax is the most connections slow-origin opens to PostgreSQL (each
// a backend), well below PostgreSQL's default max_connections of 100, so
// that the suite's own pool fits beside it.
const slowPoolMax = 64

// slowApp is the application_name of a rung's connections: a query counts
// the active backends of its rung's name, and no other's, not even those
// of a rung before it that PostgreSQL has not yet ended.
func slowApp(rung string) string { return "herd lab slow-origin " + rung }

// openSlowPostgres opens slow-origin's pool: a connection for every slot
// the rungs may hold at once (32 per replica), at most slowPoolMax, so that
// a rung that lets more calls in than the database's capacity finds the
// database slower rather than the pool's queue. Every statement ends
// server-side after the cache's load timeout, so that no backend outlives
// the call that was waiting for it.
func openSlowPostgres(ctx context.Context, o *Options, rung string) (*pgxpool.Pool, error) {
	cfg, err := pgxpool.ParseConfig(o.PostgresDSN)
	if err != nil {
		return nil, fmt.Errorf("lab: --origin-postgres: %w", err)
	}
	cfg.ConnConfig.RuntimeParams["application_name"] = slowApp(rung)
	cfg.ConnConfig.RuntimeParams["statement_timeout"] = strconv.FormatInt(slowLoadTimeout(o).Milliseconds(), 10)
	return openPool(ctx, cfg, min(32*o.Replicas, slowPoolMax))
}

// slowLoadTimeout bounds each load of slow-origin.
func slowLoadTimeout(o *Options) time.Duration { return 4 * o.ClientTimeout }

// slowQuery returns slow-origin's PostgreSQL call: pg_sleep of the drawn
// latency (×slowFactor in the slow phase) ×(n/capacity)² when n, the
// active backends of the rung's slowApp counted by the query itself in
// pg_stat_activity, exceeds capacity: the slowing with concurrency is the
// database's own count, not the lab's.
func slowQuery(pool *pgxpool.Pool, rung string, capacity int) func(context.Context, time.Duration) error {
	const q = `SELECT pg_sleep($1::float8 * power(greatest(1.0,
		(SELECT count(*) FROM pg_stat_activity WHERE application_name = $2 AND state = 'active')::float8 / $3), 2))`
	return func(ctx context.Context, d time.Duration) error {
		_, err := pool.Exec(ctx, q, d.Seconds(), slowApp(rung), float64(capacity))
		return err
	}
}

// slowScaled returns o with its latency, TTL and client timeout multiplied
// by o.SlowScale.
func slowScaled(o *Options) *Options {
	if o.SlowScale == 0 || o.SlowScale == 1 {
		return o
	}
	so := *o
	f := so.SlowScale
	scale := func(d time.Duration) time.Duration { return time.Duration(f * float64(d)) }
	so.Latency.A, so.Latency.B = scale(o.Latency.A), scale(o.Latency.B)
	so.TTL, so.ClientTimeout = scale(o.TTL), scale(o.ClientTimeout)
	return &so
}

// healthyP99 is the p99 of the healthy database's latency at or below its
// capacity as drawn: the 99th percentile of 20,000 draws of l.
func healthyP99(l Latency, seed uint64) time.Duration {
	rng := rand.New(rand.NewPCG(seed, 0x68656c))
	ds := make([]time.Duration, 20000)
	for i := range ds {
		ds[i] = l.Draw(rng)
	}
	slices.Sort(ds)
	return quantile(ds, 0.99)
}

// slowDuration is the length of a slow-origin run.
func slowDuration(o *Options) time.Duration {
	return min(max(o.Duration, slowRTTs*o.Latency.Mean()), maxDuration)
}

// overloadWindows are the spans of a run of length d in which the healthy
// database is overloaded and the limit has had a quarter of its phase to
// settle: the healthy and the recovered phases, less their first quarter.
func overloadWindows(d time.Duration) [][2]time.Duration {
	return [][2]time.Duration{{d / 10, 4 * d / 10}, {d * 775 / 1000, d}}
}

func runSlowRung(ctx context.Context, o *Options, b backend, index int, rung string) (Run, slowMeasures, error) {
	d := slowDuration(o)
	var query func(context.Context, time.Duration) error
	if o.PostgresDSN != "" {
		// Closed after the caches, when no load is left to use it.
		pool, err := openSlowPostgres(ctx, o, rung)
		if err != nil {
			return Run{}, slowMeasures{}, err
		}
		defer pool.Close()
		query = slowQuery(pool, rung, max(o.Capacity, 1))
	}
	db := &slowDB{
		lat: o.Latency, capacity: max(o.Capacity, 1), query: query,
		slowFrom: 4 * d / 10, slowTo: 7 * d / 10,
		rng: rand.New(rand.NewPCG(o.Seed, 0x736c6f77)),
	}
	rb, err := b.newRun(ctx, index)
	if err != nil {
		return Run{}, slowMeasures{}, err
	}
	defer rb.close(context.WithoutCancel(ctx))
	stale := &staleCount{}
	var lims []*limiter.Limiter
	var caches []*herd.Cache[string]
	defer func() {
		for _, c := range caches {
			c.Close(context.WithoutCancel(ctx))
		}
	}()
	for i := range o.Replicas {
		st, ls, cl, err := rb.remote(ctx, i)
		if err != nil {
			return Run{}, slowMeasures{}, err
		}
		if cl != nil {
			defer cl.Close()
		}
		lim, err := limiter.New(slowRungOptions(rung, db.capacity, o.Replicas, o.ClientTimeout/2))
		if err != nil {
			return Run{}, slowMeasures{}, err
		}
		c, err := herd.New(&herd.Options[string]{
			NoNearCache: true,
			NoBreaker:   true,
			Name:        "replica-" + strconv.Itoa(i),
			MaxEntries:  1 << 16,
			SoftTTL:     o.TTL,
			HardTTL:     3 * o.TTL,
			LoadTimeout: slowLoadTimeout(o),
			Store:       st,
			Lease:       ls,
			LeaseTTL:    max(200*time.Millisecond, 4*o.Latency.Mean()),
			OnLeaseHeld: herd.ServeStale,
			LeaseWait:   o.ClientTimeout,
			Limiter:     lim,
			Recorder:    stale,
			Load: func(ctx context.Context, key string) (string, error) {
				return key, db.call(ctx)
			},
		})
		if err != nil {
			return Run{}, slowMeasures{}, err
		}
		lims = append(lims, lim)
		caches = append(caches, c)
	}

	// Traffic: per replica, the hot key at o.Rate and cold keys, each read
	// once, at stormLoad × the database's capacity throughput shared out, at
	// Low priority: a miss of the hot key goes before them.
	stormRate := stormLoad * float64(db.capacity) / o.Latency.Mean().Seconds() / float64(o.Replicas)
	var mu sync.Mutex
	var reqs []slowReq
	var wg sync.WaitGroup
	db.epoch = time.Now()
	rctx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	for i, c := range caches {
		for s, rate := range []float64{o.Rate, stormRate} {
			rng := rand.New(rand.NewPCG(o.Seed+uint64(i), uint64(s)))
			wg.Go(func() {
				next := time.Duration(0)
				for seq := 0; ; seq++ {
					next += time.Duration(rng.ExpFloat64() / rate * float64(time.Second))
					if !sleepFor(rctx, next-db.since()) {
						return
					}
					key, pctx := "hot", ctx
					if s == 1 {
						key = "c" + strconv.Itoa(i) + "-" + strconv.Itoa(seq)
						pctx = limiter.WithPriority(ctx, limiter.Low)
					}
					wg.Go(func() {
						cctx, ccancel := context.WithTimeout(pctx, o.ClientTimeout)
						start := db.since()
						_, err := c.Get(cctx, key, nil)
						ccancel()
						q := slowReq{start: start, end: db.since(), err: err}
						mu.Lock()
						reqs = append(reqs, q)
						mu.Unlock()
					})
				}
			})
		}
	}
	wg.Wait()

	db.mu.Lock()
	calls := slices.Clone(db.calls)
	db.mu.Unlock()
	run, m := slowMeasure(rung, d, db.capacity, calls, reqs)
	run.StaleServed = stale.n.Load()
	for _, l := range lims {
		st := l.Stats()
		run.Shed += int64(st.Shed())
		run.Extra["shed_latency"] += float64(st.ShedLatency)
	}
	return run, m, nil
}

// slowMeasure sums up one rung's calls and requests.
func slowMeasure(rung string, d time.Duration, capacity int, calls []dbCall, reqs []slowReq) (Run, slowMeasures) {
	r := Run{Scenario: slowScenario, Layer: rung, Requests: int64(len(reqs)), OriginCalls: int64(len(calls)), Extra: map[string]float64{}}
	var lat []time.Duration
	good := 0
	goodBy, offeredBy := make([]int, slowSlices), make([]int, slowSlices)
	for _, q := range reqs {
		slice := min(slowSlices-1, max(0, int(q.start*slowSlices/d)))
		offeredBy[slice]++
		switch {
		case q.err == nil:
			good++
			goodBy[slice]++
			lat = append(lat, q.end-q.start)
		case errors.Is(q.err, herd.ErrOverloaded):
		default:
			r.Errors++
		}
	}
	slices.Sort(lat)
	r.P50, r.P99, r.P999 = quantile(lat, 0.5), quantile(lat, 0.99), quantile(lat, 0.999)

	r.Bucket = d / 60
	r.Timeline = make([]int64, 60)
	r.Concurrency = make([]int, 60)
	var all, over, slow, calm []time.Duration
	windows := overloadWindows(d)
	busy := 0.0 // call-time inside the overload windows
	for _, c := range calls {
		r.PeakOrigin = max(r.PeakOrigin, c.inflight)
		if b := int(c.start / r.Bucket); b >= 0 && b < 60 {
			r.Timeline[b]++
			r.Concurrency[b] = max(r.Concurrency[b], c.inflight)
		}
		end := c.end
		if !c.done {
			end = d
		}
		all = append(all, end-c.start)
		for _, w := range windows {
			busy += float64(max(0, min(end, w[1])-max(c.start, w[0])))
			if c.start >= w[0] && c.start < w[1] {
				over = append(over, end-c.start)
			}
		}
		if c.start >= 4*d/10 && c.start < 7*d/10 {
			slow = append(slow, end-c.start)
		} else if c.inflight <= capacity {
			calm = append(calm, end-c.start)
		}
	}
	span := 0.0
	for _, w := range windows {
		span += float64(w[1] - w[0])
	}
	for _, s := range [][]time.Duration{all, over, slow} {
		slices.Sort(s)
	}
	m := slowMeasures{
		rung:          rung,
		goodput:       float64(good) / d.Seconds(),
		offered:       len(reqs),
		good:          good,
		goodBy:        goodBy,
		inflight:      busy / span,
		p99:           quantile(over, 0.99),
		overloadCalls: int64(len(over)),
		calm:          calm,
	}
	r.Extra["db_p99_ms"] = msOf(quantile(all, 0.99))
	r.Extra["db_p99_overload_ms"] = msOf(m.p99)
	r.Extra["db_p99_slow_ms"] = msOf(quantile(slow, 0.99))
	r.Extra["db_mean_inflight"] = m.inflight
	r.Extra["goodput"] = m.goodput
	// The share answered in time in each phase: healthy (slices of the
	// first 40%), slow (to 70%), recovered.
	for _, p := range []struct {
		key      string
		from, to int
	}{{"goodput_healthy_pct", 0, 4 * slowSlices / 10}, {"goodput_slow_pct", 4 * slowSlices / 10, 7 * slowSlices / 10}, {"goodput_recovered_pct", 7 * slowSlices / 10, slowSlices}} {
		g, n := 0, 0
		for i := p.from; i < p.to; i++ {
			g, n = g+goodBy[i], n+offeredBy[i]
		}
		if n > 0 {
			r.Extra[p.key] = 100 * float64(g) / float64(n)
		}
	}
	return r, m
}

// slowChecks judges the adaptive rung against the static ones.
func slowChecks(o *Options, ms []slowMeasures, healthy time.Duration) []Check {
	var adaptive, tuned slowMeasures
	var bestM slowMeasures
	for _, m := range ms {
		switch {
		case m.rung == "adaptive":
			adaptive = m
			continue
		case m.rung == "static-tuned":
			tuned = m
		}
		if m.offered > 0 && (bestM.offered == 0 || m.share() > bestM.share()) {
			bestM = m
		}
	}
	capacity := float64(max(o.Capacity, 1))
	low := min(capacity, tuned.inflight) / slowInflightBand
	return []Check{{
		Scenario: slowScenario, Layer: "adaptive",
		Promise: fmt.Sprintf("mean database in-flight calls while overloaded within [%.1f, %.0f] (capacity %d ×%.0f; at least half of the capacity or of static-tuned's %.1f, the lower)",
			low, capacity*slowInflightBand, int(capacity), slowInflightBand, tuned.inflight),
		Measured:     fmt.Sprintf("%.1f", adaptive.inflight),
		Observations: adaptive.overloadCalls, Observed: "database calls while overloaded",
		OK: adaptive.overloadCalls > 0 && adaptive.inflight >= low && adaptive.inflight <= capacity*slowInflightBand,
	}, {
		Scenario: slowScenario, Layer: "adaptive",
		Promise: fmt.Sprintf("database p99 while overloaded at most %.1f× the healthy p99 (%v)",
			slowP99Factor, healthy.Round(time.Millisecond)),
		Measured:     adaptive.p99.Round(time.Millisecond).String(),
		Observations: adaptive.overloadCalls, Observed: "database calls while overloaded",
		OK: adaptive.overloadCalls > 0 && float64(adaptive.p99) <= slowP99Factor*float64(healthy),
	}, goodputCheck(adaptive, bestM)}
}

// share is the share of the rung's requests answered within their timeout.
func (m slowMeasures) share() float64 {
	if m.offered == 0 {
		return 0
	}
	return float64(m.good) / float64(m.offered)
}

// goodputCheck judges the adaptive rung's goodput against the best static
// rung's over the same offered load (the rungs draw the same arrivals):
// its share of requests answered within their timeout must be at least
// best's less slowNoiseSigmas standard errors of the difference. The
// requests of one instant succeed or fail together (a hot key's miss, a
// stall of the machine), so the error is not a count's: the run is cut in
// slowSlices slices, and the difference of the two rungs' answered
// requests, slice by slice, varies by s; the total's standard error is
// √slowSlices·s. A rung that loses throughout, or in a third of the run,
// loses more than that.
func goodputCheck(adaptive, best slowMeasures) Check {
	var diffs []float64
	for i := range min(len(adaptive.goodBy), len(best.goodBy)) {
		diffs = append(diffs, float64(adaptive.goodBy[i]-best.goodBy[i]))
	}
	n := float64(max(1, best.offered))
	se := math.Sqrt(float64(len(diffs))) * stddev(diffs) / n
	floor := best.share() - slowNoiseSigmas*se
	return Check{
		Scenario: slowScenario, Layer: "adaptive",
		Promise: fmt.Sprintf("goodput at least the best static rung's (%s: %.0f/s, %.1f%% of %d requests answered in time), "+
			"less %d standard errors of the difference over %d slices of the run (%.1f points): at least %.1f%%",
			best.rung, best.goodput, 100*best.share(), best.offered, slowNoiseSigmas, len(diffs), 100*se, 100*floor),
		Measured:     fmt.Sprintf("%.0f/s, %.1f%% of %d", adaptive.goodput, 100*adaptive.share(), adaptive.offered),
		Observations: int64(adaptive.offered), Observed: "requests",
		OK: adaptive.overloadCalls > 0 && best.offered > 0 && len(diffs) > 1 && adaptive.share() >= floor,
	}
}

// stddev is the sample standard deviation of xs; zero for fewer than two.
func stddev(xs []float64) float64 {
	if len(xs) < 2 {
		return 0
	}
	mean := 0.0
	for _, x := range xs {
		mean += x
	}
	mean /= float64(len(xs))
	ss := 0.0
	for _, x := range xs {
		ss += (x - mean) * (x - mean)
	}
	return math.Sqrt(ss / float64(len(xs)-1))
}
