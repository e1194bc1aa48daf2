package herdhttp_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/herdcache/herd/herdhttp"
	"github.com/herdcache/herd/redisstore"
	"github.com/herdcache/herd/redisstore/redisproc"
)

// redisServer starts a redis-server on loopback for the test.
func redisServer(t testing.TB) string {
	t.Helper()
	srv, err := redisproc.Start(t.Context())
	if err != nil {
		t.Fatalf("redis-server (apt-get install redis-server): %v", err)
	}
	t.Cleanup(func() { srv.Stop() })
	return srv.Addr()
}

// redisReplicas starts n proxies to origin on loopback, each with its own
// client of the Redis at addr as its Store and Lease.
// Each request that reaches a replica is announced on in, when not nil.
func redisReplicas(t testing.TB, n int, addr string, origin *url.URL, o herdhttp.Options, in chan struct{}) []*httptest.Server {
	t.Helper()
	var out []*httptest.Server
	for range n {
		client := redisstore.NewClient(&redis.UniversalOptions{Addrs: []string{addr}})
		remote, err := redisstore.New(redisstore.Options{Client: client})
		if err != nil {
			t.Fatal(err)
		}
		oo := o
		oo.Store, oo.Lease = remote, remote
		h, err := herdhttp.NewProxy(origin, &oo)
		if err != nil {
			t.Fatal(err)
		}
		var hh http.Handler = h
		if in != nil {
			hh = arrivals{next: h, in: in}
		}
		srv := httptest.NewServer(hh)
		t.Cleanup(func() {
			srv.Close()
			h.Close(context.Background())
			remote.Close()
			client.Close()
		})
		out = append(out, srv)
	}
	return out
}

// arrivals counts the requests that reached a handler.
type arrivals struct {
	next http.Handler
	in   chan struct{}
}

func (a arrivals) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	a.in <- struct{}{}
	a.next.ServeHTTP(w, r)
}

// Over a real Redis, concurrent misses of one URL on five replicas make
// one request to the origin, and a response that is not shareable sends
// every waiting request to the origin; alice's answer reaches no one else.
func TestRedisFleet(t *testing.T) {
	addr := redisServer(t)
	o := &gatedOrigin{cc: "max-age=60", arrived: make(chan struct{}, 1)}
	var calls atomic.Int64
	origin := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		calls.Add(1)
		if r.URL.Path == "/private" {
			w.Header().Set("Cache-Control", "max-age=60")
			fmt.Fprintf(w, "for %q", r.Header.Get("Authorization"))
			return
		}
		o.handle(w, r)
	}))
	defer origin.Close()
	up, _ := url.Parse(origin.URL)
	in := make(chan struct{}, 100)
	replicas := redisReplicas(t, 5, addr, up, herdhttp.Options{}, in)

	release := o.hold()
	var wg sync.WaitGroup
	for i := range 20 {
		srv := replicas[i%5]
		wg.Go(func() {
			r := getURL(t, srv.Client(), srv.URL+"/a", "Host: www.example")
			if r.err != nil || r.status != 200 || r.body != "v1" {
				t.Errorf("%s: %d %q %v", srv.URL, r.status, r.body, r.err)
			}
		})
	}
	for range 20 {
		<-in
	}
	<-o.arrived // the first fetch waits at the origin
	release()
	wg.Wait()
	if n := calls.Load(); n != 1 {
		t.Errorf("20 concurrent misses on 5 replicas over Redis: %d origin requests; want 1", n)
	}

	for _, auth := range []string{"alice", "bob", ""} {
		for _, srv := range replicas[:2] {
			fields := []string{"Host: www.example"}
			if auth != "" {
				fields = append(fields, "Authorization: "+auth)
			}
			r := getURL(t, srv.Client(), srv.URL+"/private", fields...)
			if want := fmt.Sprintf("for %q", auth); r.body != want {
				t.Errorf("%s as %q: %q; want %q (Cache-Status %q)", srv.URL, auth, r.body, want, strings.Join(r.header.Values("Cache-Status"), ", "))
			}
		}
	}
}

// Over a real Redis, in real time: 100 concurrent requests on 5 replicas
// for a response that is not shareable. Once the first response's
// fields are written, the other 99 reach the origin, released by the
// notice; the time from the one to the last of the others is measured,
// and bounded loosely here for loaded machines (the measured value is
// logged).
func TestRedisHitForPassRelease(t *testing.T) {
	addr := redisServer(t)
	gate := make(chan struct{})
	var mu sync.Mutex
	var released time.Time
	var last time.Time
	var calls atomic.Int64
	var earliest time.Time
	first := make(chan struct{}, 1)
	origin := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/warm" {
			w.Header().Set("Cache-Control", "private")
			return
		}
		if calls.Add(1) == 1 {
			first <- struct{}{}
			<-gate
			mu.Lock()
			released = time.Now()
			mu.Unlock()
		} else {
			mu.Lock()
			last = time.Now()
			if earliest.IsZero() {
				earliest = last
			}
			mu.Unlock()
		}
		w.Header().Set("Cache-Control", "private")
		w.Write([]byte("mine"))
	}))
	defer origin.Close()
	up, _ := url.Parse(origin.URL)
	in := make(chan struct{}, 200)
	replicas := redisReplicas(t, 5, addr, up, herdhttp.Options{}, in)
	// Connections to the origin are opened first, as in a fleet that has
	// been serving: 20 per replica.
	var wg sync.WaitGroup
	for i := range 100 {
		srv := replicas[i%5]
		wg.Go(func() { getURL(t, srv.Client(), srv.URL+"/warm", "Host: www.example") })
	}
	wg.Wait()
	for range 100 {
		<-in
	}
	for i := range 100 {
		srv := replicas[i%5]
		wg.Go(func() {
			if r := getURL(t, srv.Client(), srv.URL+"/p", "Host: www.example"); r.body != "mine" {
				t.Errorf("%d %q %v", r.status, r.body, r.err)
			}
		})
		if i == 0 {
			<-first // the first request leads
		}
	}
	for range 100 {
		<-in
	}
	close(gate)
	wg.Wait()
	if n := calls.Load(); n != 100 {
		t.Fatalf("%d origin requests; want 100", n)
	}
	d := last.Sub(released)
	t.Logf("hit-for-pass over Redis: the other 99 requests reached the origin from %v to %v after the first response", earliest.Sub(released), d)
	if d > time.Second {
		t.Errorf("the last waiting request reached the origin %v after the first response; want well under a second", d)
	}
}
