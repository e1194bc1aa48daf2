package herd

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// Recorder receives a cache's events as they happen, for metrics systems
// that push rather than read [Cache.Stats]. Its methods may be called
// concurrently; RecordGet runs on the hit path and must be cheap. A Recorder
// may also implement [Tracer], [EventRecorder] and [CacheRecorder]. Embed
// [NopRecorder] to implement only the methods wanted.
type Recorder interface {
	// RecordGet is called once per Get, and once per key of a GetMany, with
	// how it was answered.
	RecordGet(r GetResult)
	// RecordLoad is called after each load with its duration and error
	// ([ErrNotFound] for a key that has no value); background says whether
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

func (NopRecorder) RecordGet(GetResult)                   {}
func (NopRecorder) RecordLoad(time.Duration, error, bool) {}
func (NopRecorder) RecordLease(LeaseEvent, time.Duration) {}
func (NopRecorder) RecordShed(string, bool)               {}

// CacheRecorder is an optional interface of a [Recorder] that labels what
// it records with the name of its cache, so that the name is given once, as
// Options.Name: New calls ForCache with [Cache.Name] and uses the Recorder
// it returns in place of the one in Options. One CacheRecorder may so serve
// several caches.
type CacheRecorder interface {
	Recorder
	ForCache(name string) Recorder
}

// recorderFor returns the Recorder a cache named name uses for r: r itself,
// what r's ForCache gives, or NopRecorder when r is nil.
func recorderFor(r Recorder, name string) (Recorder, error) {
	if r == nil {
		return NopRecorder{}, nil
	}
	if b, ok := r.(CacheRecorder); ok {
		if r = b.ForCache(name); r == nil {
			return nil, fmt.Errorf("herd: Recorder's ForCache(%q) returned nil", name)
		}
	}
	return r, nil
}

// nopTracer is the Tracer of a cache whose Recorder does not trace.
type nopTracer struct{}

func (nopTracer) StartSpan(ctx context.Context, _, _ string) (context.Context, func(error)) {
	return ctx, endNothing
}

func endNothing(error) {}

// nopEvents is the EventRecorder of a cache whose Recorder takes no events.
type nopEvents struct{}

func (nopEvents) RecordEvent(Event) {}

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
	// with [JSON], say), Err. The value is served to the load's callers but
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

// histogramBounds serve every histogram of a cache: from a local round trip
// to a stuck origin call.
var histogramBounds = []time.Duration{
	100 * time.Microsecond, 250 * time.Microsecond, 500 * time.Microsecond,
	time.Millisecond, 2500 * time.Microsecond, 5 * time.Millisecond,
	10 * time.Millisecond, 25 * time.Millisecond, 50 * time.Millisecond,
	100 * time.Millisecond, 250 * time.Millisecond, 500 * time.Millisecond,
	time.Second, 2500 * time.Millisecond, 5 * time.Second,
	10 * time.Second, 30 * time.Second, time.Minute,
}

// histogram counts durations into histogramBounds without locks.
type histogram struct {
	counts [19]atomic.Uint64 // len(histogramBounds)+1
	sum    atomic.Int64
}

func (h *histogram) observe(d time.Duration) {
	i := 0
	for i < len(histogramBounds) && d > histogramBounds[i] {
		i++
	}
	h.counts[i].Add(1)
	h.sum.Add(int64(d))
}

func (h *histogram) snapshot() Histogram {
	s := Histogram{Bounds: slices.Clone(histogramBounds), Counts: make([]uint64, len(h.counts))}
	for i := range h.counts {
		s.Counts[i] = h.counts[i].Load()
		s.Count += s.Counts[i]
	}
	s.Sum = time.Duration(h.sum.Load())
	return s
}

// keyLoads tracks how many loads of each key run at once in this process:
// with coalescing it never exceeds one.
type keyLoads struct {
	mu      sync.Mutex
	running map[string]int // guarded by mu; keys with loads running
	total   int            // guarded by mu
	max     int            // guarded by mu; highest per-key count seen
}

func (k *keyLoads) start(key string) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.running == nil {
		k.running = map[string]int{}
	}
	n := k.running[key] + 1
	k.running[key] = n
	k.total++
	k.max = max(k.max, n)
}

func (k *keyLoads) done(key string) {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.total--
	if n := k.running[key] - 1; n > 0 {
		k.running[key] = n
	} else {
		delete(k.running, key)
	}
}

// snapshot returns the loads running, the highest per-key count now and the
// highest ever.
func (k *keyLoads) snapshot() (total, now, highest int) {
	k.mu.Lock()
	defer k.mu.Unlock()
	for _, n := range k.running {
		now = max(now, n)
	}
	return k.total, now, k.max
}

// Recorders returns a Recorder that hands every event to each of rs in
// order; it is a [Tracer], a [ContextEventRecorder] and a [CacheRecorder], nesting
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

// eventContext hands an Event, with the context of the load it happened
// in, to the EventRecorder: to RecordEventContext when it has one.
func (c *Cache[V]) eventContext(ctx context.Context, kind EventKind, key string, err error) {
	e := Event{Kind: kind, Key: key, Err: err}
	if er, ok := c.events.(ContextEventRecorder); ok {
		er.RecordEventContext(ctx, e)
		return
	}
	c.events.RecordEvent(e)
}

// encodeFailed reports that the codec could not encode the value loaded
// for key (EncodeErrors is counted where the encoding failed).
func (c *Cache[V]) encodeFailed(ctx context.Context, key string, err error) {
	c.eventContext(ctx, EventEncodeFailed, key, err)
}

// writeBackFailed counts and reports the failure of the remote write of
// the value loaded for key, when err says it failed.
func (c *Cache[V]) writeBackFailed(key string, err error) {
	if err == nil {
		return
	}
	c.st.writeBackErrors.add(1)
	c.event(EventWriteBackFailed, key, err)
}

// leaseWriteFailed reports the end of a lease whose value was to be
// written, was not, and whose call failed; a release that failed alone is
// not reported (see EventWriteBackFailed).
func (c *Cache[V]) leaseWriteFailed(end leaseEnd, wrote bool, err error) {
	if end.env != nil && !wrote {
		c.writeBackFailed(end.h.key, err)
	}
}
