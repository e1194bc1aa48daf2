package herd

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/herdcache/herd/xfetch"
)

// Refresh-ahead: a pinned key is kept loaded and fresh on a timer, read or
// not. Each value is replaced once, shortly before its soft expiry, by the
// same refresh a read would start: through the limiter at background
// priority (a shed one promoted as any refresh is) and through the lease,
// so that the replicas that pin a key load it once per fleet between them.

// pins are the keys refreshed ahead of their expiry; the zero value holds
// none.
type pins[V any] struct {
	mu sync.Mutex
	m  map[string]*pin[V] // guarded by mu; nil until the first pin
	// scan is the timer of scanHot; nil without RefreshAheadHot. share is
	// the timer of shareHot; nil without ShareHotKeys.
	scan, share *time.Timer
}

// pin is one pinned key: its load and the timer of its next look, both
// guarded by the pins' mu.
type pin[V any] struct {
	load  LoadFunc[V]
	timer *time.Timer
	// hot marks a key pinned by scanHot, not by Pin: it is refreshed only
	// while it is read.
	hot bool
}

// Pin keeps key loaded and fresh on this replica whether or not it is read:
// each value is refreshed in the background shortly before its soft expiry,
// through the limiter at background priority and the lease, so that
// replicas that pin the same key load it about once per soft TTL between
// them. load (or [Options.Load] when load is nil) loads it. Pinning a pinned
// key replaces its load. Pin fails when the cache is closed, when there is
// no load, and when [Options.MaxRefreshAhead] keys are pinned already.
func (c *Cache[V]) Pin(key string, load LoadFunc[V]) error {
	if c.closed.Load() {
		return ErrClosed
	}
	if load = c.loader(key, load); load == nil {
		return fmt.Errorf("%w: pin %q", ErrNoLoader, key)
	}
	c.pins.mu.Lock()
	defer c.pins.mu.Unlock()
	if p, ok := c.pins.m[key]; ok {
		p.load, p.hot = load, false
		return nil
	}
	if len(c.pins.m) >= c.cfg.MaxRefreshAhead {
		return fmt.Errorf("herd: pin %q: %d keys pinned already (MaxRefreshAhead)", key, len(c.pins.m))
	}
	c.addPin(key, load, false)
	return nil
}

// addPin pins key and looks at it at once. c.pins.mu is held.
func (c *Cache[V]) addPin(key string, load LoadFunc[V], hot bool) {
	if c.pins.m == nil {
		c.pins.m = make(map[string]*pin[V])
	}
	p := &pin[V]{load: load, hot: hot}
	c.pins.m[key] = p
	p.timer = time.AfterFunc(0, func() { c.look(key, p) })
}

// scanHot runs every soft TTL with RefreshAheadHot: it makes the keys read
// most hot pins, in place of hot pins no longer among them where
// RefreshAheadHot or MaxRefreshAhead allows no more, and starts the count
// again.
func (c *Cache[V]) scanHot() {
	top := c.hot.Top()
	c.hot.Reset()
	want := make(map[string]bool, len(top))
	for _, it := range top {
		want[it.Key] = true
	}
	c.pins.mu.Lock()
	defer c.pins.mu.Unlock()
	if c.closed.Load() {
		return
	}
	// A hot pin outside the top keeps its place until a top key needs it:
	// hits are sampled, so a key read at a modest rate may be missed by one
	// count and still be read (look drops a pin whose copy went unread).
	var spare []string
	hot := 0
	for key, p := range c.pins.m {
		if p.hot {
			hot++
			if !want[key] {
				spare = append(spare, key)
			}
		}
	}
	// The pins whose copy went unread give up their place first.
	slices.SortFunc(spare, func(a, b string) int { return cmp.Compare(c.wasRead(a), c.wasRead(b)) })
	for _, it := range top {
		if _, ok := c.pins.m[it.Key]; ok {
			continue
		}
		if hot >= c.cfg.RefreshAheadHot || len(c.pins.m) >= c.cfg.MaxRefreshAhead {
			if len(spare) == 0 {
				continue
			}
			c.pins.m[spare[0]].timer.Stop()
			delete(c.pins.m, spare[0])
			spare, hot = spare[1:], hot-1
		}
		c.addPin(it.Key, c.loader(it.Key, nil), true)
		hot++
	}
	c.pins.scan.Reset(c.cfg.SoftTTL)
}

// wasRead is 1 when key's local copy was read, else 0.
func (c *Cache[V]) wasRead(key string) int {
	if e, ok := c.local.GetIfPresent(key); ok && e.read.Load() {
		return 1
	}
	return 0
}

// Unpin stops refreshing key ahead of its expiry; its value stays cached
// until it expires. Unpinning a key that is not pinned does nothing.
func (c *Cache[V]) Unpin(key string) {
	c.pins.mu.Lock()
	defer c.pins.mu.Unlock()
	if p, ok := c.pins.m[key]; ok {
		p.timer.Stop()
		delete(c.pins.m, key)
	}
}

// unpinHot drops p, a hot pin of key, unless Pin has made it a user's pin
// meanwhile.
func (c *Cache[V]) unpinHot(key string, p *pin[V]) {
	c.pins.mu.Lock()
	defer c.pins.mu.Unlock()
	if q, ok := c.pins.m[key]; ok && q == p && p.hot {
		delete(c.pins.m, key)
	}
}

// pinned reports whether key is pinned.
func (c *Cache[V]) pinned(key string) bool {
	c.pins.mu.Lock()
	defer c.pins.mu.Unlock()
	_, ok := c.pins.m[key]
	return ok
}

// stopPins stops every pin's timer, for Close.
func (c *Cache[V]) stopPins() {
	c.pins.mu.Lock()
	defer c.pins.mu.Unlock()
	for _, p := range c.pins.m {
		p.timer.Stop()
	}
	for _, t := range []*time.Timer{c.pins.scan, c.pins.share} {
		if t != nil {
			t.Stop()
		}
	}
}

// look is a pin's timer: it loads key when this replica holds no usable
// copy, starts its refresh once the copy is due, and sets the timer for the
// next look: the copy's due time, or a short while when a load or refresh
// is under way.
func (c *Cache[V]) look(key string, p *pin[V]) {
	c.mu.RLock()
	if c.closed.Load() {
		c.mu.RUnlock()
		return
	}
	c.bg.Add(1)
	c.mu.RUnlock()
	defer c.bg.Done()
	c.pins.mu.Lock()
	load, hot := p.load, p.hot
	c.pins.mu.Unlock()
	now := c.clk.now()
	next := time.Duration(0)
	e, ok := c.local.GetIfPresent(key)
	switch {
	case hot && ok && now >= c.due(e) && !e.read.Load():
		c.unpinHot(key, p) // not read since its value was loaded
		return
	case !ok || now >= e.soft || !c.trusted(e, now) && !e.revalidating.Load():
		// Nothing fresh to refresh: a Get loads it, or reads what another
		// replica stored. It waits, on this timer's goroutine only.
		ctx, cancel := context.WithTimeout(c.closeCtx, c.cfg.LoadTimeout)
		_, err := c.Get(ctx, key, load, NoStale())
		cancel()
		next = c.recheck(nil)
		if err != nil {
			next = max(next, c.cfg.RefreshBackoff, time.Second)
		}
	case now >= c.due(e):
		c.refresh(c.closeCtx, key, load, e, &c.st.aheadRefreshes)
		next = c.recheck(e)
	default:
		next = time.Duration(c.due(e) - now)
	}
	c.pins.mu.Lock()
	defer c.pins.mu.Unlock()
	if q, ok := c.pins.m[key]; ok && q == p && !c.closed.Load() {
		p.timer.Reset(next)
	}
}

// due is when a pinned copy's refresh starts: its load duration plus the
// margin XFetch gives before its soft expiry (at least a millisecond). The
// duration is the larger of the last load's and nine tenths of the one
// before it (see entry.delta), so a load somewhat slower than the last
// still ends in time.
func (c *Cache[V]) due(e *entry[V]) int64 {
	ahead := max(time.Duration(float64(e.delta)*(1+xfetch.DefaultMargin)), time.Millisecond)
	return e.soft - int64(ahead)
}

// recheck is how soon a pin looks again while a load or refresh of its key
// may be under way: a quarter of the last load's duration, between 5ms and
// a second.
func (c *Cache[V]) recheck(e *entry[V]) time.Duration {
	d := 5 * time.Millisecond
	if e != nil {
		d = time.Duration(e.delta / 4)
	}
	return min(max(d, 5*time.Millisecond), time.Second)
}
