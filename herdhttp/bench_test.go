package herdhttp_test

import (
	"io"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"strings"
	"testing"

	"github.com/herdcache/herd/herdhttp"
)

// BenchmarkProxyHit compares the cache-hit throughput of NewProxy with
// httputil.ReverseProxy's, both on loopback in front of an instant origin
// that answers 1 KiB: herdhttp answers from its local tier, the
// ReverseProxy asks the origin each time. Compare the two with
// benchstat -col /proxy.
func BenchmarkProxyHit(b *testing.B) {
	body := strings.Repeat("x", 1024)
	origin := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Cache-Control", "max-age=3600")
		io.WriteString(w, body)
	}))
	defer origin.Close()
	up, _ := url.Parse(origin.URL)
	cached, err := herdhttp.NewProxy(up, nil)
	if err != nil {
		b.Fatal(err)
	}
	defer cached.Close(b.Context())
	rp := httputil.NewSingleHostReverseProxy(up)
	rp.Transport = &http.Transport{MaxIdleConnsPerHost: 256}
	for _, c := range []struct {
		name string
		h    http.Handler
	}{{"proxy=herdhttp", cached}, {"proxy=reverseproxy", rp}} {
		b.Run(c.name, func(b *testing.B) {
			front := httptest.NewServer(c.h)
			defer front.Close()
			client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 256}}
			u := front.URL + "/page"
			get := func() {
				resp, err := client.Get(u)
				if err != nil {
					b.Error(err)
					return
				}
				n, _ := io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				if n != 1024 {
					b.Errorf("read %d bytes", n)
				}
			}
			get() // stored
			b.SetParallelism(4)
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					get()
				}
			})
		})
	}
}

// BenchmarkHit measures the hit path alone, in process: a Middleware's
// ServeHTTP answering a stored 1 KiB response, into a ResponseWriter that
// discards it. Run with -benchmem: its allocations are the hit path's.
func BenchmarkHit(b *testing.B) {
	body := strings.Repeat("x", 1024)
	h, err := herdhttp.Middleware(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Cache-Control", "max-age=3600")
		io.WriteString(w, body)
	}), nil)
	if err != nil {
		b.Fatal(err)
	}
	defer h.Close(b.Context())
	r := httptest.NewRequest(http.MethodGet, "http://www.example/page", nil)
	w := &discardWriter{h: http.Header{}}
	h.ServeHTTP(w, r) // stored
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		clear(w.h)
		w.n = 0
		h.ServeHTTP(w, r)
		if w.n != 1024 {
			b.Fatalf("wrote %d bytes", w.n)
		}
	}
}

// BenchmarkHitVary is BenchmarkHit for a response that varies on
// Accept-Encoding: the URL's Vary index, then its variant, are looked up.
func BenchmarkHitVary(b *testing.B) {
	body := strings.Repeat("x", 1024)
	h, err := herdhttp.Middleware(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Cache-Control", "max-age=3600")
		w.Header().Set("Vary", "Accept-Encoding")
		io.WriteString(w, body)
	}), nil)
	if err != nil {
		b.Fatal(err)
	}
	defer h.Close(b.Context())
	r := httptest.NewRequest(http.MethodGet, "http://www.example/page", nil)
	r.Header.Set("Accept-Encoding", "gzip, br")
	w := &discardWriter{h: http.Header{}}
	h.ServeHTTP(w, r) // stored
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		clear(w.h)
		w.n = 0
		h.ServeHTTP(w, r)
		if w.n != 1024 {
			b.Fatalf("wrote %d bytes", w.n)
		}
	}
}

// discardWriter is a ResponseWriter that counts the body and keeps nothing.
type discardWriter struct {
	h http.Header
	n int
}

func (w *discardWriter) Header() http.Header         { return w.h }
func (w *discardWriter) WriteHeader(int)             {}
func (w *discardWriter) Write(p []byte) (int, error) { w.n += len(p); return len(p), nil }
