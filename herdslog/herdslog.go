// Package herdslog logs a herd cache's rare events with log/slog, rate-limited per kind of event.
package herdslog

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/herdcache/herd"
	"github.com/herdcache/herd/observe"
)

// Defaults of Options.Burst and Options.Interval.
const (
	DefaultBurst    = 10
	DefaultInterval = 10 * time.Second
)

// Options configures a [Recorder]. The zero value means the defaults.
type Options struct {
	// Burst is how many lines of one kind may be logged at once; zero means
	// DefaultBurst. It must not be negative.
	Burst int
	// Interval is the time over which Burst lines of one kind are allowed
	// again: after a burst, one more line every Interval/Burst. Zero means
	// DefaultInterval. It must not be negative.
	Interval time.Duration
	// KeyNames logs keys in full. Keys may hold personal data, so by default
	// a key is logged as its namespace and a short hash.
	KeyNames bool
	// Trace also logs, at Debug, how each Get was answered (kind "get"),
	// each load (kind "load") and each lease event (kind "lease"), each
	// kind through its own token bucket like every other line. False logs
	// none of them.
	Trace bool
}

// Recorder is a observe.Recorder, observe.ContextEventRecorder and
// observe.CacheRecorder, to be set as herd.Options.Recorder. It logs what an
// operator must hear of:
//
//   - observe.EventLeaseLost at Warn: a lease expired before its holder
//     released it, so the holder's write will be fenced.
//   - observe.EventRefreshFailed at Warn, with the error.
//   - observe.EventBreakerOpened at Warn and observe.EventBreakerClosed at Info.
//   - observe.EventWriteBackFailed at Warn, with the Store's error: a loaded
//     value did not reach the remote tier (Redis out of memory, a value
//     above its size limit, a timeout), so other replicas load it again.
//   - observe.EventEncodeFailed at Warn, with the codec's error: a loaded
//     value was served but cached in neither tier.
//   - each load the limiter refused (RecordShed) at Warn, kind "shed", with
//     the limiter's reason and whether it was a background refresh: the
//     backing store is at its cap.
//
// With Options.Trace it also logs the request path at Debug: each Get's
// result (hit, stale, negative or miss), each load's duration, outcome and
// whether it was a background refresh, and each lease event with the time
// a loser waited. Without it RecordGet, RecordLoad and RecordLease log
// nothing: a lost lease is logged from its event, and counts are for
// metrics (herdprom, herdotel).
//
// During an incident one event can happen thousands of times a second, so
// each kind of line has its own token bucket: at most Burst lines at once,
// then one more every Interval/Burst. When lines were dropped, the next line
// logged for that kind carries suppressed=<number dropped>. Lines below the
// logger's level are neither logged nor counted.
//
// Every line has a message, kind, cache (the cache's Name, which herd.New
// hands the Recorder; each cache so gets its own buckets) and, for key
// events, key: the key's namespace and a short hash ([herd.RedactKey])
// unless Options.KeyNames is set. An event that comes with a context
// (RecordEventContext) is logged with it, so that a handler can take the
// trace from it. It is safe for concurrent use.
type Recorder struct {
	log      *slog.Logger
	keyNames bool
	trace    bool
	burst    float64
	perToken time.Duration // Interval/Burst: the time one token takes to come back

	mu sync.Mutex
	// buckets holds the state of each kind of line logged, by kind; guarded
	// by mu.
	buckets map[string]*bucket
}

// bucket is a token bucket with a count of the lines it refused.
type bucket struct {
	tokens     float64   // in [0, burst]: lines that may be logged now
	last       time.Time // when tokens was last brought up to date
	suppressed int       // lines refused since the last one logged
}

var (
	_ observe.Recorder             = (*Recorder)(nil)
	_ observe.EventRecorder        = (*Recorder)(nil)
	_ observe.ContextEventRecorder = (*Recorder)(nil)
	_ observe.CacheRecorder        = (*Recorder)(nil)
)

// New returns a Recorder that logs to l; a nil l means slog.Default().
// Negative Options give an error.
func New(l *slog.Logger, o Options) (*Recorder, error) {
	if o.Burst < 0 {
		return nil, fmt.Errorf("herdslog: Burst must not be negative, got %d", o.Burst)
	}
	if o.Interval < 0 {
		return nil, fmt.Errorf("herdslog: Interval must not be negative, got %v", o.Interval)
	}
	if l == nil {
		l = slog.Default()
	}
	if o.Burst == 0 {
		o.Burst = DefaultBurst
	}
	if o.Interval == 0 {
		o.Interval = DefaultInterval
	}
	return &Recorder{
		log:      l,
		keyNames: o.KeyNames,
		trace:    o.Trace,
		burst:    float64(o.Burst),
		perToken: max(o.Interval/time.Duration(o.Burst), 1),
		buckets:  map[string]*bucket{},
	}, nil
}

// ForCache returns a Recorder that logs as r does, with cache=name on every
// line and buckets of its own; herd.New calls it with the cache's Name.
func (r *Recorder) ForCache(name string) observe.Recorder {
	return &Recorder{
		log:      r.log.With(slog.String("cache", name)),
		keyNames: r.keyNames,
		trace:    r.trace,
		burst:    r.burst,
		perToken: r.perToken,
		buckets:  map[string]*bucket{},
	}
}

// RecordGet logs how a Get was answered, at Debug, with Options.Trace.
func (r *Recorder) RecordGet(res observe.GetResult) {
	if r.trace {
		r.line(context.Background(), "get", slog.LevelDebug, "herd: get", slog.String("result", res.String()))
	}
}

// RecordLoad logs a load, at Debug, with Options.Trace: its duration, its
// outcome (ok, not_found or error, with the error) and whether it was a
// background refresh.
func (r *Recorder) RecordLoad(d time.Duration, err error, background bool) {
	if !r.trace {
		return
	}
	outcome := "ok"
	switch {
	case errors.Is(err, herd.ErrNotFound):
		outcome = "not_found"
	case err != nil:
		outcome = "error"
	}
	attrs := []slog.Attr{slog.Duration("duration", d), slog.String("outcome", outcome), slog.Bool("background", background)}
	if outcome == "error" {
		attrs = append(attrs, slog.Any("err", err))
	}
	r.line(context.Background(), "load", slog.LevelDebug, "herd: load", attrs...)
}

// RecordLease logs a lease event, at Debug, with Options.Trace, and the
// time a loser waited when it waited.
func (r *Recorder) RecordLease(e observe.LeaseEvent, wait time.Duration) {
	if !r.trace {
		return
	}
	attrs := []slog.Attr{slog.String("event", e.String())}
	if wait > 0 {
		attrs = append(attrs, slog.Duration("wait", wait))
	}
	r.line(context.Background(), "lease", slog.LevelDebug, "herd: lease", attrs...)
}

// RecordShed logs the limiter's refusal of a load, at Warn.
func (r *Recorder) RecordShed(reason string, background bool) {
	msg := "herd: limiter shed a load; its callers got ErrOverloaded"
	if background {
		msg = "herd: limiter shed a background refresh; the old value is served"
	}
	r.line(context.Background(), "shed", slog.LevelWarn, msg, slog.String("reason", reason), slog.Bool("background", background))
}

// RecordEvent logs e unless its kind has used up its lines.
func (r *Recorder) RecordEvent(e observe.Event) { r.RecordEventContext(context.Background(), e) }

// RecordEventContext logs e with ctx unless its kind has used up its lines.
func (r *Recorder) RecordEventContext(ctx context.Context, e observe.Event) {
	level, msg := slog.LevelWarn, ""
	switch e.Kind {
	case observe.EventLeaseLost:
		msg = "herd: lease expired before release; the load's write will be fenced"
	case observe.EventRefreshFailed:
		msg = "herd: background refresh failed; serving the old value until its hard TTL"
	case observe.EventBreakerOpened:
		msg = "herd: breaker opened; serving from the local tier"
	case observe.EventBreakerClosed:
		level, msg = slog.LevelInfo, "herd: breaker closed; remote tier answers again"
	case observe.EventWriteBackFailed:
		msg = "herd: write-back to the remote tier failed; the value is served from this replica only, others load it again"
	case observe.EventEncodeFailed:
		msg = "herd: codec could not encode a loaded value; it was served but not cached"
	default:
		level, msg = slog.LevelInfo, "herd: event"
	}
	var attrs []slog.Attr
	if e.Key != "" {
		key := e.Key
		if !r.keyNames {
			key = herd.RedactKey(key)
		}
		attrs = append(attrs, slog.String("key", key))
	}
	if e.Err != nil {
		attrs = append(attrs, slog.Any("err", e.Err))
	}
	r.line(ctx, e.Kind.String(), level, msg, attrs...)
}

// line logs msg with ctx, kind and attrs unless the kind has used up its
// lines.
func (r *Recorder) line(ctx context.Context, kind string, level slog.Level, msg string, attrs ...slog.Attr) {
	if !r.log.Enabled(ctx, level) {
		return
	}
	suppressed, ok := r.allow(kind)
	if !ok {
		return
	}
	attrs = append([]slog.Attr{slog.String("kind", kind)}, attrs...)
	if suppressed > 0 {
		attrs = append(attrs, slog.Int("suppressed", suppressed))
	}
	r.log.LogAttrs(ctx, level, msg, attrs...)
}

// allow takes a token of kind's bucket. It reports whether there was one
// and, if so, how many lines the bucket refused since its last token.
func (r *Recorder) allow(kind string) (suppressed int, ok bool) {
	now := time.Now()
	r.mu.Lock()
	defer r.mu.Unlock()
	b := r.buckets[kind]
	if b == nil {
		b = &bucket{tokens: r.burst, last: now}
		r.buckets[kind] = b
	}
	if elapsed := now.Sub(b.last); elapsed > 0 {
		b.tokens = min(r.burst, b.tokens+float64(elapsed)/float64(r.perToken))
		b.last = now
	}
	if b.tokens < 1 {
		b.suppressed++
		return 0, false
	}
	b.tokens--
	suppressed, b.suppressed = b.suppressed, 0
	return suppressed, true
}
