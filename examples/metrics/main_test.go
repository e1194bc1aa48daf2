package main

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/herdcache/herd"
	"github.com/herdcache/herd/observe"
)

// missCounter is a observe.Recorder that closes reached at the at-th miss.
type missCounter struct {
	observe.NopRecorder
	n       atomic.Int64
	at      int64
	reached chan struct{}
}

func (m *missCounter) RecordGet(r observe.GetResult) {
	if r == observe.ResultMiss && m.n.Add(1) == m.at {
		close(m.reached)
	}
}

// gatedOrigin holds each id's call until that id's gate is closed, and
// sends the id on entered when a call starts.
type gatedOrigin struct {
	entered chan string
	gates   map[string]chan struct{}
}

func (g *gatedOrigin) fetch(ctx context.Context, id string) (string, error) {
	g.entered <- id
	select {
	case <-g.gates[id]:
		return "item " + id + "\n", nil
	case <-ctx.Done():
		return "", ctx.Err()
	}
}

func get(t *testing.T, url string) (int, http.Header, string) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Errorf("GET %s: %v", url, err)
		return 0, nil, ""
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Errorf("GET %s: %v", url, err)
	}
	return resp.StatusCode, resp.Header, string(b)
}

// TestStampedeMetrics fires 50 concurrent requests for one item over
// loopback HTTP while the origin is held, then one request that the limiter
// sheds, and checks what /metrics shows.
func TestStampedeMetrics(t *testing.T) {
	const n = 50
	origin := &gatedOrigin{
		entered: make(chan string, n+2),
		gates:   map[string]chan struct{}{"1": make(chan struct{}), "2": make(chan struct{})},
	}
	misses := &missCounter{at: n, reached: make(chan struct{})}
	s, err := newServer(config{origin: origin.fetch, recorder: misses, limit: 1, queueTimeout: 10 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.cache.Close(context.Background()) })
	ts := httptest.NewServer(s)
	defer ts.Close()

	// The stampede: n misses of item 1, let through once all have missed.
	var wg sync.WaitGroup
	for range n {
		wg.Go(func() {
			if code, _, body := get(t, ts.URL+"/item?id=1"); code != http.StatusOK || body != "item 1\n" {
				t.Errorf("item 1: %d %q", code, body)
			}
		})
	}
	<-misses.reached
	close(origin.gates["1"])
	wg.Wait()
	if len(origin.entered) != 1 || <-origin.entered != "1" {
		t.Fatalf("the stampede called the origin %d times, want once", len(origin.entered)+1)
	}

	// Item 2 holds the only limiter slot; item 3 waits queueTimeout for it
	// and is answered 503.
	wg.Go(func() {
		if code, _, body := get(t, ts.URL+"/item?id=2"); code != http.StatusOK || body != "item 2\n" {
			t.Errorf("item 2: %d %q", code, body)
		}
	})
	if id := <-origin.entered; id != "2" {
		t.Fatalf("origin called for %q, want 2", id)
	}
	if code, h, _ := get(t, ts.URL+"/item?id=3"); code != http.StatusServiceUnavailable || h.Get("Retry-After") != "1" {
		t.Errorf("item 3 while the origin is busy: %d, Retry-After %q; want 503, 1", code, h.Get("Retry-After"))
	}
	close(origin.gates["2"])
	wg.Wait()
	if len(origin.entered) != 0 {
		t.Errorf("origin also called for %q", <-origin.entered)
	}
	if code, _, _ := get(t, ts.URL+"/item"); code != http.StatusBadRequest {
		t.Errorf("/item without id: %d, want 400", code)
	}

	code, _, body := get(t, ts.URL+"/metrics")
	if code != http.StatusOK {
		t.Fatalf("/metrics: %d", code)
	}
	var found []string
	for line := range strings.Lines(body) {
		if strings.HasPrefix(line, "herd_") {
			found = append(found, strings.TrimSpace(line))
		}
	}
	hot := herd.RedactKey(herd.Key("item", "1"))
	for _, want := range []string{
		`herd_requests_total{cache="items",result="miss"} 52`,
		`herd_loads_total{cache="items",outcome="ok"} 2`, // one for the whole stampede
		`herd_key_concurrency_max{cache="items"} 1`,
		`herd_load_duration_seconds_count{cache="items"} 2`,
		`herd_limiter_limit{cache="items"} 1`,
		`herd_limiter_shed_total{cache="items",reason="queue-timeout"} 1`,
		`herd_limiter_shed_by_priority_total{cache="items",priority="normal"} 1`,
		`herd_queue_wait_seconds_count{cache="items"} 3`,
		`herd_hot_key_misses_total{cache="items",key="` + hot + `"} 50`,
		`herd_hot_key_loads_total{cache="items",key="` + hot + `"} 1`,
		`herd_degraded{cache="items"} 0`,
	} {
		if !contains(found, want) {
			t.Errorf("/metrics has no line %s", want)
		}
	}
	// Every caller but the first either joined its load or, arriving as it
	// ended, found its value.
	if !containsPrefix(found, `herd_coalesced_total{cache="items"} `) {
		t.Error("/metrics has no herd_coalesced_total")
	}
	if t.Failed() {
		t.Logf("herd lines:\n%s", strings.Join(found, "\n"))
	}
}

func contains(lines []string, s string) bool {
	for _, l := range lines {
		if l == s {
			return true
		}
	}
	return false
}

func containsPrefix(lines []string, p string) bool {
	for _, l := range lines {
		if strings.HasPrefix(l, p) {
			return true
		}
	}
	return false
}

func TestRunBadFlags(t *testing.T) {
	for _, args := range [][]string{{"-delay", "soon"}, {"-delay", "-1s"}, {"-nope"}} {
		var stderr bytes.Buffer
		if err := run(t.Context(), args, &stderr); err == nil {
			t.Errorf("run(%q) = nil, want an error", args)
		}
	}
}

// TestRunStops starts the command on a free loopback port and checks that it
// shuts down cleanly when its context ends.
func TestRunStops(t *testing.T) {
	ctx, cancel := context.WithCancel(t.Context())
	var stderr bytes.Buffer
	done := make(chan error, 1)
	go func() { done <- run(ctx, []string{"-addr", "127.0.0.1:0", "-delay", "0s"}, &stderr) }()
	cancel()
	if err := <-done; err != nil {
		t.Errorf("run: %v", err)
	}
}
