package herd

import (
	"time"

	"github.com/herdcache/herd/remote"
)

// The near-cache trusted by push. A Store that is a [remote.LiveNotifier]
// proves, from time to time, that no change notice made before the proof
// was lost, each proof holding until a time it names. Until the last proof
// received ends, a local copy put after the trust floor is trusted until
// its soft expiry or a notice, with no re-read of the Store each NearTTL;
// once proofs stop coming, copies fall back to NearTTL revalidation,
// counted from the later of their own NearTTL and the end of the last
// proof.

// subscribe subscribes the cache to its Store's notices, with proofs of
// liveness when the Store gives them and the near-cache is on.
func (c *Cache[V]) subscribe() {
	if n, ok := c.cfg.Store.(remote.LiveNotifier); ok && c.cfg.NearTTL > 0 {
		c.unsubscribe = n.SubscribeLive(c.noticed)
		return
	}
	if n, ok := c.cfg.Store.(remote.Notifier); ok {
		c.unsubscribe = n.Subscribe(c.noticed)
	}
}

// proved records a proof of liveness that holds until live. Only the
// subscription's goroutine calls it.
func (c *Cache[V]) proved(live time.Time) {
	c.liveUntil.Store(live.UnixNano())
}

// live reports whether the notice channel is proven live at now.
func (c *Cache[V]) live(now int64) bool {
	return now < c.liveUntil.Load()
}

// liveYoung reports whether e, past its own 2×NearTTL, was trusted by a
// proof of liveness that stopped covering it less than NearTTL ago (or
// covers it still), so that it may be served while one read of the Store
// replaces it. A copy superseded by a notice is, only until the read that
// replaces it has been tried: a read that failed leaves it to the reader's
// path, as a copy past 2×NearTTL is.
func (c *Cache[V]) liveYoung(key string, e *entry[V], now int64) bool {
	if now >= addTime(c.liveUntil.Load(), c.cfg.NearTTL) {
		return false
	}
	return !e.superseded.Load() || !e.revalidating.Load() || c.reads.Waiters(key) > 0
}
