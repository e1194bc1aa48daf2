package main

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"net/http/httptrace"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/herdcache/herd/redisstore/redisproc"
)

// proxyDeadline bounds every wait of the proxy tests.
const proxyDeadline = 30 * time.Second

// lines is an io.Writer that sends each write on its channel, or drops it
// when the channel is full.
type lines chan string

func (l lines) Write(p []byte) (int, error) {
	select {
	case l <- string(p):
	default:
	}
	return len(p), nil
}

// origin is an HTTP service that counts its requests and answers each
// with body, cacheable for a minute, once gate (if any) is closed.
type origin struct {
	n       atomic.Int64
	entered chan struct{} // one value per request; buffered
	gate    chan struct{} // nil: answer at once
	url     string
}

func newOrigin(t *testing.T, gate chan struct{}) *origin {
	o := &origin{entered: make(chan struct{}, 100), gate: gate}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		o.n.Add(1)
		o.entered <- struct{}{}
		if o.gate != nil {
			<-o.gate
		}
		w.Header().Set("Cache-Control", "max-age=60")
		io.WriteString(w, "page "+r.URL.Path)
	}))
	t.Cleanup(srv.Close)
	o.url = srv.URL
	return o
}

// startProxy runs herd proxy with args on a free loopback port until the
// test ends, and returns its base URL; the test fails unless it then
// exits 0.
func startProxy(t *testing.T, args ...string) string {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	out, errOut := make(lines, 10), make(lines, 10)
	done := make(chan int, 1)
	go func() { done <- run(ctx, append([]string{"proxy", "--listen", "127.0.0.1:0"}, args...), out, errOut) }()
	t.Cleanup(func() {
		cancel()
		select {
		case code := <-done:
			if code != exitOK {
				t.Errorf("herd proxy exited %d", code)
			}
		case <-time.After(proxyDeadline):
			t.Errorf("herd proxy did not stop within %v", proxyDeadline)
		}
	})
	timer := time.NewTimer(proxyDeadline)
	defer timer.Stop()
	for {
		select {
		case line := <-out:
			for f := range strings.FieldsSeq(line) {
				if u, ok := strings.CutPrefix(f, "http://"); ok {
					return "http://" + strings.TrimSuffix(u, ",")
				}
			}
		case line := <-errOut:
			t.Fatalf("herd proxy: %s", line)
		case code := <-done:
			t.Fatalf("herd proxy exited %d before serving", code)
		case <-timer.C:
			t.Fatalf("herd proxy not serving within %v", proxyDeadline)
		}
	}
}

var proxyClient = &http.Client{Timeout: proxyDeadline}

// fetch GETs url and returns its body and Cache-Status. Its Host is
// www.example.test, whichever proxy it goes to, as it is for replicas
// behind one load balancer: the host is part of the cache key.
func fetch(t *testing.T, ctx context.Context, url string) (body, status string) {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		t.Error(err)
		return "", ""
	}
	req.Host = "www.example.test"
	resp, err := proxyClient.Do(req)
	if err != nil {
		t.Errorf("GET %s: %v", url, err)
		return "", ""
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Errorf("GET %s: %d, %v", url, resp.StatusCode, err)
	}
	return string(b), resp.Header.Get("Cache-Status")
}

// TestProxyCaches puts herd proxy in front of a service and reads one page
// twice: the service is asked once, and the second answer is a hit.
func TestProxyCaches(t *testing.T) {
	o := newOrigin(t, nil)
	base := startProxy(t, "--upstream", o.url)
	for i, want := range []string{"stored", "hit"} {
		body, status := fetch(t, t.Context(), base+"/products/1")
		if body != "page /products/1" || !strings.HasPrefix(status, "herd;") || !strings.Contains(status, want) {
			t.Errorf("read %d: %q, Cache-Status %q; want the page and %q", i+1, body, status, want)
		}
	}
	if n := o.n.Load(); n != 1 {
		t.Errorf("the service was asked %d times, want 1", n)
	}
}

// TestProxyFleetOverRedis runs two herd proxies over one redis-server and
// sends 20 concurrent requests for a page, half to each, while the
// service holds its answer: the service is asked once for the fleet, and
// every request gets the page; a later read through either proxy is a hit.
func TestProxyFleetOverRedis(t *testing.T) {
	srv, err := redisproc.Start(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := srv.Stop(); err != nil {
			t.Error(err)
		}
	})
	gate := make(chan struct{})
	o := newOrigin(t, gate)
	a := startProxy(t, "--upstream", o.url, "--redis", srv.Addr())
	b := startProxy(t, "--upstream", o.url, "--redis", srv.Addr())

	const n = 20
	var wrote, wg sync.WaitGroup
	wrote.Add(n)
	for i := range n {
		base := a
		if i%2 == 1 {
			base = b
		}
		var once sync.Once
		ctx := httptrace.WithClientTrace(t.Context(), &httptrace.ClientTrace{
			WroteRequest: func(httptrace.WroteRequestInfo) { once.Do(wrote.Done) },
		})
		wg.Go(func() {
			if body, status := fetch(t, ctx, base+"/hot"); body != "page /hot" {
				t.Errorf("GET %s/hot: %q, Cache-Status %q", base, body, status)
			}
		})
	}
	select {
	case <-o.entered:
	case <-time.After(proxyDeadline):
		t.Fatalf("the service was not asked within %v", proxyDeadline)
	}
	wrote.Wait() // every request is on its way before the service answers
	close(gate)
	wg.Wait()
	for _, base := range []string{a, b} {
		if body, status := fetch(t, t.Context(), base+"/hot"); body != "page /hot" || !strings.Contains(status, "hit") {
			t.Errorf("a later read through %s: %q, Cache-Status %q; want a hit", base, body, status)
		}
	}
	if got := o.n.Load(); got != 1 {
		t.Errorf("the service was asked %d times for %d concurrent requests on two proxies, want 1", got, n)
	}
}

// TestProxyForwardFields checks what each --forward-fields mode lets
// reach the service on a fetch whose answer is stored: keyed, none of a
// client's own fields; all, every one; a list, those named.
func TestProxyForwardFields(t *testing.T) {
	for _, tc := range []struct {
		mode        string
		trace, more bool
	}{{"keyed", false, false}, {"all", true, true}, {"X-Trace", true, false}} {
		t.Run(tc.mode, func(t *testing.T) {
			seen := make(chan http.Header, 1)
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				seen <- r.Header.Clone()
				w.Header().Set("Cache-Control", "max-age=60")
				io.WriteString(w, "page")
			}))
			t.Cleanup(srv.Close)
			base := startProxy(t, "--upstream", srv.URL, "--forward-fields", tc.mode)
			req, err := http.NewRequestWithContext(t.Context(), http.MethodGet, base+"/a", nil)
			if err != nil {
				t.Fatal(err)
			}
			req.Header.Set("X-Trace", "t1")
			req.Header.Set("X-More", "m1")
			resp, err := proxyClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			h := <-seen
			if got := h.Get("X-Trace") == "t1"; got != tc.trace {
				t.Errorf("the service got X-Trace: %v, want %v", got, tc.trace)
			}
			if got := h.Get("X-More") == "m1"; got != tc.more {
				t.Errorf("the service got X-More: %v, want %v", got, tc.more)
			}
		})
	}
}

// TestProxyBadCommandLines checks that a bad command line exits 2 with a
// clear message, and that an unreachable Redis exits 1 with one line
// that says so.
func TestProxyBadCommandLines(t *testing.T) {
	for _, args := range [][]string{
		{"proxy"},
		{"proxy", "--upstream", "ftp://127.0.0.1/"},
		{"proxy", "--upstream", "/relative"},
		{"proxy", "--upstream", "http://127.0.0.1:1", "extra"},
		{"proxy", "--nope"},
		{"proxy", "--upstream", "http://127.0.0.1:1", "--forward-fields", ""},
		{"proxy", "--upstream", "http://127.0.0.1:1", "--forward-fields", "X-A,,X-B"},
		{"proxy", "--upstream", "http://127.0.0.1:1", "--forward-fields", "X A"},
		{"proxy", "--upstream", "http://127.0.0.1:1", "--max-concurrency", "-1"},
		{"proxy", "--upstream", "http://127.0.0.1:1", "--max-conns", "-1"},
		{"proxy", "--upstream", "http://127.0.0.1:1", "--queue-timeout", "0s"},
		{"proxy", "--upstream", "http://127.0.0.1:1", "--max-bytes", "0"},
	} {
		code, stdout, stderr := herd(t, args...)
		if code != exitUsage || stdout != "" || !strings.HasPrefix(stderr, "herd proxy: ") {
			t.Errorf("herd %q = %d, stdout %q, stderr %q; want 2 and a herd proxy: message", args, code, stdout, stderr)
		}
	}
	code, stdout, stderr := herd(t, "proxy", "--help")
	if code != exitOK || !strings.HasPrefix(stdout, "Usage: herd proxy") || stderr != "" {
		t.Errorf("herd proxy --help = %d, %q, stderr %q", code, stdout, stderr)
	}
	code, stdout, stderr = herdProcess(t, "proxy", "--upstream", "http://127.0.0.1:1", "--redis", "127.0.0.1:1")
	if code != exitFail || stdout != "" || !strings.HasPrefix(stderr, "herd proxy: redis at 127.0.0.1:1 does not answer") || strings.Count(stderr, "\n") != 1 {
		t.Errorf("herd proxy with a dead Redis = %d, stdout %q, stderr %q; want 1 and one line", code, stdout, stderr)
	}
}

// TestProxyMaxConcurrency holds the service's one slot with a request it
// does not answer: a request for another page waits --queue-timeout for a
// slot, then is answered 503 with Retry-After, without reaching the
// service; the first is answered once the service lets it go.
func TestProxyMaxConcurrency(t *testing.T) {
	gate := make(chan struct{})
	o := newOrigin(t, gate)
	base := startProxy(t, "--upstream", o.url, "--max-concurrency", "1", "--queue-timeout", "50ms")
	first := make(chan string, 1)
	go func() {
		body, _ := fetch(t, t.Context(), base+"/a")
		first <- body
	}()
	<-o.entered
	req, err := http.NewRequestWithContext(t.Context(), http.MethodGet, base+"/b", nil)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := proxyClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusServiceUnavailable || resp.Header.Get("Retry-After") == "" {
		t.Errorf("GET /b while /a holds the only slot: %d, Retry-After %q; want 503 with Retry-After", resp.StatusCode, resp.Header.Get("Retry-After"))
	}
	if n := o.n.Load(); n != 1 {
		t.Errorf("the service received %d requests; want 1 (the shed one never reaches it)", n)
	}
	close(gate)
	if body := <-first; body != "page /a" {
		t.Errorf("GET /a = %q; want %q", body, "page /a")
	}
}

// TestProxyAdmitsTwiceMaxConcurrency holds the service's one slot with a
// request it does not answer, under a queue timeout no test waits for:
// of two more requests, at most 2×--max-concurrency being answered at
// once, one waits for the slot and the other is answered 503 with
// Retry-After at once, without reaching the service. Once the service
// lets go, the first two are answered.
func TestProxyAdmitsTwiceMaxConcurrency(t *testing.T) {
	gate := make(chan struct{})
	o := newOrigin(t, gate)
	base := startProxy(t, "--upstream", o.url, "--max-concurrency", "1", "--queue-timeout", "1h")
	type answer struct {
		path       string
		code       int
		retryAfter string
	}
	answers := make(chan answer, 3)
	get := func(path string) {
		req, err := http.NewRequestWithContext(t.Context(), http.MethodGet, base+path, nil)
		if err != nil {
			t.Error(err)
			answers <- answer{path: path}
			return
		}
		resp, err := proxyClient.Do(req)
		if err != nil {
			t.Error(err)
			answers <- answer{path: path}
			return
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		answers <- answer{path, resp.StatusCode, resp.Header.Get("Retry-After")}
	}
	go get("/a")
	<-o.entered
	go get("/b")
	go get("/c")
	var shed answer // before the gate opens, only a shed request is answered
	select {
	case shed = <-answers:
	case <-time.After(proxyDeadline):
		close(gate)
		t.Fatalf("no answer in %v while /a holds the only slot; want one of /b, /c shed at once", proxyDeadline)
	}
	if shed.code != http.StatusServiceUnavailable || shed.retryAfter == "" {
		t.Errorf("GET %s while /a holds the only slot and another waits: %d, Retry-After %q; want 503 with Retry-After", shed.path, shed.code, shed.retryAfter)
	}
	close(gate)
	for range 2 {
		if a := <-answers; a.code != http.StatusOK {
			t.Errorf("GET %s: %d; want 200 once the service answers", a.path, a.code)
		}
	}
	if n := o.n.Load(); n != 2 {
		t.Errorf("the service received %d requests; want 2 (the shed one never reaches it)", n)
	}
}
