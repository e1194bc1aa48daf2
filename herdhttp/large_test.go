package herdhttp_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/herdcache/herd/herdhttp"
)

// loopback is a proxy in front of an origin, each a real server on
// 127.0.0.1.
type loopback struct {
	proxy *httptest.Server
	h     *herdhttp.Handler
}

func newLoopback(t *testing.T, o *herdhttp.Options, origin http.Handler) *loopback {
	t.Helper()
	up := httptest.NewServer(origin)
	t.Cleanup(up.Close)
	u, err := url.Parse(up.URL)
	if err != nil {
		t.Fatal(err)
	}
	lb := &loopback{}
	if lb.h, err = herdhttp.NewProxy(u, o); err != nil {
		t.Fatal(err)
	}
	lb.proxy = httptest.NewServer(lb.h)
	t.Cleanup(lb.proxy.Close)
	t.Cleanup(func() { lb.h.Close(context.Background()) })
	return lb
}

// get fetches path from the proxy and returns its body's length and its
// Cache-Status.
func (lb *loopback) get(t *testing.T, path string) (int, string) {
	t.Helper()
	resp, err := lb.proxy.Client().Get(lb.proxy.URL + path)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	n, err := io.Copy(io.Discard, resp.Body)
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("GET %s: %d, %v", path, resp.StatusCode, err)
	}
	return int(n), resp.Header.Get("Cache-Status")
}

// sizedOrigin answers /N with N bytes and their Content-Length, fresh
// for a minute, and counts the requests for each path.
type sizedOrigin struct {
	mu    sync.Mutex
	calls map[string]int
}

func (o *sizedOrigin) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	o.mu.Lock()
	if o.calls == nil {
		o.calls = map[string]int{}
	}
	o.calls[r.URL.Path]++
	o.mu.Unlock()
	n, _ := strconv.Atoi(strings.TrimPrefix(r.URL.Path, "/"))
	w.Header().Set("Cache-Control", "max-age=60")
	w.Header().Set("Content-Length", strconv.Itoa(n))
	w.Write(make([]byte, n))
}

func (o *sizedOrigin) called(path string) int {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.calls[path]
}

// A body up to a quarter of MaxBytes that is answered as stored is
// served from the cache next time, even when the local tier is full of
// smaller responses read more often; a larger one is not answered as
// stored, and is passed.
func TestLargeBodyKept(t *testing.T) {
	const budget = 512 << 10
	origin := &sizedOrigin{}
	lb := newLoopback(t, &herdhttp.Options{MaxBytes: budget, MaxBodyBytes: budget}, origin)
	// Small responses, each read a few times, fill the tier past its
	// bound: otter's victims are read more often than a new response.
	for i := range budget / 900 {
		p := fmt.Sprintf("/%d?fill=%d", 1000, i)
		for range 5 {
			lb.get(t, p)
		}
	}
	var large []string
	for _, n := range []int{budget/4 - 4<<10, budget / 8, budget / 16} {
		p := "/" + strconv.Itoa(n)
		if got, cs := lb.get(t, p); got != n || !stored(cs) {
			t.Fatalf("GET %s: %d bytes, Cache-Status %q; want it stored", p, got, cs)
		}
		large = append(large, p)
		// Reading the tier's weight runs otter's pending maintenance,
		// where it would drop a response it does not admit.
		if w := lb.h.LocalWeight(); w > budget {
			t.Errorf("the local tier holds %d bytes; want at most %d", w, budget)
		}
	}
	for _, p := range large {
		if _, cs := lb.get(t, p); !strings.Contains(cs, "hit") {
			t.Errorf("GET %s again: Cache-Status %q; want a hit", p, cs)
		}
		if n := origin.called(p); n != 1 {
			t.Errorf("the origin was asked %d times for %s; want once", n, p)
		}
	}
	huge := fmt.Sprintf("/%d", budget/4+1)
	if _, cs := lb.get(t, huge); stored(cs) {
		t.Errorf("GET %s (over a quarter of MaxBytes): Cache-Status %q; want it not stored", huge, cs)
	}
	if _, cs := lb.get(t, huge); !strings.Contains(cs, "hit-for-pass") {
		t.Errorf("GET %s again: Cache-Status %q; want hit-for-pass", huge, cs)
	}
}

// stored reports whether a Cache-Status says the response was stored.
func stored(cacheStatus string) bool {
	for p := range strings.SplitSeq(cacheStatus, ";") {
		if strings.TrimSpace(p) == "stored" {
			return true
		}
	}
	return false
}

// Many distinct misses of large bodies, from several clients at once,
// leave the process's live heap within 1.5× MaxBytes plus a fixed
// allowance (boundSlack: the servers, the clients and their idle
// connections' buffers), where the bodies fetched add up to six times
// the budget: the bound is on memory, not on the tier's own accounting,
// so an entry whose weight leaves its body out, or a tier that keeps
// what it should drop, fails it. The tier's weight is checked too.
func TestBoundedUnderDistinctMisses(t *testing.T) {
	const budget = 4 << 20
	const boundSlack = 4 << 20
	lb := newLoopback(t, &herdhttp.Options{MaxBytes: budget, MaxBodyBytes: budget}, &sizedOrigin{})
	before := liveHeap()
	const clients, each = 4, 60
	sizes := []int{60 << 10, 100 << 10, 140 << 10, 200 << 10}
	total := 0
	for c := range clients {
		for i := range each {
			total += sizes[(i+c)%4]
		}
	}
	if total < 6*budget {
		t.Fatalf("the misses fetch %d bytes; want at least six budgets", total)
	}
	done := make(chan struct{})
	for c := range clients {
		go func() {
			defer func() { done <- struct{}{} }()
			for i := range each {
				n := sizes[(i+c)%4]
				resp, err := lb.proxy.Client().Get(fmt.Sprintf("%s/%d?c=%d&i=%d", lb.proxy.URL, n, c, i))
				if err != nil {
					t.Error(err)
					return
				}
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
			}
		}()
	}
	for range clients {
		<-done
	}
	// Reading the tier's weight runs its pending maintenance, where it
	// drops what it does not keep.
	if w := lb.h.LocalWeight(); w > budget || w == 0 {
		t.Errorf("after %d distinct misses of up to 200 KiB, the local tier holds %d bytes; want some, at most %d", clients*each, w, budget)
	}
	grown := int64(liveHeap()) - int64(before)
	t.Logf("%d bytes fetched, the live heap grew by %d", total, grown)
	if limit := int64(budget + budget/2 + boundSlack); grown > limit {
		t.Errorf("after %d distinct misses (%d bytes), the live heap grew by %d bytes; want at most %d (1.5×MaxBytes + %d)", clients*each, total, grown, limit, boundSlack)
	}
	runtime.KeepAlive(lb)
}

// liveHeap is the bytes of live heap objects, after a full collection.
func liveHeap() uint64 {
	runtime.GC()
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapAlloc
}
