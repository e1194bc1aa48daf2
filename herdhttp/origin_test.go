package herdhttp_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"net/url"
	"sync"
	"testing"
	"time"

	"github.com/herdcache/herd/herdhttp"
)

// originLog is an OriginRecorder that keeps what it is told.
type originLog struct {
	herdhttp.Counts
	mu   sync.Mutex
	seen []string // route and status
}

func (l *originLog) RecordOrigin(route string, status int, d time.Duration) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if d > 0 {
		l.seen = append(l.seen, route+" "+http.StatusText(status))
	}
}

// An OriginRecorder times each origin request by route, and
// OnOriginError hears of each that failed without a response.
func TestOriginHooks(t *testing.T) {
	origin := httptest.NewServer(static("ok", "Cache-Control: max-age=60"))
	up, _ := url.Parse(origin.URL)
	var rec originLog
	var mu sync.Mutex
	var failed []string
	o := &herdhttp.Options{Routes: []string{"GET /a"}, Recorder: &rec, OnOriginError: func(r *http.Request, err error) {
		mu.Lock()
		defer mu.Unlock()
		failed = append(failed, r.URL.Path)
	}}
	h, err := herdhttp.NewProxy(up, o)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close(context.Background())
	srv := httptest.NewServer(h)
	defer srv.Close()
	get(t, srv, "/a")
	get(t, srv, "/a") // a hit: no origin request
	get(t, srv, "/b")
	origin.Close()
	if r := get(t, srv, "/c"); r.status != http.StatusBadGateway {
		t.Errorf("/c with the origin down: %d; want 502", r.status)
	}
	rec.mu.Lock()
	got := rec.seen
	rec.mu.Unlock()
	want := []string{"GET /a OK", "other OK", "other "}
	if len(got) != len(want) {
		t.Fatalf("origin requests recorded: %q; want %q", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("origin request %d: %q; want %q", i, got[i], want[i])
		}
	}
	mu.Lock()
	defer mu.Unlock()
	if len(failed) != 1 || failed[0] != "/c" {
		t.Errorf("OnOriginError heard of %q; want [/c]", failed)
	}
}
