package memory

import (
	"bytes"
	"context"
	"crypto/rand"
	"time"

	"github.com/herdcache/herd/remote"
	"github.com/herdcache/herd/remote/envelope"
	"github.com/herdcache/herd/remote/notify"
)

var (
	_ remote.BatchStore = (*Remote)(nil)
	_ remote.BatchLease = (*Remote)(nil)
)

// The batch calls of a Remote make one single-key call per entry, in
// order: each entry is as atomic as that call, fails as it would (a down
// remote, an ended ctx, a rejected argument) without affecting the other
// entries, and counts in [Stats] exactly as that call. LoadMany,
// AcquireMany and WriteReleaseMany make their calls under one hold of the
// Remote's lock; another caller may act between two entries of
// ExtendMany, as between the keys of a Redis batch that spans servers.

// LoadMany does what Load does for each key.
func (r *Remote) LoadMany(ctx context.Context, keys []string) []remote.Loaded {
	out := make([]remote.Loaded, len(keys))
	ctx = asOfNow(ctx)
	r.mu.Lock()
	defer r.mu.Unlock()
	r.stats.Batches++
	now := time.Now() // one instant for the batch, as it holds the lock
	for i, key := range keys {
		out[i].Value, out[i].Err = r.load(ctx, key, now)
	}
	return out
}

// AcquireMany does what Acquire does for each request, and when the lease
// is taken or found held sets Stale to a copy of the value stored under
// the key, if it has one that was not fresh enough or does not decode.
func (r *Remote) AcquireMany(ctx context.Context, reqs []remote.LeaseRequest, ttl time.Duration) []remote.Acquired {
	out := make([]remote.Acquired, len(reqs))
	ctx = asOfNow(ctx)
	r.mu.Lock()
	defer r.mu.Unlock()
	r.stats.Batches++
	now := time.Now() // one instant for the batch, as it holds the lock
	for i, req := range reqs {
		out[i] = r.acquire(ctx, req.Key, ttl, req.After, now)
	}
	r.announce(reqs, out, now.Add(ttl))
	return out
}

// acquire is Acquire at now with r.mu held, with the stale value of
// AcquireMany.
func (r *Remote) acquire(ctx context.Context, key string, ttl time.Duration, after, now time.Time) remote.Acquired {
	if err := r.check(ctx, "acquire", key); err != nil {
		return remote.Acquired{Err: err}
	}
	if err := r.checkTTL(ttl, "acquire", key); err != nil {
		return remote.Acquired{Err: err}
	}
	e := r.entry(key, now, true)
	if e.value != nil {
		ev, err := envelope.Decode(e.value)
		if err == nil && ev.Soft > now.UnixMilli() && ev.Soft > after.UnixMilli() {
			r.stats.AcquireValue++
			return remote.Acquired{Grant: remote.Grant{Value: bytes.Clone(e.value)}}
		}
	}
	if e.token != "" {
		r.stats.AcquireHeld++
		return remote.Acquired{Grant: remote.Grant{HeldFor: e.leaseEnd.Sub(now)}, Stale: bytes.Clone(e.value)}
	}
	if err := r.canAdvance(e, "acquire", key); err != nil {
		return remote.Acquired{Err: err}
	}
	e.token = rand.Text()
	e.leaseEnd = now.Add(ttl)
	advance(e, nextFence(e, now), now, ttl)
	r.stats.AcquireLease++
	return remote.Acquired{Grant: remote.Grant{Token: e.token, Fence: e.fence}, Stale: bytes.Clone(e.value)}
}

// ExtendMany does what Extend does for each lease.
func (r *Remote) ExtendMany(ctx context.Context, leases []remote.HeldKey, ttl time.Duration) []remote.Outcome {
	r.countBatch()
	out := make([]remote.Outcome, len(leases))
	for i, l := range leases {
		out[i].OK, out[i].Err = r.Extend(ctx, l.Key, l.Token, ttl)
	}
	return out
}

// WriteReleaseMany does what WriteRelease does for each write, or Release
// when its Env is nil. Each stored value notifies subscribers on its own
// and each release announces its key's completion, as the single calls do.
func (r *Remote) WriteReleaseMany(ctx context.Context, writes []remote.HeldWrite) []remote.Outcome {
	out := make([]remote.Outcome, len(writes))
	ctx = asOfNow(ctx)
	r.mu.Lock()
	defer r.mu.Unlock()
	r.stats.Batches++
	r.batched = make([]notify.Notice, 0, len(writes))
	defer r.pushBatched()
	for i, w := range writes {
		if w.Env == nil {
			out[i].Err = r.releaseWith(ctx, w.Key, w.Token, nil)
			continue
		}
		out[i].OK, out[i].Err = r.writeRelease(ctx, w.Key, w.Env, w.Fence, w.TTL, w.Token)
	}
	return out
}

// pushBatched pushes the notices a batch call collected to every
// subscription, as one message that they share. r.mu is held.
func (r *Remote) pushBatched() {
	ns := r.batched
	r.batched = nil
	for s := range r.subs {
		s.PushAll(ns)
	}
}

// countBatch counts one batch call in Stats.
func (r *Remote) countBatch() {
	r.mu.Lock()
	r.stats.Batches++
	r.mu.Unlock()
}

// asOfNow is ctx with its error read once, now: a batch call, which holds
// r.mu throughout, checks its context for each key as of its start, not
// once a key (a context's Err may read the clock).
func asOfNow(ctx context.Context) context.Context { return errAsOf{ctx, ctx.Err()} }

type errAsOf struct {
	context.Context
	err error
}

func (c errAsOf) Err() error { return c.err }
