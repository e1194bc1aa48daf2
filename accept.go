package herd

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"

	"github.com/herdcache/herd/observe"
)

// Peek and Accept: a look at both tiers that loads nothing, and a Get that
// lets its caller judge the values it would be served. Together they make a
// miss of a caller with its own notion of freshness (an HTTP cache) one
// lookup: a Peek, then, when what it found will not do, one Get that loads
// instead of handing it back.

// Presence is what [Cache.Peek] found under a key.
type Presence uint8

const (
	// Absent: no value Get would serve, or none that Peek could read.
	Absent Presence = iota
	// Fresh: a value before its soft expiry.
	Fresh
	// Stale: a value past its soft expiry, before its hard one.
	Stale
)

func (p Presence) String() string {
	switch p {
	case Fresh:
		return "fresh"
	case Stale:
		return "stale"
	}
	return "absent"
}

// Peek returns the value of key that a Get would be served, and whether it
// is fresh or stale, without loading: it reads the local tier and then,
// with a Store, the Store (one read per key per replica at a time, shared
// with the Gets of key that arrive meanwhile; a value found is kept in the
// local tier). It starts and joins no load, no refresh and no lease, and a
// load of key in progress does not make it wait. As Get does for a local
// copy past NearTTL, it may start one background read of the Store that
// replaces the copy. Stats does not count it.
//
// A negative entry reports its presence with [ErrNotFound]. A Store that
// fails, or an open breaker, reports Absent with what the local tier holds
// no value for; the error of a failed read is returned with Absent. A
// closed cache returns [ErrClosed]; a caller whose ctx ends while it waits
// for the Store gets an error that wraps ctx.Err().
func (c *Cache[V]) Peek(ctx context.Context, key string) (V, Presence, error) {
	var zero V
	if c.closed.Load() {
		return zero, Absent, ErrClosed
	}
	if e, ok := c.localGet(key); ok {
		if now := c.clk.now(); now < e.hard && c.servable(ctx, key, e, now) {
			return peeked(e, now)
		}
	}
	if c.cfg.Store == nil || c.brk.open() {
		return zero, Absent, nil
	}
	r, err, _ := c.reads.Do(ctx, key, func(rctx context.Context) (remoteRead[V], error) {
		return c.sharedRead(rctx, key), nil
	})
	switch {
	case err != nil:
		return zero, Absent, outward("peek", key, fmt.Errorf("herd: %w", err))
	case r.err != nil:
		return zero, Absent, fmt.Errorf("herd: peek %q: %w", key, r.err)
	case r.e != nil:
		if now := c.clk.now(); now < r.e.hard {
			return peeked(r.e, now)
		}
	}
	return zero, Absent, nil
}

// peeked is Peek's answer for e, a value before its hard expiry at now.
func peeked[V any](e *entry[V], now int64) (V, Presence, error) {
	p := Fresh
	if e.stale(now) {
		p = Stale
	}
	v, err := e.result()
	return v, p, err
}

// AcceptFunc judges a value a Get with [Accept] would be served: the value,
// and whether it is past its soft expiry. It reports whether the caller
// takes it. It runs on the caller's goroutine or a load's, and must not call
// the cache.
type AcceptFunc[V any] func(v V, stale bool) bool

// Accept makes one Get serve only values accept takes: a value present in
// either tier, fresh or stale, that accept refuses is a miss, and the Get
// loads instead of returning it. The caller is then the judge of freshness
// (HTTP's notion of stale, say): a value it accepts is returned as it is,
// and the call starts no early or stale refresh; a load's error is
// returned, never a value accept refused (no stale-if-error). Negative
// entries are not shown to accept.
//
// What the Get's own load returns is returned as it is. A Get with Accept
// that joins a load another caller started and refuses its result does not
// return it: it loads again, in a flight of its own, up to a few times, and
// then fails with [ErrNoFreshValue]. A value accept refused does not stop
// the lease: a Get asks for it with that value's soft expiry, so that only
// a value written since counts as already loaded elsewhere; such a value
// that accept refuses too is loaded again without the lease and kept in
// this replica only.
//
// The V of accept must be the cache's value type; otherwise Get returns an
// error.
func Accept[V any](accept AcceptFunc[V]) CallOption {
	return CallOption{accept: accept}
}

// accepting reports whether opts hold an Accept.
func accepting(opts []CallOption) bool {
	for _, o := range opts {
		if o.accept != nil {
			return true
		}
	}
	return false
}

// acceptOf is the AcceptFunc of co, nil when it has none or the wrong type.
func acceptOf[V any](co callOpts) AcceptFunc[V] {
	fn, _ := co.accept.(AcceptFunc[V])
	return fn
}

// accepts reports whether accept takes e at now; negative entries are
// taken.
func accepts[V any](accept AcceptFunc[V], e *entry[V], now int64) bool {
	return e.negative || accept(e.value, e.stale(now))
}

// errAcceptType is the error of a Get whose Accept has another value type.
var errAcceptType = errors.New("herd: Accept's function is not for this cache's value type")

// getAccepting is a Get with Accept: the local tier, then a miss, each
// value judged by accept.
func (c *Cache[V]) getAccepting(ctx context.Context, key string, load LoadFunc[V], co callOpts) (V, error) {
	var zero V
	accept := acceptOf[V](co)
	if accept == nil {
		return zero, errAcceptType
	}
	if e, ok := c.localGet(key); ok {
		if now := c.clk.now(); now < e.hard && c.servable(ctx, key, e, now) && accepts(accept, e, now) {
			c.acceptedResult(key, e, now)
			return c.served(e)
		}
	}
	v, err := c.missAccepting(ctx, key, load, co, accept)
	return v, outward("get", key, err)
}

// acceptedResult counts e, served at now without a load.
func (c *Cache[V]) acceptedResult(key string, e *entry[V], now int64) {
	if e.stale(now) {
		c.markRead(e)
		c.got(key, observe.ResultStale)
		return
	}
	c.hit(key, e)
}

// missAccepting is miss for a Get with Accept: the Store's value when
// accept takes it, else a flight of fill, whose stages judge by accept
// (fillState.settles), again until accept takes its result: a joined
// flight may end in a value its own caller wanted.
func (c *Cache[V]) missAccepting(ctx context.Context, key string, load LoadFunc[V], co callOpts, accept AcceptFunc[V]) (V, error) {
	var zero V
	load = c.loader(key, load)
	e, pre := c.readShared(ctx, key, callOpts{}) // stale too: accept judges
	if e != nil && accepts(accept, e, c.clk.now()) {
		now := c.clk.now()
		c.acceptedResult(key, e, now)
		if !pre.local && !e.negative && !e.stale(now) {
			c.st.remoteHits.add(1)
		}
		return c.served(e)
	}
	c.got(key, observe.ResultMiss)
	for attempt := range maxMissAttempts {
		if attempt > 0 {
			if err := ctx.Err(); err != nil {
				return zero, fmt.Errorf("herd: %w", err)
			}
			pre = remoteRead[V]{} // out of date: the flight reads again
		}
		var own atomic.Bool // this caller's flight, not one it joined
		e, err := c.fly(ctx, key, func(fctx context.Context) (*entry[V], error) {
			own.Store(true)
			return c.fill(fctx, key, load, co, pre)
		})
		switch {
		case err != nil && load != nil && errors.Is(err, ErrNoLoader) && !own.Load():
			continue // a flight of a Get without a load: load in one of ours
		case err != nil:
			return zero, err
		case e.gone(c.clk.now()):
			continue
		case own.Load() || e.uncached || accepts(accept, e, c.clk.now()):
			return e.result() // this caller's fill judged by accept, or loaded
		}
	}
	return zero, fmt.Errorf("%w: %q: no value accepted after %d attempts", ErrNoFreshValue, key, maxMissAttempts)
}

// accepted reports whether the fill, a miss with Accept, takes e.
func (f *fillState[V]) accepted(e *entry[V]) bool {
	accept := acceptOf[V](f.co)
	return accept == nil || accepts(accept, e, f.c.clk.now())
}

// leaseAfter is the after of the lease request of a miss whose caller
// refused the value a tier holds (its candidate): only a value written
// since counts as loaded elsewhere.
func (f *fillState[V]) leaseAfter(after int64) int64 {
	if f.co.accept != nil && f.mode == foreground && f.candidate != nil {
		return max(after, f.candidate.soft)
	}
	return after
}
