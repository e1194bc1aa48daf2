package herd

import (
	"context"
	"errors"
	"math"
	"sync"
	"sync/atomic"
	"time"

	"github.com/herdcache/herd/remote"
)

// Breaker states.
const (
	breakerClosed int32 = iota
	breakerOpen
	breakerProbing
)

// breaker stops calls to the remote tier after repeated failures, lets one
// probe through after a cool-down, and closes again when a call succeeds.
// While it is open the cache serves from its local tier with in-process
// coalescing only.
//
// Every change of state starts a new epoch, and so does every failure
// counted; a call's outcome counts only in the epoch the call began in (at,
// read before the call): a call that was under way when the breaker
// opened, or when a probe closed it, says nothing about the tier since
// then. So the failures of calls that began before a probe closed the
// breaker (a read stuck in a dial to the dead server, a lease release sent
// before the outage) do not open it again, a late success of a call that
// began before it opened does not close it, and a late failure of one does
// not cost the probe its turn. Failures are consecutive in time, too: calls
// that were all under way when one of them failed (a burst that one stall
// of the server timed out together) count as that one failure, so the
// breaker opens after threshold failures each of a call that began after
// the one before failed. A success of any call that began while closed
// ends the run of failures.
type breaker struct {
	threshold int32         // consecutive failures that open it; zero: never opens
	cooldown  time.Duration // time open before a probe

	state atomic.Int32
	// run holds the epoch (high 32 bits), advanced by every change of state
	// (under mu) and every failure counted, and the consecutive failures
	// counted while closed (low 32 bits): one word, so that a failure is
	// counted only in its epoch.
	run atomic.Uint64
	// spell is the epoch in which the current state began.
	spell   atomic.Uint32
	retryAt atomic.Int64 // Unix ns when an open breaker lets a probe through

	mu            sync.Mutex
	openedAt      int64         // guarded by mu; Unix ns, zero while closed
	degradedTotal time.Duration // guarded by mu
	opens         int64         // guarded by mu

	// onChange runs after the breaker opens or closes, outside its lock,
	// with the failure that opened it (nil when it starts open, or closes).
	onChange func(open bool, cause error)
}

// epoch is a state of the breaker, as at returns it.
type epoch uint32

// at returns the current epoch, to read before a remote call and give to
// record with its outcome.
func (b *breaker) at() epoch { return epoch(b.run.Load() >> 32) }

// advance starts a new state, in a new epoch with no failures counted.
// b.mu is held.
func (b *breaker) advance() {
	next := b.at() + 1
	b.run.Store(uint64(next) << 32)
	b.spell.Store(uint32(next))
}

// open reports whether remote calls are being skipped now.
func (b *breaker) open() bool {
	return b.state.Load() != breakerClosed
}

// probeDue reports whether an open breaker would let a probe through now.
func (b *breaker) probeDue() bool {
	return b.state.Load() == breakerOpen && nowNano() >= b.retryAt.Load()
}

// allow reports whether a remote call may be made now; when it returns true
// the call's outcome must be passed to record, with the epoch read (at)
// after allow returned.
func (b *breaker) allow() bool {
	switch b.state.Load() {
	case breakerClosed:
		return true
	case breakerOpen:
		if nowNano() < b.retryAt.Load() {
			return false
		}
		b.mu.Lock()
		defer b.mu.Unlock()
		if b.state.Load() != breakerOpen || nowNano() < b.retryAt.Load() {
			return false
		}
		b.state.Store(breakerProbing)
		b.advance() // the probe's epoch: only calls from now on decide it
		return true
	}
	return false
}

// record takes the outcome of a remote call that began in epoch at. Errors
// from the caller's own context do not count against the remote tier, a
// call the tier refused ([remote.ErrRejected]) counts as an answer, and the
// outcome of a call that began before the breaker last changed state does
// not count at all.
func (b *breaker) record(ctx context.Context, at epoch, err error) {
	if errors.Is(err, remote.ErrRejected) {
		err = nil
	}
	if err != nil && ctx.Err() != nil && errors.Is(err, ctx.Err()) {
		b.probeEnded(at, false) // a probe cut short lets another through at once
		return
	}
	switch {
	case err == nil && b.state.Load() == breakerClosed:
		b.succeeded(at)
	case err == nil:
		b.close(at)
	case b.threshold == 0:
	case b.state.Load() == breakerClosed:
		if trip, now := b.failed(at); trip {
			b.trip(now, err)
		}
	default:
		b.probeEnded(at, true)
	}
}

// succeeded forgets the failures counted, when the call began (in epoch
// at) while the breaker was closed as it is now.
func (b *breaker) succeeded(at epoch) {
	if int32(uint32(at)-b.spell.Load()) < 0 {
		return // it began before the breaker last closed
	}
	for {
		r := b.run.Load()
		if uint32(r) == 0 || b.run.CompareAndSwap(r, r&^math.MaxUint32) {
			return
		}
	}
}

// failed counts a failure of a call that began in epoch at, if it is
// current, in a new epoch (now), and reports whether that makes threshold
// consecutive failures.
func (b *breaker) failed(at epoch) (trip bool, now epoch) {
	for {
		r := b.run.Load()
		if epoch(r>>32) != at {
			return false, 0
		}
		n := uint32(r) + 1
		if b.run.CompareAndSwap(r, uint64(at+1)<<32|uint64(n)) {
			return int64(n) >= int64(b.threshold), at + 1
		}
	}
}

// trip opens the breaker, closed in epoch at, the one its last failure,
// cause, began.
func (b *breaker) trip(at epoch, cause error) {
	b.mu.Lock()
	if b.state.Load() != breakerClosed || b.at() != at {
		b.mu.Unlock()
		return
	}
	b.openedAt = nowNano()
	b.opens++
	b.retryAt.Store(addTime(b.openedAt, b.cooldown))
	b.state.Store(breakerOpen)
	b.advance()
	b.mu.Unlock()
	if b.onChange != nil {
		b.onChange(true, cause)
	}
}

// probeEnded ends the probe of epoch at without closing the breaker: after
// a cool-down when it failed, at once when its caller gave up.
func (b *breaker) probeEnded(at epoch, failed bool) {
	if b.state.Load() != breakerProbing {
		return
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.state.Load() != breakerProbing || b.at() != at {
		return
	}
	if failed {
		b.retryAt.Store(addTime(nowNano(), b.cooldown))
	}
	b.state.Store(breakerOpen)
	b.advance()
}

// close closes the breaker on the success of a call that began in epoch
// at, while it was open or probing.
func (b *breaker) close(at epoch) {
	b.mu.Lock()
	if b.state.Load() == breakerClosed || b.at() != at {
		b.mu.Unlock()
		return
	}
	b.state.Store(breakerClosed)
	b.degradedTotal += time.Duration(nowNano() - b.openedAt)
	b.openedAt = 0
	b.advance()
	b.mu.Unlock()
	if b.onChange != nil {
		b.onChange(false, nil)
	}
}

// degraded returns the total time spent open, the current spell included,
// and how many times it opened.
func (b *breaker) degraded() (time.Duration, int64) {
	b.mu.Lock()
	defer b.mu.Unlock()
	d := b.degradedTotal
	if b.openedAt != 0 {
		d += time.Duration(nowNano() - b.openedAt)
	}
	return d, b.opens
}

// startFrom opens the breaker, with a probe due at once, when store knows
// it has had no answer from its server since it was made: it has a method
// Reached() bool, as redisstore's Remote has, that reports false. So the
// first remote call probes the tier, and the calls made meanwhile go
// without it instead of each waiting for its timeout. A breaker that never
// opens (threshold zero) starts closed whatever store says.
func (b *breaker) startFrom(store remote.Store) {
	r, ok := store.(interface{ Reached() bool })
	if !ok || b.threshold == 0 || r.Reached() {
		return
	}
	b.mu.Lock()
	b.openedAt = nowNano()
	b.opens++
	b.retryAt.Store(b.openedAt)
	b.state.Store(breakerOpen)
	b.advance()
	b.mu.Unlock()
	if b.onChange != nil {
		b.onChange(true, nil)
	}
}
