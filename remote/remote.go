package remote

import (
	"context"
	"errors"
	"time"
)

// The batch contracts of the remote tier. A herd Cache's GetMany reads,
// leases and writes the keys of a batch through them, in few round trips,
// when its Store and Lease implement them, and falls back to one call per
// key when they do not. Each operation reports per key: a batch that spans
// several servers may fail on some keys and succeed on the others. None
// keeps the slice it is given once it has returned: the cache reuses it.

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

// ErrRejected is wrapped by the errors of [Store] and [Lease] calls that
// the remote tier answered but refused for that call alone: invalid
// arguments, or a key whose stored state it cannot use (a fence key that
// holds no fence, a value of the wrong type). Such an error says nothing
// of the tier's health, so it never counts towards opening the breaker.
var ErrRejected = errors.New("herd: rejected by the remote tier")

// Store is the remote tier shared by every replica of a cache: encoded
// envelopes by key, each key with a fence that only grows.
//
// An envelope's fence field is the fence it was written under; Store writes it.
// A key that was never fenced has fence 0. Keys are the encoded keys a [herd.Cache]
// is given, the empty key included; an implementation may prefix them. A ttl
// that is not positive and an envelope that does not decode are errors that
// wrap [ErrRejected] and change nothing, fence included. Expiries are
// compared at millisecond resolution.
//
// The cache's breaker counts every error of a Store or Lease call as a sign
// that the tier is unhealthy, except the caller's own context ending and
// errors that wrap [ErrRejected].
// Implementations must be safe for concurrent use.
type Store interface {
	// Load returns the envelope stored under key, or nil and no error when
	// there is none (missing or past its hard expiry).
	Load(ctx context.Context, key string) ([]byte, error)
	// Write stores env under key for ttl, but only if fence is still key's
	// current fence; it reports whether it wrote. The envelope's fence field is
	// set to fence.
	Write(ctx context.Context, key string, env []byte, fence uint64, ttl time.Duration) (bool, error)
	// Set advances key's fence and stores env under the new fence for ttl, so
	// that every write under an older fence is refused from now on. It returns
	// the new fence.
	Set(ctx context.Context, key string, env []byte, ttl time.Duration) (uint64, error)
	// Invalidate advances key's fence, deletes its value and announces the
	// change to other replicas.
	Invalidate(ctx context.Context, key string) error
}

// Lease lets one replica of a fleet load a key while the others wait, serve
// stale or fail fast. The lease is an efficiency lock: correctness comes from
// the fence that Acquire advances and [Store.Write] checks.
type Lease interface {
	// Acquire returns, in order of preference: a fresh envelope already stored
	// under key (Grant.Value, no lease taken); a lease for ttl with a new fence
	// (Grant.Token, Grant.Fence); or, when another holder has the lease, how long
	// that lease has left (Grant.HeldFor).
	//
	// A stored envelope counts as fresh when it decodes and its soft expiry
	// is later than both the tier's clock and after; one that does not decode
	// counts as absent. A miss passes the replica's own clock, so that a
	// replica whose clock runs ahead of the tier's is given the lease rather
	// than a value it finds stale; a refresh passes the later of that and the
	// soft expiry of the value it is replacing, so that only a value someone
	// else refreshed meanwhile stops it.
	Acquire(ctx context.Context, key string, ttl time.Duration, after time.Time) (Grant, error)
	// Extend pushes the lease's expiry to ttl from now if token still holds it;
	// it reports whether it did.
	Extend(ctx context.Context, key, token string, ttl time.Duration) (bool, error)
	// Release gives up the lease if token still holds it, and announces that the
	// key's load has completed, whether or not its write was accepted.
	Release(ctx context.Context, key, token string) error
	// Wait blocks until a completion for key is announced after Wait was
	// called, or ctx ends. Announcements can be lost, and one made just after
	// the call may be missed while the implementation starts listening:
	// callers re-read after a bounded wait rather than waiting forever.
	Wait(ctx context.Context, key string) error
}

// WriteReleaser is implemented by a [Lease] that can end a load in one call:
// the write of its value under the lease's fence and the release of the
// lease, which a lease holder makes together when its load returns. A cache
// whose Lease implements it writes through it, so it must write where the
// cache's [Store] reads, as a tier that is both does.
type WriteReleaser interface {
	// WriteRelease does what [Store.Write] (key, env, fence, ttl) and then
	// [Lease.Release] (key, token) do, and reports whether it wrote; the
	// release and its announcement happen whether or not it wrote.
	WriteRelease(ctx context.Context, key string, env []byte, fence uint64, ttl time.Duration, token string) (bool, error)
}

// Watcher is implemented by a [Lease] whose completion announcements can
// be waited for from before an acquisition, so that a completion announced
// between the answer of Acquire and the start of a wait is not missed: a
// loser registers, then asks for the lease, then waits for what it
// registered. A cache whose Lease is a Watcher waits for the losers of a
// batch together, on no goroutine of theirs; one whose Lease is no
// Watcher waits with [Lease.Wait], a goroutine for each loser, and
// re-reads the Store after a bounded backoff.
type Watcher interface {
	// Watch registers notify, at once and without a round trip, for the
	// next completion of key announced after the call (what ends a
	// [Lease.Wait]): notify is called once, by that announcement, or when
	// announcements may have been lost. It must return at once and call
	// nothing of the Lease: it may run under the Lease's own locks. stop
	// takes the registration back; it may be called more than once, and
	// after notify was called.
	Watch(key string, notify func()) (stop func())
}

// BatchWatcher is implemented by a [Watcher] that registers many keys at
// once, sharing the registrations' allocations and lock: a cache whose
// Lease is one registers the keys of a batch so.
type BatchWatcher interface {
	// WatchMany is Watch for each of keys: notify(i) is called once, as
	// Watch calls notify, for keys[i]; stop(i) takes the registration of
	// keys[i] back, as Watch's stop does. A registration whose notify was
	// called is spent: the cache may not stop it. The Watcher may keep keys until
	// every registration is called or taken back: the caller does not
	// change it.
	WatchMany(keys []string, notify func(i int)) (stop func(i int))
}

// ValueWatcher is implemented by a [BatchWatcher] whose completion
// announcements carry the value the completed load stored: a cache whose
// Lease is one ends a loser's wait with the holder's value, without a
// read of the Store, while nothing changed the key on its replica since
// the loser began.
type ValueWatcher interface {
	// WatchValues is WatchMany with notify(i, env) given env, the
	// envelope that the completion of keys[i] stored, with the fence it
	// was stored under; nil when it stored none (a release without a
	// write, a write refused) or when the announcement does not say
	// (announcements lost). notify may keep env; nothing modifies it.
	WatchValues(keys []string, notify func(i int, env []byte)) (stop func(i int))
}

// CompletionCounter is implemented by a [Watcher] that counts the
// completions it announces: a cache that heard another replica's hold
// ([HoldNotifier]) keeps the count, and takes any later count that differs
// for the holder's completion, with no registration to make or take back.
// Keys may share counts, as a table indexed by the keys' hashes does:
// another key's completion then costs the cache one lease attempt or Store
// read more, and no completion is missed.
type CompletionCounter interface {
	// Completions returns a number that every completion of key announced
	// after the call moves, as does whatever calls a Watch registration's
	// notify without one (announcements lost, the Lease closed). It must
	// return at once, and may be called from a SubscribeHolds fn.
	Completions(key string) uint64
}

// Grant is the outcome of [Lease.Acquire]. Exactly one of Value, Token or
// HeldFor is set.
type Grant struct {
	// Value is a fresh envelope that was found instead of taking the lease.
	Value []byte
	// Token identifies this holder's lease; empty when the lease was not taken.
	Token string
	// Fence is the key's fence as advanced by this acquisition; zero when the
	// lease was not taken. Fences stay below 2^53.
	Fence uint64
	// HeldFor is how long the current holder's lease has left, when another
	// holder has it.
	HeldFor time.Duration
}

// Notifier is implemented by remote tiers that tell each replica when another
// one changed a key, so that it can replace or drop its local copy before
// NearTTL ends. Notices can be lost; NearTTL bounds the staleness that
// follows.
type Notifier interface {
	// Subscribe calls fn, on one goroutine, with each change any replica
	// made to a key (a write, a Set or an Invalidate), until stop is called.
	// A replica whose local copy of the key is older than the notice's fence
	// drops it on a Dropped notice, and otherwise serves it while one read of
	// the Store replaces it. The zero Notice means any key may have changed
	// (a notice may have been missed): trust nothing held so far. A Notice
	// with Dropped set and Fence 0 means every key was dropped
	// ([Clearer.InvalidateAll]).
	Subscribe(fn func(Notice)) (stop func())
}

// Notice is one change of a key, as a [Notifier] announces it.
type Notice struct {
	// Key is the key that changed; the empty key is a key like any other
	// when Fence is at least 1.
	Key string
	// Fence is the key's fence after the change, at least 1; 0 only in the
	// zero Notice and in the notice of an InvalidateAll.
	Fence uint64
	// Dropped reports that the change deleted the key's value (Invalidate);
	// otherwise it stored one.
	Dropped bool
	// Tag, when not empty, names a tag whose version became Fence
	// ([Tagger.InvalidateTag]); Key and Dropped are then unset.
	Tag string
	// Live, when not zero, makes the notice a proof of liveness, which
	// only [LiveNotifier.SubscribeLive] hands out: it announces no change
	// (Key, Fence, Dropped and Tag are unset), but that every notice
	// announced before it was made has been handed to fn, none lost, and
	// that the next proof is made before Live. Live is on the tier's
	// clock: the implementation dates it from when it made the proof, not
	// from when fn gets it, so that a notice delayed on its way, or lost
	// with it, does not stretch the trust it gives.
	Live time.Time
	// Held, when not zero, makes the notice a hold announcement, which
	// only [HoldNotifier.SubscribeHolds] hands out: another replica took
	// the lease of Key and holds it until about Held (on the receiving
	// replica's clock, from when the announcement was heard), unless its
	// completion or a change of Key comes first. It announces no change:
	// Dropped, Tag and Live are unset, and Fence, when set, is the
	// lease's fence.
	Held time.Time
	// Value, when not empty, is the envelope that a change which stored
	// Key's value (Dropped unset) stored, its fence field equal to Fence,
	// so that a replica holding an older copy of Key replaces it without
	// a read of the Store. A Notifier may fill it for some changes and not
	// others (small values only, say); an empty Value is a change notice
	// as before. A replica that holds no copy of Key, or one at least as
	// new as Fence, ignores it, and one that cannot use it (it does not
	// decode, or its fence is not Fence) treats the notice as if Value
	// were empty. redisstore fills it for envelopes up to
	// redisstore.NoticeValueMax bytes (1 KiB), memory.Remote when
	// configured to (SetNoticeValues).
	Value string
	// Seq, when not zero, is set on a hold announcement by a Lease that is
	// a [CompletionCounter]: Key's completion count (Completions) when the
	// lease was granted, plus one. A replica that hears the announcement
	// after the holder completed, its count moved on, knows the hold is
	// over, however late the announcement came.
	Seq uint64
}

// HoldNotifier is implemented by a [Lease] that announces each lease it
// grants to the other replicas, so that they make no attempt of their own
// while it is held. A Cache whose Lease is a HoldNotifier makes no lease
// attempt for a key it heard held until the holder's completion or change
// notice comes or the announced time passes (at most its LeaseTTL), and,
// once it knows of another replica (it heard its hold, or found the lease
// held by it), staggers its due refreshes by a short random delay so that
// the first replica's announcement reaches the others before they try.
type HoldNotifier interface {
	// SubscribeHolds calls fn with a Notice whose Key and Held are set
	// for each lease that another replica took, until stop is called (a
	// tier that cannot tell the replicas apart, as memory.Remote, may
	// announce a replica's own leases to it too: a Cache ignores the hold
	// of a key it is loading, and any other is ended by its own lease's
	// release). Unless the Notice carries Seq, fn is called before the
	// holder can announce that lease's completion (redisstore calls it
	// on the goroutine that reads the channel the completion comes on
	// too), so that a [Watcher] registration fn makes hears that
	// completion; with Seq, fn may be called later, as memory.Remote does
	// on a goroutine of the subscription's own. fn must return quickly,
	// may call the Lease's Watch, and may be called from several
	// goroutines at once. Hold announcements go to
	// SubscribeHolds subscribers alone, never to those of Subscribe or
	// SubscribeLive, and may come before or after the changes that those
	// are given. They may be lost: a replica that missed one makes the
	// lease attempt it would have made without it. stop waits for a call
	// of fn in progress, and must not be called from fn.
	SubscribeHolds(fn func(Notice)) (stop func())
}

// LiveNotifier is implemented by a [Notifier] that can prove its notices
// complete: that no change announced before a given instant was lost on
// its way to a subscriber. A Cache whose Store is a LiveNotifier, with
// NearTTL set, trusts its local copies with no periodic re-read of the
// Store until the Live of the last proof, and falls back to NearTTL
// revalidation after it; one whose Store is only a Notifier re-reads each
// copy once per NearTTL.
//
// Such a Cache subscribes through SubscribeLive alone: a Store that wraps a
// LiveNotifier by embedding it and overrides Subscribe must override
// SubscribeLive the same way, or its Subscribe is never called.
type LiveNotifier interface {
	Notifier
	// SubscribeLive does what [Notifier.Subscribe] does, and also calls
	// fn, in order with the changes, with a Notice whose Live is set each
	// time the implementation has proof that every change announced
	// before it reached fn. When a notice may have been lost, fn gets the
	// zero Notice (as from Subscribe) or no more proofs; an
	// implementation that cannot prove anything (a tier configured
	// without it) sends no proof.
	SubscribeLive(fn func(Notice)) (stop func())
}

// HotSet is implemented by a Store that keeps, for the whole fleet, the keys
// its replicas read most, so that a new replica can load them before it
// takes traffic ([herd.Options.ShareHotKeys], [herd.Cache.WarmHot]). Counts are kept
// per period, numbered from the Unix epoch: AddHot
// adds to the current period's, and Hot reads the current and the last, so
// a key the fleet stopped reading leaves the set within two periods. A
// limit, n or period that is not positive is an error that wraps
// [ErrRejected] and changes nothing.
type HotSet interface {
	// AddHot adds reads, each key's number of reads on one replica, to the
	// fleet's counts for the current period of the given length, and keeps
	// the limit keys read most in that period.
	AddHot(ctx context.Context, reads map[string]uint64, limit int, period time.Duration) error
	// Hot returns up to n keys, the most read first, by the fleet's counts
	// over the current and the last period of the given length.
	Hot(ctx context.Context, n int, period time.Duration) ([]string, error)
}

// Staler is implemented by a Store that can make a stored value stale in
// place, for [herd.Cache.MarkStale].
type Staler interface {
	// MarkStale advances key's fence and, when a value is stored, makes its
	// soft expiry now if that is earlier, under the new fence, keeping it
	// until its hard expiry; it announces the change (not as a deletion)
	// and returns the new fence.
	MarkStale(ctx context.Context, key string) (uint64, error)
}

// Clearer is implemented by a Store that can retire every key at once, for
// [herd.Cache.InvalidateAll].
type Clearer interface {
	// InvalidateAll makes every key read as absent, in a number of round
	// trips that does not depend on how many keys there are: no value
	// stored before is returned afterwards, and no write under a fence or
	// lease taken before it is accepted. It announces the change with a
	// Notice whose Dropped is set and whose Key and Fence are zero, and
	// wakes every Wait-er.
	InvalidateAll(ctx context.Context) error
}

// Tagger is implemented by a Store that keeps a version for each tag, for
// [herd.Cache.InvalidateTag] and the tagged values of [herd.Tags]. A version is a time
// on the tier's clock, in Unix microseconds, below 2^53, and never goes
// back: a value whose load began before a version of one of its tags is
// retired. A cache dates the beginning of a load under a lease by the
// lease's fence, so the fences of the cache's [Lease] must be times on the
// same clock, in Unix microseconds, as memory.Remote's and redisstore's
// are.
type Tagger interface {
	// InvalidateTag advances tag's version to max(the last + 1, the tier's
	// clock), announces it with a Notice whose Tag is tag and whose Fence is
	// the new version, and returns the version.
	InvalidateTag(ctx context.Context, tag string) (uint64, error)
	// TagVersions returns the current version of each tag, in order, in few
	// round trips. A tag the tier holds no version of (never invalidated,
	// or unused for so long that the tier dropped it) gets one, the tier's
	// clock less the time the tier keeps an unused version, so that a value
	// that could have been loaded before the dropped version is retired,
	// and no value loaded since.
	TagVersions(ctx context.Context, tags []string) ([]uint64, error)
}
