package herdhttp_test

import (
	"context"
	"io"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/herdcache/herd/herdhttp"
)

// fixture is an origin and a caching proxy in front of it, on the
// in-memory network of a synctest bubble, and a client of the proxy.
type fixture struct {
	t      *testing.T
	net    *pipeNet
	origin *url.URL
	proxy  *url.URL
	h      *herdhttp.Handler
	client *http.Client
	calls  atomic.Int64 // requests the origin received

	mu   sync.Mutex
	seen []*http.Request // the requests the origin received, in order
}

// newFixture starts origin (counted) and a proxy to it with o.
func newFixture(t *testing.T, o *herdhttp.Options, origin http.HandlerFunc) *fixture {
	t.Helper()
	f := &fixture{t: t, net: newPipeNet()}
	f.origin = f.net.serve(t, "origin", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		f.calls.Add(1)
		f.mu.Lock()
		f.seen = append(f.seen, r.Clone(context.Background()))
		f.mu.Unlock()
		origin(w, r)
	}))
	f.h = f.addProxy("proxy", o)
	f.proxy = &url.URL{Scheme: "http", Host: "proxy:80"}
	f.client = f.net.client(t)
	return f
}

// addProxy starts another proxy to the origin, named name.
func (f *fixture) addProxy(name string, o *herdhttp.Options) *herdhttp.Handler {
	f.t.Helper()
	h, err := herdhttp.NewProxyOver(f.origin, f.net.transport(f.t), o)
	if err != nil {
		f.t.Fatal(err)
	}
	f.t.Cleanup(func() { h.Close(context.Background()) })
	f.net.serve(f.t, name, h)
	return h
}

// lastSeen returns the last request the origin received.
func (f *fixture) lastSeen() *http.Request {
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.seen) == 0 {
		f.t.Fatal("the origin received no request")
	}
	return f.seen[len(f.seen)-1]
}

// reply is a response as the client read it.
type reply struct {
	status int
	header http.Header
	body   string
	err    error
}

func (r reply) cacheStatus() string { return strings.Join(r.header.Values("Cache-Status"), ", ") }

// get sends a GET for path to the proxy, with the given fields
// ("Name: value" each), and reads the whole response.
func (f *fixture) get(path string, fields ...string) reply {
	f.t.Helper()
	return f.do(http.MethodGet, "proxy", path, fields...)
}

// do sends method path to the named server, with Host www.example
// whatever the server: replicas of a fleet serve one site.
func (f *fixture) do(method, server, path string, fields ...string) reply {
	f.t.Helper()
	req, err := http.NewRequest(method, "http://"+server+":80"+path, nil)
	if err != nil {
		f.t.Fatal(err)
	}
	req.Host = "www.example"
	for _, fl := range fields {
		k, v, _ := strings.Cut(fl, ":")
		req.Header.Add(k, strings.TrimSpace(v))
	}
	resp, err := f.client.Do(req)
	if err != nil {
		return reply{err: err}
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return reply{status: resp.StatusCode, header: resp.Header, body: string(b), err: err}
}

// mustGet is get that fails the test unless the answer is want's status
// and body.
func (f *fixture) mustGet(path string, status int, body string, fields ...string) reply {
	f.t.Helper()
	r := f.get(path, fields...)
	if r.err != nil || r.status != status || r.body != body {
		f.t.Fatalf("GET %s %v = %d %q, %v (Cache-Status %q); want %d %q", path, fields, r.status, r.body, r.err, r.cacheStatus(), status, body)
	}
	return r
}

// wantCalls fails the test unless the origin received n requests.
func (f *fixture) wantCalls(n int64, when string) {
	f.t.Helper()
	if got := f.calls.Load(); got != n {
		f.t.Fatalf("%s: the origin received %d requests; want %d", when, got, n)
	}
}

// httpDate formats t as an HTTP-date.
func httpDate(t time.Time) string { return t.UTC().Format(http.TimeFormat) }

// static answers every request with body and the given fields.
func static(body string, fields ...string) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		for _, fl := range fields {
			k, v, _ := strings.Cut(fl, ":")
			w.Header().Add(k, strings.TrimSpace(v))
		}
		io.WriteString(w, body)
	}
}
