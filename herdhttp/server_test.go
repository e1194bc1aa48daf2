package herdhttp_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/herdcache/herd/herdhttp"
)

// fronts is one Handler over a real origin on loopback, served twice:
// by a plain net/http server, and by a herdhttp.Server whose Fallback
// counts the connections handed to it.
type fronts struct {
	h           *herdhttp.Handler
	plain, hits string // addresses
	srv         *herdhttp.Server
	handed      atomic.Int64
	originCalls atomic.Int64
	served      chan error
}

// origin answers /plain, /untyped (no Content-Type), /empty, /vary
// (Vary: Accept-Language), /etag (an ETag) and anything else, each
// storable for an hour.
func newFronts(t *testing.T, admit func() (func(), bool)) *fronts {
	t.Helper()
	f := &fronts{served: make(chan error, 1)}
	origin := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		f.originCalls.Add(1)
		h := w.Header()
		h.Set("Cache-Control", "public, max-age=3600")
		switch r.URL.Path {
		case "/untyped":
			h["Content-Type"] = nil // no Content-Type: net/http would sniff it
			io.WriteString(w, "<html><body>sniffed</body></html>")
		case "/empty":
			h.Set("Content-Type", "text/plain")
		case "/vary":
			h.Set("Vary", "Accept-Language")
			h.Set("Content-Type", "text/plain")
			io.WriteString(w, "lang="+r.Header.Get("Accept-Language"))
		case "/etag":
			h.Set("ETag", `"v1"`)
			h.Set("Content-Type", "text/plain")
			io.WriteString(w, "tagged")
		default:
			h.Set("Content-Type", "text/plain")
			io.WriteString(w, "body of "+r.URL.RequestURI())
		}
	}))
	t.Cleanup(origin.Close)
	u, _ := url.Parse(origin.URL)
	h, err := herdhttp.NewProxy(u, herdhttp.DefaultOptions())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = h.Close(context.Background()) })
	f.h = h

	plain := httptest.NewServer(h)
	t.Cleanup(plain.Close)
	f.plain = plain.Listener.Addr().String()

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	f.hits = ln.Addr().String()
	fallback := &http.Server{Handler: h, ConnState: func(_ net.Conn, s http.ConnState) {
		if s == http.StateNew {
			f.handed.Add(1)
		}
	}}
	f.srv = &herdhttp.Server{Handler: h, Fallback: fallback, Admit: admit}
	go func() { f.served <- f.srv.Serve(ln) }()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := f.srv.Shutdown(ctx); err != nil {
			t.Errorf("Shutdown: %v", err)
		}
		if err := <-f.served; !errors.Is(err, http.ErrServerClosed) {
			t.Errorf("Serve returned %v, want http.ErrServerClosed", err)
		}
	})
	return f
}

// conn is a raw client connection.
type conn struct {
	t  *testing.T
	c  net.Conn
	br *bufio.Reader
}

func dialRaw(t *testing.T, addr string) *conn {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	return &conn{t: t, c: c, br: bufio.NewReader(c)}
}

// send writes raw request bytes.
func (c *conn) send(raw string) {
	c.t.Helper()
	if _, err := io.WriteString(c.c, raw); err != nil {
		c.t.Fatal(err)
	}
}

// answer is a response read off the wire: its status line, its fields
// but Date, sorted, and its body.
type answer struct {
	status string
	fields []string
	body   string
}

// read reads one response to a request of method.
func (c *conn) read(method string) answer {
	c.t.Helper()
	resp, err := http.ReadResponse(c.br, &http.Request{Method: method})
	if err != nil {
		c.t.Fatalf("reading the answer: %v", err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		c.t.Fatalf("reading the body: %v", err)
	}
	a := answer{status: resp.Status, body: string(b)}
	if resp.Close { // ReadResponse takes Connection: close out of the header
		a.fields = append(a.fields, "Connection: close")
	}
	for k, vs := range resp.Header {
		if k == "Date" {
			if len(vs) != 1 {
				c.t.Errorf("Date %q, want one", vs)
			}
			continue
		}
		for _, v := range vs {
			a.fields = append(a.fields, k+": "+v)
		}
	}
	slices.Sort(a.fields)
	return a
}

// fill asks f's plain server for raw, to put its answer in the cache, and
// waits until the fetch it started has ended: a streamed body reaches the
// client before the fetch that stores it returns, and a request that came
// in between would join that fetch instead of finding a hit.
func fill(t *testing.T, f *fronts, method, raw string) {
	t.Helper()
	roundTrip(t, f.plain, method, raw)
	deadline := time.Now().Add(10 * time.Second)
	tick := time.NewTicker(time.Millisecond)
	defer tick.Stop()
	for f.h.Stats().InFlight > 0 {
		if time.Now().After(deadline) {
			t.Fatalf("%d fetches still running 10 s after the answer", f.h.Stats().InFlight)
		}
		<-tick.C
	}
}

// sameAnswer reports whether a and b are the same answer, field for
// field, given a moment apart: an Age, and the ttl of a Cache-Status,
// may differ by the one second that the clock can turn between them.
func sameAnswer(a, b answer) bool {
	if a.status != b.status || a.body != b.body || len(a.fields) != len(b.fields) {
		return false
	}
	for i, fa := range a.fields {
		na, ta := secondsIn(fa)
		nb, tb := secondsIn(b.fields[i])
		if na != nb || ta-tb > 1 || tb-ta > 1 {
			return false
		}
	}
	return true
}

// secondsRE finds the seconds of an Age field and of a Cache-Status ttl.
var secondsRE = regexp.MustCompile(`^(Age: |.*; ttl=)(-?[0-9]+)`)

// secondsIn returns field with the seconds of its Age or ttl taken out,
// and those seconds (0 for any other field).
func secondsIn(field string) (string, int) {
	m := secondsRE.FindStringSubmatchIndex(field)
	if m == nil {
		return field, 0
	}
	n, _ := strconv.Atoi(field[m[4]:m[5]])
	return field[:m[4]] + field[m[5]:], n
}

// roundTrip sends raw on a new connection to addr and reads the answer.
func roundTrip(t *testing.T, addr, method, raw string) answer {
	t.Helper()
	c := dialRaw(t, addr)
	c.send(raw)
	return c.read(method)
}

func rawGet(path string, fields ...string) string {
	return "GET " + path + " HTTP/1.1\r\nHost: cache.test\r\n" + strings.Join(append(fields, ""), "\r\n") + "\r\n"
}

// TestServerHitsAsNetHTTP checks that the loop's answers to hits are
// net/http's, field for field but Date (whose presence it checks): a
// plain hit, HEAD, a body whose type net/http sniffs, an empty body, a
// variant selected by Vary, a 304 to a conditional request; and that the
// loop answered them, handing no connection over.
func TestServerHitsAsNetHTTP(t *testing.T) {
	f := newFronts(t, nil)
	cases := []struct{ name, method, raw string }{
		{"plain", "GET", rawGet("/plain")},
		{"query", "GET", rawGet("/plain?a=1&b=%20")},
		{"HEAD", "HEAD", "HEAD /plain HTTP/1.1\r\nHost: cache.test\r\n\r\n"},
		{"sniffed", "GET", rawGet("/untyped")},
		{"empty", "GET", rawGet("/empty")},
		{"vary en", "GET", rawGet("/vary", "Accept-Language: en")},
		{"vary fr", "GET", rawGet("/vary", "Accept-Language: fr")},
		{"304", "GET", rawGet("/etag", `If-None-Match: "v1"`)},
		{"etag mismatch", "GET", rawGet("/etag", `If-None-Match: "v0"`)},
		{"lower-case names, keep-alive", "GET", "GET /plain HTTP/1.1\r\nhost: cache.test\r\nconnection: keep-alive\r\nuser-agent: x\r\n\r\n"},
		{"bare LF", "GET", "GET /plain HTTP/1.1\nHost: cache.test\n\n"},
	}
	for range 2 { // fill the cache through the plain server (a Vary index, then its variants)
		for _, tc := range cases {
			fill(t, f, tc.method, strings.Replace(tc.raw, "If-None-Match", "X-Not-Conditional", 1))
		}
	}
	calls := f.originCalls.Load()
	for _, tc := range cases {
		want := roundTrip(t, f.plain, tc.method, tc.raw)
		got := roundTrip(t, f.hits, tc.method, tc.raw)
		if !strings.Contains(strings.Join(want.fields, "\n"), "hit") {
			t.Fatalf("%s: net/http's answer %+v is not a hit", tc.name, want)
		}
		if !sameAnswer(got, want) {
			t.Errorf("%s: the loop answered\n%+v\nnet/http answered\n%+v", tc.name, got, want)
		}
	}
	if n := f.handed.Load(); n != 0 {
		t.Errorf("%d connections handed to net/http, want none: every request was a hit", n)
	}
	if n := f.originCalls.Load() - calls; n != 0 {
		t.Errorf("the origin was asked %d times during the hits", n)
	}
}

// TestServerHandsOver checks that a connection whose request is not a
// hit goes to net/http with every byte the loop read of it: pipelined
// hits before it are answered first, in order, and the miss and what
// follows it by net/http; and that requests the loop does not take are
// answered as net/http answers them.
func TestServerHandsOver(t *testing.T) {
	f := newFronts(t, nil)
	fill(t, f, "GET", rawGet("/a"))
	fill(t, f, "GET", rawGet("/b"))

	c := dialRaw(t, f.hits)
	c.send(rawGet("/a") + rawGet("/b") + rawGet("/miss") + rawGet("/a"))
	for _, want := range []string{"body of /a", "body of /b", "body of /miss", "body of /a"} {
		if a := c.read("GET"); a.body != want {
			t.Fatalf("pipelined answer %q, want %q", a.body, want)
		}
	}
	if n := f.handed.Load(); n != 1 {
		t.Errorf("%d connections handed over, want the one with the miss", n)
	}

	for _, tc := range []struct{ name, method, raw string }{
		{"HTTP/1.0", "GET", "GET /a HTTP/1.0\r\nHost: cache.test\r\n\r\n"},
		{"Connection: close", "GET", rawGet("/a", "Connection: close")},
		{"absolute form", "GET", "GET http://cache.test/a HTTP/1.1\r\nHost: cache.test\r\n\r\n"},
		{"no Host", "GET", "GET /a HTTP/1.1\r\n\r\n"},
		{"two Hosts", "GET", rawGet("/a", "Host: other.test")},
		{"Pragma", "GET", rawGet("/a", "Pragma: no-cache")},
		{"body", "GET", rawGet("/a", "Content-Length: 2") + "hi"},
		{"POST", "POST", "POST /post HTTP/1.1\r\nHost: cache.test\r\nContent-Length: 0\r\n\r\n"},
		{"bad field", "GET", rawGet("/a", "Bad Name: x")},
		{"long head", "GET", rawGet("/a", "X-Long: "+strings.Repeat("x", 8<<10))},
	} {
		want := roundTrip(t, f.plain, tc.method, tc.raw)
		before := f.handed.Load()
		got := roundTrip(t, f.hits, tc.method, tc.raw)
		if !sameAnswer(got, want) {
			t.Errorf("%s: the hit server answered\n%+v\nnet/http answered\n%+v", tc.name, got, want)
		}
		if f.handed.Load() != before+1 {
			t.Errorf("%s: the connection was not handed over", tc.name)
		}
	}
}

// TestServerAdmit checks that a hit the gate refuses is handed over, and
// that a hit answered takes a slot and gives it back.
func TestServerAdmit(t *testing.T) {
	var open atomic.Bool
	var held, taken atomic.Int64
	f := newFronts(t, func() (func(), bool) {
		if !open.Load() {
			return nil, false
		}
		taken.Add(1)
		held.Add(1)
		return func() { held.Add(-1) }, true
	})
	fill(t, f, "GET", rawGet("/a"))
	if a := roundTrip(t, f.hits, "GET", rawGet("/a")); a.body != "body of /a" || f.handed.Load() != 1 {
		t.Fatalf("refused by the gate: %+v, %d handed over; want the hit from net/http", a, f.handed.Load())
	}
	open.Store(true)
	if a := roundTrip(t, f.hits, "GET", rawGet("/a")); a.body != "body of /a" || f.handed.Load() != 1 {
		t.Fatalf("admitted: %+v, %d handed over; want the hit from the loop", a, f.handed.Load())
	}
	if taken.Load() != 1 || held.Load() != 0 {
		t.Errorf("slots taken %d, held %d after the answer; want 1 and 0", taken.Load(), held.Load())
	}
}

// TestServerKeepAlivesOff checks that with keep-alives off an answer of
// the loop says Connection: close and closes its connection.
func TestServerKeepAlivesOff(t *testing.T) {
	f := newFronts(t, nil)
	fill(t, f, "GET", rawGet("/a"))
	f.srv.SetKeepAlivesEnabled(false)
	c := dialRaw(t, f.hits)
	c.send(rawGet("/a") + rawGet("/a"))
	a := c.read("GET")
	if a.body != "body of /a" || !slices.Contains(a.fields, "Connection: close") {
		t.Fatalf("answer %+v, want the hit with Connection: close", a)
	}
	if _, err := c.br.ReadByte(); err != io.EOF {
		t.Fatalf("after the answer: %v, want the connection closed (EOF)", err)
	}
	f.srv.SetKeepAlivesEnabled(true)
	c = dialRaw(t, f.hits)
	c.send(rawGet("/a") + rawGet("/a"))
	for range 2 {
		if a := c.read("GET"); slices.Contains(a.fields, "Connection: close") {
			t.Fatalf("keep-alives on again: %+v", a)
		}
	}
}

// TestServerShutdown checks that Shutdown closes the loop's idle
// connections, lets Serve return http.ErrServerClosed (see newFronts) and
// shuts down the connections handed over.
func TestServerShutdown(t *testing.T) {
	f := newFronts(t, nil)
	fill(t, f, "GET", rawGet("/a"))
	idle := dialRaw(t, f.hits)
	idle.send(rawGet("/a"))
	idle.read("GET")
	handed := dialRaw(t, f.hits)
	handed.send(rawGet("/new"))
	handed.read("GET")
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := f.srv.Shutdown(ctx); err != nil {
		t.Fatalf("Shutdown: %v", err)
	}
	for name, c := range map[string]*conn{"the loop's": idle, "the handed-over": handed} {
		if _, err := c.br.ReadByte(); err != io.EOF {
			t.Errorf("%s idle connection after Shutdown: %v, want EOF", name, err)
		}
	}
	if _, err := net.DialTimeout("tcp", f.hits, time.Second); err == nil {
		t.Error("the listener still accepts after Shutdown")
	}
}

// FuzzServerParse feeds request heads to the loop's parser beside
// net/http's: whatever the loop takes, net/http reads the same method,
// target, Host and fields.
func FuzzServerParse(f *testing.F) {
	for _, s := range []string{
		rawGet("/a"), rawGet("/a?b=c", "Accept: */*", "X: y"), "HEAD / HTTP/1.1\nHost: h:80\n\n",
		rawGet("/a", "Host: b"), "GET /a HTTP/1.1\r\nHost: h\r\n x\r\n\r\n", rawGet("/%zz"), rawGet("/a", "Cache-Control: no-cache"),
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, head string) {
		req := herdhttp.ParseHit([]byte(head))
		if req == nil {
			return
		}
		want, err := http.ReadRequest(bufio.NewReader(strings.NewReader(head)))
		if err != nil {
			t.Fatalf("the loop took %q; net/http refuses it: %v", head, err)
		}
		if req.Method != want.Method || req.RequestURI != want.RequestURI || req.URL.String() != want.URL.String() || req.Host != want.Host {
			t.Fatalf("%q: the loop read %s %s %s (%s), net/http %s %s %s (%s)", head, req.Method, req.RequestURI, req.Host, req.URL,
				want.Method, want.RequestURI, want.Host, want.URL)
		}
		if fmt.Sprint(req.Header) != fmt.Sprint(want.Header) {
			t.Fatalf("%q: the loop read fields %v, net/http %v", head, req.Header, want.Header)
		}
	})
}

// flakyListener fails its first fails Accepts with a temporary error, as
// a listener out of file descriptors does.
type flakyListener struct {
	net.Listener
	fails atomic.Int64
}

type temporaryError struct{}

func (temporaryError) Error() string   { return "accept: too many open files" }
func (temporaryError) Timeout() bool   { return false }
func (temporaryError) Temporary() bool { return true }

func (l *flakyListener) Accept() (net.Conn, error) {
	if l.fails.Add(-1) >= 0 {
		return nil, temporaryError{}
	}
	return l.Listener.Accept()
}

// TestServerAcceptRetries checks that Serve accepts again after a
// temporary error of its listener instead of returning.
func TestServerAcceptRetries(t *testing.T) {
	f := newFronts(t, nil)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	fl := &flakyListener{Listener: ln}
	fl.fails.Store(3)
	srv := &herdhttp.Server{Handler: f.h, Fallback: &http.Server{Handler: f.h}}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(fl) }()
	fill(t, f, "GET", rawGet("/a"))
	if a := roundTrip(t, ln.Addr().String(), "GET", rawGet("/a")); a.body != "body of /a" {
		t.Fatalf("after 3 failed accepts: %+v", a)
	}
	if err := srv.Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
	if err := <-served; !errors.Is(err, http.ErrServerClosed) {
		t.Fatalf("Serve: %v", err)
	}
}
