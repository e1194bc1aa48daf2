package herd

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"time"

	"github.com/herdcache/herd/observe"
	"github.com/herdcache/herd/remote"
)

// The leases this replica holds. A fill holds its leases in a leaseSet,
// one lease for a Get, many for a GetMany: one watchdog extends them all
// while their loads run, and their ends (the write-back of each value and
// the release) are sent together, in the background.

// heldLease is a lease this replica took for one load of key. It is made
// only from a grant, so a lease never taken cannot be released or reported
// lost, and it is ended once.
type heldLease struct {
	key, token string
	fence      uint64
	// lapse is the instant (the cache's clock, Unix ns advanced by the
	// monotonic clock) after which the lease could have lapsed: when the
	// acquisition or the last extension the Lease granted was sent, plus
	// LeaseTTL; zero once the lease is known lost. Before it, the lease is
	// provably held, and the load's value may enter the local tier before
	// the Store has answered its write.
	lapse atomic.Int64
	// ended is set by the end of the lease; guarded by its set's mu.
	ended bool
}

// newLease is the lease g grants on key, asked for at sent.
func (c *Cache[V]) newLease(key string, g remote.Grant, sent int64) *heldLease {
	h := &heldLease{key: key, token: g.Token, fence: g.Fence}
	h.lapse.Store(addTime(sent, c.cfg.LeaseTTL))
	return h
}

// heldAt reports whether the lease is provably still held at now.
func (h *heldLease) heldAt(now int64) bool { return now < h.lapse.Load() }

// leaseEnd is the end of one held lease: the write of env for ttl, when env
// is not nil, and the release. refused runs when the fence refused the
// write, accepted when the Store took it (either may be nil).
type leaseEnd struct {
	h                 *heldLease
	env               []byte
	ttl               time.Duration
	refused, accepted func()
}

// leaseSet is the leases one fill holds.
type leaseSet struct {
	mu   sync.Mutex
	live map[*heldLease]struct{} // held and not yet ended
	ends []leaseEnd              // ended, not yet sent
	stop func()                  // stops the watchdog; nil while none runs
}

func newLeaseSet() *leaseSet { return &leaseSet{live: make(map[*heldLease]struct{})} }

// add puts h, a lease just taken, in the set; a nil h is none.
func (s *leaseSet) add(h *heldLease) *heldLease {
	if h != nil {
		s.mu.Lock()
		s.live[h] = struct{}{}
		s.mu.Unlock()
	}
	return h
}

// end records e, the end of a lease of the set, to be sent by flush;
// later ends of the same lease, and of a nil one, do nothing.
func (s *leaseSet) end(e leaseEnd) {
	if e.h == nil {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if e.h.ended {
		return
	}
	e.h.ended = true
	if e.ttl <= 0 {
		e.env = nil // expired already: nothing worth writing
	}
	if s.ends == nil {
		s.ends = make([]leaseEnd, 0, len(s.live)) // the rest end soon too
	}
	delete(s.live, e.h)
	s.ends = append(s.ends, e)
}

// release records the end of h without a write.
func (s *leaseSet) release(h *heldLease) { s.end(leaseEnd{h: h}) }

// take returns the ends recorded so far, for the caller to send.
func (s *leaseSet) take() []leaseEnd {
	s.mu.Lock()
	defer s.mu.Unlock()
	ends := s.ends
	s.ends = nil
	return ends
}

// snapshot returns the leases still held.
func (s *leaseSet) snapshot() []*heldLease {
	s.mu.Lock()
	defer s.mu.Unlock()
	hs := make([]*heldLease, 0, len(s.live))
	for h := range s.live {
		hs = append(hs, h)
	}
	return hs
}

// lost drops h from the live leases: its lease is gone.
func (s *leaseSet) lost(h *heldLease) {
	h.lapse.Store(0)
	s.mu.Lock()
	delete(s.live, h)
	s.mu.Unlock()
}

// watchSet starts s's watchdog once s holds a lease: every LeaseTTL/3 it
// extends the leases still held, in one call when the Lease is a
// [remote.BatchLease], each round bounded by extendBudget, until closeSet, ctx
// (bounded by the loads' own deadline) ends or the cache closes. A load
// that lost its lease may finish, but its write is fenced.
func (c *Cache[V]) watchSet(ctx context.Context, s *leaseSet) {
	if s.stop != nil || len(s.snapshot()) == 0 {
		return
	}
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
			c.extendSet(ctx, s)
		}
	})
	s.stop = func() {
		close(done)
		wg.Wait()
	}
}

// extendSet is one round of s's watchdog. A lease extended could lapse
// LeaseTTL after the round was sent.
func (c *Cache[V]) extendSet(ctx context.Context, s *leaseSet) {
	hs := s.snapshot()
	if len(hs) == 0 {
		return // a batch may take more leases, for losers that come to load
	}
	ttl := c.cfg.LeaseTTL
	ectx, cancel := context.WithTimeout(ctx, extendBudget(ttl, len(hs)))
	defer cancel()
	sent, at := c.clk.now(), c.brk.at()
	outs := make([]remote.Outcome, len(hs))
	if bl, ok := c.cfg.Lease.(remote.BatchLease); ok && len(hs) > 1 {
		keys := make([]remote.HeldKey, len(hs))
		for i, h := range hs {
			keys[i] = remote.HeldKey{Key: h.key, Token: h.token}
		}
		copy(outs, bl.ExtendMany(ectx, keys, ttl))
	} else {
		for i, h := range hs {
			outs[i].OK, outs[i].Err = c.cfg.Lease.Extend(ectx, h.key, h.token, ttl)
		}
	}
	c.remoteDone(ectx, at, firstErr(outs, func(o remote.Outcome) error { return o.Err }))
	for i, o := range outs {
		h := hs[i]
		switch {
		case o.Err != nil: // a failed call does not say the lease is gone
		case !o.OK:
			s.lost(h)
			c.st.leaseLost.add(1)
			c.leaseEvent(observe.LeaseLost, 0)
			c.event(observe.EventLeaseLost, h.key, nil)
		default:
			h.lapse.Store(addTime(sent, ttl))
			c.st.leaseExtended.add(1)
		}
	}
}

// extendBudget is how long one round of a watchdog may take to extend n
// leases with a lease TTL of ttl: ttl/6, and as much again for every
// further extendPerBudget leases, since a Store sends a large batch in
// several pipelines one after another; never more than ttl/2, so that the
// round ends before the leases it could not extend lapse.
func extendBudget(ttl time.Duration, n int) time.Duration {
	return min(ttl/6*time.Duration(1+(n-1)/extendPerBudget), ttl/2)
}

// extendPerBudget is how many leases one ttl/6 of a watchdog's round is for.
const extendPerBudget = 1024

// flushSet sends the ends of s's leases recorded so far.
func (c *Cache[V]) flushSet(ctx context.Context, s *leaseSet) {
	if ends := s.take(); len(ends) > 0 {
		c.sendEnds(ctx, ends)
	}
}

// closeSet ends s: it stops the watchdog, releases the leases still held
// (their loads never ran or failed) and sends every end.
func (c *Cache[V]) closeSet(ctx context.Context, s *leaseSet) {
	if s.stop != nil {
		s.stop()
		s.stop = nil
	}
	for _, h := range s.snapshot() {
		s.release(h)
	}
	c.flushSet(ctx, s)
}

// sendEnds sends ends in the background: the write-back of each value
// loaded and the release of each lease, in one call when the Lease is a
// [remote.BatchLease] and there are several. A write that failed (the Store
// refused it or could not be reached) is followed by a release of its
// own, so that the lease ends and its completion is announced even when
// the write's call never reached the Store.
func (c *Cache[V]) sendEnds(ctx context.Context, ends []leaseEnd) {
	c.goBackground(func() {
		rctx, cancel := c.remoteCtx(ctx)
		defer cancel()
		outs := c.endLeases(rctx, ends)
		var failed []leaseEnd
		for i, e := range ends {
			if outs[i].Err != nil && e.env != nil {
				failed = append(failed, leaseEnd{h: e.h})
			}
		}
		if len(failed) > 0 {
			c.endLeases(rctx, failed)
		}
		for i, e := range ends {
			c.leaseEnded(e, outs[i].OK, outs[i].Err)
		}
	})
}

// endLeases makes the calls that end ends, and records their outcome for
// the breaker.
func (c *Cache[V]) endLeases(ctx context.Context, ends []leaseEnd) []remote.Outcome {
	outs := make([]remote.Outcome, len(ends))
	at := c.brk.at()
	if bl, ok := c.cfg.Lease.(remote.BatchLease); ok && len(ends) > 1 {
		writes := make([]remote.HeldWrite, len(ends))
		for i, e := range ends {
			writes[i] = remote.HeldWrite{HeldKey: remote.HeldKey{Key: e.h.key, Token: e.h.token}, Env: e.env, Fence: e.h.fence, TTL: e.ttl}
		}
		copy(outs, bl.WriteReleaseMany(ctx, writes))
	} else {
		for i, e := range ends {
			if e.env == nil {
				outs[i].Err = c.cfg.Lease.Release(ctx, e.h.key, e.h.token)
				continue
			}
			outs[i].OK, outs[i].Err = c.writeRelease(ctx, e.h, e.env, e.ttl)
		}
	}
	c.remoteDone(ctx, at, firstErr(outs, func(o remote.Outcome) error { return o.Err }))
	return outs
}

// writeRelease writes env under h's fence and releases h.
func (c *Cache[V]) writeRelease(ctx context.Context, h *heldLease, env []byte, ttl time.Duration) (bool, error) {
	if wr, ok := c.cfg.Lease.(remote.WriteReleaser); ok {
		return wr.WriteRelease(ctx, h.key, env, h.fence, ttl, h.token)
	}
	wrote, err := c.cfg.Store.Write(ctx, h.key, env, h.fence, ttl)
	return wrote, errors.Join(err, c.cfg.Lease.Release(ctx, h.key, h.token))
}

// leaseEnded records how the end of a lease went: a write the fence
// refused (a newer write or an invalidation won) runs the end's refused,
// a write the Store took its accepted.
func (c *Cache[V]) leaseEnded(e leaseEnd, wrote bool, err error) {
	c.gens.forgetHeld(e.h.key)
	c.leaseWriteFailed(e, wrote, err)
	switch {
	case err != nil || e.env == nil:
	case !wrote:
		if e.refused != nil {
			e.refused()
		}
		c.st.fencedWrites.add(1)
		c.recorder.RecordLease(observe.LeaseFenced, 0)
	case e.accepted != nil:
		e.accepted()
	}
}
