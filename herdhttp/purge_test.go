package herdhttp_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/herdcache/herd/herdhttp"
	"github.com/herdcache/herd/redisstore"
)

// versioned is an origin whose answer to a GET of a path counts the
// requests for it: "/items v1", then "/items v2"; other methods get 405. Its fields are the tagFields
// entry of the path (plus max-age=60), and it varies on Accept-Language
// for paths that start with /vary.
type versioned struct {
	mu   sync.Mutex
	n    map[string]int
	tags map[string]string // path → "Field: value"
}

func newVersioned(tags map[string]string) (*versioned, *url.URL, func()) {
	v := &versioned{n: map[string]int{}, tags: tags}
	srv := httptest.NewServer(v)
	up, _ := url.Parse(srv.URL)
	return v, up, srv.Close
}

func (v *versioned) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		w.Header().Set("Allow", "GET, HEAD")
		http.Error(w, "no such method", http.StatusMethodNotAllowed)
		return
	}
	key := r.URL.RequestURI()
	if strings.HasPrefix(r.URL.Path, "/vary") {
		key += " " + r.Header.Get("Accept-Language")
		w.Header().Set("Vary", "Accept-Language")
	}
	v.mu.Lock()
	v.n[key]++
	n := v.n[key]
	v.mu.Unlock()
	w.Header().Set("Cache-Control", "max-age=60")
	if f, val, ok := strings.Cut(v.tags[r.URL.Path], ":"); ok {
		w.Header().Set(f, strings.TrimSpace(val))
	}
	fmt.Fprintf(w, "%s v%d", key, n)
}

func (v *versioned) calls(key string) int {
	v.mu.Lock()
	defer v.mu.Unlock()
	return v.n[key]
}

// fleet starts n proxies to up, each with its own client of the Redis at
// addr as Store and Lease, and returns their handlers and servers.
func fleet(t *testing.T, n int, addr string, up *url.URL, o herdhttp.Options) ([]*herdhttp.Handler, []*httptest.Server) {
	t.Helper()
	var hs []*herdhttp.Handler
	var srvs []*httptest.Server
	for range n {
		client := redisstore.NewClient(&redis.UniversalOptions{Addrs: []string{addr}})
		remote, err := redisstore.New(redisstore.Options{Client: client})
		if err != nil {
			t.Fatal(err)
		}
		oo := o
		oo.Store, oo.Lease = remote, remote
		h, err := herdhttp.NewProxy(up, &oo)
		if err != nil {
			t.Fatal(err)
		}
		srv := httptest.NewServer(h)
		t.Cleanup(func() {
			srv.Close()
			h.Close(context.Background())
			remote.Close()
			client.Close()
		})
		hs, srvs = append(hs, h), append(srvs, srv)
	}
	return hs, srvs
}

// eventually asks srv for path until its body is want, for up to 10 s:
// another replica learns of a purge from the Store's notice, a moment
// after the purge returns.
func eventually(t *testing.T, srv *httptest.Server, path, want string, fields ...string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	var r reply
	for time.Now().Before(deadline) {
		if r = getURL(t, srv.Client(), srv.URL+path, append([]string{"Host: www.example"}, fields...)...); r.body == want {
			return
		}
		<-tick.C
	}
	t.Fatalf("%s%s: %q after 10 s (Cache-Status %q); want %q", srv.URL, path, r.body, r.cacheStatus(), want)
}

// get asks srv for path as a client of www.example.
func get(t *testing.T, srv *httptest.Server, path string, fields ...string) reply {
	t.Helper()
	return getURL(t, srv.Client(), srv.URL+path, append([]string{"Host: www.example"}, fields...)...)
}

// On two replicas over one real redis-server, a purge of a tag on one
// retires the responses tagged with it on both (variants included), and
// only those: tags match whole, so /items/1 outlives a purge of /items.
func TestPurgeTagFleet(t *testing.T) {
	addr := redisServer(t)
	origin, up, stop := newVersioned(map[string]string{
		"/items":   "Surrogate-Key: /items list",
		"/items/1": "Surrogate-Key: /items/1  item-1",
		"/other":   "Cache-Tag: a,b",
		"/vary":    "Surrogate-Key: list",
	})
	defer stop()
	hs, srvs := fleet(t, 2, addr, up, herdhttp.Options{})
	a, b := srvs[0], srvs[1]

	for _, p := range []string{"/items", "/items/1", "/other"} {
		if r := get(t, a, p); r.body != p+" v1" {
			t.Fatalf("%s on a: %q", p, r.body)
		}
		if r := get(t, b, p); r.body != p+" v1" {
			t.Fatalf("%s on b: %q (Cache-Status %q); want a's stored answer", p, r.body, r.cacheStatus())
		}
	}
	for _, lang := range []string{"en", "fr"} {
		for range 2 { // the second request of a variant stores it, tagged
			get(t, a, "/vary", "Accept-Language: "+lang)
		}
		if r := get(t, b, "/vary", "Accept-Language: "+lang); r.body != "/vary "+lang+" v2" && r.body != "/vary "+lang+" v1" {
			t.Fatalf("/vary %s on b: %q", lang, r.body)
		}
	}
	before := map[string]int{"/vary en": origin.calls("/vary en"), "/vary fr": origin.calls("/vary fr")}
	for k, n := range before {
		if r := get(t, b, "/vary", "Accept-Language: "+strings.TrimPrefix(k, "/vary ")); r.body != fmt.Sprintf("%s v%d", k, n) {
			t.Fatalf("%s on b before the purge: %q; want the stored v%d", k, r.body, n)
		}
	}

	if err := hs[1].PurgeTag(t.Context(), "/items"); err != nil {
		t.Fatal(err)
	}
	eventually(t, a, "/items", "/items v2")
	// b takes a's v2 from Redis, or, when it asks between a's answer and
	// a's write-back, fetches v3: either is newer than the purged v1.
	if r := get(t, b, "/items"); r.body == "/items v1" || r.status != http.StatusOK {
		t.Errorf("/items on b after the purge: %d %q; want a newer answer than v1", r.status, r.body)
	}
	for _, srv := range srvs {
		if r := get(t, srv, "/items/1"); r.body != "/items/1 v1" {
			t.Errorf("/items/1 after a purge of tag /items: %q; want it kept (exact-match tags)", r.body)
		}
	}
	if n := origin.calls("/items"); n < 2 || n > 3 {
		t.Errorf("/items: %d origin requests; want one before the purge and one or two after", n)
	}

	// Cache-Tag, comma separated; the purge made on a, the replica that
	// stored the responses.
	if err := hs[0].PurgeTag(t.Context(), "b"); err != nil {
		t.Fatal(err)
	}
	eventually(t, b, "/other", "/other v2")
	if err := hs[0].PurgeTag(t.Context(), "item-1"); err != nil {
		t.Fatal(err)
	}
	eventually(t, b, "/items/1", "/items/1 v2")

	// A tag shared by a URL's variants retires each of them.
	items := origin.calls("/items")
	if err := hs[0].PurgeTag(t.Context(), "list"); err != nil {
		t.Fatal(err)
	}
	for k, n := range before {
		eventually(t, b, "/vary", fmt.Sprintf("%s v%d", k, n+1), "Accept-Language: "+strings.TrimPrefix(k, "/vary "))
	}
	if r, want := get(t, a, "/items"), fmt.Sprintf("/items v%d", items+1); r.body != want {
		t.Errorf("/items after a purge of tag list: %q; want %q", r.body, want)
	}
}

// On two replicas over one real redis-server, a purge of a URL on one
// retires its response and its variants on both, and nothing else: not
// another query, not a longer path.
func TestPurgeURLFleet(t *testing.T) {
	addr := redisServer(t)
	origin, up, stop := newVersioned(nil)
	defer stop()
	hs, srvs := fleet(t, 2, addr, up, herdhttp.Options{})
	a, b := srvs[0], srvs[1]
	paths := []string{"/items", "/items?x=1", "/items/1"}
	for _, p := range paths {
		get(t, a, p)
		if r := get(t, b, p); r.body != p+" v1" {
			t.Fatalf("%s on b: %q", p, r.body)
		}
	}
	for _, lang := range []string{"en", "fr"} {
		for range 2 {
			get(t, a, "/vary", "Accept-Language: "+lang)
		}
	}
	en, fr := origin.calls("/vary en"), origin.calls("/vary fr")

	if err := hs[1].PurgeURL(t.Context(), "http://www.example/items", nil); err != nil {
		t.Fatal(err)
	}
	eventually(t, a, "/items", "/items v2")
	for _, p := range paths[1:] {
		for _, srv := range srvs {
			if r := get(t, srv, p); r.body != p+" v1" {
				t.Errorf("%s after a purge of /items: %q; want it kept", p, r.body)
			}
		}
	}
	if err := hs[1].PurgeURL(t.Context(), "http://www.example/vary", nil); err != nil {
		t.Fatal(err)
	}
	eventually(t, a, "/vary", fmt.Sprintf("/vary en v%d", en+1), "Accept-Language: en")
	eventually(t, b, "/vary", fmt.Sprintf("/vary fr v%d", fr+1), "Accept-Language: fr")

	for _, bad := range []string{"", "/items", "ftp://www.example/items", "http:///items"} {
		if err := hs[0].PurgeURL(t.Context(), bad, nil); err == nil {
			t.Errorf("PurgeURL(%q): no error", bad)
		}
	}
	for _, bad := range []string{"", "a b", "a,b"} {
		if err := hs[0].PurgeTag(t.Context(), bad); err == nil {
			t.Errorf("PurgeTag(%q): no error", bad)
		}
	}
}

// The tag fields reach no client, from a stored response or a passed
// one, unless ForwardTags is set; the cache still purges by them.
func TestTagFieldsStripped(t *testing.T) {
	app := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Surrogate-Key", "k1 k2")
		w.Header().Set("Cache-Tag", "k3")
		if r.URL.Path == "/private" {
			w.Header().Set("Cache-Control", "private")
		} else {
			w.Header().Set("Cache-Control", "max-age=60")
		}
		fmt.Fprint(w, "ok")
	})
	for _, forward := range []bool{false, true} {
		h, err := herdhttp.Middleware(app, &herdhttp.Options{ForwardTags: forward})
		if err != nil {
			t.Fatal(err)
		}
		srv := httptest.NewServer(h)
		for _, p := range []string{"/a", "/a", "/private"} {
			r := get(t, srv, p)
			got := r.header.Get("Surrogate-Key") + "|" + r.header.Get("Cache-Tag")
			want := "|"
			if forward {
				want = "k1 k2|k3"
			}
			if got != want {
				t.Errorf("ForwardTags %v, %s (%s): tag fields %q; want %q", forward, p, r.cacheStatus(), got, want)
			}
		}
		if err := h.PurgeTag(t.Context(), "k3"); err != nil {
			t.Fatal(err)
		}
		if r := get(t, srv, "/a"); !strings.Contains(r.cacheStatus(), "fwd=uri-miss") {
			t.Errorf("ForwardTags %v: /a after a purge of its tag: Cache-Status %q; want a miss", forward, r.cacheStatus())
		}
		srv.Close()
		h.Close(context.Background())
	}
}
