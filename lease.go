package herd

import (
	"context"
	"fmt"
	"time"

	"github.com/herdcache/herd/observe"
	"github.com/herdcache/herd/remote"
)

// leaseOutcome is what this replica learnt from the lease of a key.
type leaseOutcome uint8

const (
	// leaseGranted: this replica holds the lease; the attempt's held has it.
	leaseGranted leaseOutcome = iota
	// leaseFound: a value to serve instead of loading, in the attempt's e:
	// fresh from the Store, or, for a loser, a stale candidate.
	leaseFound
	// leaseHeld: another load holds the lease until the attempt's until.
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
	held    *heldLease // leaseGranted
	e       *entry[V]  // leaseFound
	until   int64      // leaseHeld: when the holder's lease ends (Unix ns)
	// watch, for leaseHeld, has been registered for the holder's
	// completion since before the holder was known; whoever takes a
	// leaseHeld attempt waits on it or gives it up.
	watch *completion
}

// giveUp stops what a leaseHeld attempt watches, for a caller that will
// not wait on it.
func (a attempt[V]) giveUp() { a.watch.stop() }

// heldElsewhere sorts the keys of fs into those to ask the lease for and
// those told, whose attempt this replica need not make: the lease is held
// by another load until a time still ahead, as it was told, and no
// completion of that load has been announced since. held holds the
// attempt of each told key. The told keys' watches, with the batch's
// wake, are registered together before the check that counts, so that a
// completion announced after it ends the wait: one announced before it is
// known to what this replica remembers of the holder.
func (b *batchFill[V]) heldElsewhere(fs []*fillState[V]) (ask, told []*fillState[V], held []attempt[V]) {
	c := b.c
	for i, f := range fs {
		if _, ok := c.gens.held(f.key, f.now); ok {
			if told == nil {
				ask = append(make([]*fillState[V], 0, len(fs)), fs[:i]...)
			}
			told = append(told, f)
		} else if told != nil {
			ask = append(ask, f)
		}
	}
	if told == nil {
		return fs, nil, nil
	}
	keys := make([]string, len(told))
	for i, f := range told {
		keys[i] = f.key
	}
	watches := c.watchAll(keys, b.wakes.wake)
	still := told[:0]
	for i, f := range told {
		until, ok, spared := c.gens.heldSparing(f.key, f.now)
		if !ok {
			watches[i].stop()
			ask = append(ask, f)
			continue
		}
		if spared {
			c.st.leaseAttemptsSkipped.add(1)
		}
		still = append(still, f)
		held = append(held, attempt[V]{outcome: leaseHeld, until: until, watch: watches[i]})
	}
	return ask, still, held
}

// skipped counts the lease attempt of key that this replica does not make
// because it heard the lease announced held: once per hold heard.
func (c *Cache[V]) skipped(key string) {
	if c.gens.spare(key) {
		c.st.leaseAttemptsSkipped.add(1)
	}
}

// grantAttempt is the attempt that the lease's answer g (or err) to an
// acquisition of key sent at sent makes. The holder, this replica or
// another, is remembered, so that this replica does not try the lease
// again before it ends: its completion (told watches for it, from before
// the acquisition), its notice, its time passing, or, when this replica
// holds it, its own release. told is given up unless the lease is held.
func (c *Cache[V]) grantAttempt(ctx context.Context, key string, g remote.Grant, err error, sent int64, told *completion) (attempt[V], error) {
	if err != nil || g.Value != nil {
		told.stop()
	}
	switch {
	case err != nil && ctx.Err() != nil:
		return attempt[V]{}, fmt.Errorf("herd: %w", ctx.Err())
	case err != nil:
		return attempt[V]{outcome: leaseFailed}, nil
	case g.Value != nil:
		return c.foundAttempt(ctx, key, g, sent)
	case g.Token != "":
		c.st.leaseAcquired.add(1)
		c.leaseEvent(observe.LeaseAcquired, 0)
		h := c.newLease(key, g, sent)
		c.gens.markHeld(key, heldBy{until: h.lapse.Load(), done: told, own: true}, sent) // until its release is announced
		return attempt[V]{outcome: leaseGranted, held: h}, nil
	}
	c.st.leaseContended.add(1)
	c.leaseEvent(observe.LeaseContended, 0)
	c.hasCompany()
	now := c.clk.now()
	until := addTime(now, max(g.HeldFor, time.Millisecond))
	c.gens.markHeld(key, heldBy{until: until, done: told}, now)
	return attempt[V]{outcome: leaseHeld, until: until}, nil
}

// answerAttempt is grantAttempt for got, the answer to an acquisition of
// key sent at sent, registered for with w before it was sent: w is both
// what the replica remembers of the holder and, when the lease is held,
// the attempt's watch; otherwise the attempt gives it up.
func (c *Cache[V]) answerAttempt(ctx context.Context, key string, got remote.Acquired, sent int64, w *completion) (attempt[V], error) {
	a, err := c.grantAttempt(ctx, key, got.Grant, got.Err, sent, w.share())
	if a.outcome == leaseHeld && err == nil {
		a.watch = w
	} else {
		w.stop()
	}
	return a, err
}

// foundAttempt is the attempt of a grant that found a value: leaseFound,
// or leaseUndecodable when it does not decode. A value a tag retired is
// asked for once more, for a newer value or the lease; one retired again
// is loaded over, unfenced.
func (c *Cache[V]) foundAttempt(ctx context.Context, key string, g remote.Grant, sent int64) (attempt[V], error) {
	e, ok := c.decode(key, g.Value, sent)
	if ok && !c.usable(e) {
		told, at := c.watch(key, nil), c.brk.at()
		sent = c.clk.now()
		g, err := c.cfg.Lease.Acquire(ctx, key, c.cfg.LeaseTTL, time.Unix(0, e.soft))
		c.remoteDone(ctx, at, err)
		if err != nil || g.Value == nil {
			return c.grantAttempt(ctx, key, g, err, sent, told)
		}
		told.stop()
		c.fetchTags(ctx, g.Value)
		e, ok = c.decode(key, g.Value, sent)
		ok = ok && c.usable(e)
	}
	if !ok {
		return attempt[V]{outcome: leaseUndecodable}, nil
	}
	c.sentAt(e, sent)
	return attempt[V]{outcome: leaseFound, e: e}, nil
}

// leaseEvent counts a lease event for the Recorder and, for losers' waits,
// the wait histogram.
func (c *Cache[V]) leaseEvent(e observe.LeaseEvent, wait time.Duration) {
	if e == observe.LeaseWoken || e == observe.LeaseWaitTimeout || e == observe.LeaseWaitAbandoned {
		c.waitDur.observe(wait)
	}
	c.recorder.RecordLease(e, wait)
}
