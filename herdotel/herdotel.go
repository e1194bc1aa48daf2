// Package herdotel exports herd caches' statistics, load and lease-wait durations and spans through OpenTelemetry.
package herdotel

import (
	"context"
	"errors"
	"fmt"
	"math"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"

	"github.com/herdcache/herd"
	"github.com/herdcache/herd/limiter"
)

// ScopeName is the instrumentation scope of every meter and tracer herdotel
// makes.
const ScopeName = "github.com/herdcache/herd/herdotel"

// DefaultName is the herd.cache attribute of a cache given the empty name,
// as herd.Options.Name calls a cache without a name.
const DefaultName = "default"

// Attribute keys.
const (
	CacheKey = attribute.Key("herd.cache") // the cache's name
	KeyKey   = attribute.Key("herd.key")   // the key, redacted unless asked otherwise
)

// Source is what RegisterMetrics reads: any [herd.Cache], whatever its value
// type.
type Source interface {
	Stats() herd.Stats
}

// RegisterMetrics reports s's statistics through mp's meter as observable
// counters and gauges with the attribute herd.cache=name (the empty name
// stands for [DefaultName]); Stats is read once per collection. A nil mp
// means the global MeterProvider. Unregister the returned Registration to
// stop.
//
// OpenTelemetry has no observable histogram, so this pull path reports none:
// a [Recorder] records load and lease-wait durations as they happen. The
// limiter's queue wait has no push hook and is reported by neither. Keys
// appear only as the herd.key attribute of the herd.hot_key.* instruments:
// at most Options.HotKeys per cache, as the cache reports them (a namespace
// and a short hash unless Options.HotKeyNames is set).
func RegisterMetrics(mp metric.MeterProvider, name string, s Source) (metric.Registration, error) {
	if s == nil {
		return nil, errors.New("herdotel: nil Source")
	}
	if mp == nil {
		mp = otel.GetMeterProvider()
	}
	if name == "" {
		name = DefaultName
	}
	m := mp.Meter(ScopeName)
	var errs []error
	counter := func(n, unit, desc string) metric.Int64ObservableCounter {
		c, err := m.Int64ObservableCounter(n, metric.WithUnit(unit), metric.WithDescription(desc))
		errs = append(errs, err)
		return c
	}
	gauge := func(n, unit, desc string) metric.Int64ObservableGauge {
		g, err := m.Int64ObservableGauge(n, metric.WithUnit(unit), metric.WithDescription(desc))
		errs = append(errs, err)
		return g
	}
	var (
		requests = counter("herd.requests", "{request}", "Get calls by how they were answered (herd.result): hit, miss, "+
			"stale (also counted as miss when a miss was answered stale), negative (also counted as hit or miss).")
		remoteHits   = counter("herd.remote.hits", "{request}", "Fresh values read from the remote tier; also counted in herd.requests as hit.")
		remoteWaits  = counter("herd.remote.waits", "{request}", "Get calls that waited on a read of the remote tier: no local copy, or one older than twice NearTTL.")
		revalidate   = counter("herd.revalidations", "{read}", "Background reads of the remote tier that replaced a local copy past NearTTL or superseded by a change notice.")
		loads        = counter("herd.loads", "{load}", "Calls of a load function (backing-store calls), by herd.outcome.")
		coalesced    = counter("herd.coalesced", "{request}", "Callers that joined another caller's load instead of calling their own.")
		refreshes    = counter("herd.refreshes", "{refresh}", "Background refreshes started, by herd.refresh.kind: early (XFetch), stale or ahead (refresh-ahead).")
		refreshFails = counter("herd.refresh.failures", "{refresh}", "Background refreshes whose load failed.")
		staleIfError = counter("herd.stale_if_error", "{request}", "Stale values served because a load failed.")
		concurrency  = gauge("herd.recompute.concurrency", "{load}", "The most loads of one key running at once now; above 1 only without coalescing.")
		concMax      = gauge("herd.recompute.concurrency.max", "{load}", "The most loads of one key ever running at once.")
		loadsActive  = gauge("herd.load.active", "{load}", "Loads running now, all keys together.")
		flights      = gauge("herd.flight.active", "{flight}", "Coalesced loads (flights, with their waiting callers) running now.")
		leaseEvents  = counter("herd.lease.events", "{event}", "Cross-replica lease events, by herd.lease.event: acquired, contended, "+
			"wait_timeout, lost, extended, fenced_write.")
		wakeups    = counter("herd.lease.wakeups", "{wakeup}", "Waiting lease losers that got the holder's value, by herd.lease.woken_by: push or poll.")
		inUse      = gauge("herd.limiter.in_use", "{slot}", "Limiter slots held now (the limiter may be shared by several caches).")
		limit      = gauge("herd.limiter.limit", "{slot}", "Limiter slots in all: the cap on concurrent backing-store calls.")
		waiting    = gauge("herd.limiter.waiting", "{call}", "Loads waiting for a limiter slot now.")
		acquired   = counter("herd.limiter.acquired", "{slot}", "Limiter slots granted, foreground and background.")
		canceled   = counter("herd.limiter.canceled", "{call}", "Calls whose context ended while they waited for a limiter slot; not shed.")
		maxInUse   = gauge("herd.limiter.in_use.max", "{slot}", "The most limiter slots ever held at once.")
		loadsShed  = counter("herd.loads.shed", "{load}", "Loads of this cache that the limiter refused; herd.shed counts the whole limiter, which caches may share.")
		shed       = counter("herd.shed", "{call}", "Calls the limiter refused, by herd.shed.reason: queue-timeout, queue-full or reserve.")
		shedByPrio = counter("herd.shed.by_priority", "{call}", "Calls the limiter refused, by herd.shed.priority: low, normal, high or background.")
		remoteErrs = counter("herd.remote.errors", "{error}", "Failed calls to the remote tier.")
		decodeErrs = counter("herd.decode.errors", "{error}", "Remote values that could not be decoded, served as misses.")
		encodeErrs = counter("herd.encode.errors", "{error}", "Values the codec could not encode, served but not cached.")
		brkOpen    = gauge("herd.breaker.open", "1", "1 while the breaker is open and remote calls are skipped, else 0.")
		brkOpens   = counter("herd.breaker.opens", "{open}", "Times the breaker opened after repeated remote failures.")
		hotReqs    = counter("herd.hot_key.requests", "{request}", "Estimated requests for each of the keys with the most traffic (hits sampled, may overcount).")
		hotMisses  = counter("herd.hot_key.misses", "{request}", "Misses of each hot key since it was first tracked.")
		hotLoads   = counter("herd.hot_key.loads", "{load}", "Loads of each hot key since it was first tracked.")
		hotStale   = counter("herd.hot_key.stale", "{request}", "Stale values served for each hot key since it was first tracked.")
	)
	degraded, err := m.Float64ObservableCounter("herd.degraded.time", metric.WithUnit("s"),
		metric.WithDescription("Total time the breaker has been open, the current spell included."))
	errs = append(errs, err)
	if err := errors.Join(errs...); err != nil {
		return nil, fmt.Errorf("herdotel: %w", err)
	}

	cache := CacheKey.String(name)
	with := func(kv ...attribute.KeyValue) metric.ObserveOption {
		return metric.WithAttributeSet(attribute.NewSet(append([]attribute.KeyValue{cache}, kv...)...))
	}
	base := with()
	by := func(k attribute.Key, vs ...string) []metric.ObserveOption {
		out := make([]metric.ObserveOption, len(vs))
		for i, v := range vs {
			out[i] = with(k.String(v))
		}
		return out
	}
	result := by("herd.result", "hit", "miss", "stale", "negative")
	outcome := by("herd.outcome", "ok", "error")
	kind := by("herd.refresh.kind", "early", "stale", "ahead")
	lease := by("herd.lease.event", "acquired", "contended", "wait_timeout", "lost", "extended", "fenced_write")
	wokenBy := by("herd.lease.woken_by", "push", "poll")
	reason := by("herd.shed.reason", limiter.ReasonQueueTimeout, limiter.ReasonQueueFull, limiter.ReasonReserve)
	prio := by("herd.shed.priority", "low", "normal", "high", "background")

	return m.RegisterCallback(func(_ context.Context, o metric.Observer) error {
		st := s.Stats()
		o.ObserveInt64(requests, st.Hits, result[0])
		o.ObserveInt64(requests, st.Misses, result[1])
		o.ObserveInt64(requests, st.StaleServed, result[2])
		o.ObserveInt64(requests, st.NegativeHits, result[3])
		o.ObserveInt64(remoteHits, st.RemoteHits, base)
		o.ObserveInt64(remoteWaits, st.RemoteWaits, base)
		o.ObserveInt64(revalidate, st.Revalidations, base)
		o.ObserveInt64(loads, st.Loads-st.LoadErrors, outcome[0])
		o.ObserveInt64(loads, st.LoadErrors, outcome[1])
		o.ObserveInt64(coalesced, st.Coalesced, base)
		o.ObserveInt64(refreshes, st.EarlyRefreshes, kind[0])
		o.ObserveInt64(refreshes, st.StaleRefreshes, kind[1])
		o.ObserveInt64(refreshes, st.AheadRefreshes, kind[2])
		o.ObserveInt64(refreshFails, st.RefreshFailures, base)
		o.ObserveInt64(staleIfError, st.StaleIfError, base)
		o.ObserveInt64(concurrency, int64(st.KeyConcurrency), base)
		o.ObserveInt64(concMax, int64(st.KeyConcurrencyMax), base)
		o.ObserveInt64(loadsActive, int64(st.LoadsRunning), base)
		o.ObserveInt64(flights, int64(st.InFlight), base)
		for i, n := range []int64{st.LeaseAcquired, st.LeaseContended, st.LeaseWaitTimeouts, st.LeaseLost, st.LeaseExtended, st.FencedWrites} {
			o.ObserveInt64(leaseEvents, n, lease[i])
		}
		o.ObserveInt64(wakeups, st.WokenByPush, wokenBy[0])
		o.ObserveInt64(wakeups, st.WokenByPoll, wokenBy[1])
		if l := st.Limiter; l.Limit > 0 {
			o.ObserveInt64(inUse, int64(l.InUse), base)
			o.ObserveInt64(limit, int64(l.Limit), base)
			o.ObserveInt64(waiting, int64(l.Waiting), base)
			o.ObserveInt64(acquired, clamp(l.Acquired), base)
			o.ObserveInt64(canceled, clamp(l.Canceled), base)
			o.ObserveInt64(maxInUse, int64(l.MaxInUse), base)
			o.ObserveInt64(loadsShed, st.Shed, base)
			for i, n := range []uint64{l.ShedQueueTimeout, l.ShedQueueFull, l.ShedReserve} {
				o.ObserveInt64(shed, clamp(n), reason[i])
			}
			for i, n := range []uint64{l.ShedLow, l.ShedNormal, l.ShedHigh, l.ShedBackground} {
				o.ObserveInt64(shedByPrio, clamp(n), prio[i])
			}
		}
		o.ObserveInt64(remoteErrs, st.RemoteErrors, base)
		o.ObserveInt64(decodeErrs, st.DecodeErrors, base)
		o.ObserveInt64(encodeErrs, st.EncodeErrors, base)
		var open int64
		if st.Degraded {
			open = 1
		}
		o.ObserveInt64(brkOpen, open, base)
		o.ObserveInt64(brkOpens, st.BreakerOpens, base)
		o.ObserveFloat64(degraded, st.DegradedTime.Seconds(), base)
		for _, k := range st.HotKeys {
			a := with(KeyKey.String(k.Key))
			o.ObserveInt64(hotReqs, clamp(k.Traffic), a)
			o.ObserveInt64(hotMisses, clamp(k.Misses), a)
			o.ObserveInt64(hotLoads, clamp(k.Loads), a)
			o.ObserveInt64(hotStale, clamp(k.Stale), a)
		}
		return nil
	}, requests, remoteHits, remoteWaits, revalidate, loads, coalesced, refreshes, refreshFails, staleIfError, concurrency, concMax,
		loadsActive, flights, leaseEvents, wakeups, inUse, limit, waiting, acquired, canceled, maxInUse, loadsShed, shed, shedByPrio,
		remoteErrs, decodeErrs, encodeErrs, brkOpen, brkOpens, degraded, hotReqs, hotMisses, hotLoads, hotStale)
}

func clamp(n uint64) int64 { return int64(min(n, math.MaxInt64)) }

// Options configures a [Recorder]. The zero value is usable.
type Options struct {
	// Name is the herd.cache attribute of every measurement and span; empty
	// means [DefaultName]. Give each cache its own Recorder and Name.
	Name string
	// KeyNames puts keys on spans in full. Keys may hold personal data, so
	// by default a span's herd.key is the key's namespace and a short hash
	// ([herd.RedactKey]), as herd.Options.HotKeyNames does for hot keys.
	KeyNames bool
}

// histogramBounds are the bucket bounds, in seconds, of both histograms:
// those of the cache's own histograms, from a local round trip to a stuck
// origin call.
var histogramBounds = []float64{
	0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05,
	0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60,
}

// Recorder is a [herd.Recorder] and [herd.Tracer], to be set as
// herd.Options.Recorder. It records each load's duration (herd.load.duration)
// and each lease loser's wait (herd.lease.wait.duration) in histograms, and
// wraps loads, refreshes and lease waits in spans ("herd.load",
// "herd.refresh", "herd.lease_wait") that are children of the caller's span.
// Counts come from [RegisterMetrics], so RecordGet, RecordShed and
// RecordBreaker do nothing. It is safe for concurrent use.
type Recorder struct {
	tracer   trace.Tracer
	keyNames bool
	cache    attribute.KeyValue

	loadDur, waitDur metric.Float64Histogram
	// loadAttrs[background][failed] and waitAttrs[timedOut] are built once,
	// so that recording allocates no attribute sets.
	loadAttrs [2][2]metric.RecordOption
	waitAttrs [2]metric.RecordOption
}

var (
	_ herd.Recorder = (*Recorder)(nil)
	_ herd.Tracer   = (*Recorder)(nil)
)

// NewRecorder returns a Recorder that starts spans with tp's tracer and
// records histograms with mp's meter; nil means the global provider.
func NewRecorder(tp trace.TracerProvider, mp metric.MeterProvider, o Options) (*Recorder, error) {
	if tp == nil {
		tp = otel.GetTracerProvider()
	}
	if mp == nil {
		mp = otel.GetMeterProvider()
	}
	if o.Name == "" {
		o.Name = DefaultName
	}
	m := mp.Meter(ScopeName)
	loadDur, err1 := m.Float64Histogram("herd.load.duration", metric.WithUnit("s"),
		metric.WithDescription("How long load functions took, by herd.outcome and herd.load.kind (load or refresh)."),
		metric.WithExplicitBucketBoundaries(histogramBounds...))
	waitDur, err2 := m.Float64Histogram("herd.lease.wait.duration", metric.WithUnit("s"),
		metric.WithDescription("How long lease losers waited for the holder, by herd.lease.outcome (woken or timeout)."),
		metric.WithExplicitBucketBoundaries(histogramBounds...))
	if err := errors.Join(err1, err2); err != nil {
		return nil, fmt.Errorf("herdotel: %w", err)
	}
	r := &Recorder{
		tracer:   tp.Tracer(ScopeName),
		keyNames: o.KeyNames,
		cache:    CacheKey.String(o.Name),
		loadDur:  loadDur,
		waitDur:  waitDur,
	}
	for bg, kind := range []string{"load", "refresh"} {
		for failed, outcome := range []string{"ok", "error"} {
			r.loadAttrs[bg][failed] = metric.WithAttributeSet(attribute.NewSet(r.cache,
				attribute.String("herd.outcome", outcome), attribute.String("herd.load.kind", kind)))
		}
	}
	for timedOut, outcome := range []string{"woken", "timeout"} {
		r.waitAttrs[timedOut] = metric.WithAttributeSet(attribute.NewSet(r.cache, attribute.String("herd.lease.outcome", outcome)))
	}
	return r, nil
}

// RecordGet does nothing: RegisterMetrics reports the counts.
func (r *Recorder) RecordGet(herd.GetResult) {}

// RecordLoad records d in herd.load.duration.
func (r *Recorder) RecordLoad(d time.Duration, err error, background bool) {
	r.loadDur.Record(context.Background(), d.Seconds(), r.loadAttrs[b2i(background)][b2i(err != nil)])
}

// RecordLease records the wait of a lease loser in herd.lease.wait.duration.
func (r *Recorder) RecordLease(e herd.LeaseEvent, wait time.Duration) {
	switch e {
	case herd.LeaseWoken:
		r.waitDur.Record(context.Background(), wait.Seconds(), r.waitAttrs[0])
	case herd.LeaseWaitTimeout:
		r.waitDur.Record(context.Background(), wait.Seconds(), r.waitAttrs[1])
	}
}

// RecordShed does nothing: RegisterMetrics reports the counts.
func (r *Recorder) RecordShed(string, bool) {}

// RecordBreaker does nothing: RegisterMetrics reports the state.
func (r *Recorder) RecordBreaker(bool) {}

// StartSpan starts an internal span named op, a child of ctx's span, with
// the attributes herd.cache and herd.key; the returned function records a
// non-nil error on it, sets its status to Error, and ends it.
func (r *Recorder) StartSpan(ctx context.Context, op, key string) (context.Context, func(error)) {
	if !r.keyNames {
		key = herd.RedactKey(key)
	}
	ctx, span := r.tracer.Start(ctx, op, trace.WithSpanKind(trace.SpanKindInternal),
		trace.WithAttributes(r.cache, KeyKey.String(key)))
	return ctx, func(err error) {
		if err != nil {
			span.RecordError(err)
			span.SetStatus(codes.Error, err.Error())
		}
		span.End()
	}
}

func b2i(b bool) int {
	if b {
		return 1
	}
	return 0
}
