package herd

import (
	"context"
	"time"
)

// The batch contracts of the remote tier. [Cache.GetMany] reads, leases and
// writes the keys of a batch through them, in few round trips, when its
// Store and Lease implement them, and falls back to one call per key when
// they do not. Each operation reports per key: a batch that spans several
// servers may fail on some keys and succeed on the others.

// BatchStore is implemented by a [Store] that reads many keys at once.
type BatchStore interface {
	// LoadMany does what [Store.Load] does for each key, in few round trips;
	// the result has one entry per key, in order.
	LoadMany(ctx context.Context, keys []string) []Loaded
}

// Loaded is one key's outcome of [BatchStore.LoadMany]: what [Store.Load]
// returns for it.
type Loaded struct {
	Value []byte
	Err   error
}

// BatchLease is implemented by a [Lease] that takes, extends and ends many
// leases at once. Like a [WriteReleaser], it writes where the cache's
// [Store] reads.
type BatchLease interface {
	// AcquireMany does what [Lease.Acquire] does for each request, with
	// the request's key and after and the given ttl, in few round trips; the
	// result has one entry per request, in order. When a key's lease is
	// taken or found held and the key stores an envelope that was not
	// fresh enough to be returned as Grant.Value, the entry's Stale holds
	// it (undecodable bytes included), so that the caller may serve it.
	AcquireMany(ctx context.Context, reqs []LeaseRequest, ttl time.Duration) []Acquired
	// ExtendMany does what [Lease.Extend] does for each lease, in few round
	// trips; OK reports that the lease was extended.
	ExtendMany(ctx context.Context, leases []HeldKey, ttl time.Duration) []Outcome
	// WriteReleaseMany ends many loads: for each write, what
	// [WriteReleaser.WriteRelease] does, or, when its Env is nil, what
	// [Lease.Release] does; OK reports that it wrote. The change and
	// completion announcements of one call may be sent together.
	WriteReleaseMany(ctx context.Context, writes []HeldWrite) []Outcome
}

// LeaseRequest is one key of [BatchLease.AcquireMany], with the after of
// [Lease.Acquire].
type LeaseRequest struct {
	Key   string
	After time.Time
}

// Acquired is one key's outcome of [BatchLease.AcquireMany].
type Acquired struct {
	Grant
	// Stale is the envelope stored under the key when it was not returned
	// as Grant.Value; nil when there is none or Grant.Value is set.
	Stale []byte
	Err   error
}

// HeldKey is a lease this replica holds on Key.
type HeldKey struct {
	Key, Token string
}

// HeldWrite is the end of one load under a lease: Env written under Fence
// for TTL, then the lease released; only the release when Env is nil.
type HeldWrite struct {
	HeldKey
	Env   []byte
	Fence uint64
	TTL   time.Duration
}

// Outcome is one entry's outcome of a batch operation: whether it took
// effect, or the error that kept it from being tried or answered.
type Outcome struct {
	OK  bool
	Err error
}
