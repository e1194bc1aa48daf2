package herd

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"
)

var (
	// errRemote marks a remote-tier failure met while taking a lease: the
	// load goes on without the lease and without writing remotely.
	errRemote = errors.New("herd: remote tier error")
	// errUnfenced is how a Wait loser whose wait timed out is told to load
	// without writing (Options.LoadOnLeaseTimeout).
	errUnfenced = errors.New("herd: load without the lease")
)

// Bounds of the fallback re-read of a Wait loser between completion notices.
const (
	minWaitBackoff = 50 * time.Millisecond
	maxWaitBackoff = time.Second
)

// acquire settles a miss at the lease. It returns one of: an entry to serve
// (fresh from the lease holder, or a stale candidate), a grant with a token
// to load under, an empty grant when the stored value cannot be decoded (load
// and overwrite it with Set), or an error: errSkipped for a background
// refresh that found the lease held, errRemote or errUnfenced to load without
// a remote write, or one for the caller.
func (c *Cache[V]) acquire(ctx context.Context, key string, after time.Time, background bool, co callOpts, candidate *entry[V]) (*entry[V], Grant, error) {
	start := time.Now()
	deadline := start.Add(c.cfg.LeaseWait)
	backoff := minWaitBackoff
	waited, pushed := false, false
	var end func(error)
	defer func() {
		if end != nil {
			end(nil)
		}
	}()
	for {
		g, err := c.cfg.Lease.Acquire(ctx, key, c.cfg.LeaseTTL, after)
		c.remoteDone(ctx, err)
		if err != nil {
			if ctx.Err() != nil {
				return nil, g, fmt.Errorf("herd: %w", ctx.Err())
			}
			return nil, g, fmt.Errorf("%w: acquire %q: %w", errRemote, key, err)
		}
		if g.Value != nil {
			e, ok := c.decode(g.Value)
			if !ok {
				return nil, Grant{}, nil
			}
			if waited {
				if pushed {
					c.st.wokenByPush.add(1)
				} else {
					c.st.wokenByPoll.add(1)
				}
				c.leaseEvent(LeaseWoken, time.Since(start))
			}
			return e, Grant{}, nil
		}
		if g.Token != "" {
			c.st.leaseAcquired.add(1)
			c.leaseEvent(LeaseAcquired, 0)
			return nil, g, nil
		}
		c.st.leaseContended.add(1)
		c.leaseEvent(LeaseContended, 0)
		if background {
			return nil, g, errSkipped
		}
		if candidate != nil && !co.noStale && co.policy != Wait && c.clk.now() < candidate.hard {
			return candidate, g, nil
		}
		if co.policy == FailFast {
			return nil, g, ErrLeaseHeld
		}
		remaining := time.Until(deadline)
		if remaining <= 0 {
			c.st.leaseWaitTimeouts.add(1)
			c.leaseEvent(LeaseWaitTimeout, time.Since(start))
			if c.cfg.LoadOnLeaseTimeout {
				return nil, g, errUnfenced
			}
			return nil, g, ErrLeaseTimeout
		}
		if end == nil {
			ctx, end = c.span(ctx, "herd.lease_wait", key)
		}
		wctx, cancel := context.WithTimeout(ctx, min(backoff, remaining))
		werr := c.cfg.Lease.Wait(wctx, key)
		cancel()
		waited, pushed = true, werr == nil
		if werr != nil {
			if ctx.Err() != nil {
				return nil, g, fmt.Errorf("herd: %w", ctx.Err())
			}
			if !errors.Is(werr, context.DeadlineExceeded) {
				c.remoteDone(ctx, werr)
				return nil, g, fmt.Errorf("%w: wait %q: %w", errRemote, key, werr)
			}
		}
		backoff = min(2*backoff, maxWaitBackoff)
	}
}

// heldLease is a lease this replica took for one load of key. It owns the
// watchdog that extends the lease while the load runs and the release that
// ends it, once: with the value's write-back, or alone.
type heldLease struct {
	key, token string
	fence      uint64
	stop       func() // stops the watchdog; nil once ended
}

// hold starts the watchdog of the lease that g grants on key.
func (c *Cache[V]) hold(ctx context.Context, key string, g Grant) *heldLease {
	return &heldLease{key: key, token: g.Token, fence: g.Fence, stop: c.watchdog(ctx, key, g.Token)}
}

// endLease stops h's watchdog and, in the background, writes env under h's
// fence for ttl (when env is not nil) and releases the lease: one call when
// the Lease is a [WriteReleaser]. A refused write drops e, the entry the
// load put in the local tier, if it is still there. Later calls do nothing.
func (c *Cache[V]) endLease(ctx context.Context, h *heldLease, env []byte, ttl time.Duration, e *entry[V]) {
	if h == nil || h.stop == nil {
		return
	}
	h.stop()
	h.stop = nil
	if ttl <= 0 {
		env = nil // expired already: nothing worth writing
	}
	c.goBackground(func() {
		rctx, cancel := c.remoteCtx(ctx)
		defer cancel()
		if env == nil {
			c.remoteDone(rctx, c.cfg.Lease.Release(rctx, h.key, h.token))
			return
		}
		wrote, err := c.writeRelease(rctx, h, env, ttl)
		c.remoteDone(rctx, err)
		if err == nil && !wrote {
			c.unpublish(h.key, e) // a newer write or an invalidation won
			c.st.fencedWrites.add(1)
			if c.recorder != nil {
				c.recorder.RecordLease(LeaseFenced, 0)
			}
		}
	})
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
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		t := time.NewTicker(ttl / 3)
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
			ectx, cancel := context.WithTimeout(ctx, ttl/6)
			ok, err := c.cfg.Lease.Extend(ectx, key, token, ttl)
			c.remoteDone(ectx, err)
			cancel()
			switch {
			case err != nil:
			case !ok:
				c.st.leaseLost.add(1)
				c.leaseEvent(LeaseLost, 0)
				c.event(EventLeaseLost, key, nil)
				return
			default:
				c.st.leaseExtended.add(1)
			}
		}
	}()
	return func() {
		close(done)
		wg.Wait()
	}
}

// leaseEvent counts a lease event for the Recorder and, for losers' waits,
// the wait histogram.
func (c *Cache[V]) leaseEvent(e LeaseEvent, wait time.Duration) {
	if e == LeaseWoken || e == LeaseWaitTimeout {
		c.waitDur.observe(wait)
	}
	if c.recorder != nil {
		c.recorder.RecordLease(e, wait)
	}
}
