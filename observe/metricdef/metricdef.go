// Package metricdef lists the metrics that herdprom and herdotel export from
// [observe.Stats]: each one's name, kind, unit, help, label and the Stats
// fields its series read. Both adapters are driven from this one list, so a
// metric has one name everywhere: "herd." and the name for OpenTelemetry,
// and for Prometheus the same with underscores, the unit ("_seconds") and,
// for counters, "_total".
//
// The list is public so that an adapter for another metrics system (statsd,
// Datadog) can be written outside this repository and export the same
// metrics under the same names: range over [Metrics], read each series' value
// from a Stats snapshot, and name it with the definition's fields.
package metricdef

import (
	"fmt"
	"math"
	"reflect"
	"strings"
	"time"

	"github.com/herdcache/herd/limiter"
	"github.com/herdcache/herd/observe"
)

// Kind is what a metric is.
type Kind uint8

const (
	Counter   Kind = iota // a total that only grows
	Gauge                 // a value now
	Histogram             // a distribution of durations, read from a observe.Histogram
)

// Scope says which Stats a metric reads and when it is exported.
type Scope uint8

const (
	Always      Scope = iota // every cache
	WithLimiter              // only caches with a limiter (Stats.Limiter.Limit > 0)
	PerHotKey                // one series per hot key, labelled "key", reading observe.HotKey fields
)

// Metric is one exported metric.
type Metric struct {
	Name  string // after "herd.": "requests", "load.duration", "limiter.in_use"
	Kind  Kind
	Unit  string // UCUM, as OpenTelemetry wants it: "s", "1" or an annotation such as "{request}"
	Help  string
	Label string // the label that tells the series apart; "" for one series
	Scope Scope
	// Series are the metric's series: one, or one per value of Label.
	Series []Series
}

// Series is one series of a metric: the value of a Stats field, less any
// others.
type Series struct {
	Value string   // the label's value; "" when the metric has no label
	Field string   // the field read: "Hits", "Limiter.InUse", or a observe.HotKey field
	Minus []string // fields subtracted from it

	field []int   // Field's index path
	minus [][]int // Minus's
	float bool    // the field is a time.Duration, reported in seconds
}

// Label names, for Prometheus as they are and for OpenTelemetry after
// "herd.".
const (
	CacheLabel = "cache" // every series: the cache's name
	KeyLabel   = "key"   // PerHotKey series: the hot key
)

// PromName is m's Prometheus name.
func (m *Metric) PromName() string {
	n := "herd_" + strings.ReplaceAll(m.Name, ".", "_")
	if m.Unit == "s" {
		n += "_seconds"
	}
	if m.Kind == Counter {
		n += "_total"
	}
	return n
}

// OTelName is m's OpenTelemetry instrument name.
func (m *Metric) OTelName() string { return "herd." + m.Name }

// Exported reports whether m is exported for a cache whose Stats are st:
// WithLimiter metrics only when the cache has a limiter.
func (m *Metric) Exported(st *observe.Stats) bool {
	return m.Scope != WithLimiter || st.Limiter.Limit > 0
}

// OTelAttr is the OpenTelemetry attribute key of a label.
func OTelAttr(label string) string { return "herd." + label }

// Float reports whether m's values are seconds rather than counts.
func (m *Metric) Float() bool { return len(m.Series) > 0 && m.Series[0].float }

// Float64 is the series' value in v: a observe.Stats, or for PerHotKey
// metrics a observe.HotKey.
func (s *Series) Float64(v reflect.Value) float64 {
	f := number(v.FieldByIndex(s.field))
	for _, m := range s.minus {
		f -= number(v.FieldByIndex(m))
	}
	return f
}

// Int64 is the series' value, saturated to an int64.
func (s *Series) Int64(v reflect.Value) int64 {
	f := s.Float64(v)
	if f >= math.MaxInt64 {
		return math.MaxInt64
	}
	return int64(f)
}

// Histogram is the histogram a Histogram metric's one series reads.
func (s *Series) Histogram(v reflect.Value) observe.Histogram {
	return v.FieldByIndex(s.field).Interface().(observe.Histogram)
}

func number(v reflect.Value) float64 {
	switch {
	case v.Type() == durationType:
		return time.Duration(v.Int()).Seconds()
	case v.Kind() == reflect.Bool:
		if v.Bool() {
			return 1
		}
		return 0
	case v.CanInt():
		return float64(v.Int())
	case v.CanUint():
		return float64(v.Uint())
	}
	panic(fmt.Sprintf("metricdef: %v is not a number", v.Type()))
}

var (
	durationType  = reflect.TypeFor[time.Duration]()
	histogramType = reflect.TypeFor[observe.Histogram]()
	statsType     = reflect.TypeFor[observe.Stats]()
	hotKeyType    = reflect.TypeFor[observe.HotKey]()
)

// one is a metric's only series.
func one(field string) []Series { return []Series{{Field: field}} }

// by is a series per label value, each reading its field: by("hit",
// "Hits", "miss", "Misses").
func by(pairs ...string) []Series {
	out := make([]Series, 0, len(pairs)/2)
	for i := 0; i < len(pairs); i += 2 {
		out = append(out, Series{Value: pairs[i], Field: pairs[i+1]})
	}
	return out
}

// Metrics is every metric, in the order they are exported.
var Metrics = []Metric{
	{Name: "requests", Kind: Counter, Unit: "{request}", Label: "result",
		Help: "Get calls, and keys of GetMany calls, by how they were answered: hit (a fresh value, from either tier; not counted with DisableStats), " +
			"negative (ErrNotFound from a fresh negative entry), stale (a stale value served; a lease loser served stale is also counted as miss) " +
			"or miss (no value to serve at once).",
		Series: by("hit", "Hits", "negative", "NegativeHits", "stale", "StaleServed", "miss", "Misses")},
	{Name: "remote.hits", Kind: Counter, Unit: "{request}", Series: one("RemoteHits"),
		Help: "Fresh values read from the remote tier; also counted as herd requests with result hit."},
	{Name: "remote.waits", Kind: Counter, Unit: "{request}", Series: one("RemoteWaits"),
		Help: "Get calls that waited on a read of the remote tier: no local copy, or one older than twice NearTTL or superseded by a lost notice."},
	{Name: "revalidations", Kind: Counter, Unit: "{read}", Series: one("Revalidations"),
		Help: "Background reads of the remote tier that replaced a local copy past NearTTL or superseded by a change notice, while readers were served the copy."},
	{Name: "notice.values", Kind: Counter, Unit: "{value}", Label: "outcome",
		Help: "Values carried by change notices for a key whose older copy this replica held, by outcome: adopted (the copy replaced, " +
			"no read of the remote tier) or refused (not usable here: the copy was superseded and replaced by one read, as after a notice without a value).",
		Series: by("adopted", "NoticeValuesAdopted", "refused", "NoticeValuesRefused")},
	{Name: "loads", Kind: Counter, Unit: "{load}", Label: "outcome",
		Help: "Keys loaded by a load function (backing-store calls), by outcome: ok, not_found (the load returned ErrNotFound) or error.",
		Series: []Series{
			{Value: "ok", Field: "Loads", Minus: []string{"LoadsNotFound", "LoadErrors"}},
			{Value: "not_found", Field: "LoadsNotFound"},
			{Value: "error", Field: "LoadErrors"},
		}},
	{Name: "load.duration", Kind: Histogram, Unit: "s", Series: one("LoadDuration"),
		Help: "How long load functions took."},
	{Name: "coalesced", Kind: Counter, Unit: "{request}", Series: one("Coalesced"),
		Help: "Callers that joined another caller's load instead of calling their own."},
	{Name: "refreshes", Kind: Counter, Unit: "{refresh}", Label: "kind",
		Help: "Background refreshes started, by kind: early (a read came after the value's early-refresh instant), stale (a stale value was read) " +
			"or ahead (refresh-ahead of a pinned or hot key).",
		Series: by("early", "EarlyRefreshes", "stale", "StaleRefreshes", "ahead", "AheadRefreshes")},
	{Name: "refresh.failures", Kind: Counter, Unit: "{refresh}", Series: one("RefreshFailures"),
		Help: "Background refreshes whose load failed; the old value is kept until its hard TTL."},
	{Name: "stale_if_error", Kind: Counter, Unit: "{request}", Series: one("StaleIfError"),
		Help: "Stale values served because a load failed."},
	{Name: "key.concurrency", Kind: Gauge, Unit: "{load}", Series: one("KeyConcurrency"),
		Help: "The most loads of one key running at once in this process now; above 1 only without coalescing."},
	{Name: "key.concurrency_max", Kind: Gauge, Unit: "{load}", Series: one("KeyConcurrencyMax"),
		Help: "The most loads of one key ever running at once in this process."},
	{Name: "loads_running", Kind: Gauge, Unit: "{load}", Series: one("LoadsRunning"),
		Help: "Loads running now in this process, all keys together."},
	{Name: "in_flight", Kind: Gauge, Unit: "{flight}", Series: one("InFlight"),
		Help: "Flights (coalesced loads, with their waiting callers) running now."},
	{Name: "local.weight", Kind: Gauge, Unit: "{weight}", Series: one("LocalWeight"),
		Help: "The weight the local tier holds now, as Options.Weigher gives it; zero without MaxWeight."},
	{Name: "lease.events", Kind: Counter, Unit: "{event}", Label: "event",
		Help: "Cross-replica lease events: acquired (this replica loads), contended (another replica held it), " +
			"wait_timeout (a waiting loser gave up at LeaseWait), wait_abandoned (a waiting loser's caller left first), " +
			"extended (watchdog extension), lost (expired or moved before release), " +
			"fenced_write (a write refused because a newer write or invalidation won), " +
			"hold_heard (another replica's lease announced and recorded: no attempt until its notice or time), " +
			"attempt_skipped (a lease attempt not made because a hold was heard; at most one per hold heard).",
		Series: by("acquired", "LeaseAcquired", "contended", "LeaseContended", "wait_timeout", "LeaseWaitTimeouts",
			"wait_abandoned", "LeaseWaitsAbandoned", "extended", "LeaseExtended", "lost", "LeaseLost", "fenced_write", "FencedWrites",
			"hold_heard", "LeaseHoldsHeard", "attempt_skipped", "LeaseAttemptsSkipped")},
	{Name: "lease.wakeups", Kind: Counter, Unit: "{wakeup}", Label: "woken_by",
		Help:   "Waiting lease losers that got the holder's value, by what woke them: push (a completion notice) or poll (a fallback re-read).",
		Series: by("push", "WokenByPush", "poll", "WokenByPoll")},
	{Name: "lease.wait", Kind: Histogram, Unit: "s", Series: one("LeaseWait"),
		Help: "How long lease losers waited for the holder's value."},
	{Name: "queue.wait", Kind: Histogram, Unit: "s", Scope: WithLimiter, Series: one("QueueWait"),
		Help: "How long this cache's foreground loads waited for a limiter slot, shed ones included."},
	{Name: "shed", Kind: Counter, Unit: "{load}", Scope: WithLimiter, Series: one("Shed"),
		Help: "Loads of this cache that the limiter refused; limiter.shed counts every cache that shares the limiter."},
	{Name: "limiter.limit", Kind: Gauge, Unit: "{slot}", Scope: WithLimiter, Series: one("Limiter.Limit"),
		Help: "Limiter slots in all: the cap on concurrent backing-store calls, as adapted now when the limit is adaptive."},
	{Name: "limiter.in_use", Kind: Gauge, Unit: "{slot}", Scope: WithLimiter, Series: one("Limiter.InUse"),
		Help: "Limiter slots held now (the limiter may be shared by several caches)."},
	{Name: "limiter.max_in_use", Kind: Gauge, Unit: "{slot}", Scope: WithLimiter, Series: one("Limiter.MaxInUse"),
		Help: "The most limiter slots ever held at once."},
	{Name: "limiter.waiting", Kind: Gauge, Unit: "{call}", Scope: WithLimiter, Series: one("Limiter.Waiting"),
		Help: "Calls waiting for a limiter slot now."},
	{Name: "limiter.acquired", Kind: Counter, Unit: "{slot}", Scope: WithLimiter, Series: one("Limiter.Acquired"),
		Help: "Limiter slots granted, foreground and background."},
	{Name: "limiter.canceled", Kind: Counter, Unit: "{call}", Scope: WithLimiter, Series: one("Limiter.Canceled"),
		Help: "Calls whose context ended while they waited for a limiter slot; not shed."},
	{Name: "limiter.shed", Kind: Counter, Unit: "{call}", Scope: WithLimiter, Label: "reason",
		Help: "Calls the limiter refused, by reason: queue-timeout, queue-full (Low priority, queue too long), reserve (background, only reserved slots free) or latency (Low priority or background, the store or the queue slower than ShedLatency).",
		Series: by(limiter.ReasonQueueTimeout, "Limiter.ShedQueueTimeout", limiter.ReasonQueueFull, "Limiter.ShedQueueFull",
			limiter.ReasonReserve, "Limiter.ShedReserve", limiter.ReasonLatency, "Limiter.ShedLatency")},
	{Name: "limiter.latency", Kind: Gauge, Unit: "s", Scope: WithLimiter, Series: one("Limiter.Latency"),
		Help: "The backing store's latency as the limiter last measured it (mean time a slot was held); 0 when it measures none."},
	{Name: "limiter.no_load_latency", Kind: Gauge, Unit: "s", Scope: WithLimiter, Series: one("Limiter.NoLoadLatency"),
		Help: "The adaptive limiter's estimate of the backing store's latency without queueing; 0 when it measures none."},
	{Name: "limiter.shed_by_priority", Kind: Counter, Unit: "{call}", Scope: WithLimiter, Label: "priority",
		Help:   "Calls the limiter refused, by priority of the call: low, normal, high or background.",
		Series: by("low", "Limiter.ShedLow", "normal", "Limiter.ShedNormal", "high", "Limiter.ShedHigh", "background", "Limiter.ShedBackground")},
	{Name: "limiter.queue.wait", Kind: Counter, Unit: "s", Scope: WithLimiter, Series: one("Limiter.QueueWait"),
		Help: "Total time calls waited for a limiter slot, whatever the outcome, all caches of the limiter together."},
	{Name: "limiter.queue.waits", Kind: Counter, Unit: "{call}", Scope: WithLimiter, Series: one("Limiter.QueueWaits"),
		Help: "Calls that waited for a limiter slot, all caches of the limiter together."},
	{Name: "remote.errors", Kind: Counter, Unit: "{error}", Series: one("RemoteErrors"),
		Help: "Failed calls to the remote tier (Store and Lease)."},
	{Name: "decode.errors", Kind: Counter, Unit: "{error}", Series: one("DecodeErrors"),
		Help: "Remote values that could not be decoded, served as misses."},
	{Name: "encode.errors", Kind: Counter, Unit: "{error}", Series: one("EncodeErrors"),
		Help: "Values the codec could not encode, served but not cached."},
	{Name: "write_back.failures", Kind: Counter, Unit: "{value}", Label: "reason",
		Help: "Loaded values that did not reach the remote tier, by reason: encode (the codec could not encode the value; it was served " +
			"but cached in neither tier; the same count as encode.errors) or write (the write to the remote tier failed: Redis out of memory, " +
			"a value above its size limit, a timeout; the value stays in the local tier). A write the fence refused is the lease event fenced_write.",
		Series: by("encode", "EncodeErrors", "write", "WriteBackErrors")},
	{Name: "degraded", Kind: Gauge, Unit: "1", Series: one("Degraded"),
		Help: "1 while the breaker is open and remote calls are skipped, else 0."},
	{Name: "degraded_time", Kind: Counter, Unit: "s", Series: one("DegradedTime"),
		Help: "Total time the breaker has been open, the current spell included."},
	{Name: "breaker.opens", Kind: Counter, Unit: "{open}", Series: one("BreakerOpens"),
		Help: "Times the breaker opened after repeated remote failures."},
	{Name: "hot_key.traffic", Kind: Counter, Unit: "{request}", Scope: PerHotKey, Series: one("Traffic"),
		Help: "Estimated requests for each of the keys with the most traffic (hits sampled; may overcount by up to hot_key.error); at most Options.HotKeys keys per cache."},
	{Name: "hot_key.error", Kind: Gauge, Unit: "{request}", Scope: PerHotKey, Series: one("Error"),
		Help: "How much each hot key's traffic may be overcounted."},
	{Name: "hot_key.misses", Kind: Counter, Unit: "{request}", Scope: PerHotKey, Series: one("Misses"),
		Help: "Misses of each hot key since it was first tracked."},
	{Name: "hot_key.loads", Kind: Counter, Unit: "{load}", Scope: PerHotKey, Series: one("Loads"),
		Help: "Loads of each hot key since it was first tracked."},
	{Name: "hot_key.stale", Kind: Counter, Unit: "{request}", Scope: PerHotKey, Series: one("Stale"),
		Help: "Stale values served for each hot key since it was first tracked."},
}

// Unlisted are the Stats fields that no metric reads, with why: the label
// of the hot-key metrics, and the slice they read.
var Unlisted = map[string]string{
	"HotKeys":     "read by the PerHotKey metrics, one series per key",
	"HotKeys.Key": "the key label of the PerHotKey metrics",
}

// Lookup returns the metric named name; it panics if there is none.
func Lookup(name string) *Metric {
	for i := range Metrics {
		if Metrics[i].Name == name {
			return &Metrics[i]
		}
	}
	panic("metricdef: no metric " + name)
}

func init() {
	for i := range Metrics {
		m := &Metrics[i]
		t := statsType
		if m.Scope == PerHotKey {
			t = hotKeyType
		}
		for j := range m.Series {
			s := &m.Series[j]
			var ft reflect.Type
			s.field, ft = index(t, s.Field)
			for _, f := range s.Minus {
				idx, _ := index(t, f)
				s.minus = append(s.minus, idx)
			}
			s.float = ft == durationType
			if (m.Kind == Histogram) != (ft == histogramType) {
				panic(fmt.Sprintf("metricdef: %s reads %s, a %v", m.Name, s.Field, ft))
			}
		}
	}
}

// index resolves a dotted field path of t.
func index(t reflect.Type, path string) ([]int, reflect.Type) {
	var idx []int
	for name := range strings.SplitSeq(path, ".") {
		f, ok := t.FieldByName(name)
		if !ok {
			panic(fmt.Sprintf("metricdef: %v has no field %s (of %s)", t, name, path))
		}
		idx = append(idx, f.Index...)
		t = f.Type
	}
	return idx, t
}
