package herdhttp_test

import (
	"fmt"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/herdcache/herd/herdhttp"
	"github.com/herdcache/herd/limiter"
	"github.com/herdcache/herd/memory"
)

// fleet starts n proxies, "proxy" and "r1".."r<n-1>", sharing one
// memory.Remote as their Store and Lease, in front of f's origin.
func (f *fixture) fleet(n int, o herdhttp.Options) []string {
	remote := memory.New()
	o.Store, o.Lease = remote, remote
	names := []string{"proxy"}
	f.h.Close(f.t.Context()) // the fixture's own proxy is replaced
	f.net.down("proxy")
	for i := range n {
		name := fmt.Sprintf("r%d", i)
		if i == 0 {
			name = "proxy"
		}
		oo := o
		f.addProxy(name, &oo)
		if i > 0 {
			names = append(names, name)
		}
	}
	return names
}

// Concurrent misses of one URL on many replicas make one request to the
// origin: the other replicas wait for the lease holder's notice, and the
// requests of each replica for its own fetch.
func TestFleetCollapsing(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		o := &gatedOrigin{cc: "max-age=60"}
		f := newFixture(t, nil, o.handle)
		replicas := f.fleet(5, herdhttp.Options{})
		release := o.hold()
		var wg sync.WaitGroup
		var collapsed atomic.Int64
		for _, r := range replicas {
			for range 4 {
				wg.Go(func() {
					got := f.do(http.MethodGet, r, "/a")
					if got.status != 200 || got.body != "v1" {
						t.Errorf("%s: %d %q %v %q", r, got.status, got.body, got.err, got.cacheStatus())
					}
					// Collapsed onto another request's fetch, or (when its
					// question to the tiers joined that fetch) a hit.
					if cs := got.cacheStatus(); strings.Contains(cs, "collapsed") || strings.HasPrefix(cs, "herd; hit") {
						collapsed.Add(1)
					}
				})
			}
		}
		synctest.Wait() // every request waits: on the origin, the lease or a fetch here
		release()
		wg.Wait()
		f.wantCalls(1, "20 concurrent misses on 5 replicas")
		if collapsed.Load() != 19 {
			t.Errorf("%d answers collapsed or hits; want 19", collapsed.Load())
		}
		for _, r := range replicas {
			if got := f.do(http.MethodGet, r, "/a"); !strings.HasPrefix(got.cacheStatus(), "herd; hit") {
				t.Errorf("%s afterwards: Cache-Status %q; want a hit", r, got.cacheStatus())
			}
		}
		f.wantCalls(1, "hits on every replica")
	})
}

// stale-while-revalidate across replicas: one revalidation for the fleet.
func TestFleetStaleWhileRevalidate(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		o := &gatedOrigin{cc: "max-age=2, stale-while-revalidate=10"}
		f := newFixture(t, nil, o.handle)
		replicas := f.fleet(5, herdhttp.Options{})
		for _, r := range replicas {
			f.do(http.MethodGet, r, "/a")
		}
		f.wantCalls(1, "the first round")
		time.Sleep(3 * time.Second)
		release := o.hold()
		var wg sync.WaitGroup
		for _, r := range replicas {
			for range 4 {
				wg.Go(func() {
					if got := f.do(http.MethodGet, r, "/a"); got.body != "v1" {
						t.Errorf("%s: %d %q; want the stale v1 at once", r, got.status, got.body)
					}
				})
			}
		}
		wg.Wait()
		synctest.Wait()
		f.wantCalls(2, "stale reads on 5 replicas")
		release()
		synctest.Wait()
		// A replica told of the new response serves its copy while one
		// read of the Store replaces it.
		for _, r := range replicas {
			f.do(http.MethodGet, r, "/a")
		}
		synctest.Wait()
		for _, r := range replicas {
			if got := f.do(http.MethodGet, r, "/a"); got.body != "v2" {
				t.Errorf("%s after the revalidation: %q; want v2", r, got.body)
			}
		}
		f.wantCalls(2, "after the revalidation")
	})
}

// Hit-for-pass: once the first response shows that it is not shareable,
// every request waiting for it, on every replica, goes to the origin at
// once (no time passes), released by the notice; alice's answer reaches
// neither bob nor an anonymous request.
func TestFleetHitForPass(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var released atomic.Int64 // fake Unix ns of the release
		var late atomic.Int64     // origin requests that came after the release, later than it
		gate := make(chan struct{})
		var first sync.Once
		origin := func(w http.ResponseWriter, r *http.Request) {
			leader := false
			first.Do(func() { leader = true })
			if leader {
				<-gate
				released.Store(time.Now().UnixNano())
			} else if rel := released.Load(); rel == 0 || time.Now().UnixNano() != rel {
				late.Add(1)
			}
			w.Header().Set("Cache-Control", "private, max-age=60")
			fmt.Fprintf(w, "for %q", r.Header.Get("Authorization"))
		}
		f := newFixture(t, nil, origin)
		replicas := f.fleet(5, herdhttp.Options{})
		var wg sync.WaitGroup
		users := []string{"alice", "bob", ""}
		for i := range 100 {
			r := replicas[i%len(replicas)]
			user := users[0]
			if i > 0 {
				user = users[1+i%2]
			}
			start := func() {
				wg.Go(func() {
					var got reply
					if user == "" {
						got = f.do(http.MethodGet, r, "/a")
					} else {
						got = f.do(http.MethodGet, r, "/a", "Authorization: "+user)
					}
					if want := fmt.Sprintf("for %q", user); got.body != want {
						t.Errorf("%s as %q: %q; want %q", r, user, got.body, want)
					}
				})
			}
			start()
			if i == 0 {
				synctest.Wait() // alice leads
			}
		}
		synctest.Wait()
		close(gate)
		wg.Wait()
		f.wantCalls(100, "100 requests of a response that is not shareable")
		if late.Load() != 0 {
			t.Errorf("%d of 99 requests reached the origin later than the first response, or before it", late.Load())
		}
	})
}

// The limiter sheds fetches it cannot admit with 503 and Retry-After.
func TestLimiterSheds(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		o := &gatedOrigin{cc: "max-age=60"}
		l, err := limiter.New(limiter.Options{Limit: 1, QueueTimeout: time.Second})
		if err != nil {
			t.Fatal(err)
		}
		f := newFixture(t, &herdhttp.Options{Limiter: l}, o.handle)
		release := o.hold()
		first := make(chan reply)
		go func() { first <- f.get("/a") }()
		synctest.Wait() // /a holds the only slot
		r := f.get("/b")
		if r.status != http.StatusServiceUnavailable || r.header.Get("Retry-After") == "" {
			t.Errorf("a shed fetch: %d, Retry-After %q; want 503 with Retry-After", r.status, r.header.Get("Retry-After"))
		}
		release()
		if r := <-first; r.status != 200 {
			t.Errorf("the admitted fetch: %d", r.status)
		}
	})
}
