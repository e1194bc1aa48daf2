package herdhttp_test

import (
	"net/http"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/herdcache/herd/herdhttp"
)

// openLoad sends GETs of path to every replica at rate per second each,
// open loop (a request is sent on time whether or not the last one was
// answered), from start for d, and returns each answer's latency and
// whether it failed.
func (f *fixture) openLoad(replicas []string, path string, rate int, d time.Duration) (lat []sample, errs int) {
	var mu sync.Mutex
	var wg sync.WaitGroup
	end := time.Now().Add(d)
	for _, r := range replicas {
		wg.Go(func() {
			tick := time.NewTicker(time.Second / time.Duration(rate))
			defer tick.Stop()
			for now := range tick.C {
				if !now.Before(end) {
					return
				}
				wg.Go(func() {
					start := time.Now()
					got := f.do(http.MethodGet, r, path)
					mu.Lock()
					defer mu.Unlock()
					lat = append(lat, sample{start, time.Since(start)})
					if got.err != nil || got.status != 200 {
						if errs == 0 {
							f.t.Logf("first error at %v: %d %q %v %q", time.Since(end.Add(-d)), got.status, got.body, got.err, got.cacheStatus())
						}
						errs++
					}
				})
			}
		})
	}
	wg.Wait()
	return lat, errs
}

// sample is one request of a load: when it was sent, how long it took.
type sample struct {
	sent time.Time
	lat  time.Duration
}

// p99 is the 99th percentile latency of the samples sent at or after from.
func p99(samples []sample, from time.Time) time.Duration {
	var s []time.Duration
	for _, x := range samples {
		if !x.sent.Before(from) {
			s = append(s, x.lat)
		}
	}
	slices.Sort(s)
	return s[len(s)*99/100]
}

// The fleet acceptance run, in a synctest bubble (so latencies are on
// its fake clock: a request that waits for the origin takes its 400 ms,
// one served from a tier takes none): 20 replicas over one shared tier,
// open-loop load of 50 req/s each on one URL with max-age=2,
// stale-while-revalidate=10 and an origin that takes 400 ms, for 10 s.
// The origin is asked once per expiry, fleet-wide; no request waits for
// it after the first fetch; client p99 is at most twice that of a URL
// that does not expire during the run.
func TestAcceptanceFleet(t *testing.T) {
	if testing.Short() {
		t.Skip("the 10 s fleet run (20 replicas, 20,000 requests); run without -short")
	}
	synctest.Test(t, func(t *testing.T) {
		type call struct{ start, end time.Time }
		var mu sync.Mutex
		var hot []call
		f := newFixture(t, nil, func(w http.ResponseWriter, r *http.Request) {
			start := time.Now()
			time.Sleep(400 * time.Millisecond) // the origin's work
			cc := "max-age=2, stale-while-revalidate=10"
			if r.URL.Path == "/steady" {
				cc = "max-age=3600"
			} else {
				mu.Lock()
				hot = append(hot, call{start, time.Now()})
				mu.Unlock()
			}
			w.Header().Set("Cache-Control", cc)
			w.Write([]byte("v"))
		})
		replicas := f.fleet(20, herdhttp.Options{})
		var steadyLat, hotLat []sample
		var steadyErrs, hotErrs int
		var wg sync.WaitGroup
		t0 := time.Now()
		wg.Go(func() { steadyLat, steadyErrs = f.openLoad(replicas, "/steady", 10, 10*time.Second) })
		wg.Go(func() { hotLat, hotErrs = f.openLoad(replicas, "/hot", 50, 10*time.Second) })
		wg.Wait()

		if hotErrs+steadyErrs != 0 {
			t.Errorf("%d and %d errors; want none", hotErrs, steadyErrs)
		}
		// Once per expiry: each fetch after the first starts after the
		// value before it expired: 2 s after it was received less its age
		// then, the larger of its 400 ms response delay and the time since
		// its Date, which has a resolution of a second (RFC 9111 §4.2.3).
		for i := 1; i < len(hot); i++ {
			prev := hot[i-1]
			age := max(prev.end.Sub(prev.end.Truncate(time.Second)), 400*time.Millisecond)
			expired := prev.end.Add(2*time.Second - age)
			if hot[i].start.Before(expired) {
				t.Errorf("fetch %d began %v after fetch %d ended: before that value expired", i, hot[i].start.Sub(hot[i-1].end), i-1)
			}
		}
		expiries := len(hot) - 1
		// No request sent after the first fetch ended waited for the origin.
		firstDone := hot[0].end
		waited := 0
		for _, x := range hotLat {
			if !x.sent.Before(firstDone) && x.lat > 0 {
				waited++
			}
		}
		if waited != 0 {
			t.Errorf("%d requests sent after the first fetch waited; want none", waited)
		}
		hp, sp := p99(hotLat, t0), p99(steadyLat, t0)
		if hp > 2*sp {
			t.Errorf("p99 %v on the expiring URL; want at most twice the steady URL's %v", hp, sp)
		}
		warm := t0.Add(time.Second)
		hw, sw := p99(hotLat, warm), p99(steadyLat, warm)
		if hw > 2*sw {
			t.Errorf("p99 after the first second %v on the expiring URL; want at most twice the steady URL's %v", hw, sw)
		}
		t.Logf("fleet: %d requests in %v of fake time; %d origin fetches of the hot URL over %d expiries (1 per expiry); %d requests waited after the first fetch; p99 %v (steady URL %v), after the first second %v (steady %v)",
			len(hotLat)+len(steadyLat), time.Since(t0), len(hot), expiries, waited, hp, sp, hw, sw)
		if len(hot) < 4 {
			t.Errorf("%d fetches of the hot URL in 10 s; want one every 2.4 s or so", len(hot))
		}
	})
}

// stale-if-error acceptance: with the origin answering 500 for 5 s,
// clients get the stale 200 throughout, with no error.
func TestAcceptanceStaleIfError(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var failing atomic.Bool
		f := newFixture(t, nil, func(w http.ResponseWriter, r *http.Request) {
			if failing.Load() {
				http.Error(w, "down", http.StatusInternalServerError)
				return
			}
			w.Header().Set("Cache-Control", "max-age=1, stale-if-error=60")
			w.Write([]byte("v"))
		})
		replicas := f.fleet(4, herdhttp.Options{})
		for _, r := range replicas {
			f.do(http.MethodGet, r, "/a")
		}
		time.AfterFunc(2*time.Second, func() { failing.Store(true) })
		time.AfterFunc(7*time.Second, func() { failing.Store(false) })
		lat, errs := f.openLoad(replicas, "/a", 50, 9*time.Second)
		if errs != 0 {
			t.Errorf("%d of %d requests failed while the origin answered 500 for 5 s; want none", errs, len(lat))
		}
		t.Logf("stale-if-error: %d requests, %d errors, %d origin requests", len(lat), errs, f.calls.Load())
	})
}
