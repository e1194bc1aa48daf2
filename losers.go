package herd

import (
	"context"
	"errors"
	"slices"
	"time"
)

// The losers of a fill: keys whose lease another load holds, served stale,
// failed fast or waited for (wait.go), by the loser policy, after the
// batch has loaded its own keys.

// lose applies the loser policy to every loser at once, each on a
// goroutine of its own, and loads a key as soon as its wait ends with this
// replica to load it (the lease came here, or the wait timed out and
// LoadOnLeaseTimeout is set, or the tier failed), with the others whose
// waits have ended by then: a key leased here is never held while this
// batch waits for others. Were it held, two replicas that each took a
// lease the other waits on would stall each other until LeaseWait.
func (b *batchFill[V]) lose(ctx context.Context, losers []loser[V], loaded bool) {
	if loaded {
		// The holders may have finished while this batch loaded its own
		// keys, before a wait could hear of it: read what the Store holds.
		if losers = b.reread(ctx, losers); len(losers) == 0 {
			return
		}
	}
	if len(losers) == 1 {
		l := losers[0]
		a, err := l.f.lose(ctx, l.a)
		b.loadAll(ctx, b.lost(nil, l.f, a, err))
		return
	}
	ch := make(chan waited[V], len(losers))
	stops := make(map[*fillState[V]]context.CancelFunc, len(losers))
	for _, l := range losers {
		lctx, stop := context.WithCancel(ctx)
		stops[l.f] = stop
		go func() {
			a, err := l.f.lose(lctx, l.a)
			ch <- waited[V]{l, a, err}
		}()
	}
	left := len(losers)
	defer func() { b.abandon(ctx, ch, left, stops) }()
	// Without a Watcher, a holder may also finish between that read and the
	// start of its loser's wait, which then hears nothing until its first
	// re-read: one read of every key still waited for, soon after the waits
	// begin, ends those waits at once. A Watcher's losers listen from
	// before their attempt.
	var recheck <-chan time.Time
	if _, ok := b.c.cfg.Lease.(Watcher); !ok {
		t := time.NewTimer(loserRecheck)
		defer t.Stop()
		recheck = t.C
	}
	for left > 0 {
		select {
		case <-recheck:
			b.recheckLosers(ctx, stops)
			if len(stops) == 0 {
				return
			}
		case w := <-ch:
			var loads []pendingLoad[V]
			for more := true; more; {
				left--
				loads = b.arrived(ctx, loads, w, stops)
				select {
				case w = <-ch:
				default:
					more = false
				}
			}
			b.loadAll(ctx, loads)
		}
	}
}

// lose applies the loser policy to a lease another load holds: serve the
// candidate, fail fast, or wait for the holder.
func (f *fillState[V]) lose(ctx context.Context, a attempt[V]) (attempt[V], error) {
	c, co := f.c, f.co
	if cand := f.candidate; cand != nil && !co.noStale && co.policy != Wait && c.clk.now() < cand.hard {
		a.giveUp()
		return attempt[V]{outcome: leaseFound, e: cand}, nil
	}
	if co.policy == FailFast {
		a.giveUp()
		return a, ErrLeaseHeld
	}
	return c.waitHolder(ctx, f.key, a)
}

// reread reads the keys of losers from the Store, settles those it
// serves, and returns the others; the settled give up their waits.
func (b *batchFill[V]) reread(ctx context.Context, losers []loser[V]) []loser[V] {
	fs := make([]*fillState[V], len(losers))
	for i, l := range losers {
		fs[i] = l.f
		l.f.pre = remoteRead[V]{} // out of date: the batch loaded since
	}
	waiting := make(map[*fillState[V]]bool, len(fs))
	for _, f := range b.fromReads(ctx, fs) {
		waiting[f] = true
	}
	return slices.DeleteFunc(losers, func(l loser[V]) bool {
		if !waiting[l.f] {
			l.a.giveUp()
			return true
		}
		return false
	})
}

// waited is how one loser's wait ended.
type waited[V any] struct {
	l   loser[V]
	a   attempt[V]
	err error
}

// arrived settles the loser whose wait ended with w, or adds it to loads
// when this replica must load it; a loser the re-read settled already
// (no longer in stops) gives back a lease its wait took.
func (b *batchFill[V]) arrived(ctx context.Context, loads []pendingLoad[V], w waited[V], stops map[*fillState[V]]context.CancelFunc) []pendingLoad[V] {
	stop, ok := stops[w.l.f]
	if !ok {
		if w.err == nil && w.a.outcome == leaseGranted {
			b.c.releaseLease(ctx, w.a.held)
		}
		return loads
	}
	delete(stops, w.l.f)
	stop()
	return b.lost(loads, w.l.f, w.a, w.err)
}

// abandon stops the left waits still running (after a panic of the
// loader, or once the re-read settled every loser) and, as they end, gives
// back any lease one of them took.
func (b *batchFill[V]) abandon(ctx context.Context, ch <-chan waited[V], left int, stops map[*fillState[V]]context.CancelFunc) {
	for _, stop := range stops {
		stop()
	}
	if left == 0 {
		return
	}
	go func() {
		for range left {
			if w := <-ch; w.err == nil && w.a.outcome == leaseGranted {
				b.c.releaseLease(ctx, w.a.held)
			}
		}
	}()
}

// loserRecheck is how soon after its losers begin to wait a batch reads
// their keys once more.
const loserRecheck = 5 * time.Millisecond

// recheckLosers reads the keys of the losers still waiting (stops holds
// their waits' stop functions) and settles each that the Store holds fresh
// now, stopping its wait.
func (b *batchFill[V]) recheckLosers(ctx context.Context, stops map[*fillState[V]]context.CancelFunc) {
	fs := make([]*fillState[V], 0, len(stops))
	for f := range stops {
		fs = append(fs, f)
	}
	c := b.c
	now := c.clk.now()
	for i, r := range c.loadMany(ctx, fs) {
		if e := r.e; e != nil && now < e.soft {
			f := fs[i]
			c.setLocal(f.key, e, r.gen)
			stops[f]()
			delete(stops, f)
			b.fromStore(f, e)
		}
	}
}

// lost settles a loser whose wait ended with a or err, or adds it to loads
// when this replica must load it.
func (b *batchFill[V]) lost(loads []pendingLoad[V], f *fillState[V], a attempt[V], err error) []pendingLoad[V] {
	if err != nil {
		if errors.Is(err, ErrLeaseTimeout) && b.c.cfg.LoadOnLeaseTimeout {
			f.remoteUp = false // load, and write nothing remotely
			return b.plan(loads, f, nil)
		}
		b.settle(f.key, nil, err)
		return loads
	}
	held, e := f.settleAttempt(a)
	if e != nil {
		b.settle(f.key, e, nil)
		return loads
	}
	return b.plan(loads, f, b.leases.add(held))
}
