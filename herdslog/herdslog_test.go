package herdslog_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/herdcache/herd"
	"github.com/herdcache/herd/herdslog"
	"github.com/herdcache/herd/limiter"
	"github.com/herdcache/herd/memory"
	"github.com/herdcache/herd/observe"
)

// capture is a slog.Handler that keeps every record it is given.
type capture struct {
	level slog.Level
	mu    sync.Mutex
	lines []line
}

// withAttrs is a capture's handler after Logger.With.
type withAttrs struct {
	*capture
	attrs []slog.Attr
}

func (w withAttrs) WithAttrs(as []slog.Attr) slog.Handler {
	return withAttrs{w.capture, append(w.attrs[:len(w.attrs):len(w.attrs)], as...)}
}

func (w withAttrs) Handle(ctx context.Context, r slog.Record) error {
	r = r.Clone()
	r.AddAttrs(w.attrs...)
	return w.capture.Handle(ctx, r)
}

// line is a record flattened for comparison.
type line struct {
	level slog.Level
	msg   string
	attrs map[string]string
	req   any // the reqKey value of the context it was logged with
}

type reqKey struct{}

func (l line) String() string { return fmt.Sprintf("%v %q %v", l.level, l.msg, l.attrs) }

func (c *capture) Enabled(_ context.Context, l slog.Level) bool { return l >= c.level }
func (c *capture) WithAttrs(as []slog.Attr) slog.Handler        { return withAttrs{c, as} }
func (c *capture) WithGroup(string) slog.Handler                { return c }
func (c *capture) Handle(ctx context.Context, r slog.Record) error {
	l := line{level: r.Level, msg: r.Message, attrs: map[string]string{}, req: ctx.Value(reqKey{})}
	r.Attrs(func(a slog.Attr) bool {
		l.attrs[a.Key] = a.Value.String()
		return true
	})
	c.mu.Lock()
	defer c.mu.Unlock()
	c.lines = append(c.lines, l)
	return nil
}

// take returns the lines logged since the last call.
func (c *capture) take() []line {
	c.mu.Lock()
	defer c.mu.Unlock()
	l := c.lines
	c.lines = nil
	return l
}

func newRecorder(t *testing.T, o herdslog.Options) (*herdslog.Recorder, *capture) {
	t.Helper()
	h := &capture{level: slog.LevelDebug}
	r, err := herdslog.New(slog.New(h), o)
	if err != nil {
		t.Fatal(err)
	}
	return r, h
}

var (
	errOrigin = errors.New("origin down")
	errOOM    = errors.New("OOM command not allowed when used memory > 'maxmemory'")
)

func TestEvents(t *testing.T) {
	key := herd.Key("user", "tenant-7", "42")
	for _, c := range []struct {
		e     observe.Event
		level slog.Level
		msg   string // a part of the message
		attrs map[string]string
	}{
		{observe.Event{Kind: observe.EventLeaseLost, Key: key}, slog.LevelWarn, "lease expired",
			map[string]string{"kind": "lease-lost", "key": herd.RedactKey(key)}},
		{observe.Event{Kind: observe.EventRefreshFailed, Key: key, Err: errOrigin}, slog.LevelWarn, "refresh failed",
			map[string]string{"kind": "refresh-failed", "key": herd.RedactKey(key), "err": "origin down"}},
		{observe.Event{Kind: observe.EventBreakerOpened}, slog.LevelWarn, "breaker opened",
			map[string]string{"kind": "breaker-opened"}},
		{observe.Event{Kind: observe.EventBreakerClosed}, slog.LevelInfo, "breaker closed",
			map[string]string{"kind": "breaker-closed"}},
		{observe.Event{Kind: observe.EventWriteBackFailed, Key: key, Err: errOOM}, slog.LevelWarn, "write-back to the remote tier failed",
			map[string]string{"kind": "write-back-failed", "key": herd.RedactKey(key), "err": errOOM.Error()}},
		{observe.Event{Kind: observe.EventEncodeFailed, Key: key, Err: errOrigin}, slog.LevelWarn, "could not encode",
			map[string]string{"kind": "encode-failed", "key": herd.RedactKey(key), "err": "origin down"}},
		{observe.Event{Kind: 200}, slog.LevelInfo, "event",
			map[string]string{"kind": "unknown"}},
	} {
		r, h := newRecorder(t, herdslog.Options{})
		r.RecordEvent(c.e)
		got := h.take()
		if len(got) != 1 {
			t.Errorf("%v: %d lines, want 1", c.e.Kind, len(got))
			continue
		}
		l := got[0]
		if l.level != c.level || !strings.Contains(l.msg, c.msg) || !strings.HasPrefix(l.msg, "herd: ") || fmt.Sprint(l.attrs) != fmt.Sprint(c.attrs) {
			t.Errorf("%v: logged %v; want %v, a message with %q, %v", c.e.Kind, l, c.level, c.msg, c.attrs)
		}
	}
}

func TestKeyNames(t *testing.T) {
	key := herd.Key("user", "tenant-7", "42")
	r, h := newRecorder(t, herdslog.Options{KeyNames: true})
	r.RecordEvent(observe.Event{Kind: observe.EventLeaseLost, Key: key})
	if got := h.take(); len(got) != 1 || got[0].attrs["key"] != key {
		t.Errorf("logged %v, want key %q in full", got, key)
	}
	if strings.Contains(herd.RedactKey(key), "tenant-7") {
		t.Errorf("RedactKey(%q) = %q shows a part", key, herd.RedactKey(key))
	}
}

// TestRateLimit checks the token bucket of one kind: a burst, then one line
// per Interval/Burst, the count of refused lines on the next line logged,
// and buckets independent across kinds.
func TestRateLimit(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r, h := newRecorder(t, herdslog.Options{Burst: 3, Interval: 3 * time.Second})
		lost := observe.Event{Kind: observe.EventLeaseLost, Key: "k"}
		logs := func(n int) []line {
			for range n {
				r.RecordEvent(lost)
			}
			return h.take()
		}
		suppressed := func(ls []line) []string {
			var s []string
			for _, l := range ls {
				s = append(s, l.attrs["suppressed"])
			}
			return s
		}
		if got := logs(10); len(got) != 3 || fmt.Sprint(suppressed(got)) != "[  ]" {
			t.Fatalf("10 events at once: %v; want 3 lines without suppressed", got)
		}
		// Another kind has its own bucket.
		r.RecordEvent(observe.Event{Kind: observe.EventBreakerOpened})
		if got := h.take(); len(got) != 1 || got[0].attrs["suppressed"] != "" {
			t.Errorf("breaker event after lease-lost flood: %v; want 1 line", got)
		}

		time.Sleep(time.Second - 1)
		if got := logs(1); len(got) != 0 {
			t.Errorf("before a token came back: %v; want nothing", got)
		}
		time.Sleep(time.Nanosecond) // exactly one token back
		if got := logs(2); len(got) != 1 || got[0].attrs["suppressed"] != "8" {
			t.Errorf("one token back: %v; want 1 line with suppressed=8", got)
		}
		time.Sleep(time.Hour) // the bucket fills to Burst, no more
		if got := logs(5); fmt.Sprint(suppressed(got)) != "[1  ]" {
			t.Errorf("after a long quiet spell: %v; want 3 lines, the first with suppressed=1", got)
		}
	})
}

func TestDefaults(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r, h := newRecorder(t, herdslog.Options{})
		for range herdslog.DefaultBurst + 5 {
			r.RecordEvent(observe.Event{Kind: observe.EventRefreshFailed, Key: "k", Err: errOrigin})
		}
		if got := h.take(); len(got) != herdslog.DefaultBurst {
			t.Errorf("%d lines for %d events at once, want %d", len(got), herdslog.DefaultBurst+5, herdslog.DefaultBurst)
		}
		time.Sleep(herdslog.DefaultInterval / herdslog.DefaultBurst)
		r.RecordEvent(observe.Event{Kind: observe.EventRefreshFailed, Key: "k", Err: errOrigin})
		if got := h.take(); len(got) != 1 || got[0].attrs["suppressed"] != "5" {
			t.Errorf("after Interval/Burst: %v; want one line with suppressed=5", got)
		}
	})
}

// TestDisabledLevel checks that events the handler would drop take no
// tokens and do not count as suppressed.
func TestDisabledLevel(t *testing.T) {
	h := &capture{level: slog.LevelError}
	r, err := herdslog.New(slog.New(h), herdslog.Options{Burst: 1, Interval: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	opened := observe.Event{Kind: observe.EventBreakerOpened}
	r.RecordEvent(opened) // Warn, below the handler's level
	r.RecordEvent(opened)
	h.level = slog.LevelInfo
	r.RecordEvent(opened)
	if got := h.take(); len(got) != 1 || got[0].attrs["kind"] != "breaker-opened" || got[0].attrs["suppressed"] != "" {
		t.Errorf("logged %v, want one breaker-opened line without suppressed", got)
	}
}

func TestBadOptions(t *testing.T) {
	for _, o := range []herdslog.Options{{Burst: -1}, {Interval: -time.Second}} {
		if _, err := herdslog.New(nil, o); err == nil || !strings.HasPrefix(err.Error(), "herdslog: ") {
			t.Errorf("New(%+v) = %v, want a herdslog error", o, err)
		}
	}
	if r, err := herdslog.New(nil, herdslog.Options{}); err != nil || r == nil {
		t.Errorf("New(nil logger) = %v, %v", r, err)
	}
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

// TestWithCache drives a real cache through a failed refresh and a breaker
// that opens and closes, and checks the lines logged.
func TestWithCache(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		rec, h := newRecorder(t, herdslog.Options{})
		remote := memory.New()
		c := newCache(t, &herd.Options[string]{
			NoNearCache: true,
			MaxEntries:  10, SoftTTL: time.Second, HardTTL: time.Hour,
			Store: remote, Lease: remote, LeaseTTL: 10 * time.Second,
			BreakerThreshold: 1, BreakerCooldown: time.Second,
			Recorder: rec, Name: "items",
		})
		key := herd.Key("item", "1")
		good := func(context.Context) (string, error) { return "v", nil }
		bad := func(context.Context) (string, error) { return "", errOrigin }
		if _, err := c.Get(t.Context(), key, good); err != nil {
			t.Fatal(err)
		}
		time.Sleep(2 * time.Second)
		if v, err := c.Get(t.Context(), key, bad); v != "v" || err != nil { // stale; the refresh fails
			t.Fatalf("stale Get = %q, %v", v, err)
		}
		synctest.Wait()
		remote.SetDown(errors.New("connection refused"))
		if _, err := c.Get(t.Context(), "other", good); err != nil { // opens the breaker, loads locally
			t.Fatal(err)
		}
		remote.SetDown(nil)
		time.Sleep(2 * time.Second)
		if _, err := c.Get(t.Context(), "third", good); err != nil { // the probe succeeds
			t.Fatal(err)
		}
		got := h.take()
		want := []string{"refresh-failed " + herd.RedactKey(key) + " origin down", `breaker-opened  memory: load "other": connection refused`, "breaker-closed  "}
		levels := []slog.Level{slog.LevelWarn, slog.LevelWarn, slog.LevelInfo}
		if len(got) != len(want) {
			t.Fatalf("logged %v; want %v", got, want)
		}
		for i, l := range got {
			if s := l.attrs["kind"] + " " + l.attrs["key"] + " " + l.attrs["err"]; s != want[i] || l.level != levels[i] {
				t.Errorf("line %d: %v; want %v %q", i, l, levels[i], want[i])
			}
			if l.attrs["cache"] != "items" {
				t.Errorf("line %d: %v; want cache=items", i, l)
			}
		}
	})
}

// TestLeaseLostWithCache lets a lease expire under a running load while the
// remote refuses the watchdog's extensions, and checks the warning.
func TestLeaseLostWithCache(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		rec, h := newRecorder(t, herdslog.Options{})
		remote := memory.New()
		c := newCache(t, &herd.Options[string]{
			NoNearCache: true,
			NoBreaker:   true,
			MaxEntries:  10, SoftTTL: time.Hour,
			Store: remote, Lease: remote, LeaseTTL: 3 * time.Second,
			Recorder: rec, Name: "items",
		})
		key := herd.Key("item", "1")
		gate := make(chan struct{})
		done := make(chan error, 1)
		go func() {
			_, err := c.Get(context.Background(), key, func(context.Context) (string, error) {
				<-gate
				return "v", nil
			})
			done <- err
		}()
		synctest.Wait() // the load runs under the lease
		remote.SetDown(errors.New("connection refused"))
		time.Sleep(3500 * time.Millisecond) // extensions fail; the lease expires
		remote.SetDown(nil)
		time.Sleep(time.Second) // the next extension finds the lease gone
		close(gate)
		<-done
		got := h.take()
		if len(got) != 1 || got[0].level != slog.LevelWarn || got[0].attrs["kind"] != "lease-lost" || got[0].attrs["key"] != herd.RedactKey(key) {
			t.Errorf("logged %v; want one lease-lost warning for %s", got, herd.RedactKey(key))
		}
	})
}

// A load the limiter refuses is logged at Warn with its reason, under the
// shed kind's own bucket.
func TestShedWithCache(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		rec, h := newRecorder(t, herdslog.Options{Burst: 1, Interval: time.Hour})
		l, err := limiter.New(limiter.Options{Limit: 1, QueueTimeout: time.Second})
		if err != nil {
			t.Fatal(err)
		}
		c := newCache(t, &herd.Options[string]{MaxEntries: 10, SoftTTL: time.Hour, Limiter: l, Recorder: rec})
		gate := make(chan struct{})
		go c.Get(context.Background(), "held", func(context.Context) (string, error) { <-gate; return "v", nil })
		synctest.Wait()
		for range 3 {
			if _, err := c.Get(t.Context(), "other", func(context.Context) (string, error) { return "v", nil }); !errors.Is(err, herd.ErrOverloaded) {
				t.Fatalf("Get = %v, want ErrOverloaded", err)
			}
		}
		close(gate)
		synctest.Wait()
		got := h.take()
		if len(got) != 1 {
			t.Fatalf("logged %v; want one line (Burst 1)", got)
		}
		if l := got[0]; l.level != slog.LevelWarn || l.attrs["kind"] != "shed" || l.attrs["reason"] != limiter.ReasonQueueTimeout ||
			l.attrs["background"] != "false" || l.attrs["cache"] != "default" {
			t.Errorf("logged %v; want a Warn shed line with reason %s, background=false, cache=default", l, limiter.ReasonQueueTimeout)
		}
	})
}

// TestTraceWithCache drives a real cache through a miss, a hit, a not-found
// load and its negative entry, and a stale read and its refresh, and checks
// the Debug lines Options.Trace logs for them, and that none are logged
// without it.
func TestTraceWithCache(t *testing.T) {
	for _, trace := range []bool{true, false} {
		t.Run(fmt.Sprint("trace=", trace), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				rec, h := newRecorder(t, herdslog.Options{Trace: trace, Burst: 100})
				remote := memory.New()
				c := newCache(t, &herd.Options[string]{
					NoNearCache: true,
					NoBreaker:   true,
					MaxEntries:  10, SoftTTL: time.Second, HardTTL: time.Hour, NegativeTTL: time.Minute,
					Store: remote, Lease: remote, LeaseTTL: 10 * time.Second, Recorder: rec, Name: "items",
				})
				good := func(context.Context) (string, error) { return "v", nil }
				missing := func(context.Context) (string, error) { return "", herd.ErrNotFound }
				get := func(key string, load herd.LoadFunc[string]) {
					t.Helper()
					if _, err := c.Get(t.Context(), key, load); err != nil && !errors.Is(err, herd.ErrNotFound) {
						t.Fatal(err)
					}
					synctest.Wait()
				}
				get("a", good)       // miss: lease acquired, load ok
				get("a", good)       // hit
				get("gone", missing) // miss: lease acquired, load not-found
				get("gone", missing) // negative
				time.Sleep(2 * time.Second)
				get("a", good) // stale: a background refresh under the lease

				var got []string
				for _, l := range h.take() {
					if l.level != slog.LevelDebug || l.attrs["cache"] != "items" {
						t.Errorf("%v: want Debug, cache=items", l)
					}
					s := l.attrs["kind"] + " " + l.attrs["result"] + l.attrs["outcome"] + l.attrs["event"]
					if l.attrs["kind"] == "load" {
						s += " background=" + l.attrs["background"]
						if l.attrs["duration"] == "" {
							t.Errorf("%v: no duration", l)
						}
					}
					got = append(got, s)
				}
				want := []string{
					"get miss", "lease acquired", "load ok background=false",
					"get hit",
					"get miss", "lease acquired", "load not_found background=false",
					"get negative",
					"get stale", "lease acquired", "load ok background=true",
				}
				if !trace {
					want = nil
				}
				if fmt.Sprint(got) != fmt.Sprint(want) {
					t.Errorf("logged\n\t%q\nwant\n\t%q", got, want)
				}
			})
		})
	}
}

// A value the codec cannot encode is logged at Warn on each load, with the
// Get's context, rate-limited in the kind's own bucket; a write-back the
// remote tier refuses is logged at Warn with the Store's error.
func TestFailuresWithCache(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		rec, h := newRecorder(t, herdslog.Options{Burst: 2, Interval: time.Hour})
		remote := memory.New()
		c, err := herd.New(&herd.Options[float64]{
			NoNearCache: true,
			NoBreaker:   true,
			MaxEntries:  10, SoftTTL: time.Hour, Codec: herd.JSON[float64](),
			Store: remote, Lease: remote, LeaseTTL: 10 * time.Second,
			Recorder: rec, Name: "gauges",
		})
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close(context.Background())
		key := herd.Key("gauge", "tenant-7", "pressure")
		ctx := context.WithValue(t.Context(), reqKey{}, "request-1")
		inf := func(context.Context) (float64, error) { return math.Inf(1), nil }
		for range 3 {
			if v, err := c.Get(ctx, key, inf); !math.IsInf(v, 1) || err != nil {
				t.Fatalf("Get = %v, %v; want +Inf served", v, err)
			}
		}
		got := h.take()
		if len(got) != 2 {
			t.Fatalf("3 encode failures with Burst 2 logged %v; want 2 lines", got)
		}
		for i, l := range got {
			if l.level != slog.LevelWarn || l.attrs["kind"] != "encode-failed" || l.attrs["key"] != herd.RedactKey(key) ||
				l.attrs["cache"] != "gauges" || !strings.Contains(l.attrs["err"], "unsupported value") || l.req != "request-1" {
				t.Errorf("line %d: %v (context %v); want an encode-failed warning for %s in gauges with the codec's error and the Get's context",
					i, l, l.req, herd.RedactKey(key))
			}
		}

		other := herd.Key("gauge", "tenant-7", "flow")
		started, gate := make(chan struct{}), make(chan struct{})
		done := make(chan error, 1)
		go func() {
			_, err := c.Get(ctx, other, func(context.Context) (float64, error) {
				close(started)
				<-gate
				return 1.5, nil
			})
			done <- err
		}()
		<-started
		remote.SetDown(errOOM)
		close(gate)
		if err := <-done; err != nil {
			t.Fatal(err)
		}
		synctest.Wait() // the write-back has ended
		got = h.take()
		if len(got) != 1 || got[0].level != slog.LevelWarn || got[0].attrs["kind"] != "write-back-failed" ||
			got[0].attrs["key"] != herd.RedactKey(other) || !strings.Contains(got[0].attrs["err"], errOOM.Error()) {
			t.Errorf("logged %v; want one write-back-failed warning for %s with the Store's error", got, herd.RedactKey(other))
		}
	})
}
