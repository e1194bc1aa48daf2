package herdhttp_test

import (
	"fmt"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/herdcache/herd/herdhttp"
)

// gatedOrigin answers "v<n>" for its n-th request with the given
// Cache-Control; once gate is set, requests wait for it to close, and
// status (when set) replaces 200.
type gatedOrigin struct {
	cc     string
	n      atomic.Int64
	mu     sync.Mutex
	gate   chan struct{}
	status atomic.Int64
	// arrived gets one value (when it has room) for each request that
	// waits at the gate.
	arrived chan struct{}
}

func (o *gatedOrigin) handle(w http.ResponseWriter, r *http.Request) {
	o.mu.Lock()
	g := o.gate
	o.mu.Unlock()
	if g != nil {
		select {
		case o.arrived <- struct{}{}:
		default:
		}
		<-g
	}
	w.Header().Set("Cache-Control", o.cc)
	if s := o.status.Load(); s != 0 {
		w.WriteHeader(int(s))
		fmt.Fprintf(w, "error %d", s)
		return
	}
	fmt.Fprintf(w, "v%d", o.n.Add(1))
}

// hold makes the origin's requests wait until the returned func is called.
func (o *gatedOrigin) hold() (release func()) {
	g := make(chan struct{})
	o.mu.Lock()
	o.gate = g
	o.mu.Unlock()
	return func() {
		o.mu.Lock()
		o.gate = nil
		o.mu.Unlock()
		close(g)
	}
}

// stale-while-revalidate: a stale response is served at once, to every
// request, while one revalidation runs; its answer is served after.
func TestStaleWhileRevalidate(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		o := &gatedOrigin{cc: "max-age=1, stale-while-revalidate=10"}
		f := newFixture(t, nil, o.handle)
		f.mustGet("/a", 200, "v1")
		time.Sleep(2 * time.Second)
		release := o.hold()
		var wg sync.WaitGroup
		for range 20 {
			wg.Go(func() {
				r := f.mustGet("/a", 200, "v1")
				if !strings.Contains(r.cacheStatus(), "stale-while-revalidate") {
					t.Errorf("Cache-Status %q; want stale-while-revalidate", r.cacheStatus())
				}
			})
		}
		wg.Wait() // all answered while the revalidation waits at the origin
		synctest.Wait()
		f.wantCalls(2, "20 stale requests")
		release()
		synctest.Wait()
		r := f.mustGet("/a", 200, "v2")
		if !strings.HasPrefix(r.cacheStatus(), "herd; hit") {
			t.Errorf("after the revalidation: Cache-Status %q; want a hit", r.cacheStatus())
		}
		f.wantCalls(2, "after the revalidation")
		time.Sleep(12 * time.Second) // past the window: the request waits for the origin
		f.mustGet("/a", 200, "v3")
	})
}

// stale-if-error: a stale response is served when the origin answers
// 500, 502, 503 or 504, or cannot be reached; past the window, the error
// is passed on.
func TestStaleIfError(t *testing.T) {
	for _, code := range []int{500, 502, 503, 504, 0} {
		t.Run(fmt.Sprint(code), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				o := &gatedOrigin{cc: "max-age=1, stale-if-error=100"}
				f := newFixture(t, &herdhttp.Options{ErrorBackoff: time.Second}, o.handle)
				f.mustGet("/a", 200, "v1")
				time.Sleep(2 * time.Second)
				if code == 0 {
					f.net.down("origin")
				} else {
					o.status.Store(int64(code))
				}
				r := f.mustGet("/a", 200, "v1")
				if !strings.Contains(r.cacheStatus(), "stale-if-error") {
					t.Errorf("Cache-Status %q; want stale-if-error", r.cacheStatus())
				}
				calls := f.calls.Load()
				f.mustGet("/a", 200, "v1")
				if f.calls.Load() != calls {
					t.Error("the origin was asked again within ErrorBackoff")
				}
				time.Sleep(100 * time.Second)
				r = f.get("/a")
				if code == 0 && r.status != http.StatusBadGateway || code != 0 && r.status != code {
					t.Errorf("past stale-if-error: %d %q; want the error", r.status, r.body)
				}
			})
		})
	}
}

// The two windows differ: with max-age=60, stale-while-revalidate=600
// and stale-if-error=86400, a response is served stale at once for ten
// minutes past its freshness; then a request waits for the origin, and
// is served stale only when the origin fails, for a day.
func TestStaleWindowsDiffer(t *testing.T) {
	const cc = "max-age=60, stale-while-revalidate=600, stale-if-error=86400"
	t.Run("revalidate while serving", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			o := &gatedOrigin{cc: cc}
			f := newFixture(t, nil, o.handle)
			f.mustGet("/a", 200, "v1")
			time.Sleep(659 * time.Second)
			release := o.hold()
			f.mustGet("/a", 200, "v1") // at once, the origin held
			release()
		})
	})
	t.Run("wait for the origin", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			o := &gatedOrigin{cc: cc}
			f := newFixture(t, nil, o.handle)
			f.mustGet("/a", 200, "v1")
			time.Sleep(661 * time.Second)
			release := o.hold()
			done := make(chan reply)
			go func() { done <- f.get("/a") }()
			synctest.Wait()
			select {
			case r := <-done:
				t.Fatalf("answered %d %q while the origin was held; want a wait", r.status, r.body)
			default:
			}
			release()
			if r := <-done; r.status != 200 || r.body != "v2" {
				t.Errorf("after the origin answered: %d %q; want 200 v2", r.status, r.body)
			}
		})
	})
	t.Run("stale only on error", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			o := &gatedOrigin{cc: cc}
			f := newFixture(t, nil, o.handle)
			f.mustGet("/a", 200, "v1")
			time.Sleep(661 * time.Second)
			o.status.Store(503)
			f.mustGet("/a", 200, "v1")
			time.Sleep(86400 * time.Second)
			if r := f.get("/a"); r.status != 503 {
				t.Errorf("past stale-if-error: %d %q; want 503", r.status, r.body)
			}
		})
	})
}
