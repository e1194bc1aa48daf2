// Package herdslog logs a herd cache's rare events with log/slog, rate-limited per kind of event.
package herdslog

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/herdcache/herd"
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
}

// Recorder is a herd.Recorder and herd.EventRecorder, to be set as
// herd.Options.Recorder. Its herd.Recorder methods do nothing; it logs the
// events the cache reports:
//
//   - herd.EventLeaseLost at Warn: a lease expired before its holder
//     released it, so the holder's write will be fenced.
//   - herd.EventRefreshFailed at Warn, with the error.
//   - herd.EventBreakerOpened at Warn and herd.EventBreakerClosed at Info.
//
// During an incident one event can happen thousands of times a second, so
// each kind of event has its own token bucket: at most Burst lines at once,
// then one more every Interval/Burst. When lines were dropped, the next line
// logged for that kind carries suppressed=<number dropped>. Events below the
// logger's level are neither logged nor counted.
//
// Every line has a message, kind and, for key events, key: the key's
// namespace and a short hash ([herd.RedactKey]) unless Options.KeyNames is
// set. Add the cache's name with Logger.With. It is safe for concurrent use.
type Recorder struct {
	log      *slog.Logger
	keyNames bool
	burst    float64
	perToken time.Duration // Interval/Burst: the time one token takes to come back

	mu sync.Mutex
	// buckets holds the state of each kind of event seen; guarded by mu.
	buckets map[herd.EventKind]*bucket
}

// bucket is a token bucket with a count of the lines it refused.
type bucket struct {
	tokens     float64   // in [0, burst]: lines that may be logged now
	last       time.Time // when tokens was last brought up to date
	suppressed int       // lines refused since the last one logged
}

var (
	_ herd.Recorder      = (*Recorder)(nil)
	_ herd.EventRecorder = (*Recorder)(nil)
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
		burst:    float64(o.Burst),
		perToken: max(o.Interval/time.Duration(o.Burst), 1),
		buckets:  map[herd.EventKind]*bucket{},
	}, nil
}

// RecordGet does nothing.
func (r *Recorder) RecordGet(herd.GetResult) {}

// RecordLoad does nothing.
func (r *Recorder) RecordLoad(time.Duration, error, bool) {}

// RecordLease does nothing: a lost lease is logged from its event.
func (r *Recorder) RecordLease(herd.LeaseEvent, time.Duration) {}

// RecordShed does nothing.
func (r *Recorder) RecordShed(string, bool) {}

// RecordBreaker does nothing: breaker changes are logged from their events.
func (r *Recorder) RecordBreaker(bool) {}

// RecordEvent logs e unless its kind has used up its lines.
func (r *Recorder) RecordEvent(e herd.Event) {
	level, msg := slog.LevelWarn, ""
	switch e.Kind {
	case herd.EventLeaseLost:
		msg = "herd: lease expired before release; the load's write will be fenced"
	case herd.EventRefreshFailed:
		msg = "herd: background refresh failed; serving the old value until its hard TTL"
	case herd.EventBreakerOpened:
		msg = "herd: breaker opened; serving from the local tier"
	case herd.EventBreakerClosed:
		level, msg = slog.LevelInfo, "herd: breaker closed; remote tier answers again"
	default:
		level, msg = slog.LevelInfo, "herd: event"
	}
	ctx := context.Background()
	if !r.log.Enabled(ctx, level) {
		return
	}
	suppressed, ok := r.allow(e.Kind)
	if !ok {
		return
	}
	attrs := make([]slog.Attr, 0, 4)
	attrs = append(attrs, slog.String("kind", e.Kind.String()))
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
	if suppressed > 0 {
		attrs = append(attrs, slog.Int("suppressed", suppressed))
	}
	r.log.LogAttrs(ctx, level, msg, attrs...)
}

// allow takes a token of kind's bucket. It reports whether there was one
// and, if so, how many lines the bucket refused since its last token.
func (r *Recorder) allow(kind herd.EventKind) (suppressed int, ok bool) {
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
