package herdhttp_test

import (
	"net/http"
	"strings"
	"testing"
	"testing/synctest"
	"time"
)

// By default a stale response with a validator is kept and revalidated:
// the origin gets If-None-Match, and its 304 refreshes the stored
// response's freshness and the fields it carries, its body kept.
func TestRevalidatedByDefault(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newFixture(t, nil, func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Cache-Control", "max-age=10")
			w.Header().Set("ETag", `"1"`)
			if r.Header.Get("If-None-Match") == `"1"` {
				w.Header().Set("X-Version", "2")
				w.WriteHeader(http.StatusNotModified)
				return
			}
			w.Header().Set("X-Version", "1")
			w.Write([]byte("body"))
		})
		f.mustGet("/a", 200, "body")
		time.Sleep(11 * time.Second)
		r := f.mustGet("/a", 200, "body")
		if f.lastSeen().Header.Get("If-None-Match") != `"1"` {
			t.Fatalf("the stale response's fetch carried If-None-Match %q; want \"1\"", f.lastSeen().Header.Get("If-None-Match"))
		}
		if !strings.Contains(r.cacheStatus(), "fwd-status=304") || r.header.Get("X-Version") != "2" {
			t.Errorf("after the 304: Cache-Status %q, X-Version %q; want fwd-status=304 and 2", r.cacheStatus(), r.header.Get("X-Version"))
		}
		time.Sleep(5 * time.Second)
		r = f.mustGet("/a", 200, "body")
		f.wantCalls(2, "a hit after the revalidation")
		if r.header.Get("X-Version") != "2" {
			t.Errorf("the hit's X-Version %q; want 2, from the 304", r.header.Get("X-Version"))
		}
	})
}

// A response whose body arrives after its head is stored a little after
// its freshness began to count down; just after it goes stale, the
// request that finds it stale still revalidates it, rather than being
// handed back the stale response.
func TestRevalidatedRightAfterExpiry(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newFixture(t, nil, func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Cache-Control", "max-age=2")
			w.Header().Set("ETag", `"1"`)
			if r.Header.Get("If-None-Match") == `"1"` {
				w.WriteHeader(http.StatusNotModified)
				return
			}
			w.WriteHeader(http.StatusOK)
			w.(http.Flusher).Flush()
			time.Sleep(500 * time.Millisecond)
			w.Write([]byte("body"))
		})
		f.mustGet("/a", 200, "body")
		time.Sleep(1700 * time.Millisecond) // 2.2 s after the head arrived
		r := f.mustGet("/a", 200, "body")
		f.wantCalls(2, "the stale response")
		if got := f.lastSeen().Header.Get("If-None-Match"); got != `"1"` || !strings.Contains(r.cacheStatus(), "fwd-status=304") {
			t.Errorf("the stale response's fetch carried If-None-Match %q and was answered %q; want \"1\" and a 304", got, r.cacheStatus())
		}
	})
}
