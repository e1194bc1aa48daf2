package herd

import (
	"cmp"
	"context"
	"errors"
	"sync"
	"time"

	"github.com/herdcache/herd/limiter"
)

// refresh starts one background refresh of e, unless one is running, a
// failed or shed one is backing off, a load of key runs in this process,
// or key's lease is held, elsewhere or by a load of this replica: then
// readers are served e until the lease ends (the holder's notice, its time
// passing, or this replica's own release) or e's hard TTL is near.
func (c *Cache[V]) refresh(ctx context.Context, key string, load LoadFunc[V], e *entry[V], started *stripedCounter) {
	if !c.refreshDue(key, e) {
		return
	}
	if load == nil && c.cfg.Load == nil && c.cfg.LoadMany != nil {
		c.window.add(c, staleRead[V]{key: key, e: e, started: started})
		return
	}
	load = c.loader(key, load)
	if load == nil || !c.claimRefresh(key, e) {
		return
	}
	bctx := context.WithoutCancel(ctx)
	if !c.onExecutor(started, func() {
		c.runRefresh(bctx, key, load, e)
		c.unclaimRefresh(key, e)
	}) {
		c.unclaimRefresh(key, e)
	}
}

// refreshDue reports whether e may be refreshed now: it is not being
// refreshed, not backing off, not superseded (the read that replaces e
// brings the newer value), its lease is not known to be held until near its
// hard expiry, and no load of key runs in this process (its value replaces
// e).
func (c *Cache[V]) refreshDue(key string, e *entry[V]) bool {
	now := c.clk.now()
	if e.uncached || e.retryAt.Load() > now || e.refreshing.Load() || e.superseded.Load() {
		return false
	}
	if until, held := c.gens.held(key, now); held && until < e.hard-e.delta {
		return false
	}
	return c.flights.Waiters(key) == 0
}

// claimRefresh claims the refresh of e, and of key: one refresh of a key
// runs at a time, whichever copy it replaces.
func (c *Cache[V]) claimRefresh(key string, e *entry[V]) bool {
	if !e.refreshing.CompareAndSwap(false, true) {
		return false
	}
	if !c.gens.startRefresh(key) {
		e.refreshing.Store(false) // another copy of key is being refreshed
		return false
	}
	return true
}

// unclaimRefresh ends a claim of claimRefresh, so that a later reader may
// try again if the refresh did not replace e.
func (c *Cache[V]) unclaimRefresh(key string, e *entry[V]) {
	c.gens.endRefresh(key)
	e.refreshing.Store(false)
}

// onExecutor runs fn on the Executor, as background work that Close waits
// for, counted by started (when not nil), and reports whether it did: not on a closed
// cache.
func (c *Cache[V]) onExecutor(started *stripedCounter, fn func()) bool {
	c.mu.RLock()
	if c.closed.Load() {
		c.mu.RUnlock()
		return false
	}
	c.bg.Add(1)
	c.mu.RUnlock()
	if started != nil {
		started.add(1)
	}
	c.cfg.Executor(func() {
		defer c.bg.Done()
		fn()
	})
	return true
}

// runRefresh is one background refresh of old: its limiter slot first, so
// that a refresh that would be shed touches no remote key; then its one
// lease attempt; then the load, in a flight that misses of key join. A
// refresh that finds a flight of key running leaves the load to it.
func (c *Cache[V]) runRefresh(ctx context.Context, key string, load LoadFunc[V], old *entry[V]) {
	release, ok := c.refreshSlot(ctx, old)
	if !ok {
		return
	}
	defer release()
	held, remoteUp, settled := c.refreshLease(ctx, key, old)
	if settled {
		return
	}
	set := newLeaseSet()
	set.add(held)
	defer c.closeSet(ctx, set) // the lease's end, or its release when no flight ran
	_, err, ran := c.flights.TryDo(ctx, key, func(fctx context.Context) (*entry[V], error) {
		return c.refill(fctx, key, load, old, held, set, remoteUp)
	})
	if !ran {
		return
	}
	if err != nil {
		c.st.refreshFailures.add(1)
		c.event(EventRefreshFailed, key, err)
		c.backOff(old, 0)
	}
}

// backOff keeps old from being refreshed again for RefreshBackoff, or for d
// when that is longer.
func (c *Cache[V]) backOff(old *entry[V], d time.Duration) {
	old.retryAt.Store(addTime(c.clk.now(), max(c.cfg.RefreshBackoff, d)))
}

// refreshSlot takes a limiter slot for a refresh of old without waiting. A
// refresh shed that way backs off for the longer of RefreshBackoff and the
// limiter's RetryAfter, but never past the middle of old's stale window:
// from there on its refresh waits for a slot at High priority.
func (c *Cache[V]) refreshSlot(ctx context.Context, old *entry[V]) (release func(), ok bool) {
	l := c.cfg.Limiter
	if l == nil {
		return func() {}, true
	}
	now := c.clk.now()
	if old.shed.Load() && now >= old.midStale() {
		return c.urgentSlot(ctx, l, old)
	}
	if l.TryAcquireBackground() {
		return l.Release, true
	}
	c.shed(limiter.ReasonReserve, true)
	old.shed.Store(true)
	old.retryAt.Store(min(addTime(now, max(c.cfg.RefreshBackoff, l.RetryAfter())), old.midStale()))
	return nil, false
}

// urgentSlot waits for a limiter slot at High priority, for a refresh that
// was shed until half of its stale window passed, so that it takes the next
// released slot. It runs under key's refresh claim (startRefresh), so one
// such refresh of a key waits or runs at a time.
func (c *Cache[V]) urgentSlot(ctx context.Context, l *limiter.Limiter, old *entry[V]) (release func(), ok bool) {
	actx, cancel := context.WithTimeout(limiter.WithPriority(ctx, limiter.High), c.cfg.LoadTimeout)
	stop := context.AfterFunc(c.closeCtx, cancel)
	start := time.Now()
	err := l.Acquire(actx)
	c.queueDur.observe(time.Since(start))
	stop()
	cancel()
	if err != nil {
		var oe *limiter.OverloadError
		if errors.As(err, &oe) {
			c.shed(oe.Reason, true)
		}
		c.backOff(old, l.RetryAfter())
		return nil, false
	}
	return l.Release, true
}

// refreshLease is a refresh's one lease attempt, made before its flight. It
// returns the lease taken (nil: none) and whether the refresh uses the
// remote tier, or settled when the attempt ended the refresh: a newer value
// was found and put in the local tier, or another holds the lease, and no
// refresh of key starts until that lease ends.
func (c *Cache[V]) refreshLease(ctx context.Context, key string, old *entry[V]) (held *heldLease, remoteUp, settled bool) {
	switch {
	case c.cfg.Store == nil:
		return nil, false, false
	case c.cfg.Lease == nil:
		return nil, true, false // refill reads the Store first
	case !c.brk.allow():
		return nil, false, false
	}
	gen, _ := c.gens.get(key)
	now := c.clk.now()
	// Only a value someone else refreshed since old was written stops it.
	a, err := c.tryLease(ctx, key, max(now, old.soft))
	if err != nil {
		return nil, false, true
	}
	switch a.outcome {
	case leaseGranted:
		return a.held, true, false
	case leaseFound:
		c.setLocal(key, a.e, gen)
		return nil, false, true
	case leaseHeld:
		a.giveUp()
		c.backOff(old, 0) // and tryLease remembered the holder
		return nil, false, true
	case leaseUndecodable:
		return nil, true, false // load, and overwrite it unfenced
	}
	return nil, false, false // the tier failed: load, and write nothing remotely
}

// refill is a background refresh's work inside its flight, with its slot
// and its lease (held, when it took one) already taken.
func (c *Cache[V]) refill(ctx context.Context, key string, load LoadFunc[V], old *entry[V], held *heldLease, set *leaseSet, remoteUp bool) (*entry[V], error) {
	c.watchSet(ctx, set)
	f := c.newFill(key, background, callOpts{})
	f.old, f.remoteUp = old, remoteUp
	if e := f.recheckLocal(); e != nil {
		return e, nil // refreshed by someone else meanwhile
	}
	if held == nil && remoteUp && c.cfg.Lease == nil {
		// Without a lease, the Store shows a refresh another replica made.
		if e := f.recheckStore(ctx, remoteRead[V]{}); e != nil {
			return e, nil
		}
	}
	return f.loadAndStore(ctx, load, held, set)
}

// The refresh window of Gets served by Options.LoadMany: the refreshes
// their stale and early reads start within refreshWindow of the first one,
// up to MaxBatch (refreshWindowKeys when MaxBatch is zero) of them, run as
// one batch load.
const (
	refreshWindow     = 2 * time.Millisecond
	refreshWindowKeys = 100
)

// refreshBatch gathers the refreshes of one refresh window.
type refreshBatch[V any] struct {
	mu    sync.Mutex
	reads []staleRead[V]
	keys  map[string]bool // the keys in reads
	timer *time.Timer     // flushes the window; nil while it is empty
}

// add puts r in the window, and starts the window's batch once it is full.
func (w *refreshBatch[V]) add(c *Cache[V], r staleRead[V]) {
	w.mu.Lock()
	if w.keys[r.key] {
		w.mu.Unlock()
		return
	}
	if w.keys == nil {
		w.keys = make(map[string]bool)
	}
	w.keys[r.key] = true
	w.reads = append(w.reads, r)
	if len(w.reads) < cmp.Or(c.cfg.MaxBatch, refreshWindowKeys) {
		if w.timer == nil {
			w.timer = time.AfterFunc(refreshWindow, func() { w.flush(c) })
		}
		w.mu.Unlock()
		return
	}
	w.mu.Unlock()
	w.flush(c)
}

// flush starts the batch of the reads the window holds.
func (w *refreshBatch[V]) flush(c *Cache[V]) {
	w.mu.Lock()
	reads := w.reads
	w.reads, w.keys = nil, nil
	if w.timer != nil {
		w.timer.Stop()
		w.timer = nil
	}
	w.mu.Unlock()
	if len(reads) > 0 {
		c.refreshMany(context.Background(), reads, c.cfg.LoadMany)
	}
}

// stop drops the window's reads, for Close.
func (w *refreshBatch[V]) stop() {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.reads, w.keys = nil, nil
	if w.timer != nil {
		w.timer.Stop()
		w.timer = nil
	}
}
