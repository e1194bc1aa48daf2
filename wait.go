package herd

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// The losers' wait: a miss that found another load holding its key's lease
// waits for that load's completion, asking for the lease again when it is
// announced, and re-reading the Store between announcements after a
// bounded backoff.

// Bounds of the fallback re-read of a Wait loser between completion notices.
const (
	minWaitBackoff = 50 * time.Millisecond
	maxWaitBackoff = time.Second
)

// completion is a registration for the next completion of a key, made
// with the Lease's [Watcher] before an attempt at the lease; its zero
// value (no Watcher) registers nothing, and waits go through Lease.Wait.
type completion struct {
	done <-chan struct{}
	end  func()
	// backoff marks a wait that only waits out its backoff: done is nil,
	// and Lease.Wait is not asked either.
	backoff bool
}

// watch registers for key's next completion, when the Lease is a Watcher.
func (c *Cache[V]) watch(key string) completion {
	w, ok := c.cfg.Lease.(Watcher)
	if !ok {
		return completion{}
	}
	done, stop := w.Watch(key)
	return completion{done: done, end: stop}
}

// stop takes the registration back; it may be called more than once.
func (w completion) stop() {
	if w.end != nil {
		w.end()
	}
}

// waitHolder waits for the load that holds key's lease, as a said, for at
// most LeaseWait per holder: for its completion, re-reading the Store
// between announcements with a bounded backoff (an announcement can be
// lost). The lease is asked for again only once a completion came or the
// holder's time has passed. A remote failure ends the wait only when it
// opened the breaker. A wait that ends with the caller's context is
// counted as abandoned.
func (c *Cache[V]) waitHolder(ctx context.Context, key string, a attempt[V]) (attempt[V], error) {
	ctx, end := c.span(ctx, "herd.lease_wait", key)
	defer end(nil)
	start := time.Now()
	deadline := start.Add(c.cfg.LeaseWait)
	backoff := minWaitBackoff
	until, w := a.until, a.watch
	defer func() { w.stop() }()
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
		pushed, err := c.waitFor(ctx, key, w, wait)
		backoff = min(2*backoff, maxWaitBackoff)
		asked := false
		if now := c.clk.now(); err == nil && (pushed || now >= until) {
			w.stop()
			a, err = c.tryLease(ctx, key, now)
			w, asked = a.watch, true
		} else if err == nil {
			a = c.peek(ctx, key, now)
		}
		if err != nil {
			c.st.leaseWaitsAbandoned.add(1)
			c.leaseEvent(LeaseWaitAbandoned, time.Since(start))
			return attempt[V]{}, err
		}
		switch {
		case a.outcome == leaseHeld && asked:
			if pushed {
				// The holder completed and another load took the lease:
				// LeaseWait bounds the wait for each holder, not their chain.
				deadline = time.Now().Add(c.cfg.LeaseWait)
			}
			until = a.until
		case a.outcome == leaseHeld:
		case a.outcome == leaseFailed && !c.brk.open():
			if asked {
				w = completion{backoff: true} // a hiccup: ask again after the backoff
			}
		case a.outcome == leaseFound:
			if pushed || w.came() { // the completion came while the Store was read
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

// waitFor waits up to d for the completion w watches (or, without a
// Watcher, for one announced through Lease.Wait) and reports whether one
// came. The error is the caller's context ending.
func (c *Cache[V]) waitFor(ctx context.Context, key string, w completion, d time.Duration) (bool, error) {
	if w.done == nil && !w.backoff {
		return c.waitNotice(ctx, key, d)
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-w.done:
		return true, nil
	case <-t.C:
		return w.came(), nil // both may be ready when this goroutine runs late
	case <-ctx.Done():
		return false, fmt.Errorf("herd: %w", ctx.Err())
	}
}

// came reports whether the completion w watches has been announced.
func (w completion) came() bool {
	select {
	case <-w.done:
		return true
	default:
		return false
	}
}

// waitNotice waits up to d for a completion notice of key through
// Lease.Wait and reports whether one came. The error is the caller's
// context ending.
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
