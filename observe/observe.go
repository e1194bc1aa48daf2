package observe

import (
	"context"
	"time"

	"github.com/herdcache/herd/limiter"
)

// Recorder receives a cache's events as they happen, for metrics systems
// that push rather than read [herd.Cache.Stats]. Its methods may be called
// concurrently; RecordGet runs on the hit path and must be cheap. A Recorder
// may also implement [Tracer], [EventRecorder] and [observe.CacheRecorder]. Embed
// [NopRecorder] to implement only the methods wanted.
type Recorder interface {
	// RecordGet is called once per Get, and once per key of a GetMany, with
	// how it was answered.
	RecordGet(r GetResult)
	// RecordLoad is called after each load with its duration and error
	// ([herd.ErrNotFound] for a key that has no value); background says whether
	// it was a refresh.
	RecordLoad(d time.Duration, err error, background bool)
	// RecordLease is called for each lease event; wait is the time a loser
	// waited (LeaseWoken, LeaseWaitTimeout, LeaseWaitAbandoned), zero
	// otherwise.
	RecordLease(e LeaseEvent, wait time.Duration)
	// RecordShed is called when the limiter refuses a load, with the
	// limiter's reason (limiter.ReasonQueueTimeout, ReasonQueueFull,
	// ReasonReserve or ReasonLatency); background says whether it was a
	// refresh.
	RecordShed(reason string, background bool)
}

// NopRecorder is a [Recorder] whose methods do nothing: the Recorder of a
// cache without one, and a base to embed in a Recorder that implements
// only some methods.
type NopRecorder struct{}

func (NopRecorder) RecordGet(GetResult) {}

func (NopRecorder) RecordLoad(time.Duration, error, bool) {}

func (NopRecorder) RecordLease(LeaseEvent, time.Duration) {}

func (NopRecorder) RecordShed(string, bool) {}

// CacheRecorder is an optional interface of a [Recorder] that labels what
// it records with the name of its cache, so that the name is given once, as
// Options.Name: New calls ForCache with [herd.Cache.Name] and uses the Recorder
// it returns in place of the one in Options. One CacheRecorder may so serve
// several caches.
type CacheRecorder interface {
	Recorder
	ForCache(name string) Recorder
}

// Tracer is an optional interface of a [Recorder] that wraps loads,
// refreshes and lease waits in spans, so that a slow request shows what it
// waited on.
type Tracer interface {
	// StartSpan begins a span named op ("herd.load", "herd.refresh" or
	// "herd.lease_wait") for key and returns a context carrying it and a
	// function that ends it with the operation's error.
	StartSpan(ctx context.Context, op, key string) (context.Context, func(err error))
}

// EventRecorder is an optional interface of a [Recorder] that receives the
// rare events worth a log line.
type EventRecorder interface {
	RecordEvent(e Event)
}

// ContextEventRecorder is an optional interface of an [EventRecorder] that
// also receives the context of the load an event happened in, so that a
// tracer can put the event on the span of the caller the load ran for, or
// a logger take the trace from it. A cache calls RecordEventContext in
// place of RecordEvent for EventEncodeFailed, with the context the load
// ran for (it keeps the values, the span among them, of the context of the
// call that started the load); every other event, write-back failures
// included (they happen after the load's callers got their value), comes
// to RecordEvent.
type ContextEventRecorder interface {
	EventRecorder
	RecordEventContext(ctx context.Context, e Event)
}

// Event is something that went wrong or changed state.
type Event struct {
	Kind EventKind
	// Key is the key concerned; empty for breaker events.
	Key string
	// Err is the error behind the event, if any.
	Err error
}

// EventKind names an [Event].
type EventKind uint8

const (
	// EventLeaseLost: a lease expired or moved before its holder released
	// it; the holder's write will be fenced.
	EventLeaseLost EventKind = iota + 1
	// EventRefreshFailed: a background refresh's load failed; the old value
	// is kept until its hard TTL.
	EventRefreshFailed
	// EventBreakerOpened: repeated remote failures; serving from the local
	// tier only. Err is the failure that opened it (nil when the cache
	// starts open over a Store that has not reached its server). Breaker
	// changes are reported only as events; Stats counts them
	// (BreakerOpens, Degraded).
	EventBreakerOpened
	// EventBreakerClosed: the remote tier answers again.
	EventBreakerClosed
	// EventWriteBackFailed: the write of a loaded value to the Store (with
	// the release of its lease, when the load held one) returned an error,
	// Err: Redis refused it (out of memory under maxmemory with the
	// noeviction policy, a value above its size limit) or did not answer in
	// time. The value was served and stays in the local tier; other
	// replicas find nothing and load the key again. It is reported for each
	// key, batch loads included. A write the fence refused (a newer write or
	// an invalidation won) is no failure: it is the lease event
	// LeaseFenced. A release that failed on its own (no value to write, or
	// the value written) is not reported: the lease expires after LeaseTTL.
	// Stats counts these in WriteBackErrors, and the calls in RemoteErrors.
	EventWriteBackFailed
	// EventEncodeFailed: the Codec could not encode a loaded value (+Inf
	// with [herd.JSON], say), Err. The value is served to the load's callers but
	// cached in neither tier, so the next Get of the key loads again; it is
	// reported on each such load. Stats counts these in EncodeErrors. A Set
	// of such a value returns the error instead.
	EventEncodeFailed
)

func (k EventKind) String() string {
	switch k {
	case EventLeaseLost:
		return "lease-lost"
	case EventRefreshFailed:
		return "refresh-failed"
	case EventBreakerOpened:
		return "breaker-opened"
	case EventBreakerClosed:
		return "breaker-closed"
	case EventWriteBackFailed:
		return "write-back-failed"
	case EventEncodeFailed:
		return "encode-failed"
	}
	return "unknown"
}

// GetResult says how a Get was answered.
type GetResult uint8

const (
	ResultHit      GetResult = iota // a fresh value, from either tier
	ResultStale                     // a stale value (or stale negative entry), served at once
	ResultNegative                  // ErrNotFound from a fresh negative entry, from either tier
	ResultMiss                      // the caller waited for a lease holder or a load
)

func (r GetResult) String() string {
	switch r {
	case ResultHit:
		return "hit"
	case ResultStale:
		return "stale"
	case ResultNegative:
		return "negative"
	case ResultMiss:
		return "miss"
	}
	return "unknown"
}

// LeaseEvent names what happened at a lease.
type LeaseEvent uint8

const (
	LeaseAcquired      LeaseEvent = iota // this replica took the lease
	LeaseContended                       // another replica held it
	LeaseWoken                           // a waiting loser got the holder's value
	LeaseWaitTimeout                     // a waiting loser gave up
	LeaseLost                            // the lease expired or moved before release
	LeaseFenced                          // a write was refused: a newer write or invalidation won
	LeaseWaitAbandoned                   // a waiting loser's caller left (its context ended) first
)

func (e LeaseEvent) String() string {
	switch e {
	case LeaseAcquired:
		return "acquired"
	case LeaseContended:
		return "contended"
	case LeaseWoken:
		return "woken"
	case LeaseWaitTimeout:
		return "wait-timeout"
	case LeaseLost:
		return "lost"
	case LeaseFenced:
		return "fenced"
	case LeaseWaitAbandoned:
		return "wait-abandoned"
	}
	return "unknown"
}

// Histogram is a snapshot of a duration histogram.
type Histogram struct {
	// Bounds are the buckets' inclusive upper bounds, ascending; a last
	// bucket above the highest bound is implied.
	Bounds []time.Duration
	// Counts holds the number of observations in each bucket (not
	// cumulative); len(Counts) == len(Bounds)+1.
	Counts []uint64
	Sum    time.Duration
	Count  uint64
}

// Recorders returns a Recorder that hands every event to each of rs in
// order; it is a [Tracer], a [ContextEventRecorder] and a [observe.CacheRecorder], nesting
// the spans of every member that traces and naming every member that is a
// CacheRecorder. Nil members are skipped.
func Recorders(rs ...Recorder) Recorder {
	m := multiRecorder{}
	for _, r := range rs {
		if r != nil {
			m = append(m, r)
		}
	}
	return m
}

type multiRecorder []Recorder

func (m multiRecorder) RecordGet(r GetResult) {
	for _, x := range m {
		x.RecordGet(r)
	}
}

func (m multiRecorder) RecordLoad(d time.Duration, err error, background bool) {
	for _, x := range m {
		x.RecordLoad(d, err, background)
	}
}

func (m multiRecorder) RecordLease(e LeaseEvent, wait time.Duration) {
	for _, x := range m {
		x.RecordLease(e, wait)
	}
}

func (m multiRecorder) RecordShed(reason string, background bool) {
	for _, x := range m {
		x.RecordShed(reason, background)
	}
}

// ForCache hands name to every member that is a CacheRecorder.
func (m multiRecorder) ForCache(name string) Recorder {
	out := make(multiRecorder, len(m))
	for i, x := range m {
		if b, ok := x.(CacheRecorder); ok {
			x = b.ForCache(name)
		}
		out[i] = x
	}
	return out
}

func (m multiRecorder) RecordEvent(e Event) {
	for _, x := range m {
		if er, ok := x.(EventRecorder); ok {
			er.RecordEvent(e)
		}
	}
}

// RecordEventContext hands e with ctx to every member that is a
// ContextEventRecorder, and e alone to every other EventRecorder.
func (m multiRecorder) RecordEventContext(ctx context.Context, e Event) {
	for _, x := range m {
		switch er := x.(type) {
		case ContextEventRecorder:
			er.RecordEventContext(ctx, e)
		case EventRecorder:
			er.RecordEvent(e)
		}
	}
}

func (m multiRecorder) StartSpan(ctx context.Context, op, key string) (context.Context, func(error)) {
	var ends []func(error)
	for _, x := range m {
		if t, ok := x.(Tracer); ok {
			var end func(error)
			ctx, end = t.StartSpan(ctx, op, key)
			ends = append(ends, end)
		}
	}
	return ctx, func(err error) {
		for i := len(ends) - 1; i >= 0; i-- {
			ends[i](err)
		}
	}
}

// Stats is a snapshot of a cache's counters since it was made.
type Stats struct {
	Hits       int64 // fresh values served, from either tier
	RemoteHits int64 // of those, values read from the Store
	// RemoteWaits counts the Gets that waited on a read of the Store: their
	// key had no local copy young enough to serve (none, past 2×NearTTL,
	// or from before a lost notice), so they read it on their own path.
	RemoteWaits int64
	// Revalidations counts the background reads that replaced a local copy
	// served past NearTTL or superseded by a notice.
	Revalidations int64
	// NoticeValuesAdopted counts the local copies replaced by the value a
	// change notice carried (remote.Notice.Value), with no read of the
	// Store.
	NoticeValuesAdopted int64
	// NoticeValuesRefused counts the values carried by change notices for
	// a key whose older copy this replica held that it could not adopt
	// (the value did not decode, named another fence, had tags whose
	// versions are not known or current, was past its hard expiry, or the
	// copy's own fence was not known yet, or a change of the key ran
	// here): the copy was marked superseded, to be replaced by one read,
	// as after a notice that carries no value.
	NoticeValuesRefused int64
	Misses              int64 // Gets that found no value they could serve at once
	// NegativeHits counts the ErrNotFound answers served from a fresh
	// negative entry, from either tier; they are not counted in Hits.
	NegativeHits   int64
	StaleServed    int64 // stale values served (stale-while-revalidate, lease losers)
	StaleIfError   int64 // stale values served because a load failed
	EarlyRefreshes int64 // background refreshes started early by XFetch
	AheadRefreshes int64 // background refreshes of pinned keys (Pin)
	// StaleRefreshes counts background refreshes started by a stale read.
	StaleRefreshes  int64
	RefreshFailures int64 // background refreshes whose load failed

	Loads         int64 // keys loaded: calls of a load function, each key of a batch counted
	LoadsNotFound int64 // of those, keys the load had no value for (ErrNotFound)
	LoadErrors    int64 // of those, keys whose load failed with another error
	Coalesced     int64 // callers that joined another caller's load

	LeaseAcquired     int64 // leases taken
	LeaseContended    int64 // acquisitions that found the lease held
	LeaseWaitTimeouts int64 // Wait losers that gave up at LeaseWait
	// LeaseWaitsAbandoned counts Wait losers whose caller's context ended
	// before the holder's load did: with LeaseWait and the callers'
	// deadlines, every wait that did not end with a value is counted.
	LeaseWaitsAbandoned int64
	LeaseExtended       int64 // watchdog extensions
	LeaseLost           int64 // extensions refused: the lease had expired or moved
	WokenByPush         int64 // Wait losers woken by a completion notice
	WokenByPoll         int64 // Wait losers that found the value on a fallback re-read
	FencedWrites        int64 // writes refused because a newer write or invalidation won
	// LeaseHoldsHeard counts the announcements of another replica's lease
	// (remote.HoldNotifier) that this replica acted on: it recorded the
	// hold, and makes no lease attempt for the key until the holder's
	// notice or the announced time. Announcements it had no use for (a
	// load of the key ran here, or a lease attempt had already told it of
	// the holder) are not counted.
	LeaseHoldsHeard int64
	// LeaseAttemptsSkipped counts the lease attempts this replica did not
	// make because it had heard another's hold: one for each hold heard
	// that a miss or a due refresh of the key met, the attempt that would
	// otherwise have found the lease held (and kept the later ones from
	// being made). LeaseContended counts the attempts that were made and
	// found it held.
	LeaseAttemptsSkipped int64

	Shed         int64 // loads refused by the limiter
	RemoteErrors int64 // failed remote calls
	DecodeErrors int64 // remote values that could not be decoded (served as misses)
	EncodeErrors int64 // values the codec could not encode (served, not cached)
	// WriteBackErrors counts the loaded values whose write to the Store
	// failed (EventWriteBackFailed), each key of a batch counted; a write
	// the fence refused is counted in FencedWrites instead.
	WriteBackErrors int64

	InFlight int // flights (coalesced loads, with their waiters) running now

	// LocalWeight is the weight the local tier holds now, as
	// Options.Weigher gives it; at most Options.MaxWeight once the tier's
	// pending maintenance has run. Zero without MaxWeight.
	LocalWeight uint64

	// LoadsRunning is the number of loads running now in this process.
	LoadsRunning int
	// KeyConcurrency is the most loads of one key running at once now, and
	// KeyConcurrencyMax the most ever: with coalescing both stay at most 1.
	KeyConcurrency, KeyConcurrencyMax int

	// Limiter is a snapshot of the cache's limiter, shared with any other
	// cache that uses it; zero without a limiter.
	Limiter LimiterStats

	// HotKeys are the keys with the most traffic (hits sampled 1 in 256, plus
	// misses and stale serves), most first, at most Options.HotKeys of them;
	// each name appears once (keys whose redacted names collide are summed).
	HotKeys []HotKey

	LoadDuration Histogram // how long loads took
	LeaseWait    Histogram // how long lease losers waited for the holder
	QueueWait    Histogram // how long loads waited for a limiter slot

	Degraded     bool          // the breaker is open: remote calls are skipped
	DegradedTime time.Duration // total time the breaker has been open
	BreakerOpens int64         // times the breaker opened
}

// LimiterStats describes the limiter a cache uses.
type LimiterStats struct {
	Limit, InUse, Waiting int
	limiter.Stats
}

// HotKey is one of the keys with the most traffic. Traffic may overcount by
// up to Error; Misses, Loads and Stale count from when the key was first
// tracked, so they are lower bounds.
type HotKey struct {
	// Key is the key, or its namespace and a short hash unless
	// Options.HotKeyNames is set.
	Key     string
	Traffic uint64
	Misses  uint64
	Loads   uint64
	Stale   uint64
	Error   uint64
}
