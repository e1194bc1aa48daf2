package herdotel_test

import (
	"context"
	"errors"
	"math"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/metric"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/herdcache/herd"
	"github.com/herdcache/herd/herdotel"
	"github.com/herdcache/herd/limiter"
	"github.com/herdcache/herd/memory"
	"github.com/herdcache/herd/observe"
)

// setup is a meter provider on a manual reader and a tracer provider on a
// span recorder.
type setup struct {
	reader *sdkmetric.ManualReader
	mp     *sdkmetric.MeterProvider
	spans  *tracetest.SpanRecorder
	tp     *sdktrace.TracerProvider
}

func newSetup() *setup {
	s := &setup{reader: sdkmetric.NewManualReader(), spans: tracetest.NewSpanRecorder()}
	s.mp = sdkmetric.NewMeterProvider(sdkmetric.WithReader(s.reader))
	s.tp = sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(s.spans))
	return s
}

func (s *setup) recorder(t *testing.T, o herdotel.Options) *herdotel.Recorder {
	t.Helper()
	r, err := herdotel.NewRecorder(s.tp, s.mp, o)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// collect returns the metrics read now, by name.
func (s *setup) collect(t *testing.T) map[string]metricdata.Aggregation {
	t.Helper()
	var rm metricdata.ResourceMetrics
	if err := s.reader.Collect(context.Background(), &rm); err != nil {
		t.Fatalf("Collect: %v", err)
	}
	out := map[string]metricdata.Aggregation{}
	for _, sm := range rm.ScopeMetrics {
		if sm.Scope.Name != herdotel.ScopeName {
			t.Errorf("scope %q, want %q", sm.Scope.Name, herdotel.ScopeName)
		}
		for _, m := range sm.Metrics {
			out[m.Name] = m.Data
		}
	}
	return out
}

// value returns the value of the point of metric name whose attributes are
// exactly kv.
func value(t *testing.T, ms map[string]metricdata.Aggregation, name string, kv ...attribute.KeyValue) float64 {
	t.Helper()
	want := attribute.NewSet(kv...)
	switch d := ms[name].(type) {
	case metricdata.Sum[int64]:
		if !d.IsMonotonic {
			t.Errorf("%s is not monotonic", name)
		}
		for _, p := range d.DataPoints {
			if p.Attributes.Equals(&want) {
				return float64(p.Value)
			}
		}
	case metricdata.Sum[float64]:
		for _, p := range d.DataPoints {
			if p.Attributes.Equals(&want) {
				return p.Value
			}
		}
	case metricdata.Gauge[int64]:
		for _, p := range d.DataPoints {
			if p.Attributes.Equals(&want) {
				return float64(p.Value)
			}
		}
	case metricdata.Gauge[float64]:
		for _, p := range d.DataPoints {
			if p.Attributes.Equals(&want) {
				return p.Value
			}
		}
	case nil:
		t.Fatalf("no metric %s", name)
	default:
		t.Fatalf("%s is a %T", name, d)
	}
	t.Fatalf("%s has no point with attributes %v", name, want.Encoded(attribute.DefaultEncoder()))
	return 0
}

func histogram(t *testing.T, ms map[string]metricdata.Aggregation, name string, kv ...attribute.KeyValue) metricdata.HistogramDataPoint[float64] {
	t.Helper()
	want := attribute.NewSet(kv...)
	d, ok := ms[name].(metricdata.Histogram[float64])
	if !ok {
		t.Fatalf("%s is a %T, want a histogram", name, ms[name])
	}
	for _, p := range d.DataPoints {
		if p.Attributes.Equals(&want) {
			return p
		}
	}
	t.Fatalf("%s has no point with attributes %v", name, want.Encoded(attribute.DefaultEncoder()))
	return metricdata.HistogramDataPoint[float64]{}
}

func newCache(t *testing.T, o *herd.Options[string]) *herd.Cache[string] {
	t.Helper()
	c, err := herd.New(o)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	t.Cleanup(func() {
		if err := c.Close(context.Background()); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	return c
}

var (
	cacheAttr = herdotel.CacheKey.String("items")
	ok        = attribute.String("herd.outcome", "ok")
)

// TestStampedeMetrics reads the metrics of a cache after 1,000 concurrent
// misses of one key, both the observed counters and the recorded histogram.
func TestStampedeMetrics(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := newSetup()
		c := newCache(t, &herd.Options[string]{
			Name: "items", MaxEntries: 10, SoftTTL: time.Hour, HotKeys: 4,
			Recorder: s.recorder(t, herdotel.Options{}),
		})
		reg, err := herdotel.RegisterMetrics(s.mp, c)
		if err != nil {
			t.Fatal(err)
		}
		key := herd.Key("item", "42")
		gate := make(chan struct{})
		var wg sync.WaitGroup
		const n = 1000
		for range n {
			wg.Go(func() {
				v, err := c.Get(context.Background(), key, func(context.Context) (string, error) {
					<-gate
					return "v", nil
				})
				if v != "v" || err != nil {
					t.Errorf("Get = %q, %v", v, err)
				}
			})
		}
		synctest.Wait()
		ms := s.collect(t)
		if got := value(t, ms, "herd.loads_running", cacheAttr); got != 1 {
			t.Errorf("herd.load.active = %v during the stampede, want 1", got)
		}
		if got := value(t, ms, "herd.key.concurrency", cacheAttr); got != 1 {
			t.Errorf("herd.recompute.concurrency = %v during the stampede, want 1", got)
		}
		time.Sleep(100 * time.Millisecond)
		close(gate)
		wg.Wait()

		ms = s.collect(t)
		for _, c := range []struct {
			name string
			kv   []attribute.KeyValue
			want float64
		}{
			{"herd.requests", []attribute.KeyValue{attribute.String("herd.result", "miss")}, n},
			{"herd.requests", []attribute.KeyValue{attribute.String("herd.result", "hit")}, 0},
			{"herd.loads", []attribute.KeyValue{ok}, 1},
			{"herd.coalesced", nil, n - 1},
			{"herd.key.concurrency", nil, 0},
			{"herd.key.concurrency_max", nil, 1},
			{"herd.loads_running", nil, 0},
			{"herd.hot_key.misses", []attribute.KeyValue{herdotel.KeyKey.String(herd.RedactKey(key))}, n},
			{"herd.hot_key.loads", []attribute.KeyValue{herdotel.KeyKey.String(herd.RedactKey(key))}, 1},
		} {
			if got := value(t, ms, c.name, append([]attribute.KeyValue{cacheAttr}, c.kv...)...); got != c.want {
				t.Errorf("%s%v = %v, want %v", c.name, c.kv, got, c.want)
			}
		}
		p := histogram(t, ms, "herd.load.duration", cacheAttr, ok, attribute.Bool("herd.background", false))
		if p.Count != 1 || p.Sum != 0.1 {
			t.Errorf("herd.load.duration: count %d, sum %v; want 1, 0.1", p.Count, p.Sum)
		}
		if i := indexOf(p.Bounds, 0.1); i < 0 || p.BucketCounts[i] != 1 {
			t.Errorf("herd.load.duration: bounds %v, counts %v; want the load in the bucket ending at 0.1", p.Bounds, p.BucketCounts)
		}

		if err := reg.Unregister(); err != nil {
			t.Fatal(err)
		}
		ms = s.collect(t)
		if d, ok := ms["herd.requests"]; ok && len(d.(metricdata.Sum[int64]).DataPoints) != 0 {
			t.Errorf("herd.requests still observed after Unregister: %+v", d)
		}
	})
}

func indexOf(s []float64, v float64) int {
	for i, x := range s {
		if x == v {
			return i
		}
	}
	return -1
}

// fake returns a fixed snapshot, named by its Coalesced count: "" (0), "a"
// (1) or "b" (2).
type fake observe.Stats

func (f *fake) Name() string         { return [...]string{"", "a", "b"}[f.Coalesced%3] }
func (f *fake) Stats() observe.Stats { return observe.Stats(*f) }

// TestEveryField checks that each field of a snapshot whose fields all differ
// is observed under its own instrument and attributes.
func TestEveryField(t *testing.T) {
	s := newSetup()
	st := &fake{
		Hits: 1, Misses: 2, NegativeHits: 3, StaleServed: 4, StaleIfError: 5,
		EarlyRefreshes: 6, StaleRefreshes: 7, RefreshFailures: 8,
		Loads: 66, LoadsNotFound: 46, LoadErrors: 9, Coalesced: 9,
		LeaseAcquired: 11, LeaseContended: 12, LeaseWaitTimeouts: 13, LeaseExtended: 14,
		LeaseLost: 15, WokenByPush: 16, WokenByPoll: 17, FencedWrites: 18,
		RemoteHits: 40, RemoteWaits: 43, Revalidations: 44, AheadRefreshes: 45, Shed: 19, RemoteErrors: 21, DecodeErrors: 22, EncodeErrors: 23,
		WriteBackErrors: 48, LeaseWaitsAbandoned: 49, LocalWeight: 51,
		LeaseHoldsHeard: 52, LeaseAttemptsSkipped: 53, NoticeValuesAdopted: 54, NoticeValuesRefused: 55,
		InFlight: 24, LoadsRunning: 25, KeyConcurrency: 26, KeyConcurrencyMax: 27,
		Limiter: observe.LimiterStats{Limit: 28, InUse: 29, Waiting: 30, Stats: limiter.Stats{
			Acquired: 31, ShedQueueTimeout: 32, ShedQueueFull: 33, ShedReserve: 34,
			ShedLow: 35, ShedNormal: 36, ShedHigh: 37, ShedBackground: 38,
			Canceled: 41, MaxInUse: 42, QueueWait: 2500 * time.Millisecond, QueueWaits: 47,
			ShedLatency: 50, Latency: 250 * time.Millisecond, NoLoadLatency: 125 * time.Millisecond,
		}},
		HotKeys: []observe.HotKey{
			{Key: "item#0000000a", Traffic: 100, Misses: 40, Loads: 2, Stale: 3, Error: 4},
		},
		Degraded: true, DegradedTime: 1500 * time.Millisecond, BreakerOpens: 39,
	}
	if _, err := herdotel.RegisterMetrics(s.mp, st); err != nil {
		t.Fatal(err)
	}
	ms := s.collect(t)
	cache := herdotel.CacheKey.String(herdotel.DefaultName)
	hot := herdotel.KeyKey.String("item#0000000a")
	for _, c := range []struct {
		name string
		kv   attribute.KeyValue
		want float64
	}{
		{"herd.requests", attribute.String("herd.result", "hit"), 1},
		{"herd.requests", attribute.String("herd.result", "miss"), 2},
		{"herd.requests", attribute.String("herd.result", "negative"), 3},
		{"herd.requests", attribute.String("herd.result", "stale"), 4},
		{"herd.remote.hits", cache, 40},
		{"herd.remote.waits", cache, 43},
		{"herd.revalidations", cache, 44},
		{"herd.notice.values", attribute.String("herd.outcome", "adopted"), 54},
		{"herd.notice.values", attribute.String("herd.outcome", "refused"), 55},
		{"herd.stale_if_error", cache, 5},
		{"herd.refreshes", attribute.String("herd.kind", "early"), 6},
		{"herd.refreshes", attribute.String("herd.kind", "stale"), 7},
		{"herd.refreshes", attribute.String("herd.kind", "ahead"), 45},
		{"herd.refresh.failures", cache, 8},
		{"herd.loads", attribute.String("herd.outcome", "error"), 9},
		{"herd.loads", attribute.String("herd.outcome", "ok"), 11},
		{"herd.loads", attribute.String("herd.outcome", "not_found"), 46},
		{"herd.limiter.queue.wait", cache, 2.5},
		{"herd.limiter.queue.waits", cache, 47},
		{"herd.hot_key.error", hot, 4},
		{"herd.coalesced", cache, 9},
		{"herd.lease.events", attribute.String("herd.event", "acquired"), 11},
		{"herd.lease.events", attribute.String("herd.event", "contended"), 12},
		{"herd.lease.events", attribute.String("herd.event", "wait_timeout"), 13},
		{"herd.lease.events", attribute.String("herd.event", "wait_abandoned"), 49},
		{"herd.lease.events", attribute.String("herd.event", "extended"), 14},
		{"herd.lease.events", attribute.String("herd.event", "lost"), 15},
		{"herd.lease.events", attribute.String("herd.event", "fenced_write"), 18},
		{"herd.lease.events", attribute.String("herd.event", "hold_heard"), 52},
		{"herd.lease.events", attribute.String("herd.event", "attempt_skipped"), 53},
		{"herd.lease.wakeups", attribute.String("herd.woken_by", "push"), 16},
		{"herd.lease.wakeups", attribute.String("herd.woken_by", "poll"), 17},
		{"herd.remote.errors", cache, 21},
		{"herd.decode.errors", cache, 22},
		{"herd.encode.errors", cache, 23},
		{"herd.write_back.failures", attribute.String("herd.reason", "encode"), 23},
		{"herd.write_back.failures", attribute.String("herd.reason", "write"), 48},
		{"herd.in_flight", cache, 24},
		{"herd.local.weight", cache, 51},
		{"herd.loads_running", cache, 25},
		{"herd.key.concurrency", cache, 26},
		{"herd.key.concurrency_max", cache, 27},
		{"herd.limiter.limit", cache, 28},
		{"herd.limiter.in_use", cache, 29},
		{"herd.limiter.waiting", cache, 30},
		{"herd.limiter.acquired", cache, 31},
		{"herd.limiter.canceled", cache, 41},
		{"herd.limiter.max_in_use", cache, 42},
		{"herd.shed", cache, 19},
		{"herd.limiter.shed", attribute.String("herd.reason", "queue-timeout"), 32},
		{"herd.limiter.shed", attribute.String("herd.reason", "queue-full"), 33},
		{"herd.limiter.shed", attribute.String("herd.reason", "reserve"), 34},
		{"herd.limiter.shed", attribute.String("herd.reason", "latency"), 50},
		{"herd.limiter.latency", cache, 0.25},
		{"herd.limiter.no_load_latency", cache, 0.125},
		{"herd.limiter.shed_by_priority", attribute.String("herd.priority", "low"), 35},
		{"herd.limiter.shed_by_priority", attribute.String("herd.priority", "normal"), 36},
		{"herd.limiter.shed_by_priority", attribute.String("herd.priority", "high"), 37},
		{"herd.limiter.shed_by_priority", attribute.String("herd.priority", "background"), 38},
		{"herd.degraded", cache, 1},
		{"herd.breaker.opens", cache, 39},
		{"herd.degraded_time", cache, 1.5},
		{"herd.hot_key.traffic", hot, 100},
		{"herd.hot_key.misses", hot, 40},
		{"herd.hot_key.loads", hot, 2},
		{"herd.hot_key.stale", hot, 3},
	} {
		kv := []attribute.KeyValue{cache}
		if c.kv != cache {
			kv = append(kv, c.kv)
		}
		if got := value(t, ms, c.name, kv...); got != c.want {
			t.Errorf("%s{%s} = %v, want %v", c.name, c.kv.Value.String(), got, c.want)
		}
	}
	if n := len(ms); n != 42 {
		t.Errorf("%d instruments observed, want 42", n)
	}
}

// TestTwoCaches registers two caches on one provider: each is observed
// under its own herd.cache, and unregistering one leaves the other.
func TestTwoCaches(t *testing.T) {
	s := newSetup()
	a, err := herdotel.RegisterMetrics(s.mp, &fake{Coalesced: 1})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := herdotel.RegisterMetrics(s.mp, &fake{Coalesced: 2}); err != nil {
		t.Fatal(err)
	}
	ms := s.collect(t)
	if a, b := value(t, ms, "herd.coalesced", herdotel.CacheKey.String("a")), value(t, ms, "herd.coalesced", herdotel.CacheKey.String("b")); a != 1 || b != 2 {
		t.Errorf("herd.coalesced a=%v b=%v, want 1 and 2", a, b)
	}
	if err := a.Unregister(); err != nil {
		t.Fatal(err)
	}
	ms = s.collect(t)
	if pts := ms["herd.coalesced"].(metricdata.Sum[int64]).DataPoints; len(pts) != 1 || pts[0].Value != 2 {
		t.Errorf("after unregistering a: %+v, want only b's point", pts)
	}
}

// spanNamed returns the one ended span called name.
func spanNamed(t *testing.T, spans []sdktrace.ReadOnlySpan, name string) sdktrace.ReadOnlySpan {
	t.Helper()
	var found []sdktrace.ReadOnlySpan
	for _, s := range spans {
		if s.Name() == name {
			found = append(found, s)
		}
	}
	if len(found) != 1 {
		t.Fatalf("%d ended spans named %q, want 1", len(found), name)
	}
	return found[0]
}

func attr(s sdktrace.ReadOnlySpan, k attribute.Key) string {
	for _, kv := range s.Attributes() {
		if kv.Key == k {
			return kv.Value.String()
		}
	}
	return "<none>"
}

// TestLeaseWaitSpan runs two replicas on one in-memory remote: A holds the
// lease while its load is held, B waits for it under a span of its own, and
// B's trace must show the wait as a child span.
func TestLeaseWaitSpan(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := newSetup()
		remote := memory.New()
		rec := s.recorder(t, herdotel.Options{}) // one Recorder for both caches, named by each
		replica := func(name string) *herd.Cache[string] {
			return newCache(t, &herd.Options[string]{
				NoNearCache: true,
				NoBreaker:   true,
				Name:        name, MaxEntries: 10, SoftTTL: time.Hour,
				Store: remote, Lease: remote, LeaseTTL: 10 * time.Second, OnLeaseHeld: herd.Wait,
				Recorder: rec,
			})
		}
		a, b := replica("a"), replica("b")
		tracer := s.tp.Tracer("test")
		key := herd.Key("item", "42")

		gate := make(chan struct{})
		aCtx, aSpan := tracer.Start(context.Background(), "request-a")
		aDone := make(chan error, 1)
		go func() {
			_, err := a.Get(aCtx, key, func(context.Context) (string, error) {
				<-gate
				return "v", nil
			})
			aDone <- err
		}()
		synctest.Wait() // A holds the lease and runs its load

		bCtx, bSpan := tracer.Start(context.Background(), "request-b")
		bDone := make(chan error, 1)
		go func() {
			v, err := b.Get(bCtx, key, func(context.Context) (string, error) {
				return "", errors.New("B loaded although A held the lease")
			})
			if err == nil && v != "v" {
				err = errors.New("B got " + v)
			}
			bDone <- err
		}()
		synctest.Wait() // B waits for A
		time.Sleep(30 * time.Millisecond)
		close(gate)
		if err := <-aDone; err != nil {
			t.Fatalf("A: %v", err)
		}
		if err := <-bDone; err != nil {
			t.Fatalf("B: %v", err)
		}
		aSpan.End()
		bSpan.End()

		ended := s.spans.Ended()
		wait := spanNamed(t, ended, "herd.lease_wait")
		if p := wait.Parent(); p.SpanID() != bSpan.SpanContext().SpanID() || p.TraceID() != bSpan.SpanContext().TraceID() {
			t.Errorf("herd.lease_wait parent %v, want B's request span %v", p.SpanID(), bSpan.SpanContext().SpanID())
		}
		if got, want := attr(wait, herdotel.KeyKey), herd.RedactKey(key); got != want {
			t.Errorf("herd.lease_wait herd.key = %q, want %q", got, want)
		}
		if got := attr(wait, herdotel.CacheKey); got != "b" {
			t.Errorf("herd.lease_wait herd.cache = %q, want b", got)
		}
		if d := wait.EndTime().Sub(wait.StartTime()); d != 30*time.Millisecond {
			t.Errorf("herd.lease_wait lasted %v, want 30ms", d)
		}
		load := spanNamed(t, ended, "herd.load") // one load in the fleet: A's
		if p := load.Parent(); p.SpanID() != aSpan.SpanContext().SpanID() {
			t.Errorf("herd.load parent %v, want A's request span %v", p.SpanID(), aSpan.SpanContext().SpanID())
		}
		if got := attr(load, herdotel.CacheKey); got != "a" {
			t.Errorf("herd.load herd.cache = %q, want a", got)
		}
		if load.Status().Code != codes.Unset {
			t.Errorf("herd.load status %v, want unset", load.Status())
		}

		ms := s.collect(t)
		p := histogram(t, ms, "herd.lease.wait", herdotel.CacheKey.String("b"), attribute.String("herd.outcome", "woken"))
		if p.Count != 1 || p.Sum != 0.03 {
			t.Errorf("herd.lease.wait: count %d, sum %v; want 1, 0.03", p.Count, p.Sum)
		}
	})
}

// TestLoadErrorSpan checks that a failed load's span carries the error and
// its duration is recorded as an error.
func TestLoadErrorSpan(t *testing.T) {
	s := newSetup()
	c := newCache(t, &herd.Options[string]{MaxEntries: 10, SoftTTL: time.Hour, Recorder: s.recorder(t, herdotel.Options{})})
	errOrigin := errors.New("origin down")
	if _, err := c.Get(t.Context(), "k", func(context.Context) (string, error) { return "", errOrigin }); !errors.Is(err, errOrigin) {
		t.Fatalf("Get = %v, want %v", err, errOrigin)
	}
	load := spanNamed(t, s.spans.Ended(), "herd.load")
	if st := load.Status(); st.Code != codes.Error || st.Description != errOrigin.Error() {
		t.Errorf("status %+v, want Error %q", st, errOrigin)
	}
	if ev := load.Events(); len(ev) != 1 || ev[0].Name != "exception" {
		t.Errorf("events %+v, want one exception", ev)
	}
	if load.SpanKind() != trace.SpanKindInternal {
		t.Errorf("span kind %v, want internal", load.SpanKind())
	}
	p := histogram(t, s.collect(t), "herd.load.duration", herdotel.CacheKey.String(herdotel.DefaultName),
		attribute.String("herd.outcome", "error"), attribute.Bool("herd.background", false))
	if p.Count != 1 {
		t.Errorf("herd.load.duration{error} count %d, want 1", p.Count)
	}
	if _, err := c.Get(t.Context(), "gone", func(context.Context) (string, error) { return "", herd.ErrNotFound }); !errors.Is(err, herd.ErrNotFound) {
		t.Fatalf("Get = %v, want ErrNotFound", err)
	}
	p = histogram(t, s.collect(t), "herd.load.duration", herdotel.CacheKey.String(herdotel.DefaultName),
		attribute.String("herd.outcome", "not_found"), attribute.Bool("herd.background", false))
	if p.Count != 1 {
		t.Errorf("herd.load.duration{not_found} count %d, want 1", p.Count)
	}
}

// TestRefreshSpanAndKeyNames checks that a background refresh has its own
// span name and that KeyNames puts the key in full.
func TestRefreshSpanAndKeyNames(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := newSetup()
		c := newCache(t, &herd.Options[string]{
			MaxEntries: 10, SoftTTL: time.Second, HardTTL: time.Hour,
			Recorder: s.recorder(t, herdotel.Options{KeyNames: true}),
		})
		key := herd.Key("user", "tenant-7", "42")
		load := func(context.Context) (string, error) { return "v", nil }
		if _, err := c.Get(t.Context(), key, load); err != nil {
			t.Fatal(err)
		}
		time.Sleep(2 * time.Second)
		if _, err := c.Get(t.Context(), key, load); err != nil { // stale: refreshes
			t.Fatal(err)
		}
		synctest.Wait()
		refresh := spanNamed(t, s.spans.Ended(), "herd.refresh")
		if got := attr(refresh, herdotel.KeyKey); got != key {
			t.Errorf("herd.key = %q, want the key in full %q", got, key)
		}
		p := histogram(t, s.collect(t), "herd.load.duration", herdotel.CacheKey.String(herdotel.DefaultName),
			ok, attribute.Bool("herd.background", true))
		if p.Count != 1 {
			t.Errorf("herd.load.duration{refresh} count %d, want 1", p.Count)
		}
	})
}

// TestFailures runs a real cache whose JSON codec cannot encode +Inf, and
// whose remote tier then refuses a write-back: each encode failure is an
// event on the caller's span, with the cache and the redacted key, and
// herd.write_back.failures counts both failures by herd.reason, with no
// attribute from keys.
func TestFailures(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := newSetup()
		remote := memory.New()
		c, err := herd.New(&herd.Options[float64]{
			NoNearCache: true,
			NoBreaker:   true,
			Name:        "gauges", MaxEntries: 10, SoftTTL: time.Hour, Codec: herd.JSON[float64](),
			Store: remote, Lease: remote, LeaseTTL: 10 * time.Second,
			Recorder: s.recorder(t, herdotel.Options{}),
		})
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close(context.Background())
		if _, err := herdotel.RegisterMetrics(s.mp, c); err != nil {
			t.Fatal(err)
		}
		key := herd.Key("gauge", "tenant-7", "pressure")
		inf := func(context.Context) (float64, error) { return math.Inf(1), nil }
		ctx, req := s.tp.Tracer("test").Start(t.Context(), "request")
		for range 2 {
			if v, err := c.Get(ctx, key, inf); !math.IsInf(v, 1) || err != nil {
				t.Fatalf("Get = %v, %v; want +Inf served", v, err)
			}
		}
		req.End()
		if v, err := c.Get(t.Context(), key, inf); !math.IsInf(v, 1) || err != nil { // no span: nothing to add the event to
			t.Fatalf("Get = %v, %v; want +Inf served", v, err)
		}
		events := spanNamed(t, s.spans.Ended(), "request").Events()
		if len(events) != 2 {
			t.Fatalf("request span events %+v, want 2 encode failures", events)
		}
		for i, ev := range events {
			got := attribute.NewSet(ev.Attributes...)
			msg, _ := got.Value("exception.message")
			k, _ := got.Value(herdotel.KeyKey)
			cache, _ := got.Value(herdotel.CacheKey)
			if ev.Name != "herd.encode_failed" || got.Len() != 3 || k.AsString() != herd.RedactKey(key) ||
				cache.AsString() != "gauges" || !strings.Contains(msg.AsString(), "unsupported value") {
				t.Errorf("event %d: %s %v; want herd.encode_failed with herd.cache=gauges, herd.key=%s and the codec's error",
					i, ev.Name, got.Encoded(attribute.DefaultEncoder()), herd.RedactKey(key))
			}
		}

		started, gate := make(chan struct{}), make(chan struct{})
		done := make(chan error, 1)
		go func() {
			_, err := c.Get(t.Context(), herd.Key("gauge", "tenant-7", "flow"), func(context.Context) (float64, error) {
				close(started)
				<-gate
				return 1.5, nil
			})
			done <- err
		}()
		<-started
		remote.SetDown(errors.New("OOM command not allowed when used memory > 'maxmemory'"))
		close(gate)
		if err := <-done; err != nil {
			t.Fatal(err)
		}
		synctest.Wait() // the write-back has ended
		ms := s.collect(t)
		gauges := herdotel.CacheKey.String("gauges")
		if got := value(t, ms, "herd.write_back.failures", gauges, attribute.String("herd.reason", "encode")); got != 3 {
			t.Errorf("herd.write_back.failures{encode} = %v, want 3", got)
		}
		if got := value(t, ms, "herd.write_back.failures", gauges, attribute.String("herd.reason", "write")); got != 1 {
			t.Errorf("herd.write_back.failures{write} = %v, want 1", got)
		}
	})
}

func TestBadInput(t *testing.T) {
	if _, err := herdotel.RegisterMetrics(newSetup().mp, nil); err == nil || !strings.HasPrefix(err.Error(), "herdotel: ") {
		t.Errorf("RegisterMetrics with a nil Source: %v, want a herdotel error", err)
	}
	// Nil providers mean the global ones (no-ops unless set).
	r, err := herdotel.NewRecorder(nil, nil, herdotel.Options{})
	if err != nil {
		t.Fatal(err)
	}
	_, end := r.StartSpan(t.Context(), "herd.load", "k")
	end(errors.New("x"))
	r.RecordLoad(time.Second, nil, false)
	r.RecordLease(observe.LeaseWaitTimeout, time.Second)
	if _, err := herdotel.RegisterMetrics(nil, &fake{}); err != nil {
		t.Errorf("RegisterMetrics on the global provider: %v", err)
	}
}

// BenchmarkRecordLoad compares the Recorder, whose attribute sets are built
// once, with building them on every call.
func BenchmarkRecordLoad(b *testing.B) {
	s := newSetup()
	b.Run("recorder", func(b *testing.B) {
		r, err := herdotel.NewRecorder(s.tp, s.mp, herdotel.Options{})
		if err != nil {
			b.Fatal(err)
		}
		b.ReportAllocs()
		for b.Loop() {
			r.RecordLoad(time.Millisecond, nil, false)
		}
	})
	b.Run("attributes-per-call", func(b *testing.B) {
		h, err := s.mp.Meter("bench").Float64Histogram("herd.load.duration")
		if err != nil {
			b.Fatal(err)
		}
		ctx := context.Background()
		b.ReportAllocs()
		for b.Loop() {
			h.Record(ctx, time.Millisecond.Seconds(), metric.WithAttributes(
				herdotel.CacheKey.String(herdotel.DefaultName), ok, attribute.Bool("herd.background", false)))
		}
	})
}

// TestLeaseWaitOutcomes: each way a loser's wait ends has its own series
// of herd.lease.wait, the waits whose caller left first included.
func TestLeaseWaitOutcomes(t *testing.T) {
	s := newSetup()
	r, err := herdotel.NewRecorder(s.tp, s.mp, herdotel.Options{})
	if err != nil {
		t.Fatal(err)
	}
	r.RecordLease(observe.LeaseWoken, time.Second)
	r.RecordLease(observe.LeaseWaitTimeout, 2*time.Second)
	r.RecordLease(observe.LeaseWaitAbandoned, 3*time.Second)
	ms := s.collect(t)
	for o, want := range map[string]float64{"woken": 1, "timeout": 2, "abandoned": 3} {
		p := histogram(t, ms, "herd.lease.wait", herdotel.CacheKey.String(herdotel.DefaultName), attribute.String("herd.outcome", o))
		if p.Count != 1 || p.Sum != want {
			t.Errorf("herd.lease.wait{%s}: count %d, sum %v; want 1, %v", o, p.Count, p.Sum, want)
		}
	}
}
