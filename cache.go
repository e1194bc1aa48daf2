package herd

import (
	"context"
	"errors"
	"fmt"
	"hash/maphash"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"github.com/maypok86/otter/v2"

	"github.com/herdcache/herd/flight"
	"github.com/herdcache/herd/internal/topk"
	"github.com/herdcache/herd/observe"
	"github.com/herdcache/herd/remote"
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
// optional [remote.Lease]. Its methods are safe for concurrent use.
type Cache[V any] struct {
	cfg     config[V]
	local   *localTier[V]
	flights flight.Group[string, *entry[V]]
	// reads coalesces the Store reads of a key: a burst of callers of one
	// key makes one read per replica, not one each.
	reads flight.Group[string, remoteRead[V]]
	// fillBlocks and waitBlocks recycle the fills of batches and their
	// losers' waits (*fillBlock, *waitBlock).
	fillBlocks, waitBlocks sync.Pool
	// scratches recycles the arrays of batches' fills (*scratch).
	scratches sync.Pool
	gens      generations
	clk       clock
	// hitClk is the clock of the hit path; it reads clk.
	hitClk coarseClock
	st     counters
	brk    breaker

	recorder observe.Recorder      // NopRecorder without Options.Recorder
	tracer   observe.Tracer        // nopTracer unless the Recorder traces
	events   observe.EventRecorder // nopEvents unless the Recorder takes events
	loadDur  histogram
	waitDur  histogram // lease losers' waits
	queueDur histogram // limiter queue waits
	keyLoads keyLoads
	top      *topk.Tracker // nil: no hot-key tracking
	// trustFloor is when the local tier last lost its claim to be current
	// (Unix ns): a missed change notice, or the breaker closing. Local entries
	// put before it are re-read from the Store before being served as fresh.
	trustFloor atomic.Int64
	// liveUntil is when the last proof that no change notice was lost
	// stops covering the local tier (Unix ns; see live.go). Zero while there is none; only the
	// subscription's goroutine stores it.
	liveUntil atomic.Int64

	// draw, when not nil, returns the uniform number in (0, 1] that decides
	// a value's early refresh instead of the one derived from the value
	// itself, and jitterDraw one in [0, 1) for TTL jitter; tests replace
	// them for determinism.
	draw       func() float64
	jitterDraw func() float64
	// staggerDraw returns the number in [0, 1) that scales the random
	// delay of a due refresh (announced.go); tests replace it.
	staggerDraw func() float64

	// closeCtx ends when Close is called; it cancels running loads.
	closeCtx context.Context
	cancel   context.CancelFunc
	// mu guards closed against bg.Add racing bg.Wait in Close.
	mu          sync.RWMutex
	closed      atomic.Bool
	bg          sync.WaitGroup
	unsubscribe func()
	// unsubscribeHolds stops the subscription to the Lease's hold
	// announcements; nil when the Lease makes none (announced.go).
	unsubscribeHolds func()
	// announces is set, before the subscription, when the cache hears its
	// Lease's hold announcements.
	announces bool
	// company is set once this replica knows that others lease its
	// keys: from then on due refreshes are staggered (announced.go).
	company atomic.Bool
	pins    pins[V]
	// hot counts reads for RefreshAheadHot over each soft TTL, and shared
	// for ShareHotKeys over each of its periods; nil when off.
	hot, shared *topk.Tracker
	// window gathers the refreshes of Gets served by Options.LoadMany.
	window refreshBatch[V]
	// tags holds the versions of the tags this replica has seen.
	tags tagVersions
	// clears counts this replica's InvalidateAlls whose notice has not come
	// back yet (ownClear).
	clears atomic.Int32
}

// New returns a cache configured by o; a nil o means [DefaultOptions],
// whose Limiter (32 concurrent loads) is new on each call, so two caches
// made with nil options over one backing store put two caps on it: give
// them one limiter instead. Invalid options give an error whose text
// starts with "herd: ".
func New[V any](o *Options[V]) (*Cache[V], error) {
	if o == nil {
		o = DefaultOptions[V]()
	}
	cfg, err := o.validate()
	if err != nil {
		return nil, err
	}
	rec, err := recorderFor(cfg.Recorder, cfg.name())
	if err != nil {
		return nil, err
	}
	c := &Cache[V]{
		cfg:         cfg,
		clk:         newClock(),
		jitterDraw:  rand.Float64,
		staggerDraw: rand.Float64,
		recorder:    rec,
	}
	c.hitClk = coarseClock{precise: &c.clk, stop: make(chan struct{})}
	if !cfg.PreciseClock {
		c.hitClk.res = coarseResolution(cfg.SoftTTL, cfg.NearTTL, cfg.NegativeTTL)
	}
	c.flights.Timeout = cfg.LoadTimeout
	c.reads.Timeout = cfg.LoadTimeout
	c.flights.OnJoin = func(string) { c.st.coalesced.add(1) }
	c.brk.threshold = int32(cfg.BreakerThreshold)
	c.brk.cooldown = cfg.BreakerCooldown
	c.brk.onChange = c.breakerChanged
	c.observe()
	c.brk.startFrom(cfg.Store)
	c.gens.seed = maphash.MakeSeed()
	c.gens.completions, _ = cfg.Lease.(remote.CompletionCounter)
	c.tags.limit = max(2*cfg.MaxEntries, 1024)
	if c.local, err = newLocal(cfg); err != nil {
		return nil, err
	}
	c.closeCtx, c.cancel = context.WithCancel(context.Background())
	c.subscribe()
	c.subscribeHolds()
	// The timers read their own fields under pins.mu: a short period may
	// fire before New returns.
	c.pins.mu.Lock()
	if c.hot != nil {
		c.pins.scan = time.AfterFunc(cfg.SoftTTL, c.scanHot)
	}
	if c.shared != nil {
		c.pins.share = time.AfterFunc(c.sharePeriod(), c.shareHot)
	}
	c.pins.mu.Unlock()
	return c, nil
}

// observe sets up what the cache counts and whom it tells: the hot-key
// trackers, and the Recorder's optional Tracer and EventRecorder.
func (c *Cache[V]) observe() {
	cfg := &c.cfg
	if cfg.HotKeys > 0 && !cfg.DisableStats {
		c.top = topk.New(cfg.HotKeys)
	}
	if cfg.RefreshAheadHot > 0 {
		c.hot = topk.New(cfg.RefreshAheadHot)
	}
	if cfg.ShareHotKeys > 0 {
		c.shared = topk.New(cfg.ShareHotKeys)
	}
	c.tracer, c.events = nopTracer{}, nopEvents{}
	if t, ok := c.recorder.(observe.Tracer); ok {
		c.tracer = t
	}
	if ev, ok := c.recorder.(observe.EventRecorder); ok {
		c.events = ev
	}
}

// newLocal makes the local tier. It evicts by size (or weight) only:
// entries carry their own soft and hard expiry, checked on each read with
// the cache's clock, so otter needs no clock of its own on the hit path.
func newLocal[V any](cfg config[V]) (*localTier[V], error) {
	lo := &otter.Options[string, *entry[V]]{MaximumSize: cfg.MaxEntries, Clock: noClock{}}
	t := &localTier[V]{}
	if w := cfg.Weigher; cfg.MaxWeight > 0 {
		t.weigh = func(key string, e *entry[V]) uint32 { return w(key, e.value) }
		t.max, t.heavy = cfg.MaxWeight, cfg.MaxWeight/256
		lo.MaximumWeight, lo.Weigher = cfg.MaxWeight, t.weigh
	}
	local, err := otter.New(lo)
	if err != nil {
		return nil, fmt.Errorf("herd: local tier: %w", err)
	}
	t.main = local
	return t, nil
}

// breakerChanged reports the breaker opening, with the failure that
// opened it, or closing; once it closes, local copies put before are
// re-read from the Store before being served as fresh.
func (c *Cache[V]) breakerChanged(open bool, cause error) {
	if !open {
		c.trustFloor.Store(c.clk.now())
	}
	if open {
		c.event(observe.EventBreakerOpened, "", cause)
	} else {
		c.event(observe.EventBreakerClosed, "", nil)
	}
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
	accept    any // an AcceptFunc; nil: none
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
	accept  any // an AcceptFunc; nil: none
	noStale bool
	policy  LoserPolicy
}

func (c *Cache[V]) resolve(opts []CallOption) callOpts {
	co := callOpts{noStale: c.cfg.NoStale, policy: c.cfg.OnLeaseHeld}
	for _, o := range opts {
		co.noStale = co.noStale || o.noStale
		if o.accept != nil {
			co.accept = o.accept
		}
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
//
// An error the load returns is returned as it is. Other errors start with
// "herd: ". A load that panics does not crash the process: every caller
// waiting for it gets an error that wraps a [*flight.PanicError] holding
// the panic value and the stack (errors.Is and errors.As see through it to
// a panic value that is an error), nothing is cached, and the next Get of
// the key loads again; a load that calls runtime.Goexit gives
// [flight.ErrGoexit] the same way. A caller whose ctx ends first gets an
// error that wraps ctx.Err() (and its cause).
func (c *Cache[V]) Get(ctx context.Context, key string, load LoadFunc[V], opts ...CallOption) (V, error) {
	if c.closed.Load() {
		var zero V
		return zero, ErrClosed
	}
	if len(opts) > 0 && accepting(opts) {
		return c.getAccepting(ctx, key, load, c.resolve(opts))
	}
	if e, ok := c.localGet(key); ok {
		// The coarse clock's bound judges a value far from its expiries; one
		// within a resolution of them is judged by the precise time.
		if now := c.hitClk.bound(); now < e.soft-e.lead && c.trusted(e, now) {
			c.hit(key, e)
			return c.served(e)
		}
		if c.hitNear(ctx, key, load, e, opts) {
			return c.served(e)
		}
	}
	v, err := c.miss(ctx, key, load, c.resolve(opts))
	return v, outward("get", key, err)
}

// GetIfPresent returns key's value when the local tier holds a fresh one
// that Get would serve at once: before its soft expiry and, with a Store,
// within the consistency contract's bound (trusted, or younger than
// 2×NearTTL and not superseded by a change notice). It never loads, never
// reads the Store and starts no refresh or revalidation, and Stats does not
// count it. A stale value, a negative entry and a closed cache report
// false.
func (c *Cache[V]) GetIfPresent(key string) (V, bool) {
	var zero V
	e, ok := c.localGet(key)
	if !ok || e.negative || c.closed.Load() {
		return zero, false
	}
	if now := c.hitClk.bound(); now < e.soft-e.lead && c.trusted(e, now) {
		return e.value, true
	}
	now := c.clk.now()
	if now >= e.soft || !c.trusted(e, now) && (e.superseded.Load() || !c.young(key, e, now)) {
		return zero, false
	}
	return e.value, true
}

// hitNear decides, by the precise time, whether a local entry near or past
// one of its expiries is served: fresh (starting an early refresh when its
// lead has come), or stale unless the call wants no stale value. When it is
// not, the call is a miss.
func (c *Cache[V]) hitNear(ctx context.Context, key string, load LoadFunc[V], e *entry[V], opts []CallOption) bool {
	serve, refresh := c.near(ctx, key, e, opts)
	if refresh != nil {
		c.refresh(ctx, key, load, e, refresh)
	}
	return serve
}

// near is hitNear's decision, and the counter of the refresh that serving e
// starts (nil: none), for the caller to start it.
func (c *Cache[V]) near(ctx context.Context, key string, e *entry[V], opts []CallOption) (serve bool, refresh *stripedCounter) {
	now := c.clk.now()
	if now >= e.hard || !c.servable(ctx, key, e, now) {
		return false, nil
	}
	if now < e.soft {
		c.hit(key, e)
		if now >= e.soft-e.lead {
			return true, &c.st.earlyRefreshes
		}
		return true, nil
	}
	if c.noStale(opts) {
		return false, nil
	}
	c.markRead(e)
	c.got(key, observe.ResultStale)
	return true, &c.st.staleRefreshes
}

// hit counts a fresh hit on e.
func (c *Cache[V]) hit(key string, e *entry[V]) {
	c.markRead(e)
	c.got(key, e.freshResult())
}

// markRead records that e was read, for RefreshAheadHot.
func (c *Cache[V]) markRead(e *entry[V]) {
	if c.hot != nil && !e.read.Load() {
		e.read.Store(true)
	}
}

// trusted reports whether a local entry may be served without asking the
// Store: there is none, the entry is within NearTTL or the notice channel
// is proven live (live.go) and no notice may have been missed since it was
// put, or the breaker is open and not yet due for a
// probe (a due probe goes through the flight, which the other readers join).
func (c *Cache[V]) trusted(e *entry[V], now int64) bool {
	return c.cfg.Store == nil || (now < e.near || c.live(now)) && e.born > c.trustFloor.Load() && !e.superseded.Load() || c.brk.open() && !c.brk.probeDue()
}

// servable reports whether a reader may be served a local entry without
// waiting on the Store: it is trusted, or it is a copy past NearTTL, or
// superseded by a notice, that is younger than 2×NearTTL and put after the
// trust floor while the breaker is closed. Such a copy is served while one
// read of the Store replaces it in the background (revalidate).
func (c *Cache[V]) servable(ctx context.Context, key string, e *entry[V], now int64) bool {
	if c.trusted(e, now) {
		return true
	}
	if !c.young(key, e, now) {
		return false
	}
	c.revalidate(ctx, key, e)
	return true
}

// young reports whether a local entry that is not trusted may still be
// served while the Store is read again: it was put after the trust floor,
// the breaker is closed, and it is younger than 2×NearTTL or the live
// channel that trusted it lapsed less than NearTTL ago (liveYoung).
func (c *Cache[V]) young(key string, e *entry[V], now int64) bool {
	if c.cfg.NearTTL == 0 || e.born <= c.trustFloor.Load() || c.brk.open() {
		return false
	}
	return now < addTime(e.near, c.cfg.NearTTL) || c.liveYoung(key, e, now)
}

// remoteChange makes the Store call of a Set, Invalidate or MarkStale (op)
// of key, unless the breaker is open, and records its outcome; an error
// wraps ErrDegraded.
func (c *Cache[V]) remoteChange(ctx context.Context, op, key string, call func() error) error {
	if !c.brk.allow() {
		return fmt.Errorf("%w: %s %q: breaker open", ErrDegraded, op, key)
	}
	at := c.brk.at()
	err := call()
	c.remoteDone(ctx, at, err)
	if err != nil {
		return fmt.Errorf("%w: %s %q: %w", ErrDegraded, op, key, err)
	}
	return nil
}

// remoteDone records the outcome of a remote call that began in the
// breaker's epoch at for the breaker and the stats.
func (c *Cache[V]) remoteDone(ctx context.Context, at epoch, err error) {
	if err != nil {
		c.st.remoteErrors.add(1)
	}
	c.brk.record(ctx, at, err)
}

func (c *Cache[V]) served(e *entry[V]) (V, error) { return e.result() }

// event hands an Event to the EventRecorder.
func (c *Cache[V]) event(kind observe.EventKind, key string, err error) {
	c.events.RecordEvent(observe.Event{Kind: kind, Key: key, Err: err})
}

// span starts a span with the Tracer; end is never nil.
func (c *Cache[V]) span(ctx context.Context, op, key string) (context.Context, func(error)) {
	return c.tracer.StartSpan(ctx, op, key)
}

// loader resolves the load function of a call.
func (c *Cache[V]) loader(key string, load LoadFunc[V]) LoadFunc[V] {
	if load != nil {
		return load
	}
	switch {
	case c.cfg.Load != nil:
		return func(ctx context.Context) (V, error) { return c.cfg.Load(ctx, key) }
	case c.cfg.LoadMany != nil:
		return oneOf(key, c.cfg.LoadMany)
	}
	return nil
}

// noticed handles a change notice from another replica: the zero Notice
// means notices may have been lost. A local copy older than the change is
// dropped when the change deleted the value, replaced by the value the
// notice carries when it carries one this replica can use (carried.go),
// and otherwise marked superseded: served while one read of the Store
// replaces it.
func (c *Cache[V]) noticed(n remote.Notice) {
	if n.Tag != "" {
		c.tags.learn(n.Tag, n.Fence) // entries with the tag are refused as they are read
		return
	}
	if !n.Live.IsZero() {
		c.proved(n.Live)
		return
	}
	if !n.Held.IsZero() {
		return // a hold is no change; it comes through SubscribeHolds (announced.go)
	}
	if n.Fence == 0 {
		if n.Dropped && c.ownClear() {
			return // this replica's own InvalidateAll: it dropped everything already
		}
		if !n.Dropped {
			c.liveUntil.Store(0) // notices were lost: no proof holds until the next
		}
		c.trustFloor.Store(c.clk.now())
		c.gens.forgetAllHeld()
		if n.Dropped {
			c.dropAll() // another replica's InvalidateAll
		} else {
			c.clears.Store(0) // notices were lost, this replica's own among them perhaps
		}
		return
	}
	c.gens.forgetHeld(n.Key)
	e, ok := c.local.GetIfPresent(n.Key)
	switch {
	case !ok || e.fence.Load() >= n.Fence:
	case n.Dropped:
		c.unpublish(n.Key, e)
	case c.adopt(n, e):
	default:
		if n.Value != "" {
			c.st.noticeValuesRefused.add(1)
		}
		e.superseded.Store(true)
		if c.pinned(n.Key) {
			c.revalidate(context.Background(), n.Key, e) // no read may come to do it
		}
	}
}

// Set stores v under key in both tiers with the configured TTLs (jittered),
// fencing out every load of key that began before it: in this process
// always, on other replicas when the cache has a Lease.
func (c *Cache[V]) Set(ctx context.Context, key string, v V) error {
	return c.SetWithTTL(ctx, key, v, c.cfg.SoftTTL, c.cfg.HardTTL)
}

// SetWithTTL is Set with the soft and hard TTL of this value (jittered as
// configured) in place of the cache's. They are judged as [New] judges
// [Options.SoftTTL] and HardTTL: a hard TTL of zero means the soft one (no
// stale window), and TTLs New would refuse are an error with New's words,
// and nothing is stored.
func (c *Cache[V]) SetWithTTL(ctx context.Context, key string, v V, soft, hard time.Duration) error {
	if c.closed.Load() {
		return ErrClosed
	}
	if err := ttlError(fmt.Sprintf("herd: set %q: ", key), soft, hard); err != nil {
		return err
	}
	now := c.clk.now()
	soft, hard = c.cfg.jitter.Pair(soft, max(hard, soft), c.jitterDraw())
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
		if err = c.remoteChange(ctx, "set", key, func() (err error) {
			f, err = c.cfg.Store.Set(ctx, key, env, hard)
			return err
		}); err == nil {
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
	c.forget(key)
	return err
}

// MarkStale makes key's value stale rather than gone, on this replica and,
// with a Store, on every replica: it is served stale, to callers that allow
// it, while one refresh replaces it (with a Lease, one for the fleet), and
// a NoStale caller loads. Like Set and Invalidate it fences out every load
// of key that began before it. With a Store, other replicas mark their
// copies on the change notice (until then they serve them, as the
// consistency contract allows); the Store must implement [remote.Staler], or
// MarkStale changes nothing and returns an error wrapping
// [errors.ErrUnsupported]. When the Store cannot be reached, the local copy
// is dropped and the error wraps [ErrDegraded].
func (c *Cache[V]) MarkStale(ctx context.Context, key string) error {
	if c.closed.Load() {
		return ErrClosed
	}
	st, ok := c.cfg.Store.(remote.Staler)
	if c.cfg.Store != nil && !ok {
		return fmt.Errorf("herd: mark stale %q: the Store cannot (it is not a Staler): %w", key, errors.ErrUnsupported)
	}
	c.gens.beginChange(key, nil)
	var (
		err   error
		fence uint64
	)
	if st != nil {
		err = c.remoteChange(ctx, "mark stale", key, func() (err error) {
			fence, err = st.MarkStale(ctx, key)
			return err
		})
	}
	c.gens.endChange(key, func() {
		e, ok := c.local.GetIfPresent(key)
		switch {
		case !ok:
		case err != nil:
			c.local.Invalidate(key)
		default:
			if now := c.clk.now(); now < e.soft {
				c.local.Set(key, e.staleCopy(now, fence))
			}
		}
	})
	c.forget(key)
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
	c.forget(key)
	var err error
	if c.cfg.Store != nil {
		err = c.remoteChange(ctx, "invalidate", key, func() error { return c.cfg.Store.Invalidate(ctx, key) })
	}
	// A read of the Store made while it still held the old value may have
	// put that value back in the local tier, or started a flight that would
	// hand it out: the change ends by dropping both again.
	c.gens.endChange(key, drop)
	c.forget(key)
	return err
}

// InvalidateAll drops every key from both tiers, on every replica, as
// Invalidate drops one: no load running now writes its value back (on other
// replicas, only with a Lease), and other replicas drop their local tiers
// on the Store's notice, or within 2×NearTTL if it is lost. The Store
// retires its keys in a few round trips whatever their number; it must be
// a [remote.Clearer], or InvalidateAll drops the local tier and returns an error
// wrapping [errors.ErrUnsupported]. When the Store cannot be reached, the
// local tier is dropped and the error wraps [ErrDegraded].
func (c *Cache[V]) InvalidateAll(ctx context.Context) error {
	if c.closed.Load() {
		return ErrClosed
	}
	c.gens.beginAll()
	c.dropAll()
	var err error
	if s := c.cfg.Store; s != nil {
		if cl, ok := s.(remote.Clearer); ok {
			c.clears.Add(1) // before the call: its notice may come back before it returns
			if err = c.remoteChange(ctx, "invalidate-all", "", func() error { return cl.InvalidateAll(ctx) }); err != nil {
				c.ownClear() // no notice will come, or one that is taken for another replica's
			}
		} else {
			err = fmt.Errorf("herd: InvalidateAll: the Store (%T) cannot retire every key: %w", s, errors.ErrUnsupported)
		}
	}
	// As in Invalidate: what a read of the Store put back meanwhile goes.
	c.gens.endAll()
	c.dropAll()
	return err
}

// ownClear takes one of this replica's own InvalidateAlls whose notice has
// not come back, and reports whether there was one. Notices come in the
// order the Store made the changes, so a notice taken for this replica's
// own is at worst another replica's earlier one, whose keys this replica's
// own InvalidateAll dropped too.
func (c *Cache[V]) ownClear() bool {
	for {
		n := c.clears.Load()
		if n <= 0 {
			return false
		}
		if c.clears.CompareAndSwap(n, n-1) {
			return true
		}
	}
}

// forget frees key for a new flight and a new read of the Store, so that
// no caller joins one that began before a change of key.
func (c *Cache[V]) forget(key string) {
	c.flights.Forget(key)
	c.reads.Forget(key)
}

// dropAll empties the local tier and frees every key for a new flight, so
// that no caller joins a load that began before.
func (c *Cache[V]) dropAll() {
	c.gens.bumpAll()
	c.local.InvalidateAll()
	c.flights.ForgetAll()
	c.reads.ForgetAll()
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
	close(c.hitClk.stop)
	if c.unsubscribe != nil {
		c.unsubscribe()
	}
	if c.unsubscribeHolds != nil {
		c.unsubscribeHolds()
	}
	c.stopPins()
	c.window.stop()
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

// localGet is the local tier's entry for key when it may be served; a
// tagged entry a tag's version retired is dropped.
func (c *Cache[V]) localGet(key string) (*entry[V], bool) {
	e, ok := c.local.GetIfPresent(key)
	if !ok || c.usable(e) {
		return e, ok
	}
	c.unpublish(key, e)
	return nil, false
}
