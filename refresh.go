package herd

import (
	"cmp"
	"context"
	"errors"
	"slices"
	"sync"
	"time"

	"github.com/herdcache/herd/limiter"
	"github.com/herdcache/herd/observe"
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
	if load = c.loader(key, load); load != nil {
		c.refreshMany(ctx, []staleRead[V]{{key: key, e: e, started: started}}, batchOf(key, load))
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
	h, held, completed := c.gens.heldOrCompleted(key, now)
	switch {
	case held && h.until < e.hard-e.delta:
		if h.heard && !h.spared {
			c.skipped(key)
		}
		return false
	case completed:
		// The holder's load ended: its value, if it wrote one, is in the
		// Store, and its notice is on the way. As that notice would, mark
		// e superseded, replaced by one read of the Store, and ask for no
		// lease meanwhile; the copy that read brings is refreshed if it
		// is still due (the holder wrote nothing).
		e.superseded.Store(true)
		c.revalidate(context.Background(), key, e)
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

// refreshMany starts one background refresh of the values reads served,
// with one batch load, for those that are due; without a batch loader each
// is refreshed on its own.
func (c *Cache[V]) refreshMany(ctx context.Context, reads []staleRead[V], load BatchLoadFunc[V]) {
	if load == nil {
		for _, r := range reads {
			c.refresh(ctx, r.key, nil, r.e, r.started)
		}
		return
	}
	olds := make(map[string]*entry[V], len(reads))
	var (
		keys    []string
		started []*stripedCounter
	)
	for _, r := range reads {
		if _, dup := olds[r.key]; dup || !c.refreshDue(r.key, r.e) || !c.claimRefresh(r.key, r.e) {
			continue
		}
		olds[r.key] = r.e
		keys = append(keys, r.key)
		started = append(started, r.started)
	}
	if len(keys) == 0 {
		return
	}
	unclaim := func() {
		for key, e := range olds {
			c.unclaimRefresh(key, e)
		}
	}
	bctx := context.WithoutCancel(ctx)
	// A refresh ahead of a pinned or hot key is timed to end before the
	// value's soft expiry: it is not delayed.
	ahead := slices.Contains(started, &c.st.aheadRefreshes)
	if !c.onExecutor(nil, func() {
		defer unclaim()
		if !ahead {
			keys = c.stagger(keys)
		}
		if len(keys) > 0 {
			c.runRefreshMany(bctx, keys, olds, load)
		}
	}) {
		unclaim()
		return
	}
	for _, n := range started {
		if n != nil {
			n.add(1)
		}
	}
}

// runRefreshMany is one background refresh of the values olds holds: one
// limiter slot for the batch, then, in the keys' flights, the lease of
// each key and one load of the keys this replica leased.
func (c *Cache[V]) runRefreshMany(ctx context.Context, keys []string, olds map[string]*entry[V], load BatchLoadFunc[V]) {
	// The value nearest to the middle of its stale window decides the
	// slot's urgency; the others share its fate.
	first := olds[keys[0]]
	for _, e := range olds {
		if e.midStale() < first.midStale() {
			first = e
		}
	}
	release, ok := c.refreshSlot(ctx, first)
	if !ok {
		for _, e := range olds {
			e.shed.Store(first.shed.Load())
			e.retryAt.Store(max(e.retryAt.Load(), min(first.retryAt.Load(), e.midStale())))
		}
		return
	}
	defer release()
	res := c.flyMany(ctx, keys, func(fctx context.Context, led []string, settle func(string, *entry[V], error)) {
		fs, free := c.newFills(led, callOpts{}, olds)
		defer free()
		c.fillMany(fctx, fs, load, true, settle, false)
	})
	for j, key := range keys {
		if err := res[j].Err; err != nil {
			c.st.refreshFailures.add(1)
			c.event(observe.EventRefreshFailed, key, err)
			c.backOff(olds[key], 0)
		}
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
	err := l.AcquireBackground()
	if err == nil {
		return l.Release, true
	}
	var oe *limiter.OverloadError
	if errors.As(err, &oe) {
		c.shed(oe.Reason, true)
	}
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
