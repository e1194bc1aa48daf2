package herd

import (
	"time"

	"github.com/herdcache/herd/remote"
)

// Quiet losers. A Lease that is a [remote.HoldNotifier] announces each
// lease it grants to the other replicas. A replica that hears that another
// holds a key's lease records it as it records a lease attempt that found
// the lease held: it makes no attempt of its own for the key until the
// holder's completion or change notice comes or the announced time passes,
// at most LeaseTTL from when it heard it, so a holder that crashed is taken
// over then; readers are served the stale value meanwhile. Once a replica
// knows it has company (it heard another's hold, or one of its lease
// attempts found another's lease), its due refreshes wait a random delay
// below min(maxStagger, SoftTTL/staggerPart) before they try the lease, so
// that the first replica's announcement reaches the others before they
// do; refreshes ahead of a pinned or hot key, timed to end before the soft
// expiry, do not wait. Stats counts the holds heard (LeaseHoldsHeard) and
// the lease attempts they spared (LeaseAttemptsSkipped).

// Bounds of the random delay of a due refresh when the Lease announces
// holds.
const (
	maxStagger  = 100 * time.Millisecond
	staggerPart = 20
)

// subscribeHolds subscribes the cache to its Lease's hold announcements,
// when it has a Store and its Lease is a HoldNotifier.
func (c *Cache[V]) subscribeHolds() {
	hn, ok := c.cfg.Lease.(remote.HoldNotifier)
	if !ok || c.cfg.Store == nil {
		return
	}
	c.announces = true
	c.unsubscribeHolds = hn.SubscribeHolds(c.heardHold)
}

// heardHold records that another replica holds n.Key's lease until about
// n.Held, capped at LeaseTTL from now. It ignores a hold while a load of
// the key runs in this process (its own lease, or a load whose value comes
// first), one this replica knows of already (its own lease until its
// release, or another's that a lease attempt found, watched since before
// the attempt), and one whose holder completed before this replica heard
// of it: a Lease that counts completions ([remote.CompletionCounter]) may
// announce late, with the count at the grant in n.Seq, as memory.Remote
// does. A Lease that sets no Seq calls it before the holder can announce
// its completion, so that the count, or the watch it registers, hears
// that completion. A hold heard, completed or not, tells the replica it
// has company, unless the value here is that holder's or newer: its own
// lease, heard late. It returns at once.
func (c *Cache[V]) heardHold(n remote.Notice) {
	if n.Held.IsZero() || c.flights.Waiters(n.Key) > 0 {
		return // a zero Notice: holds may have been lost, which costs attempts only
	}
	now := c.clk.now()
	until := min(n.Held.UnixNano(), addTime(now, c.cfg.LeaseTTL))
	if until <= now {
		return
	}
	h := heldBy{until: until, heard: true}
	if cc := c.gens.completions; cc != nil {
		h.counted, h.seq = true, cc.Completions(n.Key)
		if n.Seq != 0 && h.seq != n.Seq-1 {
			// The holder completed before this replica heard of it: another
			// replica, unless the value here is that holder's or newer.
			if c.company.Load() {
				return // known already
			}
			if e, ok := c.local.GetIfPresent(n.Key); n.Fence == 0 || !ok || e.fence.Load() < n.Fence {
				c.hasCompany()
			}
			return
		}
	} else {
		h.done = c.watch(n.Key, nil)
	}
	if c.gens.markHeldFirst(n.Key, h, now) {
		c.hasCompany()
		c.st.leaseHoldsHeard.add(1)
	}
}

// hasCompany records that another replica leases this cache's keys, heard
// from an announcement or from a lease attempt that found the lease held:
// from now on, when the Lease announces holds, due refreshes are
// staggered. A replica that learnt of others only from the announcements
// would not learn it while its own attempts keep colliding with theirs:
// an announcement that comes while a load of the key runs here is ignored.
func (c *Cache[V]) hasCompany() {
	if c.announces && !c.company.Load() {
		c.company.Store(true)
	}
}

// stagger waits the random delay of a due refresh of keys, once the cache
// knows it has company, and returns the keys whose lease it has
// not heard held meanwhile; none when the cache closes first.
func (c *Cache[V]) stagger(keys []string) []string {
	if !c.company.Load() {
		return keys
	}
	if d := time.Duration(c.staggerDraw() * float64(min(maxStagger, c.cfg.SoftTTL/staggerPart))); d > 0 {
		t := time.NewTimer(d)
		select {
		case <-t.C:
		case <-c.closeCtx.Done():
			t.Stop()
			return nil
		}
	}
	now := c.clk.now()
	due := keys[:0:0]
	for _, key := range keys {
		if _, held, spared := c.gens.heldSparing(key, now); held {
			if spared {
				c.st.leaseAttemptsSkipped.add(1)
			}
		} else {
			due = append(due, key)
		}
	}
	return due
}
