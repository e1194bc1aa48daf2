package herd

import (
	"context"
	"errors"
	"slices"
)

// The losers of a fill: keys whose lease another load holds, served stale,
// failed fast or waited for together (wait.go), by the loser policy, after
// the batch has loaded its own keys.

// lose applies the loser policy to every loser: a miss that may be served
// its stale candidate is, under FailFast a miss fails with ErrLeaseHeld,
// and every other waits for its holder.
func (b *batchFill[V]) lose(ctx context.Context, losers []loser[V], loaded bool) {
	if loaded {
		// The holders may have finished while this batch loaded its own
		// keys, before a wait could hear of it: read what the Store holds.
		if losers = b.reread(ctx, losers); len(losers) == 0 {
			return
		}
	}
	c := b.c
	wait := losers[:0] // losers is this batch's own, read once here
	for _, l := range losers {
		f, co := l.f, l.f.co
		switch cand := f.candidate; {
		case cand != nil && !co.noStale && co.policy != Wait && c.clk.now() < cand.hard && f.accepted(cand):
			l.a.giveUp()
			b.lost(nil, f, attempt[V]{outcome: leaseFound, e: cand}, nil)
		case co.policy == FailFast:
			l.a.giveUp()
			b.done(f, nil, ErrLeaseHeld)
		default:
			wait = append(wait, l)
		}
	}
	if len(wait) > 0 {
		b.wait(ctx, wait)
	}
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

// lost settles a loser whose wait ended with a or err, or adds it to loads
// when this replica must load it.
func (b *batchFill[V]) lost(loads []pendingLoad[V], f *fillState[V], a attempt[V], err error) []pendingLoad[V] {
	if err != nil {
		if errors.Is(err, ErrLeaseTimeout) && b.c.cfg.LoadOnLeaseTimeout {
			f.remoteUp = false // load, and write nothing remotely
			return b.plan(loads, f, nil)
		}
		b.done(f, nil, err)
		return loads
	}
	held, e := f.settleAttempt(a)
	if e != nil {
		b.done(f, e, nil)
		return loads
	}
	return b.plan(loads, f, b.leases.add(held))
}
