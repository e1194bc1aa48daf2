package herd

import (
	"context"
	"fmt"

	"github.com/herdcache/herd/observe"
)

// Get's miss. Get comes here when its local tier has nothing to serve: it
// reads the Store once per key per replica (readShared), and when that has
// nothing usable either, one flight per key fills it: a batch of one key
// through the pipeline GetMany and refreshes use (fill.go).

// miss serves key from the Store or, when it has nothing usable, from a
// flight of fill that it starts or joins.
func (c *Cache[V]) miss(ctx context.Context, key string, load LoadFunc[V], co callOpts) (V, error) {
	var zero V
	load = c.loader(key, load) // nil: serve what the tiers hold, or ErrNoLoader
	e, pre := c.readShared(ctx, key, co)
	if e != nil {
		if e.stale(c.clk.now()) {
			c.got(key, observe.ResultStale)
			c.refresh(ctx, key, load, e, &c.st.staleRefreshes)
		} else {
			c.got(key, e.freshResult())
			if !pre.local && !e.negative {
				c.st.remoteHits.add(1)
			}
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
		e, err := c.fly(ctx, key, func(fctx context.Context) (*entry[V], error) {
			return c.fill(fctx, key, load, co, pre)
		})
		if err != nil {
			return zero, err
		}
		if e.gone(c.clk.now()) {
			continue // it expired while remote calls were waited on: fill again
		}
		if !e.stale(c.clk.now()) {
			return e.result()
		}
		// Served stale by the flight (from the Store or as a lease loser).
		if !co.noStale {
			c.countStale(key)
			c.refresh(ctx, key, load, e, &c.st.staleRefreshes)
			return e.result()
		}
	}
	return zero, errNoFresh(key)
}

// errNoFresh is the error of a NoStale miss of key that found no fresh
// value in maxMissAttempts.
func errNoFresh(key string) error {
	return fmt.Errorf("%w: %q: no fresh value after %d attempts", ErrNoFreshValue, key, maxMissAttempts)
}

// maxMissAttempts bounds the flights of one NoStale miss that keep finding
// a value that went stale before this caller could take it.
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

// readShared reads key from the Store before any load's flight, sharing one
// read among the callers of key that arrive while it runs: a value another
// replica wrote is served at the cost of one round trip. It returns the
// entry to serve, or nil when the caller must go on to the flight (no
// Store, breaker open, nothing usable stored), with what the read found so
// that a flight this caller starts need not read again.
func (c *Cache[V]) readShared(ctx context.Context, key string, co callOpts) (*entry[V], remoteRead[V]) {
	if c.cfg.Store == nil || c.brk.open() {
		return nil, remoteRead[V]{} // a half-open breaker's probe is made inside the flight
	}
	r, err, _ := c.reads.Do(ctx, key, func(rctx context.Context) (remoteRead[V], error) {
		return c.sharedRead(rctx, key), nil
	})
	if err != nil || !r.local {
		c.st.remoteWaits.add(1)
	}
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

// sharedRead is the read of key that readShared and revalidate share: a
// value found is put in the local tier. A caller that missed the local tier
// just before the last shared read put its value there would start a read
// of its own: it re-checks the local tier first.
func (c *Cache[V]) sharedRead(ctx context.Context, key string) remoteRead[V] {
	if e, ok := c.localGet(key); ok {
		if now := c.clk.now(); now < e.hard && c.trusted(e, now) {
			r := remoteRead[V]{done: true, local: true, e: e}
			r.gen, r.puts = c.gens.get(key)
			return r
		}
	}
	r := c.loadRemote(ctx, key)
	if r.e != nil && c.clk.now() < r.e.hard {
		c.setLocal(key, r.e, r.gen)
		_, r.puts = c.gens.get(key) // the read is as new as its own put
	}
	return r
}

// revalidate replaces e, a copy of key served past NearTTL or superseded by
// a notice, with what the Store holds: one read in the background per copy,
// shared with any read of key on the reader's path. When the Store no
// longer holds a usable value, e is dropped; when the read fails, e is not
// revalidated again, and readers re-read once it is 2×NearTTL old.
func (c *Cache[V]) revalidate(ctx context.Context, key string, e *entry[V]) {
	if c.closed.Load() || !e.revalidating.CompareAndSwap(false, true) {
		return
	}
	bctx := context.WithoutCancel(ctx)
	c.goBackground(func() {
		r, _, _ := c.reads.Do(bctx, key, func(rctx context.Context) (remoteRead[V], error) {
			return c.sharedRead(rctx, key), nil
		})
		c.st.revalidations.add(1)
		if r.err == nil && r.e == nil {
			c.unpublish(key, e) // gone, or undecodable: the next read misses
		}
	})
}
