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
)

// A HEAD is answered from a stored GET: its fields, no body. A HEAD that
// nothing stored answers goes to the origin and stores nothing.
func TestHeadFromGet(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newFixture(t, nil, static("body", "Cache-Control: max-age=60", "X-A: 1"))
		r := f.do(http.MethodHead, "proxy", "/miss")
		if r.err != nil || r.status != 200 || r.body != "" {
			t.Fatalf("HEAD of a miss: %d %q %v", r.status, r.body, r.err)
		}
		f.wantCalls(1, "a HEAD miss")
		if m := f.lastSeen().Method; m != http.MethodHead {
			t.Errorf("the origin got %s for a HEAD miss; want HEAD", m)
		}
		f.mustGet("/a", 200, "body")
		r = f.do(http.MethodHead, "proxy", "/a")
		if r.err != nil || r.status != 200 || r.body != "" || r.header.Get("X-A") != "1" || r.header.Get("Content-Length") != "4" {
			t.Errorf("HEAD after a GET: %d %q %v, X-A %q, Content-Length %q", r.status, r.body, r.err, r.header.Get("X-A"), r.header.Get("Content-Length"))
		}
		f.wantCalls(2, "a HEAD answered from the stored GET")
		f.mustGet("/miss", 200, "body")
		f.wantCalls(3, "a GET after a HEAD miss")
	})
}

// Status codes cacheable by default are stored with heuristic freshness;
// others only with explicit freshness; 206 never.
func TestStatusCodes(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newFixture(t, &herdhttp.Options{Heuristic: 0.1}, func(w http.ResponseWriter, r *http.Request) {
			var code int
			fmt.Sscanf(strings.TrimPrefix(r.URL.Path, "/"), "%d", &code)
			if r.URL.Query().Has("explicit") {
				w.Header().Set("Cache-Control", "max-age=60")
			}
			w.Header().Set("Last-Modified", httpDate(time.Now().Add(-1000*time.Second)))
			w.WriteHeader(code)
			fmt.Fprint(w, code)
		})
		for _, c := range []struct {
			path   string
			code   int
			stored bool
		}{
			{"/200", 200, true}, {"/404", 404, true}, {"/410", 410, true}, {"/301", 301, true},
			{"/302", 302, false}, {"/500", 500, false}, {"/403", 403, false},
			{"/302?explicit", 302, true}, {"/403?explicit", 403, true}, {"/206?explicit", 206, false},
		} {
			before := f.calls.Load()
			for range 2 {
				req, _ := http.NewRequest(http.MethodGet, "http://proxy:80"+c.path, nil)
				resp, err := f.net.transport(t).RoundTrip(req)
				if err != nil || resp.StatusCode != c.code {
					t.Fatalf("GET %s: %v %v", c.path, resp, err)
				}
				resp.Body.Close()
			}
			if got := f.calls.Load() - before; got != 1 && c.stored || got != 2 && !c.stored {
				t.Errorf("GET %s twice: %d fetches; stored %v", c.path, got, c.stored)
			}
		}
	})
}

// A stale response is revalidated with its ETag or Last-Modified; a 304
// updates the stored fields and freshness, and the stored body is served.
func TestRevalidation(t *testing.T) {
	for _, validator := range []string{"ETag", "Last-Modified"} {
		t.Run(validator, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				lm := httpDate(time.Now().Add(-time.Hour))
				var version, full atomic.Int64
				version.Store(1)
				f := newFixture(t, &herdhttp.Options{KeepForRevalidation: time.Hour}, func(w http.ResponseWriter, r *http.Request) {
					w.Header().Set("Cache-Control", "max-age=10")
					w.Header().Set("X-Version", fmt.Sprint(version.Load()))
					if validator == "ETag" {
						w.Header().Set("ETag", `"e1"`)
						if r.Header.Get("If-None-Match") == `"e1"` {
							w.WriteHeader(http.StatusNotModified)
							return
						}
					} else {
						w.Header().Set("Last-Modified", lm)
						if r.Header.Get("If-Modified-Since") == lm {
							w.WriteHeader(http.StatusNotModified)
							return
						}
					}
					full.Add(1)
					w.Write([]byte("body"))
				})
				f.mustGet("/a", 200, "body")
				time.Sleep(11 * time.Second)
				version.Store(2)
				r := f.mustGet("/a", 200, "body")
				if r.header.Get("X-Version") != "2" || !strings.Contains(r.cacheStatus(), "fwd-status=304") {
					t.Errorf("revalidated answer: X-Version %q, Cache-Status %q; want 2 and fwd-status=304", r.header.Get("X-Version"), r.cacheStatus())
				}
				time.Sleep(5 * time.Second)
				r = f.mustGet("/a", 200, "body")
				if r.header.Get("X-Version") != "2" || r.header.Get("Age") != "5" {
					t.Errorf("hit after the 304: X-Version %q, Age %q; want 2 and 5", r.header.Get("X-Version"), r.header.Get("Age"))
				}
				f.wantCalls(2, "a fetch and a revalidation")
				if full.Load() != 1 {
					t.Errorf("%d full responses; want 1", full.Load())
				}
			})
		})
	}
}

// An unsafe method answered without error invalidates the target URI and
// the URIs of Location and Content-Location on the same host; an error
// answer invalidates nothing.
func TestUnsafeInvalidates(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var n atomic.Int64
		f := newFixture(t, nil, func(w http.ResponseWriter, r *http.Request) {
			switch {
			case r.Method == http.MethodGet:
				w.Header().Set("Cache-Control", "max-age=600")
				fmt.Fprintf(w, "%s %d", r.URL.Path, n.Add(1))
			case r.URL.Path == "/fail":
				w.WriteHeader(http.StatusInternalServerError)
			default:
				w.Header().Set("Location", "/loc")
				w.Header().Set("Content-Location", "http://www.example/cloc")
				w.WriteHeader(http.StatusCreated)
			}
		})
		f.mustGet("/t", 200, "/t 1")
		f.mustGet("/loc", 200, "/loc 2")
		f.mustGet("/cloc", 200, "/cloc 3")
		f.mustGet("/fail", 200, "/fail 4")
		f.mustGet("/other", 200, "/other 5")
		if r := f.do(http.MethodPost, "proxy", "/t"); r.status != http.StatusCreated {
			t.Fatalf("POST: %d %v", r.status, r.err)
		}
		if r := f.do(http.MethodDelete, "proxy", "/fail"); r.status != http.StatusInternalServerError {
			t.Fatalf("DELETE: %d %v", r.status, r.err)
		}
		f.mustGet("/t", 200, "/t 6")
		f.mustGet("/loc", 200, "/loc 7")
		f.mustGet("/cloc", 200, "/cloc 8")
		f.mustGet("/fail", 200, "/fail 4")
		f.mustGet("/other", 200, "/other 5")
	})
}

// A client's own If-None-Match or If-Modified-Since that the stored
// response meets is answered 304 from the cache.
func TestClientConditional(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		lm := time.Now().Add(-time.Hour)
		f := newFixture(t, nil, static("body", "Cache-Control: max-age=60", `ETag: "x"`, "Last-Modified: "+httpDate(lm)))
		f.mustGet("/a", 200, "body")
		for _, cond := range [][]string{
			{`If-None-Match: "x"`},
			{`If-None-Match: "y", W/"x"`},
			{"If-Modified-Since: " + httpDate(lm)},
		} {
			r := f.get("/a", cond...)
			if r.status != http.StatusNotModified || r.body != "" || r.header.Get("ETag") != `"x"` {
				t.Errorf("GET with %v: %d %q ETag %q; want 304 with the ETag", cond, r.status, r.body, r.header.Get("ETag"))
			}
		}
		f.mustGet("/a", 200, "body", `If-None-Match: "y"`)
		f.mustGet("/a", 200, "body", "If-Modified-Since: "+httpDate(lm.Add(-time.Second)))
		f.wantCalls(1, "conditional requests answered from the cache")
	})
}

// A Range is served from a stored full response; one that nothing stored
// answers is passed to the origin, and its 206 is not stored.
func TestRange(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newFixture(t, nil, func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Cache-Control", "max-age=60")
			w.Header().Set("ETag", `"r"`)
			http.ServeContent(w, r, "", time.Time{}, strings.NewReader("0123456789"))
		})
		r := f.mustGet("/miss", 206, "234", "Range: bytes=2-4")
		f.wantCalls(1, "a Range miss")
		if f.lastSeen().Header.Get("Range") != "bytes=2-4" {
			t.Errorf("the origin got Range %q; want it passed", f.lastSeen().Header.Get("Range"))
		}
		f.mustGet("/miss", 206, "234", "Range: bytes=2-4")
		f.wantCalls(2, "a second Range miss")
		f.mustGet("/a", 200, "0123456789")
		r = f.mustGet("/a", 206, "234", "Range: bytes=2-4")
		if r.header.Get("Content-Range") != "bytes 2-4/10" {
			t.Errorf("Content-Range %q; want bytes 2-4/10", r.header.Get("Content-Range"))
		}
		f.mustGet("/a", 206, "789", "Range: bytes=-3")
		f.mustGet("/a", 206, "89", "Range: bytes=8-")
		f.mustGet("/a", 206, "01", "Range: bytes=0-1", `If-Range: "r"`)
		f.mustGet("/a", 200, "0123456789", "Range: bytes=0-1", `If-Range: "other"`)
		if r := f.get("/a", "Range: bytes=20-"); r.status != http.StatusRequestedRangeNotSatisfiable || r.header.Get("Content-Range") != "bytes */10" {
			t.Errorf("unsatisfiable Range: %d %q", r.status, r.header.Get("Content-Range"))
		}
		f.wantCalls(3, "ranges of a stored response")
	})
}
