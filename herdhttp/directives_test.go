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

// Responses that no-store, private, Set-Cookie or Vary: * keep from
// being shared are never served from the cache; the key is marked
// hit-for-pass.
func TestNotShareable(t *testing.T) {
	for _, fields := range [][]string{
		{"Cache-Control: max-age=60, no-store"},
		{"Cache-Control: max-age=60, private"},
		{"Cache-Control: max-age=60", "Set-Cookie: id=1"},
		{"Cache-Control: max-age=60", "Vary: *"},
	} {
		t.Run(strings.Join(fields, "; "), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				f := newFixture(t, nil, static("v", fields...))
				f.mustGet("/a", 200, "v")
				r := f.mustGet("/a", 200, "v")
				f.wantCalls(2, "after two requests")
				if !strings.Contains(r.cacheStatus(), "hit-for-pass") {
					t.Errorf("second answer's Cache-Status %q; want hit-for-pass", r.cacheStatus())
				}
			})
		})
	}
}

// private="X-User" and no-cache="X-User" keep the response shareable
// without that field.
func TestQualifiedPrivate(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newFixture(t, nil, static("v", `Cache-Control: max-age=60, private="X-User", no-cache="X-Other"`, "X-User: alice", "X-Other: 1", "X-Kept: 2"))
		f.mustGet("/a", 200, "v")
		r := f.mustGet("/a", 200, "v")
		f.wantCalls(1, "after two requests")
		if r.header.Get("X-User") != "" || r.header.Get("X-Other") != "" || r.header.Get("X-Kept") != "2" {
			t.Errorf("hit fields X-User %q, X-Other %q, X-Kept %q; want none, none, 2", r.header.Get("X-User"), r.header.Get("X-Other"), r.header.Get("X-Kept"))
		}
	})
}

// no-cache: every use is validated with the origin first (a 304 serves
// the stored body); a response without a validator is not stored.
func TestNoCacheRevalidates(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var conditional atomic.Int64
		f := newFixture(t, &herdhttp.Options{KeepForRevalidation: time.Hour}, func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Cache-Control", "no-cache")
			if r.URL.Path == "/etag" {
				w.Header().Set("ETag", `"1"`)
				if r.Header.Get("If-None-Match") == `"1"` {
					conditional.Add(1)
					w.WriteHeader(http.StatusNotModified)
					return
				}
			}
			w.Write([]byte("body"))
		})
		for range 3 {
			f.mustGet("/etag", 200, "body")
			time.Sleep(2 * time.Second)
		}
		f.wantCalls(3, "three uses of a no-cache response")
		if conditional.Load() != 2 {
			t.Errorf("%d conditional requests answered 304; want 2", conditional.Load())
		}
		f.mustGet("/plain", 200, "body")
		f.mustGet("/plain", 200, "body")
		f.wantCalls(5, "a no-cache response without a validator")
	})
}

// must-revalidate and proxy-revalidate: once stale, a response is never
// served without a successful validation, stale windows notwithstanding:
// an origin's 503 is passed on, and an origin that cannot be reached
// makes a 504 (RFC 9111 §5.2.2.2).
func TestMustRevalidate(t *testing.T) {
	for _, d := range []string{"must-revalidate", "proxy-revalidate"} {
		t.Run(d, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				var fail atomic.Bool
				f := newFixture(t, &herdhttp.Options{KeepForRevalidation: time.Hour}, func(w http.ResponseWriter, r *http.Request) {
					if fail.Load() {
						http.Error(w, "down", http.StatusServiceUnavailable)
						return
					}
					w.Header().Set("Cache-Control", "max-age=10, stale-while-revalidate=100, stale-if-error=100, "+d)
					w.Header().Set("ETag", `"1"`)
					w.Write([]byte("v"))
				})
				f.mustGet("/a", 200, "v")
				time.Sleep(11 * time.Second)
				fail.Store(true)
				if r := f.get("/a"); r.status != http.StatusServiceUnavailable {
					t.Errorf("stale %s response, origin answering 503: %d %q (Cache-Status %q); want 503", d, r.status, r.body, r.cacheStatus())
				}
				f.net.down("origin")
				if r := f.get("/a"); r.status != http.StatusGatewayTimeout {
					t.Errorf("stale %s response, origin unreachable: %d %q (Cache-Status %q); want 504", d, r.status, r.body, r.cacheStatus())
				}
				f.wantCalls(2, "after the stale requests")
			})
		})
	}
}

// The request's Cache-Control is ignored by default, and honoured with
// RequestCacheControl: no-cache fetches (and stores), max-age bounds the
// age served, no-store passes, only-if-cached answers 504 on a miss.
func TestRequestCacheControl(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var n atomic.Int64
		origin := func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Cache-Control", "max-age=60")
			fmt.Fprintf(w, "v%d", n.Add(1))
		}
		f := newFixture(t, nil, origin)
		f.mustGet("/a", 200, "v1")
		f.mustGet("/a", 200, "v1", "Cache-Control: no-cache")
		f.wantCalls(1, "no-cache ignored")

		n.Store(0)
		g := newFixture(t, &herdhttp.Options{RequestCacheControl: true}, origin)
		g.mustGet("/a", 200, "v1")
		g.mustGet("/a", 200, "v2", "Cache-Control: no-cache")
		g.mustGet("/a", 200, "v2")
		time.Sleep(10 * time.Second)
		g.mustGet("/a", 200, "v2", "Cache-Control: max-age=20")
		g.mustGet("/a", 200, "v3", "Cache-Control: max-age=5")
		g.mustGet("/a", 200, "v4", "Cache-Control: no-store")
		g.mustGet("/a", 200, "v3")
		if r := g.get("/b", "Cache-Control: only-if-cached"); r.status != http.StatusGatewayTimeout {
			t.Errorf("only-if-cached miss: %d; want 504", r.status)
		}
		g.wantCalls(4, "with RequestCacheControl")
	})
}

// RFC 9111 §3.5: a response to a request with Authorization is shared
// only when it says public, s-maxage or must-revalidate. alice's answer
// is served neither to bob nor to an anonymous request.
func TestAuthorization(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newFixture(t, nil, func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Cache-Control", "max-age=60"+strings.TrimPrefix(r.URL.Path, "/plain"))
			fmt.Fprintf(w, "for %q", r.Header.Get("Authorization"))
		})
		for _, p := range []string{"/plain", "/plain,public", "/plain,s-maxage=60", "/plain,must-revalidate"} {
			shared := p != "/plain"
			f.mustGet(p, 200, `for "alice"`, "Authorization: alice")
			want := `for "bob"`
			if shared {
				want = `for "alice"`
			}
			f.mustGet(p, 200, want, "Authorization: bob")
			if !shared {
				want = `for ""`
			}
			f.mustGet(p, 200, want)
		}
	})
}

// A request with Authorization whose response may not be stored (§3.5)
// marks nothing: the next anonymous request is an ordinary miss, its
// response stored and served to the one after it; the collapsed requests
// that waited for the authorized fetch each go to the origin.
func TestAuthorizationMarksNothing(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newFixture(t, nil, func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Cache-Control", "max-age=60")
			fmt.Fprintf(w, "for %q", r.Header.Get("Authorization"))
		})
		f.mustGet("/a", 200, `for "alice"`, "Authorization: alice")
		synctest.Wait() // the fetch ends a moment after its client has read it all
		r := f.mustGet("/a", 200, `for ""`)
		if cs := r.cacheStatus(); strings.Contains(cs, "hit-for-pass") || !strings.Contains(cs, "stored") {
			t.Errorf("an anonymous request after alice's: Cache-Status %q; want a miss that stored its response", cs)
		}
		f.wantCalls(2, "alice's request, then an anonymous one")
		synctest.Wait()
		r = f.mustGet("/a", 200, `for ""`)
		if cs := r.cacheStatus(); !strings.HasPrefix(cs, "herd; hit") {
			t.Errorf("the next anonymous request: Cache-Status %q; want a hit", cs)
		}
		f.wantCalls(2, "the stored response served")
	})
}

// The answer to the request that fetched a response carries every field
// the origin sent, its own Set-Cookie and the fields a qualified private
// or no-cache names among them; what is stored, and served to others,
// carries none of those, but keeps the obsolete Set-Cookie2.
func TestLeaderGetsEveryField(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newFixture(t, &herdhttp.Options{StoreSetCookie: true}, static("v",
			`Cache-Control: max-age=60, no-cache="X-Other"`, "Set-Cookie: id=1", "Set-Cookie2: a=c", "X-Other: 1", "X-Kept: 2"))
		r := f.mustGet("/a", 200, "v")
		for k, want := range map[string]string{"Set-Cookie": "id=1", "Set-Cookie2": "a=c", "X-Other": "1", "X-Kept": "2"} {
			if got := r.header.Get(k); got != want {
				t.Errorf("the fetching request's answer has %s %q; want %q", k, got, want)
			}
		}
		r = f.mustGet("/a", 200, "v")
		f.wantCalls(1, "a hit")
		for k, want := range map[string]string{"Set-Cookie": "", "Set-Cookie2": "a=c", "X-Other": "", "X-Kept": "2"} {
			if got := r.header.Get(k); got != want {
				t.Errorf("the hit has %s %q; want %q", k, got, want)
			}
		}
	})
}
