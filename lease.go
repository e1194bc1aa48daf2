package herd

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"
)

// Bounds of the fallback re-read of a Wait loser between completion notices.
const (
	minWaitBackoff = 50 * time.Millisecond
	maxWaitBackoff = time.Second
)

// leaseOutcome is what this replica learnt from the lease of a key.
type leaseOutcome uint8

const (
	// leaseGranted: this replica holds the lease; the attempt's grant has its
	// token and fence.
	leaseGranted leaseOutcome = iota
	// leaseFound: a value to serve instead of loading, in the attempt's e:
	// fresh from the Store, or, for a loser, a stale candidate.
	leaseFound
	// leaseHeld: another replica holds the lease until the attempt's until.
	leaseHeld
	// leaseUndecodable: the Store holds a value this cache cannot decode and
	// no lease was taken: load, and overwrite it unfenced.
	leaseUndecodable
	// leaseFailed: the remote tier failed: load without writing remotely.
	leaseFailed
)

// attempt is one answer of the lease: its outcome and what comes with it.
type attempt[V any] struct {
	outcome leaseOutcome
	grant   Grant     // leaseGranted
	e       *entry[V] // leaseFound
	until   int64     // leaseHeld: when the holder's lease ends (Unix ns)
}

// tryLease makes one attempt at key's lease: one round trip, whose answer is
// the lease, a value fresh by both clocks (the Store's and after, Unix ns),
// or how long another holder keeps it. The holder, this replica or another,
// is remembered, so that this replica does not try again before the lease
// ends: the holder's notice, its time passing, or, when this replica holds
// it, its own release. The error
// is the caller's context ending; a remote failure is an outcome.
func (c *Cache[V]) tryLease(ctx context.Context, key string, after int64) (attempt[V], error) {
	at := c.brk.at()
	g, err := c.cfg.Lease.Acquire(ctx, key, c.cfg.LeaseTTL, time.Unix(0, after))
	c.remoteDone(ctx, at, err)
	c.fetchTags(ctx, g.Value)
	return c.grantAttempt(ctx, key, g, err)
}

// grantAttempt is the attempt that the lease's answer g (or err) to an
// acquisition of key makes, remembered as tryLease remembers it.
func (c *Cache[V]) grantAttempt(ctx context.Context, key string, g Grant, err error) (attempt[V], error) {
	switch {
	case err != nil && ctx.Err() != nil:
		return attempt[V]{}, fmt.Errorf("herd: %w", ctx.Err())
	case err != nil:
		return attempt[V]{outcome: leaseFailed}, nil
	case g.Value != nil:
		e, ok := c.decode(key, g.Value)
		if ok && !c.usable(e) {
			// A tag retired it: ask once more, for a newer value or the
			// lease; a value retired again is loaded over, unfenced.
			at := c.brk.at()
			g, err = c.cfg.Lease.Acquire(ctx, key, c.cfg.LeaseTTL, time.Unix(0, e.soft))
			c.remoteDone(ctx, at, err)
			if err != nil || g.Value == nil {
				return c.grantAttempt(ctx, key, g, err)
			}
			c.fetchTags(ctx, g.Value)
			e, ok = c.decode(key, g.Value)
			ok = ok && c.usable(e)
		}
		if !ok {
			return attempt[V]{outcome: leaseUndecodable}, nil
		}
		return attempt[V]{outcome: leaseFound, e: e}, nil
	case g.Token != "":
		c.st.leaseAcquired.add(1)
		c.leaseEvent(LeaseAcquired, 0)
		// Held here now: no other path of this replica tries it until the
		// lease is ended (endLease forgets it).
		now := c.clk.now()
		c.gens.markHeld(key, addTime(now, c.cfg.LeaseTTL), now)
		return attempt[V]{outcome: leaseGranted, grant: g}, nil
	}
	c.st.leaseContended.add(1)
	c.leaseEvent(LeaseContended, 0)
	now := c.clk.now()
	until := addTime(now, max(g.HeldFor, time.Millisecond))
	c.gens.markHeld(key, until, now)
	return attempt[V]{outcome: leaseHeld, until: until}, nil
}

// heldElsewhere is the attempt this replica need not make: the lease of key
// is held by another replica until a time still ahead, as it was told.
func (c *Cache[V]) heldElsewhere(key string, now int64) (attempt[V], bool) {
	until, ok := c.gens.held(key, now)
	return attempt[V]{outcome: leaseHeld, until: until}, ok
}

// waitHolder waits for another replica's load of key, for at most
// LeaseWait: for its completion notice, re-reading the Store between
// notices with a bounded backoff. The lease is tried again only once a
// notice came or the holder's time (until) has passed. A remote failure
// ends the wait only when it opened the breaker.
func (c *Cache[V]) waitHolder(ctx context.Context, key string, until int64) (attempt[V], error) {
	ctx, end := c.span(ctx, "herd.lease_wait", key)
	defer end(nil)
	start := time.Now()
	deadline := start.Add(c.cfg.LeaseWait)
	backoff := minWaitBackoff
	for {
		remaining := time.Until(deadline)
		if remaining <= 0 {
			c.st.leaseWaitTimeouts.add(1)
			c.leaseEvent(LeaseWaitTimeout, time.Since(start))
			return attempt[V]{}, ErrLeaseTimeout
		}
		wait := min(backoff, remaining)
		if left := time.Duration(until - c.clk.now()); left > 0 && left < wait {
			wait = left
		}
		pushed, err := c.waitNotice(ctx, key, wait)
		if err != nil {
			return attempt[V]{}, err
		}
		backoff = min(2*backoff, maxWaitBackoff)
		var a attempt[V]
		if now := c.clk.now(); pushed || now >= until {
			a, err = c.tryLease(ctx, key, now)
		} else {
			a = c.peek(ctx, key, now)
		}
		switch {
		case err != nil:
			return a, err
		case a.outcome == leaseHeld && a.until > 0:
			until = a.until
		case a.outcome == leaseHeld, a.outcome == leaseFailed && !c.brk.open():
		case a.outcome == leaseFound:
			if pushed {
				c.st.wokenByPush.add(1)
			} else {
				c.st.wokenByPoll.add(1)
			}
			c.leaseEvent(LeaseWoken, time.Since(start))
			return a, nil
		default:
			return a, nil
		}
	}
}

// waitNotice waits up to d for a completion notice of key and reports
// whether one came. The error is the caller's context ending.
func (c *Cache[V]) waitNotice(ctx context.Context, key string, d time.Duration) (bool, error) {
	wctx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	at := c.brk.at()
	err := c.cfg.Lease.Wait(wctx, key)
	switch {
	case err == nil:
		return true, nil
	case ctx.Err() != nil:
		return false, fmt.Errorf("herd: %w", ctx.Err())
	case !errors.Is(err, context.DeadlineExceeded):
		c.remoteDone(ctx, at, err) // the tier failed; a timeout is no failure
	}
	return false, nil
}

// peek is a Wait loser's re-read of the Store between notices: leaseFound
// when a value fresh at now has appeared, leaseHeld (with no new time)
// when none has, leaseFailed when the read failed.
func (c *Cache[V]) peek(ctx context.Context, key string, now int64) attempt[V] {
	if !c.brk.allow() {
		return attempt[V]{outcome: leaseFailed}
	}
	r := c.loadRemote(ctx, key)
	switch {
	case r.err != nil:
		return attempt[V]{outcome: leaseFailed}
	case r.e != nil && now < r.e.soft:
		return attempt[V]{outcome: leaseFound, e: r.e}
	}
	return attempt[V]{outcome: leaseHeld}
}

// heldLease is a lease this replica took for one load of key. It owns the
// watchdog that extends the lease while the load runs and the release that
// ends it, once: with the value's write-back, or alone. Only a granted lease
// is ever a heldLease.
type heldLease struct {
	key, token string
	fence      uint64
	stop       func() // stops the watchdog; nil while none runs
	ended      bool
	// batch, when not nil, is the batch whose watchdog extends this lease
	// and whose write-back ends it.
	batch *leaseBatch
}

// heldFrom is the lease that g grants on key, with no watchdog yet.
func heldFrom(key string, g Grant) *heldLease {
	return &heldLease{key: key, token: g.Token, fence: g.Fence}
}

// hold starts the watchdog of h for a load that runs with ctx.
func (c *Cache[V]) hold(ctx context.Context, h *heldLease) *heldLease {
	h.stop = c.watchdog(ctx, h.key, h.token)
	return h
}

// endLease stops h's watchdog and, in the background, writes env under h's
// fence for ttl (when env is not nil) and releases the lease: one call when
// the Lease is a [WriteReleaser]. A refused write drops e, the entry the
// load put in the local tier, if it is still there. Later calls, and calls
// with a nil h, do nothing.
func (c *Cache[V]) endLease(ctx context.Context, h *heldLease, env []byte, ttl time.Duration, e *entry[V]) {
	if h == nil || h.ended {
		return
	}
	h.ended = true
	if h.stop != nil {
		h.stop()
	}
	if ttl <= 0 {
		env = nil // expired already: nothing worth writing
	}
	end := leaseEnd{h: h, env: env, ttl: ttl, refused: func() { c.unpublish(h.key, e) }}
	if h.batch != nil {
		h.batch.end(end) // written with the rest of its batch (flushLeases)
		return
	}
	c.goBackground(func() {
		rctx, cancel := c.remoteCtx(ctx)
		defer cancel()
		at := c.brk.at()
		if env == nil {
			err := c.cfg.Lease.Release(rctx, h.key, h.token)
			c.remoteDone(rctx, at, err)
			c.leaseEnded(end, false, err)
			return
		}
		wrote, err := c.writeRelease(rctx, h, env, ttl)
		c.remoteDone(rctx, at, err)
		c.leaseEnded(end, wrote, err)
	})
}

// leaseEnd is the end of one held lease: the write of env for ttl, when env
// is not nil, and the release; refused drops the load's local entry.
type leaseEnd struct {
	h       *heldLease
	env     []byte
	ttl     time.Duration
	refused func()
}

// leaseEnded records how the end of a lease went: a write the fence refused
// (a newer write or an invalidation won) drops the load's local entry.
func (c *Cache[V]) leaseEnded(end leaseEnd, wrote bool, err error) {
	c.gens.forgetHeld(end.h.key)
	if err == nil && end.env != nil && !wrote {
		end.refused()
		c.st.fencedWrites.add(1)
		c.recorder.RecordLease(LeaseFenced, 0)
	}
}

// writeRelease writes env under h's fence and releases h.
func (c *Cache[V]) writeRelease(ctx context.Context, h *heldLease, env []byte, ttl time.Duration) (bool, error) {
	if wr, ok := c.cfg.Lease.(WriteReleaser); ok {
		return wr.WriteRelease(ctx, h.key, env, h.fence, ttl, h.token)
	}
	wrote, err := c.cfg.Store.Write(ctx, h.key, env, h.fence, ttl)
	return wrote, errors.Join(err, c.cfg.Lease.Release(ctx, h.key, h.token))
}

// watchdog extends the lease every LeaseTTL/3 while the load runs, each
// extension bounded by LeaseTTL/6. It stops when stop is called, when ctx
// (bounded by the load's own deadline) ends, when the cache closes, or when
// the lease is lost; a load that lost its lease may finish, but its write is
// fenced.
func (c *Cache[V]) watchdog(ctx context.Context, key, token string) (stop func()) {
	ttl := c.cfg.LeaseTTL
	return c.everyThird(ctx, func() bool {
		ectx, cancel := context.WithTimeout(ctx, ttl/6)
		defer cancel()
		at := c.brk.at()
		ok, err := c.cfg.Lease.Extend(ectx, key, token, ttl)
		c.remoteDone(ectx, at, err)
		return c.extended(key, ok, err)
	})
}

// everyThird calls round every LeaseTTL/3, on a goroutine of its own,
// until round returns false, stop is called, ctx ends or the cache closes;
// stop returns once the goroutine has.
func (c *Cache[V]) everyThird(ctx context.Context, round func() bool) (stop func()) {
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		t := time.NewTicker(c.cfg.LeaseTTL / 3)
		defer t.Stop()
		for {
			select {
			case <-done:
				return
			case <-ctx.Done():
				return
			case <-c.closeCtx.Done():
				return
			case <-t.C:
			}
			if !round() {
				return
			}
		}
	})
	return func() {
		close(done)
		wg.Wait()
	}
}

// extended records the outcome of one extension of key's lease, and
// reports whether the lease is still held: a failed call does not say it
// is not.
func (c *Cache[V]) extended(key string, ok bool, err error) bool {
	switch {
	case err != nil:
	case !ok:
		c.st.leaseLost.add(1)
		c.leaseEvent(LeaseLost, 0)
		c.event(EventLeaseLost, key, nil)
		return false
	default:
		c.st.leaseExtended.add(1)
	}
	return true
}

// leaseEvent counts a lease event for the Recorder and, for losers' waits,
// the wait histogram.
func (c *Cache[V]) leaseEvent(e LeaseEvent, wait time.Duration) {
	if e == LeaseWoken || e == LeaseWaitTimeout {
		c.waitDur.observe(wait)
	}
	c.recorder.RecordLease(e, wait)
}
