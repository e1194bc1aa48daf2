package herd

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"time"
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
type breaker struct {
	threshold int32         // consecutive failures that open it; zero: never opens
	cooldown  time.Duration // time open before a probe

	state    atomic.Int32
	failures atomic.Int32 // consecutive failures while closed
	retryAt  atomic.Int64 // Unix ns when an open breaker lets a probe through

	mu            sync.Mutex
	openedAt      int64         // guarded by mu; Unix ns, zero while closed
	degradedTotal time.Duration // guarded by mu
	opens         int64         // guarded by mu

	// onChange runs after the breaker opens or closes, outside its lock.
	onChange func(open bool)
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
// the call's outcome must be passed to record.
func (b *breaker) allow() bool {
	switch b.state.Load() {
	case breakerClosed:
		return true
	case breakerOpen:
		if nowNano() >= b.retryAt.Load() && b.state.CompareAndSwap(breakerOpen, breakerProbing) {
			return true
		}
	}
	return false
}

// record takes the outcome of an allowed call. Errors from the caller's own
// context do not count against the remote tier, and a call the tier refused
// ([ErrRejected]) counts as an answer.
func (b *breaker) record(ctx context.Context, err error) {
	if errors.Is(err, ErrRejected) {
		err = nil
	}
	if err != nil && ctx.Err() != nil && errors.Is(err, ctx.Err()) {
		if b.state.Load() == breakerProbing {
			b.state.Store(breakerOpen) // let another probe through
		}
		return
	}
	if err == nil {
		b.failures.Store(0)
		if b.state.Load() != breakerClosed {
			b.close()
		}
		return
	}
	if b.threshold == 0 {
		return
	}
	switch b.state.Load() {
	case breakerClosed:
		if b.failures.Add(1) >= b.threshold {
			b.trip()
		}
	case breakerProbing:
		b.retryAt.Store(addTime(nowNano(), b.cooldown))
		b.state.Store(breakerOpen)
	}
}

func (b *breaker) trip() {
	b.mu.Lock()
	if b.state.Load() != breakerClosed {
		b.mu.Unlock()
		return
	}
	b.openedAt = nowNano()
	b.opens++
	b.retryAt.Store(addTime(b.openedAt, b.cooldown))
	b.state.Store(breakerOpen)
	b.mu.Unlock()
	if b.onChange != nil {
		b.onChange(true)
	}
}

func (b *breaker) close() {
	b.mu.Lock()
	if b.state.Load() == breakerClosed {
		b.mu.Unlock()
		return
	}
	b.state.Store(breakerClosed)
	b.failures.Store(0)
	b.degradedTotal += time.Duration(nowNano() - b.openedAt)
	b.openedAt = 0
	b.mu.Unlock()
	if b.onChange != nil {
		b.onChange(false)
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
