package redisstore

import (
	"github.com/herdcache/herd/remote"
	"github.com/herdcache/herd/remote/notify"
)

// SubscribeHolds calls fn with a Notice whose Key and Held are set for
// each lease another Remote on the same Redis and prefix took (Acquire,
// AcquireMany): Held is when the lease would end if nothing extended or
// released it, counted on this replica's clock from when the
// announcement was heard. fn is called, one call at a time, on the
// goroutine that reads the subscription the announcement came on (on a
// Cluster, one per channel), before it reads the next message, so a Watch
// that fn registers hears the holder's completion, which comes on the
// same channel; fn must return quickly, and may call Watch but nothing
// else that waits for the channel. Leases this Remote took are not
// announced to its own subscribers, and hold announcements reach no
// Subscribe or SubscribeLive subscriber. stop
// waits for a call of fn in progress and may be called more than once; it
// must not be called from fn. After Close, fn is never called.
func (r *Remote) SubscribeHolds(fn func(remote.Notice)) (stop func()) {
	if r.closed.Load() {
		return func() {}
	}
	return r.holds.Add(func(n notify.Notice) { fn(remote.Notice(n)) })
}
