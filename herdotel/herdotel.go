// Package herdotel exports herd caches' statistics, load and lease-wait durations and spans through OpenTelemetry.
package herdotel

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"strings"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"

	"github.com/herdcache/herd"
	"github.com/herdcache/herd/observe"
	"github.com/herdcache/herd/observe/metricdef"
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
// type. Its Name is the herd.cache attribute.
type Source interface {
	Name() string
	Stats() observe.Stats
}

// RegisterMetrics reports s's statistics through mp's meter as observable
// counters and gauges with the attribute herd.cache=s.Name() (the empty
// name stands for [DefaultName]); Stats is read once per collection. A nil
// mp means the global MeterProvider. Unregister the returned Registration to
// stop.
//
// The instruments are those herdprom exports, under the same names with
// dots: herd_requests_total is herd.requests. Each reads the Stats field of
// the same name; the description of each says what it counts. Series are
// told apart by attributes named "herd." and herdprom's label: herd.result,
// herd.outcome, herd.kind, herd.event, herd.woken_by, herd.reason,
// herd.priority.
//
// OpenTelemetry has no observable histogram, so this pull path reports none:
// a [Recorder] records herd.load.duration and herd.lease.wait as they
// happen. The limiter's queue wait has no push hook; this path reports its
// totals (herd.limiter.queue.wait, herd.limiter.queue.waits). Keys appear
// only as the herd.key attribute of the herd.hot_key.* instruments: at most
// Options.HotKeys per cache, as the cache reports them (a namespace and a
// short hash unless Options.HotKeyNames is set).
func RegisterMetrics(mp metric.MeterProvider, s Source) (metric.Registration, error) {
	if s == nil {
		return nil, errors.New("herdotel: nil Source")
	}
	if mp == nil {
		mp = otel.GetMeterProvider()
	}
	name := s.Name()
	if name == "" {
		name = DefaultName
	}
	m := mp.Meter(ScopeName)
	cache := CacheKey.String(name)
	type instrument struct {
		def   *metricdef.Metric
		inst  metric.Observable
		attrs []metric.ObserveOption // per series; nil for PerHotKey metrics
	}
	var (
		insts []instrument
		all   []metric.Observable
		errs  []error
	)
	for i := range metricdef.Metrics {
		d := &metricdef.Metrics[i]
		if d.Kind == metricdef.Histogram {
			continue
		}
		var inst metric.Observable
		var err error
		switch {
		case d.Kind == metricdef.Counter && d.Float():
			inst, err = m.Float64ObservableCounter(d.OTelName(), metric.WithUnit(d.Unit), metric.WithDescription(d.Help))
		case d.Kind == metricdef.Counter:
			inst, err = m.Int64ObservableCounter(d.OTelName(), metric.WithUnit(d.Unit), metric.WithDescription(d.Help))
		case d.Float():
			inst, err = m.Float64ObservableGauge(d.OTelName(), metric.WithUnit(d.Unit), metric.WithDescription(d.Help))
		default:
			inst, err = m.Int64ObservableGauge(d.OTelName(), metric.WithUnit(d.Unit), metric.WithDescription(d.Help))
		}
		if err != nil {
			errs = append(errs, err)
			continue
		}
		in := instrument{def: d, inst: inst}
		if d.Scope != metricdef.PerHotKey {
			for _, sr := range d.Series {
				kv := []attribute.KeyValue{cache}
				if d.Label != "" {
					kv = append(kv, attribute.String(metricdef.OTelAttr(d.Label), sr.Value))
				}
				in.attrs = append(in.attrs, metric.WithAttributeSet(attribute.NewSet(kv...)))
			}
		}
		insts = append(insts, in)
		all = append(all, inst)
	}
	if err := errors.Join(errs...); err != nil {
		return nil, fmt.Errorf("herdotel: %w", err)
	}
	observe := func(o metric.Observer, in instrument, v reflect.Value, i int, attrs metric.ObserveOption) {
		sr := &in.def.Series[i]
		switch inst := in.inst.(type) {
		case metric.Float64Observable:
			o.ObserveFloat64(inst, sr.Float64(v), attrs)
		case metric.Int64Observable:
			o.ObserveInt64(inst, sr.Int64(v), attrs)
		}
	}
	return m.RegisterCallback(func(_ context.Context, o metric.Observer) error {
		st := s.Stats()
		stats := reflect.ValueOf(st)
		for _, in := range insts {
			if !in.def.Exported(&st) {
				continue
			}
			switch in.def.Scope {
			case metricdef.PerHotKey:
				for _, k := range st.HotKeys {
					a := metric.WithAttributeSet(attribute.NewSet(cache, KeyKey.String(k.Key)))
					observe(o, in, reflect.ValueOf(k), 0, a)
				}
				continue
			}
			for i := range in.def.Series {
				observe(o, in, stats, i, in.attrs[i])
			}
		}
		return nil
	}, all...)
}

// Options configures a [Recorder]. The zero value is usable.
type Options struct {
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

// Recorder is a [observe.Recorder], [observe.Tracer], [observe.ContextEventRecorder]
// and [observe.CacheRecorder], to be set as herd.Options.Recorder; one Recorder
// may serve several caches, each under its own herd.cache attribute, the
// cache's Name. It records each load's duration in herd.load.duration, by herd.outcome (ok, not_found or
// error) and herd.background (whether the load was a refresh), and each
// lease loser's wait in herd.lease.wait, by herd.outcome (woken or timeout);
// and it wraps loads, refreshes and lease waits in spans ("herd.load",
// "herd.refresh", "herd.lease_wait") that are children of the caller's span.
// An event that comes with a context (RecordEventContext) is added to the
// span current in it, if that span is recording: a value the codec could
// not encode is the event "herd.encode_failed" on the span of the caller
// the load ran for, with herd.cache, herd.key and exception.message (the
// codec's error). Other events, write-back failures among them (they
// happen after the load's callers got their value, when no span of theirs
// is current), come without one, so RecordEvent does nothing with them.
// Counts come from [RegisterMetrics] (herd.write_back.failures counts
// both failures by herd.reason), so RecordGet and RecordShed do nothing.
// It is safe for concurrent use.
type Recorder struct {
	tracer   trace.Tracer
	keyNames bool
	cache    attribute.KeyValue

	loadDur, waitDur metric.Float64Histogram
	// loadAttrs[background][outcome] and waitAttrs[timedOut] are built
	// once, so that recording allocates no attribute sets.
	loadAttrs [2][3]metric.RecordOption
	waitAttrs [3]metric.RecordOption
}

var (
	_ observe.Recorder      = (*Recorder)(nil)
	_ observe.Tracer        = (*Recorder)(nil)
	_ observe.CacheRecorder = (*Recorder)(nil)

	_ observe.ContextEventRecorder = (*Recorder)(nil)
)

// Load outcomes, the values of herd.outcome on herd.load.duration.
var loadOutcomes = [3]string{"ok", "not_found", "error"}

// NewRecorder returns a Recorder that starts spans with tp's tracer and
// records histograms with mp's meter; nil means the global provider. Until
// a cache hands it its name, its herd.cache is [DefaultName].
func NewRecorder(tp trace.TracerProvider, mp metric.MeterProvider, o Options) (*Recorder, error) {
	if tp == nil {
		tp = otel.GetTracerProvider()
	}
	if mp == nil {
		mp = otel.GetMeterProvider()
	}
	m := mp.Meter(ScopeName)
	hist := func(name string) (metric.Float64Histogram, error) {
		d := metricdef.Lookup(name)
		return m.Float64Histogram(d.OTelName(), metric.WithUnit(d.Unit), metric.WithDescription(d.Help),
			metric.WithExplicitBucketBoundaries(histogramBounds...))
	}
	loadDur, err1 := hist("load.duration")
	waitDur, err2 := hist("lease.wait")
	if err := errors.Join(err1, err2); err != nil {
		return nil, fmt.Errorf("herdotel: %w", err)
	}
	r := &Recorder{tracer: tp.Tracer(ScopeName), keyNames: o.KeyNames, loadDur: loadDur, waitDur: waitDur}
	return r.named(DefaultName), nil
}

// ForCache returns a Recorder that records as r does, under
// herd.cache=name; herd.New calls it with the cache's Name.
func (r *Recorder) ForCache(name string) observe.Recorder {
	if name == "" {
		name = DefaultName
	}
	return r.named(name)
}

func (r *Recorder) named(name string) *Recorder {
	n := *r
	n.cache = CacheKey.String(name)
	outcome := attribute.Key(metricdef.OTelAttr("outcome"))
	for bg := range 2 {
		for i, o := range loadOutcomes {
			n.loadAttrs[bg][i] = metric.WithAttributeSet(attribute.NewSet(n.cache,
				outcome.String(o), attribute.Bool(metricdef.OTelAttr("background"), bg == 1)))
		}
	}
	for i, o := range []string{"woken", "timeout", "abandoned"} {
		n.waitAttrs[i] = metric.WithAttributeSet(attribute.NewSet(n.cache, outcome.String(o)))
	}
	return &n
}

// RecordGet does nothing: RegisterMetrics reports the counts.
func (r *Recorder) RecordGet(observe.GetResult) {}

// RecordLoad records d in herd.load.duration.
func (r *Recorder) RecordLoad(d time.Duration, err error, background bool) {
	o := 0
	switch {
	case errors.Is(err, herd.ErrNotFound):
		o = 1
	case err != nil:
		o = 2
	}
	r.loadDur.Record(context.Background(), d.Seconds(), r.loadAttrs[b2i(background)][o])
}

// RecordLease records the wait of a lease loser in herd.lease.wait.
func (r *Recorder) RecordLease(e observe.LeaseEvent, wait time.Duration) {
	switch e {
	case observe.LeaseWoken:
		r.waitDur.Record(context.Background(), wait.Seconds(), r.waitAttrs[0])
	case observe.LeaseWaitTimeout:
		r.waitDur.Record(context.Background(), wait.Seconds(), r.waitAttrs[1])
	case observe.LeaseWaitAbandoned:
		r.waitDur.Record(context.Background(), wait.Seconds(), r.waitAttrs[2])
	}
}

// RecordShed does nothing: RegisterMetrics reports the counts.
func (r *Recorder) RecordShed(string, bool) {}

// RecordEvent does nothing: an event without a context has no span to go
// on, and RegisterMetrics reports the counts.
func (r *Recorder) RecordEvent(observe.Event) {}

// RecordEventContext adds e to the span current in ctx, if it is recording,
// as the event "herd." and e's kind with '_' for '-' ("herd.encode_failed"),
// with the attributes herd.cache, herd.key (for an event of a key) and
// exception.message (for an event with an error).
func (r *Recorder) RecordEventContext(ctx context.Context, e observe.Event) {
	span := trace.SpanFromContext(ctx)
	if !span.IsRecording() {
		return
	}
	attrs := []attribute.KeyValue{r.cache}
	if key := e.Key; key != "" {
		if !r.keyNames {
			key = herd.RedactKey(key)
		}
		attrs = append(attrs, KeyKey.String(key))
	}
	if e.Err != nil {
		attrs = append(attrs, attribute.String("exception.message", e.Err.Error()))
	}
	span.AddEvent("herd."+strings.ReplaceAll(e.Kind.String(), "-", "_"), trace.WithAttributes(attrs...))
}

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
