package herdhttp_test

import (
	"net/http"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/herdcache/herd/herdhttp"
)

// Outcomes are counted by the route templates configured, never by raw
// path: hits, misses, stale serves, collapsed requests, hit-for-pass and
// revalidations (one behind a stale serve, one a request waited for).
func TestRouteMetrics(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		counts := &herdhttp.Counts{}
		o := &herdhttp.Options{
			Routes:              []string{"GET /products/{id}", "/private/"},
			Recorder:            counts,
			KeepForRevalidation: time.Hour,
		}
		gate := make(chan struct{})
		f := newFixture(t, o, func(w http.ResponseWriter, r *http.Request) {
			switch r.URL.Path {
			case "/private/x":
				w.Header().Set("Cache-Control", "private")
			case "/slow":
				<-gate
				w.Header().Set("Cache-Control", "max-age=60")
			default:
				w.Header().Set("Cache-Control", "max-age=10, stale-while-revalidate=10")
				w.Header().Set("ETag", `"e"`)
				if r.Header.Get("If-None-Match") == `"e"` {
					w.WriteHeader(http.StatusNotModified)
					return
				}
			}
			w.Write([]byte("v"))
		})
		f.get("/products/1") // miss
		f.get("/products/2") // miss
		f.get("/products/1") // hit
		time.Sleep(15 * time.Second)
		f.get("/products/1") // stale, revalidated behind
		synctest.Wait()
		time.Sleep(30 * time.Second)
		f.get("/products/2") // revalidated: 304
		f.get("/private/x")  // miss
		f.get("/private/x")  // hit-for-pass
		var wg sync.WaitGroup
		for range 3 {
			wg.Go(func() { f.get("/slow") })
			synctest.Wait()
		}
		close(gate)
		wg.Wait() // one miss, two collapsed
		want := map[string]map[herdhttp.Outcome]int64{
			"GET /products/{id}": {herdhttp.OutcomeMiss: 2, herdhttp.OutcomeHit: 1, herdhttp.OutcomeStale: 1, herdhttp.OutcomeRevalidated: 1, herdhttp.OutcomeRevalidation: 2},
			"/private/":          {herdhttp.OutcomeMiss: 1, herdhttp.OutcomeHitForPass: 1},
			"other":              {herdhttp.OutcomeMiss: 1, herdhttp.OutcomeCollapsed: 2},
		}
		if diff := cmp.Diff(want, counts.Snapshot()); diff != "" {
			t.Errorf("counts by route (-want +got):\n%s", diff)
		}
	})
}
