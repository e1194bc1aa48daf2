package herdhttp_test

import (
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/herdcache/herd/herdhttp"
)

// BenchmarkFleetRedis is the fleet acceptance run in real time, on
// loopback: 20 proxies over one redis-server, open-loop load of 50 req/s
// each on one URL (max-age=2, stale-while-revalidate=10) whose origin
// takes 400 ms, and 10 req/s each on a URL that does not expire, for 10
// s. Run it once: go test -run ^$ -bench FleetRedis -benchtime 1x. It
// reports the origin fetches of the expiring URL per expiry, the requests
// that waited 400 ms or more after the first fetch, and both URLs' p99.
func BenchmarkFleetRedis(b *testing.B) {
	addr := redisServer(b)
	var mu sync.Mutex
	var hot []time.Time // the fetches' ends
	origin := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		time.Sleep(400 * time.Millisecond) // the origin's work
		if r.URL.Path == "/steady" {
			w.Header().Set("Cache-Control", "max-age=3600")
		} else {
			w.Header().Set("Cache-Control", "max-age=2, stale-while-revalidate=10")
			mu.Lock()
			hot = append(hot, time.Now())
			mu.Unlock()
		}
		io.WriteString(w, "v")
	}))
	defer origin.Close()
	up, _ := url.Parse(origin.URL)
	replicas := redisReplicas(b, 20, addr, up, herdhttp.Options{}, nil)
	for range b.N {
		mu.Lock()
		hot = nil
		mu.Unlock()
		type sample struct {
			sent time.Time
			lat  time.Duration
		}
		var smu sync.Mutex
		var hotLat, steadyLat []sample
		errs := 0
		var wg sync.WaitGroup
		start := time.Now()
		load := func(path string, rate int, out *[]sample) {
			for _, srv := range replicas {
				client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 64}}
				wg.Go(func() {
					tick := time.NewTicker(time.Second / time.Duration(rate))
					defer tick.Stop()
					for now := range tick.C {
						if now.Sub(start) >= 10*time.Second {
							return
						}
						wg.Go(func() {
							t0 := time.Now()
							r := getURL(b, client, srv.URL+path, "Host: www.example")
							smu.Lock()
							defer smu.Unlock()
							*out = append(*out, sample{t0, time.Since(t0)})
							if r.err != nil || r.status != 200 {
								errs++
							}
						})
					}
				})
			}
		}
		load("/hot", 50, &hotLat)
		load("/steady", 10, &steadyLat)
		wg.Wait()
		mu.Lock()
		fetches := len(hot)
		firstEnd := hot[0]
		mu.Unlock()
		waited := 0
		for _, s := range hotLat {
			if s.sent.After(firstEnd) && s.lat >= 400*time.Millisecond {
				waited++
			}
		}
		pct := func(ss []sample, from time.Time) time.Duration {
			var d []time.Duration
			for _, s := range ss {
				if !s.sent.Before(from) {
					d = append(d, s.lat)
				}
			}
			slices.Sort(d)
			return d[len(d)*99/100]
		}
		b.ReportMetric(float64(fetches), "hot-fetches")
		b.ReportMetric(float64(len(hotLat)+len(steadyLat)), "requests")
		b.ReportMetric(float64(errs), "errors")
		b.ReportMetric(float64(waited), "waited-after-first")
		b.ReportMetric(float64(pct(hotLat, start).Microseconds())/1000, "hot-p99-ms")
		b.ReportMetric(float64(pct(steadyLat, start).Microseconds())/1000, "steady-p99-ms")
		b.ReportMetric(float64(pct(hotLat, start.Add(time.Second)).Microseconds())/1000, "hot-warm-p99-ms")
		b.ReportMetric(float64(pct(steadyLat, start.Add(time.Second)).Microseconds())/1000, "steady-warm-p99-ms")
	}
}
