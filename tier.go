package herd

import (
	"context"
	"errors"
	"time"

	"github.com/herdcache/herd/remote"
)

// The remote tier's reads and acquisitions on behalf of fills and reads:
// one call per batch when the Store and Lease take batches, the outcome
// recorded once for the breaker, tags' versions fetched alongside.

// loadRemote reads key from the Store and decodes what it finds.
func (c *Cache[V]) loadRemote(ctx context.Context, key string) remoteRead[V] {
	r := remoteRead[V]{done: true}
	r.gen, r.puts = c.gens.get(key)
	at, sent := c.brk.at(), c.clk.now()
	env, err := c.cfg.Store.Load(ctx, key)
	c.remoteDone(ctx, at, err)
	c.fetchTags(ctx, env)
	c.readOf(&r, key, env, err, sent)
	c.sentAt(r.e, sent)
	return r
}

// sentAt dates e, decoded from the answer of a remote call sent at sent
// (whose NearTTL decode counted from then), as put in the local tier no
// later than the call was sent, rather than when its answer came. A late
// answer may hold a value the Store replaced meanwhile, with a notice this
// replica lost; dated so, it is trusted and served no longer after that
// change than an answer that came at once. e may be nil.
func (c *Cache[V]) sentAt(e *entry[V], sent int64) {
	if e != nil {
		e.born = sent
	}
}

// readOf fills r with what one read of key from the Store, sent at sent,
// returned.
func (c *Cache[V]) readOf(r *remoteRead[V], key string, env []byte, err error, sent int64) {
	switch {
	case errors.Is(err, remote.ErrRejected):
		c.st.decodeErrors.add(1) // the key holds nothing this cache can use
	case err != nil:
		r.err = err
	case env == nil:
		r.gone = true
	default:
		if e, ok := c.decode(key, env, sent); ok && c.usable(e) {
			r.e = e // a value a tag retired is of no use either
		}
	}
}

// loadMany reads the keys of fs from the Store: one call when it is a
// [remote.BatchStore], one per key otherwise. The breaker records one outcome for
// the batch. The reads are in s's array, valid until its next loadMany.
func (c *Cache[V]) loadMany(ctx context.Context, fs []*fillState[V], s *scratch[V]) []remoteRead[V] {
	if len(fs) == 0 {
		return nil // no call, and no outcome for the breaker
	}
	reads := room(&s.reads, len(fs))[:len(fs)]
	clear(reads) // of the batch's last loadMany
	keys := room(&s.keys, len(fs))[:len(fs)]
	for i, f := range fs {
		keys[i] = f.key
		reads[i].done = true
		reads[i].gen, reads[i].puts = c.gens.get(f.key)
	}
	var got []remote.Loaded
	at, sent := c.brk.at(), c.clk.now()
	if bs, ok := c.cfg.Store.(remote.BatchStore); ok {
		got = bs.LoadMany(ctx, keys)
	} else {
		got = make([]remote.Loaded, len(keys))
		for i, k := range keys {
			got[i].Value, got[i].Err = c.cfg.Store.Load(ctx, k)
		}
	}
	c.remoteDone(ctx, at, firstErr(got, func(l remote.Loaded) error { return l.Err }))
	var tags []string
	for _, l := range got {
		tags = appendTags(tags, l.Value)
	}
	c.learnTags(ctx, tags)
	for i, l := range got[:len(keys)] {
		c.readOf(&reads[i], keys[i], l.Value, l.Err, sent)
		c.sentAt(reads[i].e, sent)
	}
	return reads
}

// leaseRequests appends to reqs the requests for the leases of the keys of
// fs, each fresh after its fill's start (a miss) or its old value's soft
// expiry (a refresh).
func leaseRequests[V any](reqs []remote.LeaseRequest, fs []*fillState[V]) []remote.LeaseRequest {
	for _, f := range fs {
		after := f.now
		if f.old != nil {
			after = max(after, f.old.soft) // only a value refreshed meanwhile stops it
		}
		after = f.leaseAfter(after)
		reqs = append(reqs, remote.LeaseRequest{Key: f.key, After: time.Unix(0, after)})
	}
	return reqs
}

// acquireMany asks for the leases of reqs: one call when the Lease is a
// [remote.BatchLease], and otherwise one Acquire per key, with a read of the
// Store for each key whose value was not returned and whose stale value
// is wanted (stale, nil when none is). One key whose stale value is not
// wanted asks with Acquire alone.
func (c *Cache[V]) acquireMany(ctx context.Context, reqs []remote.LeaseRequest, stale func(i int) bool) []remote.Acquired {
	if stale == nil {
		stale = func(int) bool { return false }
	}
	ttl := c.cfg.LeaseTTL
	var got []remote.Acquired
	at := c.brk.at()
	if bl, ok := c.cfg.Lease.(remote.BatchLease); ok && (len(reqs) > 1 || stale(0)) {
		got = bl.AcquireMany(ctx, reqs, ttl)
	} else {
		got = make([]remote.Acquired, len(reqs))
		for i, r := range reqs {
			got[i].Grant, got[i].Err = c.cfg.Lease.Acquire(ctx, r.Key, ttl, r.After)
			if got[i].Err == nil && got[i].Value == nil && stale(i) {
				got[i].Stale, _ = c.cfg.Store.Load(ctx, r.Key)
			}
		}
	}
	c.remoteDone(ctx, at, firstErr(got, func(a remote.Acquired) error { return a.Err }))
	var tags []string
	for _, a := range got {
		tags = appendTags(tags, a.Value, a.Stale)
	}
	c.learnTags(ctx, tags)
	return got[:len(reqs)]
}

// firstErr returns the first error of a batch's outcomes, or nil.
func firstErr[T any](outs []T, err func(T) error) error {
	for _, o := range outs {
		if e := err(o); e != nil {
			return e
		}
	}
	return nil
}
