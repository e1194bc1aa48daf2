package herdhttp_test

import (
	"net/http"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/herdcache/herd/herdhttp"
)

// max-age: the response is served from the cache, with its Age, until it
// is max-age old, then fetched again.
func TestMaxAge(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newFixture(t, nil, static("v", "Cache-Control: max-age=60"))
		r := f.mustGet("/a", 200, "v")
		if !strings.Contains(r.cacheStatus(), "fwd=uri-miss") || !strings.Contains(r.cacheStatus(), "stored") {
			t.Errorf("first answer's Cache-Status %q; want a stored uri-miss", r.cacheStatus())
		}
		time.Sleep(30 * time.Second)
		r = f.mustGet("/a", 200, "v")
		f.wantCalls(1, "at 30 s")
		if r.header.Get("Age") != "30" || r.cacheStatus() != "herd; hit; ttl=30" {
			t.Errorf("at 30 s: Age %q, Cache-Status %q; want 30 and a hit with ttl=30", r.header.Get("Age"), r.cacheStatus())
		}
		time.Sleep(30 * time.Second)
		f.mustGet("/a", 200, "v")
		f.wantCalls(2, "at 60 s")
	})
}

// s-maxage wins over max-age in a shared cache.
func TestSMaxAge(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newFixture(t, nil, static("v", "Cache-Control: max-age=100, s-maxage=10"))
		f.mustGet("/a", 200, "v")
		time.Sleep(9 * time.Second)
		f.mustGet("/a", 200, "v")
		f.wantCalls(1, "at 9 s")
		time.Sleep(time.Second)
		f.mustGet("/a", 200, "v")
		f.wantCalls(2, "at 10 s")
	})
}

// Expires less Date gives the freshness lifetime; an invalid Expires
// means already expired.
func TestExpires(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newFixture(t, nil, func(w http.ResponseWriter, r *http.Request) {
			now := time.Now()
			w.Header().Set("Date", httpDate(now))
			if r.URL.Path == "/bad" {
				w.Header().Set("Expires", "0")
			} else {
				w.Header().Set("Expires", httpDate(now.Add(20*time.Second)))
			}
			w.Write([]byte("v"))
		})
		f.mustGet("/a", 200, "v")
		time.Sleep(19 * time.Second)
		f.mustGet("/a", 200, "v")
		f.wantCalls(1, "within Expires")
		time.Sleep(time.Second)
		f.mustGet("/a", 200, "v")
		f.wantCalls(2, "at Expires")
		f.mustGet("/bad", 200, "v")
		f.mustGet("/bad", 200, "v")
		f.wantCalls(4, "with an invalid Expires")
	})
}

// Without explicit freshness a response is stored only when heuristic
// freshness is configured: a tenth of its age since Last-Modified.
func TestHeuristic(t *testing.T) {
	for _, frac := range []float64{0, 0.1} {
		synctest.Test(t, func(t *testing.T) {
			o := &herdhttp.Options{Heuristic: frac}
			f := newFixture(t, o, func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("Last-Modified", httpDate(time.Now().Add(-100*time.Second)))
				w.Write([]byte("v"))
			})
			f.mustGet("/a", 200, "v")
			time.Sleep(9 * time.Second)
			f.mustGet("/a", 200, "v")
			if frac == 0 {
				f.wantCalls(2, "without Heuristic")
				return
			}
			f.wantCalls(1, "within the heuristic lifetime")
			time.Sleep(time.Second)
			f.mustGet("/a", 200, "v")
			f.wantCalls(2, "past the heuristic lifetime")
		})
	}
}

// Age is computed as RFC 9111 §4.2.3 says: the origin's Age, and a Date
// in the past (apparent age), make the response older from the start.
func TestAgeFromOriginAndDate(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newFixture(t, nil, func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Cache-Control", "max-age=60")
			switch r.URL.Path {
			case "/age":
				w.Header().Set("Age", "50")
				w.Header().Set("Date", httpDate(time.Now()))
			case "/date":
				w.Header().Set("Date", httpDate(time.Now().Add(-40*time.Second)))
			}
			w.Write([]byte("v"))
		})
		r := f.mustGet("/age", 200, "v")
		if r.header.Get("Age") != "50" {
			t.Errorf("Age of a response that came with Age: 50 = %q; want 50", r.header.Get("Age"))
		}
		r = f.mustGet("/date", 200, "v")
		if r.header.Get("Age") != "40" {
			t.Errorf("Age of a response dated 40 s ago = %q; want 40", r.header.Get("Age"))
		}
		time.Sleep(10 * time.Second)
		f.mustGet("/age", 200, "v")
		f.mustGet("/date", 200, "v")
		f.wantCalls(3, "at 10 s: /age is 60 s old, /date 50 s")
		if d := f.lastSeen(); d.URL.Path != "/age" {
			t.Errorf("the origin was asked for %s again; want /age", d.URL.Path)
		}
	})
}

// The origin's Date is served as it is; a response without one gets the
// time it was received.
func TestDate(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		t0 := time.Now()
		f := newFixture(t, nil, func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Cache-Control", "max-age=60")
			w.Header().Set("Date", httpDate(t0.Add(-5*time.Second)))
			w.Write([]byte("v"))
		})
		f.mustGet("/a", 200, "v")
		time.Sleep(10 * time.Second)
		r := f.mustGet("/a", 200, "v")
		if got, want := r.header.Get("Date"), httpDate(t0.Add(-5*time.Second)); got != want {
			t.Errorf("Date of a hit = %q; want the origin's %q", got, want)
		}
		if r.header.Get("Age") != "15" {
			t.Errorf("Age = %q; want 15", r.header.Get("Age"))
		}
	})
}

// Hop-by-hop fields, and the fields Connection names, are neither stored
// nor served.
func TestHopByHop(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newFixture(t, nil, static("v", "Cache-Control: max-age=60", "Connection: X-Hop", "X-Hop: 1", "X-End: 2", "Keep-Alive: timeout=5", "Proxy-Authenticate: Basic"))
		for _, when := range []string{"miss", "hit"} {
			r := f.mustGet("/a", 200, "v")
			for _, h := range []string{"X-Hop", "Keep-Alive", "Proxy-Authenticate"} {
				if v := r.header.Get(h); v != "" {
					t.Errorf("%s: %s: %q served; want none", when, h, v)
				}
			}
			if r.header.Get("X-End") != "2" {
				t.Errorf("%s: the end-to-end field X-End was not served", when)
			}
		}
		f.wantCalls(1, "after a miss and a hit")
	})
}

// An Expires that bends the HTTP-date grammar, or is given twice, counts
// as already expired (RFC 9111 §5.3): the response is not reused.
func TestExpiresInvalid(t *testing.T) {
	for _, lines := range [][]string{
		{"Thu, 18  Aug  2050 02:01:18 GMT"},
		{"Thu, 18 Aug 2050 2:01:18 GMT"},
		{"Thu, 18 Aug 2050 02:01:18 UTC"},
		{"Thu, 18 Aug 2050 02:01:18 GMT", "Thu, 18 Aug 2050 02:01:19 GMT"},
	} {
		t.Run(strings.Join(lines, " + "), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				f := newFixture(t, nil, func(w http.ResponseWriter, r *http.Request) {
					w.Header()["Expires"] = lines
					w.Write([]byte("v"))
				})
				f.mustGet("/a", 200, "v")
				f.mustGet("/a", 200, "v")
				f.wantCalls(2, "two requests")
			})
		})
	}
	synctest.Test(t, func(t *testing.T) {
		f := newFixture(t, nil, static("v", "Expires: Thu, 18 Aug 2050 02:01:18 gMT"))
		f.mustGet("/a", 200, "v")
		f.mustGet("/a", 200, "v")
		f.wantCalls(1, "a valid Expires in another case")
	})
}

// Age holding a list counts by its first member: "7200, 0" makes a
// max-age=3600 response stale on arrival.
func TestAgeList(t *testing.T) {
	for _, tc := range []struct {
		age   string
		calls int64
	}{{"7200, 0", 2}, {"0, 7200", 1}} {
		t.Run(tc.age, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				f := newFixture(t, nil, static("v", "Cache-Control: max-age=3600", "Age: "+tc.age))
				f.mustGet("/a", 200, "v")
				f.mustGet("/a", 200, "v")
				f.wantCalls(tc.calls, "two requests")
			})
		})
	}
}
