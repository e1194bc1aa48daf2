package redisstore

import (
	"github.com/herdcache/herd/remote"
	"github.com/herdcache/herd/remote/notify"
)

// SubscribeHolds calls fn, on one goroutine per subscription and in
// order, with a Notice whose Key and Held are set for each lease another
// Remote on the same Redis and prefix took (Acquire, AcquireMany): Held is
// when the lease would end if nothing extended or released it, counted on
// this replica's clock from when the announcement was heard. Leases this
// Remote took are not announced to its own subscribers, and hold
// announcements reach no Subscribe or SubscribeLive subscriber. Like
// Subscribe's, each subscription queues up to 1024 messages; a full queue
// is replaced by a single zero Notice, which a hold subscriber may ignore.
// stop drops the notices still queued, waits until fn has returned and
// may be called more than once; it must not be called from fn. After
// Close, SubscribeHolds starts nothing and fn is never called.
func (r *Remote) SubscribeHolds(fn func(remote.Notice)) (stop func()) {
	r.mu.Lock()
	if r.closed.Load() {
		r.mu.Unlock()
		return func() {}
	}
	s := notify.Start(func(n notify.Notice) { fn(remote.Notice(n)) }, subscribeQueue)
	r.holds[s] = struct{}{}
	r.mu.Unlock()
	return func() {
		r.mu.Lock()
		delete(r.holds, s)
		r.mu.Unlock()
		s.Stop()
	}
}
