package herdhttp_test

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/herdcache/herd/herdhttp"
)

// getURL GETs u with client and reads the answer.
func getURL(t testing.TB, client *http.Client, u string, fields ...string) reply {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, u, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, fl := range fields {
		k, v, _ := strings.Cut(fl, ":")
		if k == "Host" {
			req.Host = strings.TrimSpace(v)
			continue
		}
		req.Header.Add(k, strings.TrimSpace(v))
	}
	resp, err := client.Do(req)
	if err != nil {
		return reply{err: err}
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return reply{status: resp.StatusCode, header: resp.Header, body: string(b), err: err}
}

// Middleware caches the handler it wraps, served by a real server on
// loopback.
func TestMiddleware(t *testing.T) {
	var calls atomic.Int64
	app := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n := calls.Add(1)
		if r.URL.Path == "/private" {
			w.Header().Set("Cache-Control", "private")
		} else {
			w.Header().Set("Cache-Control", "max-age=60")
		}
		w.Header().Set("X-Handler", "app")
		fmt.Fprintf(w, "%s %d", r.URL.Path, n)
	})
	h, err := herdhttp.Middleware(app, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close(t.Context())
	srv := httptest.NewServer(h)
	defer srv.Close()
	c := srv.Client()
	for range 3 {
		if r := getURL(t, c, srv.URL+"/a"); r.err != nil || r.status != 200 || r.body != "/a 1" || r.header.Get("X-Handler") != "app" {
			t.Fatalf("GET /a: %d %q %v %v", r.status, r.body, r.header, r.err)
		}
	}
	getURL(t, c, srv.URL+"/private")
	if r := getURL(t, c, srv.URL+"/private"); r.body != "/private 3" {
		t.Errorf("GET /private again: %q; want the handler's third answer", r.body)
	}
	if calls.Load() != 3 {
		t.Errorf("the handler ran %d times; want 3", calls.Load())
	}
}

// Transport caches for a client, and for httputil.ReverseProxy.
func TestTransport(t *testing.T) {
	var calls atomic.Int64
	origin := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		calls.Add(1)
		w.Header().Set("Cache-Control", "max-age=60")
		fmt.Fprintf(w, "%s", r.URL.Path)
	}))
	defer origin.Close()
	tr, err := herdhttp.NewTransport(origin.Client().Transport, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer tr.Close(t.Context())
	client := &http.Client{Transport: tr}
	for range 3 {
		if r := getURL(t, client, origin.URL+"/c"); r.err != nil || r.body != "/c" {
			t.Fatalf("client GET: %q %v", r.body, r.err)
		}
	}
	up, _ := url.Parse(origin.URL)
	rp := httputil.NewSingleHostReverseProxy(up)
	rp.Transport = tr
	front := httptest.NewServer(rp)
	defer front.Close()
	for range 3 {
		if r := getURL(t, front.Client(), front.URL+"/p"); r.err != nil || r.body != "/p" {
			t.Fatalf("proxy GET: %q %v", r.body, r.err)
		}
	}
	if calls.Load() != 2 {
		t.Errorf("the origin got %d requests; want 2", calls.Load())
	}
	origin.Close()
	if _, err := client.Get(origin.URL + "/gone"); err == nil {
		t.Error("a Transport whose origin is down returned no error")
	}
}

// NewProxy, on loopback, sends requests to its upstream with the path and
// query joined and Host set to the upstream's, and caches the answers.
func TestProxyLoopback(t *testing.T) {
	var calls atomic.Int64
	origin := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		calls.Add(1)
		w.Header().Set("Cache-Control", "max-age=60")
		fmt.Fprintf(w, "%s %s?%s %s", r.Host, r.URL.Path, r.URL.RawQuery, r.Header.Get("X-Forwarded-Host"))
	}))
	defer origin.Close()
	up, _ := url.Parse(origin.URL + "/base?v=1")
	h, err := herdhttp.NewProxy(up, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close(t.Context())
	front := httptest.NewServer(h)
	defer front.Close()
	fu, _ := url.Parse(front.URL)
	for path, want := range map[string]string{
		"/x":     fmt.Sprintf("%s /base/x?v=1 %s", up.Host, fu.Host),
		"/y?q=2": fmt.Sprintf("%s /base/y?v=1&q=2 %s", up.Host, fu.Host),
	} {
		for range 2 {
			if r := getURL(t, front.Client(), front.URL+path); r.err != nil || r.body != want {
				t.Fatalf("GET %s: %q %v; want %q", path, r.body, r.err, want)
			}
		}
	}
	if calls.Load() != 2 {
		t.Errorf("the origin got %d requests for two paths read twice; want 2", calls.Load())
	}
}
