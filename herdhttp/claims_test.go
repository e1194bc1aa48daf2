package herdhttp_test

import (
	"fmt"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/herdcache/herd/herdhttp"
	"github.com/herdcache/herd/limiter"
)

// counter answers "v<n>" with the given Cache-Control.
func counter(cc string, fields ...string) http.HandlerFunc {
	var n atomic.Int64
	return func(w http.ResponseWriter, r *http.Request) {
		for _, fl := range fields {
			k, v, _ := strings.Cut(fl, ":")
			w.Header().Add(k, strings.TrimSpace(v))
		}
		w.Header().Set("Cache-Control", cc)
		fmt.Fprintf(w, "v%d", n.Add(1))
	}
}

// With RequestCacheControl: Pragma: no-cache counts as no-cache when
// there is no Cache-Control; min-fresh and max-stale bound what is served.
func TestRequestDirectivesMore(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newFixture(t, &herdhttp.Options{RequestCacheControl: true}, counter("max-age=10, stale-if-error=60"))
		f.mustGet("/a", 200, "v1")
		f.mustGet("/a", 200, "v2", "Pragma: no-cache")
		f.mustGet("/a", 200, "v2", "Pragma: no-cache", "Cache-Control: max-age=100")
		time.Sleep(8 * time.Second)
		f.mustGet("/a", 200, "v2", "Cache-Control: min-fresh=1")
		f.mustGet("/a", 200, "v3", "Cache-Control: min-fresh=5")
		time.Sleep(12 * time.Second) // v3 is 2 s stale
		f.mustGet("/a", 200, "v3", "Cache-Control: max-stale=5")
		f.mustGet("/a", 200, "v4", "Cache-Control: max-stale=1")
	})
}

// Several ranges are answered with the whole stored response.
func TestMultipleRanges(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newFixture(t, nil, static("0123456789", "Cache-Control: max-age=60"))
		f.mustGet("/a", 200, "0123456789")
		f.mustGet("/a", 200, "0123456789", "Range: bytes=0-1,4-5")
		f.wantCalls(1, "")
	})
}

// StoreSetCookie stores a response with Set-Cookie, without the field.
func TestStoreSetCookie(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newFixture(t, &herdhttp.Options{StoreSetCookie: true}, counter("max-age=60", "Set-Cookie: id=1"))
		f.mustGet("/a", 200, "v1")
		r := f.mustGet("/a", 200, "v1")
		if r.header.Get("Set-Cookie") != "" {
			t.Errorf("a stored response was served with Set-Cookie %q", r.header.Get("Set-Cookie"))
		}
	})
}

// A 5xx that may not be stored marks its key hit-for-pass for a second,
// not PassTTL.
func TestErrorPassTTL(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var fail atomic.Bool
		fail.Store(true)
		f := newFixture(t, &herdhttp.Options{PassTTL: time.Hour}, func(w http.ResponseWriter, r *http.Request) {
			if fail.Load() {
				http.Error(w, "down", http.StatusServiceUnavailable)
				return
			}
			w.Header().Set("Cache-Control", "max-age=60")
			w.Write([]byte("up"))
		})
		f.mustGet("/a", 503, "down\n")
		fail.Store(false)
		f.mustGet("/a", 200, "up") // passed: hit-for-pass
		time.Sleep(time.Second)
		f.mustGet("/a", 200, "up")
		f.mustGet("/a", 200, "up")
		f.wantCalls(3, "the pass mark of a 503 lasts a second")
	})
}

// An unsafe request invalidates the target on every replica of a fleet.
func TestFleetInvalidation(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		get := counter("max-age=600")
		f := newFixture(t, nil, func(w http.ResponseWriter, r *http.Request) {
			if r.Method != http.MethodGet {
				w.WriteHeader(http.StatusNoContent)
				return
			}
			get(w, r)
		})
		f.fleet(2, herdhttp.Options{})
		f.do(http.MethodGet, "proxy", "/a")
		if got := f.do(http.MethodGet, "r1", "/a"); got.body != "v1" {
			t.Fatalf("r1: %q", got.body)
		}
		f.do(http.MethodPut, "proxy", "/a")
		synctest.Wait() // the invalidation's notice reaches r1
		if got := f.do(http.MethodGet, "r1", "/a"); got.body != "v2" {
			t.Errorf("r1 after a PUT on the other replica: %q %q; want v2", got.body, got.cacheStatus())
		}
	})
}

// A fetch the limiter sheds serves the stale response when
// stale-if-error allows it.
func TestShedServesStale(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		o := &gatedOrigin{cc: "max-age=1, stale-if-error=60"}
		l, err := limiter.New(limiter.Options{Limit: 1, QueueTimeout: time.Second})
		if err != nil {
			t.Fatal(err)
		}
		f := newFixture(t, &herdhttp.Options{Limiter: l}, o.handle)
		f.mustGet("/stale", 200, "v1")
		time.Sleep(2 * time.Second)
		release := o.hold()
		done := make(chan reply)
		go func() { done <- f.get("/other") }()
		synctest.Wait() // /other holds the only slot
		r := f.mustGet("/stale", 200, "v1")
		if !strings.Contains(r.cacheStatus(), "stale-if-error") {
			t.Errorf("Cache-Status %q; want stale-if-error", r.cacheStatus())
		}
		release()
		<-done
	})
}
