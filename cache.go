package herd

import (
	"context"
	"errors"
	"fmt"
	"hash/maphash"
	"math/rand/v2"
	"runtime/debug"
	"sync"
	"sync/atomic"
	"time"

	"github.com/maypok86/otter/v2"

	"github.com/herdcache/herd/flight"
	"github.com/herdcache/herd/internal/envelope"
	"github.com/herdcache/herd/internal/topk"
	"github.com/herdcache/herd/limiter"
	"github.com/herdcache/herd/xfetch"
)

// LoadFunc loads the value of one key from the backing store. Its context
// carries the values of the first caller's context, not its cancellation, and
// ends at the cache's LoadTimeout or when the cache closes. A load may call
// [SetTTL] or [NoCache] on its context to decide about its own entry.
//
// A function literal that captures variables allocates each time it is made;
// on the hit path, prefer a loader built once (or [Options.Load]).
type LoadFunc[V any] func(ctx context.Context) (V, error)

// Cache is a two-tier get-or-load cache that lets one load per key run at a
// time: per process through in-process coalescing, and per fleet through the
// optional [Lease]. Its methods are safe for concurrent use.
type Cache[V any] struct {
	cfg     config[V]
	local   *otter.Cache[string, *entry[V]]
	flights flight.Group[string, *entry[V]]
	// reads coalesces the Store reads of a key: a burst of callers of one
	// key makes one read per replica, not one each.
	reads flight.Group[string, remoteRead[V]]
	gens  generations
	clk   clock
	st    counters
	brk   breaker

	recorder Recorder      // nil: none
	tracer   Tracer        // nil: no spans
	events   EventRecorder // nil: no events
	loadDur  histogram
	waitDur  histogram // lease losers' waits
	queueDur histogram // limiter queue waits
	keyLoads keyLoads
	top      *topk.Tracker // nil: no hot-key tracking
	// trustFloor is when the local tier last lost its claim to be current
	// (Unix ns): a missed change notice, or the breaker closing. Local entries
	// put before it are re-read from the Store before being served as fresh.
	trustFloor atomic.Int64

	// draw returns a uniform number in (0, 1] for XFetch, and jitterDraw one in
	// [0, 1) for TTL jitter; tests replace them for determinism.
	draw       func() float64
	jitterDraw func() float64

	// closeCtx ends when Close is called; it cancels running loads.
	closeCtx context.Context
	cancel   context.CancelFunc
	// mu guards closed against bg.Add racing bg.Wait in Close.
	mu          sync.RWMutex
	closed      atomic.Bool
	bg          sync.WaitGroup
	unsubscribe func()
}

// entry is one value in the local tier. Its fields are written before the
// entry is published to the local tier or a flight's waiters and never after,
// except the atomics.
type entry[V any] struct {
	value V
	// soft and hard are the wall-clock expiries in Unix nanoseconds: fresh
	// before soft, stale between, gone at hard.
	soft, hard int64
	// near is when a replica with a Store must ask it again (Unix
	// nanoseconds); zero without a Store.
	near int64
	// born is when the entry was put in the local tier (Unix nanoseconds).
	born int64
	// delta is the measured duration of the load that made the value.
	delta    int64
	negative bool
	// uncached marks a value its load asked not to cache: it is handed to the
	// flight's callers and never stored.
	uncached bool

	// refreshing is set by the one reader that starts a background refresh of
	// this entry; a new entry replaces it when the refresh succeeds.
	refreshing atomic.Bool
	// retryAt is the earliest time (Unix nanoseconds) another background
	// refresh may start after one failed.
	retryAt atomic.Int64
	// fence is the remote fence the value was written under; zero until its
	// write-back, made in the background, reports it, and when it never
	// reached a Store.
	fence atomic.Uint64
}

func (e *entry[V]) result() (V, error) {
	if e.negative {
		var zero V
		return zero, ErrNotFound
	}
	return e.value, nil
}

func (e *entry[V]) stale(now int64) bool { return !e.uncached && now >= e.soft }

// New returns a cache configured by o; a nil o means [DefaultOptions].
// Invalid options give an error whose text starts with "herd: ".
func New[V any](o *Options[V]) (*Cache[V], error) {
	if o == nil {
		o = DefaultOptions[V]()
	}
	cfg, err := o.validate()
	if err != nil {
		return nil, err
	}
	c := &Cache[V]{
		cfg:        cfg,
		clk:        newClock(),
		draw:       xfetch.U,
		jitterDraw: rand.Float64,
	}
	c.flights.Timeout = cfg.LoadTimeout
	c.reads.Timeout = cfg.LoadTimeout
	c.flights.OnJoin = func(string) { c.st.coalesced.add(1) }
	c.brk.threshold = int32(cfg.BreakerThreshold)
	c.brk.cooldown = cfg.BreakerCooldown
	c.brk.onChange = func(open bool) {
		if !open {
			c.trustFloor.Store(c.clk.now())
		}
		if c.recorder != nil {
			c.recorder.RecordBreaker(open)
		}
		if open {
			c.event(EventBreakerOpened, "", nil)
		} else {
			c.event(EventBreakerClosed, "", nil)
		}
	}
	if cfg.HotKeys > 0 && !cfg.DisableStats {
		c.top = topk.New(cfg.HotKeys)
	}
	if r := cfg.Recorder; r != nil {
		c.recorder = r
		c.tracer, _ = r.(Tracer)
		c.events, _ = r.(EventRecorder)
	}
	c.gens.seed = maphash.MakeSeed()
	// The local tier evicts by size only: entries carry their own soft and
	// hard expiry, checked on each read with the cache's clock, so otter needs
	// no clock of its own on the hit path.
	c.local, err = otter.New(&otter.Options[string, *entry[V]]{
		MaximumSize: cfg.MaxEntries,
		Clock:       noClock{},
	})
	if err != nil {
		return nil, fmt.Errorf("herd: local tier: %w", err)
	}
	c.closeCtx, c.cancel = context.WithCancel(context.Background())
	if n, ok := cfg.Store.(Notifier); ok {
		c.unsubscribe = n.Subscribe(c.noticed)
	}
	return c, nil
}

// noClock is the local tier's clock: it evicts by size only and never needs
// the time.
type noClock struct{}

func (noClock) NowNano() int64                      { return 0 }
func (noClock) Tick(time.Duration) <-chan time.Time { return nil }

// Must is New for options known to be valid; it panics on an error.
func Must[V any](c *Cache[V], err error) *Cache[V] {
	if err != nil {
		panic(err)
	}
	return c
}

// CallOption adjusts one Get. The first caller of a coalesced load decides
// for the load; every caller decides for what it is itself served.
type CallOption struct {
	noStale   bool
	hasPolicy bool
	policy    LoserPolicy
}

// NoStale makes this call treat a stale value as a miss, as [Options.NoStale]
// does for every call.
func NoStale() CallOption { return CallOption{noStale: true} }

// WithLoserPolicy overrides [Options.OnLeaseHeld] for this call.
func WithLoserPolicy(p LoserPolicy) CallOption { return CallOption{hasPolicy: true, policy: p} }

// noStale is resolve(opts).noStale without building the rest.
func (c *Cache[V]) noStale(opts []CallOption) bool {
	if c.cfg.NoStale {
		return true
	}
	for _, o := range opts {
		if o.noStale {
			return true
		}
	}
	return false
}

type callOpts struct {
	noStale bool
	policy  LoserPolicy
}

func (c *Cache[V]) resolve(opts []CallOption) callOpts {
	co := callOpts{noStale: c.cfg.NoStale, policy: c.cfg.OnLeaseHeld}
	for _, o := range opts {
		co.noStale = co.noStale || o.noStale
		if o.hasPolicy {
			co.policy = o.policy
		}
	}
	if co.noStale && co.policy == ServeStale {
		co.policy = Wait
	}
	return co
}

// Get returns the value of key, calling load (or [Options.Load] when load is
// nil) on a miss. A fresh local value is returned without locks or
// allocation. A stale one is returned at once while one background refresh
// runs (unless NoStale). On a miss one load per key runs at a time in this
// process, and with a Lease one per fleet; every caller waiting for it gets
// its value or error, and each caller's ctx bounds only its own wait.
func (c *Cache[V]) Get(ctx context.Context, key string, load LoadFunc[V], opts ...CallOption) (V, error) {
	if c.closed.Load() {
		var zero V
		return zero, ErrClosed
	}
	if e, ok := c.local.GetIfPresent(key); ok {
		now := c.clk.now()
		if now < e.hard && c.trusted(e, now) {
			if now < e.soft {
				c.got(key, ResultHit)
				if c.cfg.Beta > 0 && xfetch.Decide(now, e.soft, e.delta, c.cfg.Beta, c.draw) {
					c.refresh(ctx, key, load, e, &c.st.earlyRefreshes)
				}
				return c.served(e)
			}
			if !c.noStale(opts) {
				c.got(key, ResultStale)
				c.refresh(ctx, key, load, e, &c.st.staleRefreshes)
				return c.served(e)
			}
		}
	}
	return c.miss(ctx, key, load, c.resolve(opts))
}

// trusted reports whether a local entry may be served without asking the
// Store: there is none, the entry is within NearTTL and no notice may have
// been missed since it was put, or the breaker is open and not yet due for a
// probe (a due probe goes through the flight, which the other readers join).
func (c *Cache[V]) trusted(e *entry[V], now int64) bool {
	return c.cfg.Store == nil || now < e.near && e.born > c.trustFloor.Load() || c.brk.open() && !c.brk.probeDue()
}

// remoteDone records the outcome of a remote call for the breaker and the stats.
func (c *Cache[V]) remoteDone(ctx context.Context, err error) {
	if err != nil {
		c.st.remoteErrors.add(1)
	}
	c.brk.record(ctx, err)
}

func (c *Cache[V]) served(e *entry[V]) (V, error) {
	if e.negative {
		c.st.negativeHits.add(1)
	}
	return e.result()
}

// event hands e to the EventRecorder, if any.
func (c *Cache[V]) event(kind EventKind, key string, err error) {
	if c.events != nil {
		c.events.RecordEvent(Event{Kind: kind, Key: key, Err: err})
	}
}

// span starts a span if the Recorder traces; end is never nil.
func (c *Cache[V]) span(ctx context.Context, op, key string) (context.Context, func(error)) {
	if c.tracer == nil {
		return ctx, func(error) {}
	}
	return c.tracer.StartSpan(ctx, op, key)
}

// loader resolves the load function of a call.
func (c *Cache[V]) loader(key string, load LoadFunc[V]) LoadFunc[V] {
	if load != nil {
		return load
	}
	if c.cfg.Load == nil {
		return nil
	}
	return func(ctx context.Context) (V, error) { return c.cfg.Load(ctx, key) }
}

// errSkipped is what a background refresh that gave up (lease held, limiter
// shedding) hands to foreground callers that joined its flight; they retry.
var errSkipped = errors.New("herd: background refresh skipped")

// errLoadPanicked ends the span of a load that panicked or called
// runtime.Goexit.
var errLoadPanicked = errors.New("herd: load panicked")

func (c *Cache[V]) miss(ctx context.Context, key string, load LoadFunc[V], co callOpts) (V, error) {
	var zero V
	load = c.loader(key, load) // nil: serve what the tiers hold, or ErrNoLoader
	e, pre := c.readRemote(ctx, key, co)
	if e != nil {
		if e.stale(c.clk.now()) {
			c.got(key, ResultStale)
			c.refresh(ctx, key, load, e, &c.st.staleRefreshes)
		} else {
			c.got(key, ResultHit)
			if !pre.local {
				c.st.remoteHits.add(1)
			}
		}
		return c.served(e)
	}
	c.got(key, ResultMiss)
	for attempt := range maxMissAttempts {
		if attempt > 0 {
			if err := ctx.Err(); err != nil {
				return zero, fmt.Errorf("herd: %w", err)
			}
			pre = remoteRead[V]{} // out of date: the flight reads again
		}
		var (
			e   *entry[V]
			err error
		)
		if c.cfg.DisableCoalescing || attempt == maxMissAttempts-1 {
			e, err = c.fillAlone(ctx, key, load, co, pre)
		} else {
			e, err, _ = c.flights.Do(ctx, key, func(fctx context.Context) (*entry[V], error) {
				return c.fill(fctx, key, load, co, nil, pre)
			})
		}
		if errors.Is(err, errSkipped) {
			continue
		}
		if err != nil {
			return zero, err
		}
		if e.stale(c.clk.now()) {
			// Served stale by the flight (from the Store or as a lease loser).
			if co.noStale {
				continue
			}
			c.countStale(key)
			c.refresh(ctx, key, load, e, &c.st.staleRefreshes)
		}
		return e.result()
	}
	return zero, fmt.Errorf("%w: %q: no fresh value after %d attempts", ErrNoFreshValue, key, maxMissAttempts)
}

// maxMissAttempts bounds the attempts of one miss: a flight it joined may
// have been a background refresh that gave up, or may have found only a
// value that went stale before this caller could take it. The last attempt
// runs on its own, without joining a flight.
const maxMissAttempts = 4

// remoteRead is what one read of the Store found.
type remoteRead[V any] struct {
	done bool   // the read was made; the rest is unset otherwise
	gen  uint64 // the local generation read before it
	puts uint64 // the stripe's count of local puts read before it
	// local is set when no read was made: e was found in the local tier,
	// put there by a read that ended just before.
	local bool
	err   error
	// e is the decoded value; nil when there is none (gone) or it does not
	// decode.
	e    *entry[V]
	gone bool
}

// loadRemote reads key from the Store and decodes what it finds.
func (c *Cache[V]) loadRemote(ctx context.Context, key string) remoteRead[V] {
	r := remoteRead[V]{done: true}
	r.gen, r.puts = c.gens.get(key)
	env, err := c.cfg.Store.Load(ctx, key)
	c.remoteDone(ctx, err)
	switch {
	case errors.Is(err, ErrRejected):
		c.st.decodeErrors.add(1) // the key holds nothing this cache can use
	case err != nil:
		r.err = err
	case env == nil:
		r.gone = true
	default:
		r.e, _ = c.decode(env)
	}
	return r
}

// readRemote reads key from the Store before any load's flight, sharing one
// read among the callers of key that arrive while it runs: a value another
// replica wrote is served at the cost of one round trip. It returns the entry to serve, or nil when the
// caller must go on to the flight (no Store, breaker open, nothing usable
// stored), with what the read found so that a flight this caller starts
// need not read again.
func (c *Cache[V]) readRemote(ctx context.Context, key string, co callOpts) (*entry[V], remoteRead[V]) {
	if c.cfg.Store == nil || c.brk.open() {
		return nil, remoteRead[V]{} // a half-open breaker's probe is made inside the flight
	}
	r, err, _ := c.reads.Do(ctx, key, func(rctx context.Context) (remoteRead[V], error) {
		// A caller that missed the local tier just before the last shared
		// read put its value there starts a read of its own: re-check first.
		if e, ok := c.local.GetIfPresent(key); ok {
			if now := c.clk.now(); now < e.hard && c.trusted(e, now) {
				r := remoteRead[V]{done: true, local: true, e: e}
				r.gen, r.puts = c.gens.get(key)
				return r, nil
			}
		}
		r := c.loadRemote(rctx, key)
		if r.e != nil && c.clk.now() < r.e.hard {
			c.setLocal(key, r.e, r.gen)
			_, r.puts = c.gens.get(key) // the read is as new as its own put
		}
		return r, nil
	})
	if err != nil {
		return nil, remoteRead[V]{} // this caller's ctx ended: the flight reads again, or the caller leaves
	}
	if e := r.e; e != nil {
		now := c.clk.now()
		if now < e.soft || now < e.hard && !co.noStale {
			return e, r
		}
	}
	return nil, r
}

// fillAlone runs fill without coalescing, bounded as a flight would be.
func (c *Cache[V]) fillAlone(ctx context.Context, key string, load LoadFunc[V], co callOpts, pre remoteRead[V]) (*entry[V], error) {
	// The load outlives a caller that leaves: it ends at LoadTimeout.
	fctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), c.cfg.LoadTimeout)
	type res struct {
		e   *entry[V]
		err error
	}
	done := make(chan res, 1)
	go func() {
		defer cancel()
		var r res
		returned := false
		defer func() {
			if p := recover(); p != nil {
				r.err = &flight.PanicError{Value: p, Stack: debug.Stack()}
			} else if !returned {
				r.err = flight.ErrGoexit
			}
			done <- r
		}()
		r.e, r.err = c.fill(fctx, key, load, co, nil, pre)
		returned = true
	}()
	select {
	case r := <-done:
		return r.e, r.err
	case <-ctx.Done():
		return nil, fmt.Errorf("herd: %w", ctx.Err())
	}
}

// refresh starts one background refresh of e, unless one is running or a
// failed one is backing off.
func (c *Cache[V]) refresh(ctx context.Context, key string, load LoadFunc[V], e *entry[V], started *stripedCounter) {
	if e.uncached || e.retryAt.Load() > c.clk.now() || e.refreshing.Load() {
		return
	}
	load = c.loader(key, load)
	if load == nil || !e.refreshing.CompareAndSwap(false, true) {
		return
	}
	c.mu.RLock()
	if c.closed.Load() {
		c.mu.RUnlock()
		return
	}
	c.bg.Add(1)
	c.mu.RUnlock()
	started.add(1)
	bctx := context.WithoutCancel(ctx)
	c.cfg.Executor(func() {
		defer c.bg.Done()
		_, err, _ := c.flights.Do(bctx, key, func(fctx context.Context) (*entry[V], error) {
			return c.fill(fctx, key, load, callOpts{}, e, remoteRead[V]{})
		})
		switch {
		case errors.Is(err, errSkipped):
			// Shed, or the lease is held elsewhere: back off as after a
			// failure, without counting one.
			e.retryAt.Store(addTime(c.clk.now(), c.cfg.RefreshBackoff))
		case err != nil:
			c.st.refreshFailures.add(1)
			c.event(EventRefreshFailed, key, err)
			e.retryAt.Store(addTime(c.clk.now(), c.cfg.RefreshBackoff))
		}
		// Let a later reader try again if this refresh did not replace e.
		e.refreshing.Store(false)
	})
}

// fill does the work of a miss inside its flight: re-check the tiers, take
// the lease, take a limiter slot, load, write. old is the entry a background
// refresh replaces, nil for a miss. pre is the Store read the caller made
// just before starting the flight, used instead of reading again; a zero pre
// means read.
func (c *Cache[V]) fill(ctx context.Context, key string, load LoadFunc[V], co callOpts, old *entry[V], pre remoteRead[V]) (*entry[V], error) {
	background := old != nil
	staleOK := !background && !co.noStale
	gen, puts := c.gens.get(key)
	now := c.clk.now()

	// A stale candidate, served to lease losers and on load errors.
	var candidate *entry[V]
	if e, ok := c.local.GetIfPresent(key); ok && now < e.hard {
		trusted := c.trusted(e, now)
		switch {
		case background && e != old && trusted && now < e.soft:
			return e, nil // refreshed by someone else meanwhile
		case !background && trusted && now < e.soft:
			return e, nil // a flight that just finished
		case !background && trusted && staleOK:
			return e, nil
		}
		candidate = e
	}

	// A refresh is admitted by the limiter, without waiting, before it makes
	// any remote call: one that would be shed touches no Redis key.
	if l := c.cfg.Limiter; l != nil && background {
		if !l.TryAcquireBackground() {
			c.shed(limiter.ReasonReserve, true)
			return nil, errSkipped
		}
		defer l.Release()
	}

	// The Store read is decided once per fill: a probe of a half-open breaker
	// goes on using the Store for the rest of its fill.
	rr := pre // its gen predates it: an entry it found is refused locally after any change since
	if rr.done && rr.puts != puts {
		rr = remoteRead[V]{} // a load finished since: what the Store holds may have changed
	}
	if !rr.done && c.cfg.Store != nil && c.brk.allow() {
		rr = c.loadRemote(ctx, key)
	}
	// A failed read still tries the lease, unless it opened the breaker: one
	// slow read must not make this replica load on its own.
	remoteUp := rr.done && (rr.err == nil || !c.brk.open())
	switch re := rr.e; {
	case !rr.done:
	case rr.err != nil:
		if candidate != nil && !background && (now < candidate.soft || staleOK) {
			return candidate, nil
		}
	case rr.gone:
		candidate = nil // gone remotely: the local copy is not to be trusted
	case re != nil && re.hard > now:
		if !background && now < re.soft || background && re.soft > old.soft || !background && staleOK {
			c.setLocal(key, re, rr.gen)
			return re, nil
		}
		candidate = re
	}

	if load == nil {
		// Nothing to load with: take neither the lease (which would advance
		// the fence) nor a limiter slot.
		return nil, ErrNoLoader
	}
	var held *heldLease
	if remoteUp && c.cfg.Lease != nil {
		// A value counts as fresh by both clocks, the Store's and this
		// replica's, so that a replica whose clock runs ahead loads instead
		// of being handed, again and again, a value it finds stale.
		after := now
		if background {
			after = max(after, old.soft)
		}
		e, g, err := c.acquire(ctx, key, time.Unix(0, after), background, co, candidate)
		switch {
		case err != nil && (errors.Is(err, errRemote) || errors.Is(err, errUnfenced)):
			remoteUp = false
		case err != nil:
			return nil, err
		case e != nil:
			if !e.stale(c.clk.now()) {
				c.setLocal(key, e, gen)
			}
			return e, nil
		case g.Token != "":
			held = c.hold(ctx, key, g)
			defer c.endLease(ctx, held, nil, 0, nil) // unless the write-back ended it
		}
	}

	if l := c.cfg.Limiter; l != nil && !background { // a refresh took its slot first
		start := time.Now()
		err := l.Acquire(ctx)
		c.queueDur.observe(time.Since(start))
		if err != nil {
			var oe *limiter.OverloadError
			if errors.As(err, &oe) {
				c.shed(oe.Reason, false)
			}
			return nil, err
		}
		defer l.Release()
	}

	v, delta, d, err := c.runLoad(ctx, key, load, background)
	now = c.clk.now()
	if err != nil {
		c.st.loadErrors.add(1)
		if errors.Is(err, ErrNotFound) && c.cfg.NegativeTTL > 0 {
			exp := addTime(now, c.cfg.NegativeTTL)
			e := &entry[V]{soft: exp, hard: exp, negative: true}
			c.store(ctx, key, e, held, remoteUp, gen)
			return e, nil
		}
		if candidate != nil && staleOK && now < candidate.hard {
			c.st.staleIfError.add(1)
			return candidate, nil
		}
		return nil, err
	}
	e := &entry[V]{value: v, delta: int64(delta)}
	if d.noCache {
		e.uncached = true
		return e, nil
	}
	soft, hard := c.cfg.SoftTTL, c.cfg.HardTTL
	if d.soft > 0 {
		soft, hard = min(d.soft, MaxTTL), min(max(d.hard, d.soft), MaxTTL)
	}
	soft, hard = c.cfg.jitter.Pair(soft, hard, c.jitterDraw())
	e.soft, e.hard = addTime(now, soft), addTime(now, hard)
	c.store(ctx, key, e, held, remoteUp, gen)
	return e, nil
}

// store puts a freshly loaded entry in the local tier and hands its remote
// write, with the release of the lease when one is held, to the background,
// so that the load's callers get the value as soon as the load returns.
// Nothing is written to either tier when key was set or invalidated in this
// process since gen was read: with a lease the fence would refuse the write,
// without one this process's own order refuses it.
func (c *Cache[V]) store(ctx context.Context, key string, e *entry[V], held *heldLease, remoteUp bool, gen uint64) {
	var env []byte
	if remoteUp {
		var err error
		if env, err = c.encode(e); err != nil {
			c.st.encodeErrors.add(1)
			return // a value the codec cannot encode is served, not cached
		}
		if held != nil {
			e.fence.Store(held.fence)
		}
		if c.cfg.NearTTL > 0 {
			e.near = addTime(c.clk.now(), c.cfg.NearTTL)
		}
	}
	unfenced := env != nil && held == nil
	if !c.publish(key, e, gen, unfenced) {
		return
	}
	ttl := time.Duration(e.hard - c.clk.now())
	switch {
	case held != nil:
		c.endLease(ctx, held, env, ttl, e)
	case unfenced:
		c.goBackground(func() {
			defer c.gens.endWrite(key)
			if ttl <= 0 {
				return
			}
			rctx, cancel := c.remoteCtx(ctx)
			defer cancel()
			f, err := c.cfg.Store.Set(rctx, key, env, ttl)
			c.remoteDone(rctx, err)
			if err == nil {
				e.fence.Store(f)
			}
		})
	}
}

// remoteCtx bounds a remote call made on behalf of a load that may have used
// up its own time; it keeps ctx's values.
func (c *Cache[V]) remoteCtx(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.WithoutCancel(ctx), c.cfg.LoadTimeout)
}

// directives is what a load decided about its own entry through SetTTL and
// NoCache.
type directives struct {
	soft, hard time.Duration
	noCache    bool
}

type directivesKey struct{}

// SetTTL sets, from inside a load, the soft and hard TTL of the entry that
// load is making (before jitter); hard below soft means no stale window.
// Outside a load it does nothing.
func SetTTL(ctx context.Context, soft, hard time.Duration) {
	if d, ok := ctx.Value(directivesKey{}).(*directives); ok && soft > 0 {
		d.soft, d.hard = soft, hard
	}
}

// NoCache tells the cache, from inside a load, to return the value the load
// returns to its callers without caching it in either tier. Outside a load
// it does nothing.
func NoCache(ctx context.Context) {
	if d, ok := ctx.Value(directivesKey{}).(*directives); ok {
		d.noCache = true
	}
}

// runLoad calls load, cancelled if the cache closes, and measures it.
func (c *Cache[V]) runLoad(ctx context.Context, key string, load LoadFunc[V], background bool) (v V, elapsed time.Duration, d *directives, err error) {
	lctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stop := context.AfterFunc(c.closeCtx, cancel)
	defer stop()
	d = &directives{}
	lctx = context.WithValue(lctx, directivesKey{}, d)
	op := "herd.load"
	if background {
		op = "herd.refresh"
	}
	lctx, end := c.span(lctx, op, key)
	c.st.loads.add(1)
	c.countLoad(key)
	c.keyLoads.start(key)
	start := time.Now()
	returned := false
	defer func() {
		elapsed = time.Since(start)
		c.keyLoads.done(key)
		c.loadDur.observe(elapsed)
		if c.recorder != nil {
			c.recorder.RecordLoad(elapsed, err, background)
		}
		if !returned {
			end(errLoadPanicked) // the panic goes on to the flight
			return
		}
		end(err)
	}()
	v, err = load(lctx)
	returned = true
	return v, 0, d, err
}

func (c *Cache[V]) decode(env []byte) (*entry[V], bool) {
	ev, err := envelope.Decode(env)
	if err != nil {
		c.st.decodeErrors.add(1)
		return nil, false
	}
	e := &entry[V]{
		soft:     ev.Soft * int64(time.Millisecond),
		hard:     ev.Hard * int64(time.Millisecond),
		delta:    int64(ev.Delta),
		negative: ev.Flags&envelope.FlagNegative != 0,
	}
	e.fence.Store(ev.Fence)
	if !e.negative {
		v, err := c.cfg.Codec.Unmarshal(ev.Value)
		if err != nil {
			c.st.decodeErrors.add(1)
			return nil, false
		}
		e.value = v
	}
	if c.cfg.NearTTL > 0 {
		e.near = addTime(c.clk.now(), c.cfg.NearTTL)
	}
	return e, true
}

func (c *Cache[V]) encode(e *entry[V]) ([]byte, error) {
	ev := envelope.Envelope{
		Soft:  e.soft / int64(time.Millisecond),
		Hard:  e.hard / int64(time.Millisecond),
		Delta: time.Duration(e.delta),
	}
	if e.negative {
		ev.Flags |= envelope.FlagNegative
	} else {
		b, err := c.cfg.Codec.Marshal(e.value)
		if err != nil {
			return nil, err
		}
		ev.Value = b
	}
	return envelope.Append(nil, &ev), nil
}

// setLocal puts e in the local tier unless key was set or invalidated since
// gen was read.
func (c *Cache[V]) setLocal(key string, e *entry[V], gen uint64) { c.publish(key, e, gen, false) }

// publish puts e in the local tier unless key was set or invalidated since
// gen was read, and reports whether it did. With write, it also refuses
// while a Set or Invalidate of key is running, and otherwise counts an
// unfenced remote write of key as in flight, to be ended with endWrite.
func (c *Cache[V]) publish(key string, e *entry[V], gen uint64, write bool) bool {
	s := c.gens.stripe(key)
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.n != gen || write && s.changes[key] > 0 {
		return false
	}
	if cur, ok := c.local.GetIfPresent(key); ok && cur == e && !write {
		return true // put already, by a caller that shared its read
	}
	s.puts++
	if write {
		if s.writes == nil {
			s.writes = make(map[string]int)
		}
		s.writes[key]++
	}
	e.born = c.clk.now()
	c.local.Set(key, e)
	return true
}

// unpublish drops e from the local tier if it is still key's entry there.
func (c *Cache[V]) unpublish(key string, e *entry[V]) {
	s := c.gens.stripe(key)
	s.mu.Lock()
	defer s.mu.Unlock()
	if cur, ok := c.local.GetIfPresent(key); ok && cur == e {
		c.local.Invalidate(key)
	}
}

// noticed handles a change notice from another replica: ("", 0) means
// notices may have been lost.
func (c *Cache[V]) noticed(key string, fence uint64) {
	if key == "" && fence == 0 {
		c.trustFloor.Store(c.clk.now())
		return
	}
	if e, ok := c.local.GetIfPresent(key); ok && e.fence.Load() < fence {
		c.local.Invalidate(key)
	}
}

// Set stores v under key in both tiers with the configured TTLs (jittered),
// fencing out every load of key that began before it: in this process
// always, on other replicas when the cache has a Lease.
func (c *Cache[V]) Set(ctx context.Context, key string, v V) error {
	if c.closed.Load() {
		return ErrClosed
	}
	now := c.clk.now()
	soft, hard := c.cfg.jitter.Pair(c.cfg.SoftTTL, c.cfg.HardTTL, c.jitterDraw())
	e := &entry[V]{value: v, soft: addTime(now, soft), hard: addTime(now, hard)}
	var env []byte
	if c.cfg.Store != nil {
		var err error
		if env, err = c.encode(e); err != nil {
			return fmt.Errorf("herd: encode %q: %w", key, err)
		}
	}
	// The Store is written first and the local tier after, both inside the
	// change, so that no load of key that began before Set returns can write
	// either tier afterwards.
	c.gens.beginChange(key, nil)
	var err error
	if c.cfg.Store != nil {
		var f uint64
		if !c.brk.allow() {
			err = fmt.Errorf("%w: set %q: breaker open", ErrDegraded, key)
		} else if f, err = c.cfg.Store.Set(ctx, key, env, hard); err != nil {
			c.remoteDone(ctx, err)
			err = fmt.Errorf("%w: set %q: %w", ErrDegraded, key, err)
		} else {
			c.remoteDone(ctx, nil)
			e.fence.Store(f)
			if c.cfg.NearTTL > 0 {
				e.near = addTime(c.clk.now(), c.cfg.NearTTL)
			}
		}
	}
	c.gens.endChange(key, func() {
		if err == nil {
			e.born = c.clk.now()
			c.local.Set(key, e)
		} else {
			c.local.Invalidate(key)
		}
	})
	c.flights.Forget(key)
	return err
}

// Invalidate drops key from both tiers. A load of key running now cannot
// write its value back (with a Store, a load running on another replica is
// fenced out only when the cache has a Lease), and the next Get starts a new
// load; callers that had already joined the running load may still receive
// its value. With a Store, other replicas drop their copies on the change
// notice, or within NearTTL if the notice is lost. When the Store cannot be
// reached, the local copy is dropped and the error wraps [ErrDegraded].
func (c *Cache[V]) Invalidate(ctx context.Context, key string) error {
	if c.closed.Load() {
		return ErrClosed
	}
	drop := func() { c.local.Invalidate(key) }
	c.gens.beginChange(key, drop)
	c.flights.Forget(key)
	var err error
	if c.cfg.Store != nil {
		if !c.brk.allow() {
			err = fmt.Errorf("%w: invalidate %q: breaker open", ErrDegraded, key)
		} else if err = c.cfg.Store.Invalidate(ctx, key); err != nil {
			c.remoteDone(ctx, err)
			err = fmt.Errorf("%w: invalidate %q: %w", ErrDegraded, key, err)
		} else {
			c.remoteDone(ctx, nil)
		}
	}
	// A read of the Store made while it still held the old value may have
	// put that value back in the local tier, or started a flight that would
	// hand it out: the change ends by dropping both again.
	c.gens.endChange(key, drop)
	c.flights.Forget(key)
	return err
}

// goBackground runs fn on a goroutine of its own that Close waits for; on a
// closed cache it runs fn on the caller's goroutine.
func (c *Cache[V]) goBackground(fn func()) {
	c.mu.RLock()
	if c.closed.Load() {
		c.mu.RUnlock()
		fn()
		return
	}
	c.bg.Add(1)
	c.mu.RUnlock()
	go func() {
		defer c.bg.Done()
		fn()
	}()
}

// Close stops background refreshes, cancels running loads, waits for the
// write-backs of finished loads and stops every goroutine the cache started,
// waiting for them until ctx ends. Calls after Close return [ErrClosed].
func (c *Cache[V]) Close(ctx context.Context) error {
	c.mu.Lock()
	already := c.closed.Swap(true)
	c.mu.Unlock()
	if already {
		return nil
	}
	c.cancel()
	if c.unsubscribe != nil {
		c.unsubscribe()
	}
	done := make(chan struct{})
	go func() {
		c.bg.Wait()
		c.local.StopAllGoroutines()
		close(done)
	}()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("herd: close: %w", ctx.Err())
	}
}

// generations order the tiers' writes against Set and Invalidate. Set and
// Invalidate bump the generation of their key's stripe when they begin and
// when they end, and a load that read an older generation writes neither
// tier. Keys share stripes, so an unrelated change can keep a value out of
// the local tier, never let an old one in.
//
// A load without a lease writes the Store unfenced, so the order of those
// writes is kept here too: while a Set or Invalidate of key runs, no such
// write of key starts, and it begins only once every one in flight has
// landed.
type generations struct {
	seed    maphash.Seed
	stripes [256]genStripe
}

type genStripe struct {
	mu sync.Mutex
	n  uint64 // guarded by mu
	// puts counts the entries put in the local tier by loads and reads;
	// guarded by mu. A Store read made before a put may be out of date.
	puts uint64
	// writes counts, by key, the unfenced remote writes in flight, and
	// changes the Sets and Invalidates running; guarded by mu, nil until
	// first used, and a key is deleted when its count drops to zero.
	writes, changes map[string]int
	// idle is signalled when a key's writes drop to zero; its L is &mu.
	idle sync.Cond
}

func (g *generations) stripe(key string) *genStripe {
	return &g.stripes[maphash.String(g.seed, key)%uint64(len(g.stripes))]
}

// get returns the generation and the count of puts of key's stripe.
func (g *generations) get(key string) (gen, puts uint64) {
	s := g.stripe(key)
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.n, s.puts
}

// beginChange starts a Set or Invalidate of key: it bumps the generation,
// runs fn (if not nil) under the stripe's lock, and returns once no unfenced
// remote write of key is in flight. Each call is ended by endChange.
func (g *generations) beginChange(key string, fn func()) {
	s := g.stripe(key)
	s.mu.Lock()
	defer s.mu.Unlock()
	s.n++
	if s.changes == nil {
		s.changes = make(map[string]int)
	}
	s.changes[key]++
	if fn != nil {
		fn()
	}
	for s.writes[key] > 0 {
		if s.idle.L == nil {
			s.idle.L = &s.mu
		}
		s.idle.Wait()
	}
}

// endChange ends a change begun by beginChange: it bumps the generation
// again and runs fn under the stripe's lock.
func (g *generations) endChange(key string, fn func()) {
	s := g.stripe(key)
	s.mu.Lock()
	defer s.mu.Unlock()
	s.n++
	if s.changes[key]--; s.changes[key] == 0 {
		delete(s.changes, key)
	}
	fn()
}

// endWrite ends an unfenced remote write of key counted by publish.
func (g *generations) endWrite(key string) {
	s := g.stripe(key)
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.writes[key]--; s.writes[key] == 0 {
		delete(s.writes, key)
		if s.idle.L != nil {
			s.idle.Broadcast()
		}
	}
}
