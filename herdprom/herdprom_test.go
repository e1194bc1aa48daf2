package herdprom

import (
	"context"
	"errors"
	"fmt"
	"math"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/herdcache/herd"
	"github.com/herdcache/herd/limiter"
	"github.com/herdcache/herd/memory"
	"github.com/herdcache/herd/observe"
)

// newCache returns a cache that is closed when the test (or bubble) ends.
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

// stampede starts n Gets of key whose load waits for the returned release
// function, and returns once every caller is in the load or waiting for it.
// release lets the loads finish after d of fake time and waits for every
// caller. It runs in a synctest bubble.
func stampede(t *testing.T, c *herd.Cache[string], key string, n int) (release func(d time.Duration)) {
	t.Helper()
	gate := make(chan struct{})
	load := func(context.Context) (string, error) {
		<-gate
		return "v", nil
	}
	var wg sync.WaitGroup
	for range n {
		wg.Go(func() {
			if v, err := c.Get(context.Background(), key, load); v != "v" || err != nil {
				t.Errorf("Get(%q) = %q, %v", key, v, err)
			}
		})
	}
	synctest.Wait()
	return func(d time.Duration) {
		time.Sleep(d)
		close(gate)
		wg.Wait()
	}
}

// withHelp inserts, before every "# TYPE name" line of text, the HELP line of
// the family name as the Collector describes it.
func withHelp(t *testing.T, text string) string {
	t.Helper()
	var b strings.Builder
	for line := range strings.Lines(strings.TrimLeft(text, "\n")) {
		line = strings.TrimLeft(line, "\t")
		if name, ok := strings.CutPrefix(line, "# TYPE "); ok {
			name, _, _ = strings.Cut(name, " ")
			fmt.Fprintf(&b, "# HELP %s %s\n", name, help(t, name))
		}
		b.WriteString(line)
	}
	return b.String()
}

var descRE = regexp.MustCompile(`^Desc\{fqName: ("(?:[^"\\]|\\.)*"), help: ("(?:[^"\\]|\\.)*")`)

// help returns the help text of the family name.
func help(t *testing.T, name string) string {
	t.Helper()
	for _, f := range families {
		m := descRE.FindStringSubmatch(f.desc.String())
		if m == nil {
			t.Fatalf("cannot parse %v", f.desc)
		}
		if n, _ := strconv.Unquote(m[1]); n == name {
			h, _ := strconv.Unquote(m[2])
			return h
		}
	}
	t.Fatalf("no metric %s", name)
	return ""
}

func compare(t *testing.T, c prometheus.Collector, want string, names ...string) {
	t.Helper()
	if err := testutil.CollectAndCompare(c, strings.NewReader(withHelp(t, want)), names...); err != nil {
		t.Error(err)
	}
}

// loadBuckets is the cumulative bucket lines of herd_load_duration_seconds
// for cache with n observations of 0 and m of 100ms.
func loadBuckets(cache string, n, m int) string {
	var b strings.Builder
	for _, le := range []string{"0.0001", "0.00025", "0.0005", "0.001", "0.0025", "0.005", "0.01", "0.025", "0.05"} {
		fmt.Fprintf(&b, "herd_load_duration_seconds_bucket{cache=%q,le=%q} %d\n", cache, le, n)
	}
	for _, le := range []string{"0.1", "0.25", "0.5", "1", "2.5", "5", "10", "30", "60", "+Inf"} {
		fmt.Fprintf(&b, "herd_load_duration_seconds_bucket{cache=%q,le=%q} %d\n", cache, le, n+m)
	}
	fmt.Fprintf(&b, "herd_load_duration_seconds_sum{cache=%q} %g\n", cache, float64(m)*0.1)
	fmt.Fprintf(&b, "herd_load_duration_seconds_count{cache=%q} %d\n", cache, n+m)
	return b.String()
}

// TestStampede builds a known state in two real caches, one coalescing and
// one not, and checks the exposition of both through one Collector.
func TestStampede(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		on := newCache(t, &herd.Options[string]{Name: "on", MaxEntries: 100, SoftTTL: time.Hour, HotKeys: 4})
		off := newCache(t, &herd.Options[string]{Name: "off", MaxEntries: 100, SoftTTL: time.Hour, HotKeys: 4, DisableCoalescing: true})
		col, err := New(on, off)
		if err != nil {
			t.Fatal(err)
		}
		a, b := herd.Key("item", "a"), herd.Key("item", "b")

		// One miss and five hits of a on the coalescing cache.
		load := func(context.Context) (string, error) { return "v", nil }
		for range 6 {
			if _, err := on.Get(t.Context(), a, load); err != nil {
				t.Fatal(err)
			}
		}
		// 1,000 concurrent misses of b on each cache, held in their loads.
		const n = 1000
		releaseOn := stampede(t, on, b, n)
		releaseOff := stampede(t, off, b, n)
		compare(t, col, `
			# TYPE herd_key_concurrency gauge
			herd_key_concurrency{cache="off"} 1000
			herd_key_concurrency{cache="on"} 1
			# TYPE herd_key_concurrency_max gauge
			herd_key_concurrency_max{cache="off"} 1000
			herd_key_concurrency_max{cache="on"} 1
			# TYPE herd_loads_running gauge
			herd_loads_running{cache="off"} 1000
			herd_loads_running{cache="on"} 1
			# TYPE herd_in_flight gauge
			herd_in_flight{cache="off"} 0
			herd_in_flight{cache="on"} 1
			`, "herd_key_concurrency", "herd_key_concurrency_max", "herd_loads_running", "herd_in_flight")

		releaseOn(100 * time.Millisecond)
		releaseOff(0) // the same instant: these loads also took 100ms
		compare(t, col, `
			# TYPE herd_requests_total counter
			herd_requests_total{cache="off",result="hit"} 0
			herd_requests_total{cache="off",result="miss"} 1000
			herd_requests_total{cache="off",result="negative"} 0
			herd_requests_total{cache="off",result="stale"} 0
			herd_requests_total{cache="on",result="hit"} 5
			herd_requests_total{cache="on",result="miss"} 1001
			herd_requests_total{cache="on",result="negative"} 0
			herd_requests_total{cache="on",result="stale"} 0
			# TYPE herd_loads_total counter
			herd_loads_total{cache="off",outcome="error"} 0
			herd_loads_total{cache="off",outcome="not_found"} 0
			herd_loads_total{cache="off",outcome="ok"} 1000
			herd_loads_total{cache="on",outcome="error"} 0
			herd_loads_total{cache="on",outcome="not_found"} 0
			herd_loads_total{cache="on",outcome="ok"} 2
			# TYPE herd_coalesced_total counter
			herd_coalesced_total{cache="off"} 0
			herd_coalesced_total{cache="on"} 999
			# TYPE herd_key_concurrency gauge
			herd_key_concurrency{cache="off"} 0
			herd_key_concurrency{cache="on"} 0
			# TYPE herd_key_concurrency_max gauge
			herd_key_concurrency_max{cache="off"} 1000
			herd_key_concurrency_max{cache="on"} 1
			# TYPE herd_loads_running gauge
			herd_loads_running{cache="off"} 0
			herd_loads_running{cache="on"} 0
			# TYPE herd_degraded gauge
			herd_degraded{cache="off"} 0
			herd_degraded{cache="on"} 0
			# TYPE herd_load_duration_seconds histogram
			`+loadBuckets("off", 0, n)+loadBuckets("on", 1, 1),
			"herd_requests_total", "herd_loads_total", "herd_coalesced_total",
			"herd_key_concurrency", "herd_key_concurrency_max",
			"herd_loads_running", "herd_degraded", "herd_load_duration_seconds")

		// Hot keys: misses, loads and stale serves are exact here (two keys,
		// far fewer than the tracked slots); requests include sampled hits.
		ra, rb := herd.RedactKey(a), herd.RedactKey(b)
		compare(t, col, fmt.Sprintf(`
			# TYPE herd_hot_key_misses_total counter
			herd_hot_key_misses_total{cache="off",key=%[2]q} 1000
			herd_hot_key_misses_total{cache="on",key=%[1]q} 1
			herd_hot_key_misses_total{cache="on",key=%[2]q} 1000
			# TYPE herd_hot_key_loads_total counter
			herd_hot_key_loads_total{cache="off",key=%[2]q} 1000
			herd_hot_key_loads_total{cache="on",key=%[1]q} 1
			herd_hot_key_loads_total{cache="on",key=%[2]q} 1
			# TYPE herd_hot_key_stale_total counter
			herd_hot_key_stale_total{cache="off",key=%[2]q} 0
			herd_hot_key_stale_total{cache="on",key=%[1]q} 0
			herd_hot_key_stale_total{cache="on",key=%[2]q} 0
			`, ra, rb),
			"herd_hot_key_misses_total", "herd_hot_key_loads_total", "herd_hot_key_stale_total")
		if n := testutil.CollectAndCount(col, "herd_hot_key_traffic_total"); n != 3 {
			t.Errorf("%d herd_hot_key_traffic_total series, want 3", n)
		}
	})
}

// TestWriteBackFailures checks herd_write_back_failures_total of a real
// cache: a value the JSON codec cannot encode, loaded twice, and a value
// whose write-back the remote tier refused. Its labels are the cache and
// the reason only: keys, their namespaces included, label no series but
// the hot keys'.
func TestWriteBackFailures(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		remote := memory.New()
		c, err := herd.New(&herd.Options[float64]{
			NoNearCache: true,
			NoBreaker:   true,
			Name:        "gauges", MaxEntries: 10, SoftTTL: time.Hour, Codec: herd.JSON[float64](),
			Store: remote, Lease: remote, LeaseTTL: 10 * time.Second,
		})
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close(context.Background())
		col, err := New(c)
		if err != nil {
			t.Fatal(err)
		}
		inf := func(context.Context) (float64, error) { return math.Inf(1), nil }
		for range 2 {
			if v, err := c.Get(t.Context(), herd.Key("gauge", "pressure"), inf); !math.IsInf(v, 1) || err != nil {
				t.Fatalf("Get = %v, %v; want +Inf served", v, err)
			}
		}
		started, gate := make(chan struct{}), make(chan struct{})
		done := make(chan error, 1)
		go func() {
			_, err := c.Get(t.Context(), herd.Key("gauge", "flow"), func(context.Context) (float64, error) {
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
		compare(t, col, `
			# TYPE herd_write_back_failures_total counter
			herd_write_back_failures_total{cache="gauges",reason="encode"} 2
			herd_write_back_failures_total{cache="gauges",reason="write"} 1
			# TYPE herd_encode_errors_total counter
			herd_encode_errors_total{cache="gauges"} 2
			`, "herd_write_back_failures_total", "herd_encode_errors_total")
	})
}

// TestLimiter checks the limiter metrics of a real cache whose second load
// was shed after waiting out the queue timeout.
func TestLimiter(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		l, err := limiter.New(limiter.Options{Limit: 1, QueueTimeout: time.Second})
		if err != nil {
			t.Fatal(err)
		}
		c := newCache(t, &herd.Options[string]{MaxEntries: 10, SoftTTL: time.Hour, Limiter: l})
		col, err := New(c)
		if err != nil {
			t.Fatal(err)
		}
		release := stampede(t, c, "x", 1) // holds the only slot
		if _, err := c.Get(t.Context(), "y", func(context.Context) (string, error) { return "", nil }); !herd.WriteOverloaded(discard{}, err) {
			t.Fatalf("Get(y) = %v, want ErrOverloaded", err)
		}
		compare(t, col, `
			# TYPE herd_limiter_in_use gauge
			herd_limiter_in_use{cache="default"} 1
			# TYPE herd_limiter_limit gauge
			herd_limiter_limit{cache="default"} 1
			# TYPE herd_limiter_waiting gauge
			herd_limiter_waiting{cache="default"} 0
			# TYPE herd_limiter_acquired_total counter
			herd_limiter_acquired_total{cache="default"} 1
			# TYPE herd_limiter_max_in_use gauge
			herd_limiter_max_in_use{cache="default"} 1
			# TYPE herd_shed_total counter
			herd_shed_total{cache="default"} 1
			# TYPE herd_limiter_shed_total counter
			herd_limiter_shed_total{cache="default",reason="latency"} 0
			herd_limiter_shed_total{cache="default",reason="queue-full"} 0
			herd_limiter_shed_total{cache="default",reason="queue-timeout"} 1
			herd_limiter_shed_total{cache="default",reason="reserve"} 0
			# TYPE herd_limiter_shed_by_priority_total counter
			herd_limiter_shed_by_priority_total{cache="default",priority="background"} 0
			herd_limiter_shed_by_priority_total{cache="default",priority="high"} 0
			herd_limiter_shed_by_priority_total{cache="default",priority="low"} 0
			herd_limiter_shed_by_priority_total{cache="default",priority="normal"} 1
			# TYPE herd_queue_wait_seconds histogram
			herd_queue_wait_seconds_bucket{cache="default",le="0.0001"} 1
			herd_queue_wait_seconds_bucket{cache="default",le="0.00025"} 1
			herd_queue_wait_seconds_bucket{cache="default",le="0.0005"} 1
			herd_queue_wait_seconds_bucket{cache="default",le="0.001"} 1
			herd_queue_wait_seconds_bucket{cache="default",le="0.0025"} 1
			herd_queue_wait_seconds_bucket{cache="default",le="0.005"} 1
			herd_queue_wait_seconds_bucket{cache="default",le="0.01"} 1
			herd_queue_wait_seconds_bucket{cache="default",le="0.025"} 1
			herd_queue_wait_seconds_bucket{cache="default",le="0.05"} 1
			herd_queue_wait_seconds_bucket{cache="default",le="0.1"} 1
			herd_queue_wait_seconds_bucket{cache="default",le="0.25"} 1
			herd_queue_wait_seconds_bucket{cache="default",le="0.5"} 1
			herd_queue_wait_seconds_bucket{cache="default",le="1"} 2
			herd_queue_wait_seconds_bucket{cache="default",le="2.5"} 2
			herd_queue_wait_seconds_bucket{cache="default",le="5"} 2
			herd_queue_wait_seconds_bucket{cache="default",le="10"} 2
			herd_queue_wait_seconds_bucket{cache="default",le="30"} 2
			herd_queue_wait_seconds_bucket{cache="default",le="60"} 2
			herd_queue_wait_seconds_bucket{cache="default",le="+Inf"} 2
			herd_queue_wait_seconds_sum{cache="default"} 1
			herd_queue_wait_seconds_count{cache="default"} 2
			`, "herd_limiter_in_use", "herd_limiter_limit", "herd_limiter_waiting", "herd_limiter_acquired_total",
			"herd_limiter_max_in_use", "herd_shed_total", "herd_limiter_shed_total", "herd_limiter_shed_by_priority_total", "herd_queue_wait_seconds")
		release(0)
	})
}

// TestNoLimiterNoLimiterMetrics checks that a cache without a limiter
// exports no limiter metrics rather than a limit of zero.
func TestNoLimiterNoLimiterMetrics(t *testing.T) {
	c := newCache(t, &herd.Options[string]{MaxEntries: 10, SoftTTL: time.Hour})
	col, err := New(c)
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"herd_limiter_limit", "herd_limiter_shed_total", "herd_queue_wait_seconds"} {
		if n := testutil.CollectAndCount(col, name); n != 0 {
			t.Errorf("%d %s series without a limiter, want 0", n, name)
		}
	}
	if n := testutil.CollectAndCount(col, "herd_requests_total"); n != 4 {
		t.Errorf("%d herd_requests_total series, want 4", n)
	}
}

type discard struct{}

func (discard) Header() http.Header         { return http.Header{} }
func (discard) Write(b []byte) (int, error) { return len(b), nil }
func (discard) WriteHeader(int)             {}

// fakeSource returns a fixed snapshot under the name c.
type fakeSource observe.Stats

func (f *fakeSource) Name() string         { return "c" }
func (f *fakeSource) Stats() observe.Stats { return observe.Stats(*f) }

// named is a Source under another name.
type named struct {
	*fakeSource
	name string
}

func (n named) Name() string { return n.name }

// fullStats gives every field its own value, so a field exported under the
// wrong name shows.
func fullStats() *fakeSource {
	h := func(sum time.Duration) observe.Histogram {
		return observe.Histogram{
			Bounds: []time.Duration{time.Millisecond, time.Second},
			Counts: []uint64{1, 2, 3},
			Sum:    sum, Count: 6,
		}
	}
	return &fakeSource{
		Hits: 1, Misses: 2, NegativeHits: 3, StaleServed: 4, StaleIfError: 5,
		EarlyRefreshes: 6, StaleRefreshes: 7, RefreshFailures: 8,
		Loads: 66, LoadsNotFound: 46, LoadErrors: 9, Coalesced: 10,
		LeaseAcquired: 11, LeaseContended: 12, LeaseWaitTimeouts: 13, LeaseExtended: 14,
		LeaseLost: 15, WokenByPush: 16, WokenByPoll: 17, FencedWrites: 18,
		RemoteHits: 40, RemoteWaits: 43, Revalidations: 44, AheadRefreshes: 45, Shed: 19, RemoteErrors: 21, DecodeErrors: 22, EncodeErrors: 23,
		WriteBackErrors: 48, LeaseWaitsAbandoned: 49, LocalWeight: 51,
		LeaseHoldsHeard: 52, LeaseAttemptsSkipped: 53, NoticeValuesAdopted: 54, NoticeValuesRefused: 55,
		InFlight: 24, LoadsRunning: 25, KeyConcurrency: 26, KeyConcurrencyMax: 27,
		Limiter: observe.LimiterStats{Limit: 28, InUse: 29, Waiting: 30, Stats: limiter.Stats{
			Acquired: 31, ShedQueueTimeout: 32, ShedQueueFull: 33, ShedReserve: 34, ShedLatency: 50, Latency: 250 * time.Millisecond, NoLoadLatency: 125 * time.Millisecond,
			ShedLow: 35, ShedNormal: 36, ShedHigh: 37, ShedBackground: 38,
			Canceled: 41, MaxInUse: 42, QueueWait: 2500 * time.Millisecond, QueueWaits: 47,
		}},
		HotKeys: []observe.HotKey{
			{Key: "item#0000000a", Traffic: 100, Misses: 40, Loads: 2, Stale: 3, Error: 4},
			{Key: "user#0000000b", Traffic: 50, Misses: 5, Loads: 1, Stale: 0, Error: 0},
		},
		LoadDuration: h(10 * time.Second),
		LeaseWait:    h(20 * time.Second),
		QueueWait:    h(30 * time.Second),
		Degraded:     true, DegradedTime: 1500 * time.Millisecond, BreakerOpens: 39,
	}
}

// TestEveryField checks the whole exposition of a snapshot whose fields all
// differ, through a pedantic registry (which checks Collect against
// Describe).
func TestEveryField(t *testing.T) {
	col, err := New(fullStats())
	if err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(col)
	want := `
		# TYPE herd_requests_total counter
		herd_requests_total{cache="c",result="hit"} 1
		herd_requests_total{cache="c",result="miss"} 2
		herd_requests_total{cache="c",result="negative"} 3
		herd_requests_total{cache="c",result="stale"} 4
		# TYPE herd_remote_hits_total counter
		herd_remote_hits_total{cache="c"} 40
		# TYPE herd_remote_waits_total counter
		herd_remote_waits_total{cache="c"} 43
		# TYPE herd_revalidations_total counter
		herd_revalidations_total{cache="c"} 44
		# TYPE herd_notice_values_total counter
		herd_notice_values_total{cache="c",outcome="adopted"} 54
		herd_notice_values_total{cache="c",outcome="refused"} 55
		# TYPE herd_stale_if_error_total counter
		herd_stale_if_error_total{cache="c"} 5
		# TYPE herd_refreshes_total counter
		herd_refreshes_total{cache="c",kind="ahead"} 45
		herd_refreshes_total{cache="c",kind="early"} 6
		herd_refreshes_total{cache="c",kind="stale"} 7
		# TYPE herd_refresh_failures_total counter
		herd_refresh_failures_total{cache="c"} 8
		# TYPE herd_loads_total counter
		herd_loads_total{cache="c",outcome="error"} 9
		herd_loads_total{cache="c",outcome="not_found"} 46
		herd_loads_total{cache="c",outcome="ok"} 11
		# TYPE herd_coalesced_total counter
		herd_coalesced_total{cache="c"} 10
		# TYPE herd_lease_events_total counter
		herd_lease_events_total{cache="c",event="acquired"} 11
		herd_lease_events_total{cache="c",event="attempt_skipped"} 53
		herd_lease_events_total{cache="c",event="contended"} 12
		herd_lease_events_total{cache="c",event="extended"} 14
		herd_lease_events_total{cache="c",event="fenced_write"} 18
		herd_lease_events_total{cache="c",event="hold_heard"} 52
		herd_lease_events_total{cache="c",event="lost"} 15
		herd_lease_events_total{cache="c",event="wait_abandoned"} 49
		herd_lease_events_total{cache="c",event="wait_timeout"} 13
		# TYPE herd_lease_wakeups_total counter
		herd_lease_wakeups_total{cache="c",woken_by="poll"} 17
		herd_lease_wakeups_total{cache="c",woken_by="push"} 16
		# TYPE herd_remote_errors_total counter
		herd_remote_errors_total{cache="c"} 21
		# TYPE herd_decode_errors_total counter
		herd_decode_errors_total{cache="c"} 22
		# TYPE herd_encode_errors_total counter
		herd_encode_errors_total{cache="c"} 23
		# TYPE herd_write_back_failures_total counter
		herd_write_back_failures_total{cache="c",reason="encode"} 23
		herd_write_back_failures_total{cache="c",reason="write"} 48
		# TYPE herd_in_flight gauge
		herd_in_flight{cache="c"} 24
		# TYPE herd_local_weight gauge
		herd_local_weight{cache="c"} 51
		# TYPE herd_loads_running gauge
		herd_loads_running{cache="c"} 25
		# TYPE herd_key_concurrency gauge
		herd_key_concurrency{cache="c"} 26
		# TYPE herd_key_concurrency_max gauge
		herd_key_concurrency_max{cache="c"} 27
		# TYPE herd_limiter_limit gauge
		herd_limiter_limit{cache="c"} 28
		# TYPE herd_limiter_in_use gauge
		herd_limiter_in_use{cache="c"} 29
		# TYPE herd_limiter_waiting gauge
		herd_limiter_waiting{cache="c"} 30
		# TYPE herd_limiter_acquired_total counter
		herd_limiter_acquired_total{cache="c"} 31
		# TYPE herd_limiter_canceled_total counter
		herd_limiter_canceled_total{cache="c"} 41
		# TYPE herd_limiter_max_in_use gauge
		herd_limiter_max_in_use{cache="c"} 42
		# TYPE herd_limiter_queue_wait_seconds_total counter
		herd_limiter_queue_wait_seconds_total{cache="c"} 2.5
		# TYPE herd_limiter_queue_waits_total counter
		herd_limiter_queue_waits_total{cache="c"} 47
		# TYPE herd_limiter_latency_seconds gauge
		herd_limiter_latency_seconds{cache="c"} 0.25
		# TYPE herd_limiter_no_load_latency_seconds gauge
		herd_limiter_no_load_latency_seconds{cache="c"} 0.125
		# TYPE herd_shed_total counter
		herd_shed_total{cache="c"} 19
		# TYPE herd_limiter_shed_total counter
		herd_limiter_shed_total{cache="c",reason="latency"} 50
		herd_limiter_shed_total{cache="c",reason="queue-full"} 33
		herd_limiter_shed_total{cache="c",reason="queue-timeout"} 32
		herd_limiter_shed_total{cache="c",reason="reserve"} 34
		# TYPE herd_limiter_shed_by_priority_total counter
		herd_limiter_shed_by_priority_total{cache="c",priority="background"} 38
		herd_limiter_shed_by_priority_total{cache="c",priority="high"} 37
		herd_limiter_shed_by_priority_total{cache="c",priority="low"} 35
		herd_limiter_shed_by_priority_total{cache="c",priority="normal"} 36
		# TYPE herd_degraded gauge
		herd_degraded{cache="c"} 1
		# TYPE herd_breaker_opens_total counter
		herd_breaker_opens_total{cache="c"} 39
		# TYPE herd_degraded_time_seconds_total counter
		herd_degraded_time_seconds_total{cache="c"} 1.5
		# TYPE herd_hot_key_traffic_total counter
		herd_hot_key_traffic_total{cache="c",key="item#0000000a"} 100
		herd_hot_key_traffic_total{cache="c",key="user#0000000b"} 50
		# TYPE herd_hot_key_error gauge
		herd_hot_key_error{cache="c",key="item#0000000a"} 4
		herd_hot_key_error{cache="c",key="user#0000000b"} 0
		# TYPE herd_hot_key_misses_total counter
		herd_hot_key_misses_total{cache="c",key="item#0000000a"} 40
		herd_hot_key_misses_total{cache="c",key="user#0000000b"} 5
		# TYPE herd_hot_key_loads_total counter
		herd_hot_key_loads_total{cache="c",key="item#0000000a"} 2
		herd_hot_key_loads_total{cache="c",key="user#0000000b"} 1
		# TYPE herd_hot_key_stale_total counter
		herd_hot_key_stale_total{cache="c",key="item#0000000a"} 3
		herd_hot_key_stale_total{cache="c",key="user#0000000b"} 0
		`
	for _, h := range []struct {
		name string
		sum  int
	}{{"herd_load_duration_seconds", 10}, {"herd_lease_wait_seconds", 20}, {"herd_queue_wait_seconds", 30}} {
		want += fmt.Sprintf(`
		# TYPE %[1]s histogram
		%[1]s_bucket{cache="c",le="0.001"} 1
		%[1]s_bucket{cache="c",le="1"} 3
		%[1]s_bucket{cache="c",le="+Inf"} 6
		%[1]s_sum{cache="c"} %[2]d
		%[1]s_count{cache="c"} 6
		`, h.name, h.sum)
	}
	if err := testutil.GatherAndCompare(reg, strings.NewReader(withHelp(t, want))); err != nil {
		t.Error(err)
	}
	if n, err := testutil.GatherAndCount(reg); err != nil || n != 74 {
		t.Errorf("GatherAndCount = %d, %v; want 74 series", n, err)
	}
}

// TestLint runs promlint over every metric the Collector exports.
func TestLint(t *testing.T) {
	col, err := New(fullStats())
	if err != nil {
		t.Fatal(err)
	}
	problems, err := testutil.CollectAndLint(col)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range problems {
		t.Errorf("%s: %s", p.Metric, p.Text)
	}
	if n := testutil.CollectAndCount(col); n != 74 {
		t.Errorf("%d series linted, want 74", n)
	}
}

// TestRegisterMany checks that one registry gathers several caches from one
// Collector, caches added after registration included, and that a second
// Collector is refused by the registry.
func TestRegisterMany(t *testing.T) {
	col, err := New(named{fullStats(), "a"}, named{fullStats(), "b"})
	if err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(col)
	if err := col.Add(fullStats()); err != nil {
		t.Fatal(err)
	}
	if n, err := testutil.GatherAndCount(reg, "herd_requests_total"); err != nil || n != 12 {
		t.Errorf("GatherAndCount = %d, %v; want 12 (3 caches × 4 results)", n, err)
	}
	other, err := New(named{fullStats(), "d"})
	if err != nil {
		t.Fatal(err)
	}
	if err := reg.Register(other); err == nil {
		t.Error("a second Collector registered in one registry; want an error")
	}
}

func TestBadInput(t *testing.T) {
	if _, err := New(nil); err == nil || !strings.HasPrefix(err.Error(), "herdprom: ") {
		t.Errorf("New with a nil Source: %v, want a herdprom error", err)
	}
	if _, err := New(fullStats(), nil); err == nil {
		t.Error("New with a nil Source among others: no error")
	}
	if _, err := New(fullStats(), named{fullStats(), "c"}); err == nil || !strings.Contains(err.Error(), "twice") {
		t.Errorf("New with two caches named c: %v, want an error", err)
	}
	col, err := New(named{fullStats(), ""})
	if err != nil {
		t.Fatal(err)
	}
	if err := col.Add(named{fullStats(), DefaultName}); err == nil || !strings.Contains(err.Error(), "twice") {
		t.Errorf("Add of a name in use (the empty name is %q): %v", DefaultName, err)
	}
	if err := col.Add(fullStats()); err != nil {
		t.Errorf("Add: %v", err)
	}
	var zero Collector
	if err := zero.Add(fullStats()); err != nil {
		t.Errorf("Add to a zero Collector: %v", err)
	}
	if n := testutil.CollectAndCount(&zero, "herd_coalesced_total"); n != 1 {
		t.Errorf("zero Collector exports %d series, want 1", n)
	}
}

// TestBadHistogram checks that a histogram the core could not have made
// fails the scrape with an error instead of a panic or a wrong exposition,
// and that the zero Histogram is an empty one.
func TestBadHistogram(t *testing.T) {
	for name, h := range map[string]observe.Histogram{
		"bounds not ascending": {Bounds: []time.Duration{time.Second, time.Second}, Counts: []uint64{1, 1, 0}, Count: 2},
		"counts short":         {Bounds: []time.Duration{time.Second}, Counts: []uint64{1}, Count: 1},
		"count wrong":          {Bounds: []time.Duration{time.Second}, Counts: []uint64{1, 1}, Count: 1},
		"count without counts": {Count: 1},
	} {
		s := fullStats()
		s.LoadDuration = h
		col, err := New(s)
		if err != nil {
			t.Fatal(err)
		}
		reg := prometheus.NewRegistry()
		reg.MustRegister(col)
		if _, err := reg.Gather(); err == nil || !strings.Contains(err.Error(), "herdprom: ") {
			t.Errorf("%s: Gather = %v, want a herdprom error", name, err)
		}
	}
	s := fullStats()
	s.LoadDuration = observe.Histogram{}
	col, err := New(s)
	if err != nil {
		t.Fatal(err)
	}
	compare(t, col, `
		# TYPE herd_load_duration_seconds histogram
		herd_load_duration_seconds_bucket{cache="c",le="+Inf"} 0
		herd_load_duration_seconds_sum{cache="c"} 0
		herd_load_duration_seconds_count{cache="c"} 0
		`, "herd_load_duration_seconds")
}
