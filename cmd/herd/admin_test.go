package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/herdcache/herd/herdhttp"
	"github.com/herdcache/herd/redisstore/redisproc"
)

// opsProxy is a herd proxy started by startOps.
type opsProxy struct {
	url, admin string // admin is empty without --admin
	stderr     lines
}

// startOps runs herd proxy with args on free loopback ports (--admin too,
// when args hold it) until the test ends; the test fails unless it then
// exits 0. Unlike startProxy, what it writes on stderr is the test's.
func startOps(t *testing.T, args ...string) opsProxy {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	out, errOut := make(lines, 10), make(lines, 100)
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
	p := opsProxy{stderr: errOut}
	timer := time.NewTimer(proxyDeadline)
	defer timer.Stop()
	for p.url == "" {
		select {
		case line := <-out:
			for f := range strings.FieldsSeq(line) {
				if u, ok := strings.CutPrefix(f, "http://"); ok {
					u = "http://" + strings.TrimSuffix(u, ",")
					if strings.Contains(line, "admin on") {
						p.admin = u
					} else {
						p.url = u
					}
					break
				}
			}
		case code := <-done:
			t.Fatalf("herd proxy exited %d before serving", code)
		case <-timer.C:
			t.Fatalf("herd proxy not serving within %v", proxyDeadline)
		}
	}
	return p
}

// taggedOrigin answers a GET of a path with its version, "/items v1",
// then "/items v2", cacheable for a minute and tagged with the path;
// other methods get 405.
type taggedOrigin struct {
	mu  sync.Mutex
	n   map[string]int
	url string
}

func newTaggedOrigin(t *testing.T) *taggedOrigin {
	o := &taggedOrigin{n: map[string]int{}}
	srv := httptest.NewServer(o)
	t.Cleanup(srv.Close)
	o.url = srv.URL
	return o
}

func (o *taggedOrigin) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		http.Error(w, "no", http.StatusMethodNotAllowed)
		return
	}
	o.mu.Lock()
	o.n[r.URL.Path]++
	n := o.n[r.URL.Path]
	o.mu.Unlock()
	w.Header().Set("Cache-Control", "max-age=60")
	w.Header().Set("Surrogate-Key", r.URL.Path+" all")
	fmt.Fprintf(w, "%s v%d", r.URL.Path, n)
}

func (o *taggedOrigin) calls(path string) int {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.n[path]
}

// call sends method to u with the bearer token (none when empty) and
// returns the status and body.
func call(t *testing.T, method, u, token string) (int, string) {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), method, u, nil)
	if err != nil {
		t.Fatal(err)
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := proxyClient.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, u, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// eventuallyNot reads base+path until its body is no longer old, for up
// to proxyDeadline, and returns it: a proxy learns of another's purge
// from Redis's notice.
func eventuallyNot(t *testing.T, base, path, old string) string {
	t.Helper()
	deadline := time.Now().Add(proxyDeadline)
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	for time.Now().Before(deadline) {
		if body, _ := fetch(t, t.Context(), base+path); body != old {
			return body
		}
		<-tick.C
	}
	t.Fatalf("%s%s: still %q after %v", base, path, old, proxyDeadline)
	return ""
}

func startRedis(t *testing.T) *redisproc.Server {
	t.Helper()
	srv, err := redisproc.Start(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Stop() })
	return srv
}

// Three proxies over one redis-server: a purge by tag on one proxy's
// admin listener retires the response on all three, and only it; a purge
// by URL on another does the same. The public listener serves no purge.
func TestProxyPurgeFleet(t *testing.T) {
	rs := startRedis(t)
	o := newTaggedOrigin(t)
	var ps []opsProxy
	for range 3 {
		ps = append(ps, startOps(t, "--upstream", o.url, "--redis", rs.Addr(), "--admin", "127.0.0.1:0", "--purge-token", "tok"))
	}
	for _, path := range []string{"/items", "/items/1"} {
		for _, p := range ps {
			if body, status := fetch(t, t.Context(), p.url+path); body != path+" v1" {
				t.Fatalf("%s%s: %q, %q", p.url, path, body, status)
			}
		}
	}
	if code, _ := call(t, http.MethodPost, ps[0].url+"/purge/tag/%2Fitems", "tok"); code == http.StatusOK {
		t.Errorf("the public listener answered a purge 200")
	}
	if code, body := call(t, http.MethodPost, ps[1].admin+"/purge/tag/%2Fitems", "tok"); code != http.StatusOK {
		t.Fatalf("purge of tag /items: %d %q", code, body)
	}
	for _, p := range ps {
		// v2, or v3 from a proxy that asked between another's answer and
		// its write to Redis.
		if body := eventuallyNot(t, p.url, "/items", "/items v1"); !strings.HasPrefix(body, "/items v") {
			t.Errorf("%s/items after the purge: %q", p.url, body)
		}
		if body, _ := fetch(t, t.Context(), p.url+"/items/1"); body != "/items/1 v1" {
			t.Errorf("%s/items/1 after a purge of tag /items: %q; want it kept", p.url, body)
		}
	}
	if n := o.calls("/items"); n < 2 || n > 4 {
		t.Errorf("/items: %d origin requests for 3 proxies, a purge between; want 1 before it and 1 to 3 after", n)
	}
	u := ps[2].admin + "/purge/url?url=" + url.QueryEscape("http://www.example.test/items/1")
	if code, body := call(t, http.MethodPost, u, "tok"); code != http.StatusOK {
		t.Fatalf("purge of /items/1: %d %q", code, body)
	}
	for _, p := range ps {
		eventuallyNot(t, p.url, "/items/1", "/items/1 v1")
	}
	if code, _ := call(t, http.MethodPost, ps[0].admin+"/purge/tag/all", "bad"); code != http.StatusForbidden {
		t.Errorf("purge with a wrong token: %d; want 403", code)
	}
}

// The admin listener serves /healthz, /readyz (503 once Redis is gone),
// /metrics with the outcomes by route, and no purge without a token.
func TestProxyAdmin(t *testing.T) {
	rs := startRedis(t)
	o := newTaggedOrigin(t)
	t.Setenv("HERD_PURGE_TOKEN", "")
	p := startOps(t, "--upstream", o.url, "--redis", rs.Addr(), "--admin", "127.0.0.1:0", "--route", "GET /items/{id}")
	if p.admin == "" {
		t.Fatal("no admin address printed")
	}
	for range 2 {
		fetch(t, t.Context(), p.url+"/items/1")
	}
	fetch(t, t.Context(), p.url+"/other")
	for path, want := range map[string]int{"/healthz": 200, "/readyz": 200, "/purge/tag/all": 404} {
		if code, body := call(t, http.MethodGet, p.admin+path, ""); code != want {
			t.Errorf("GET %s: %d %q; want %d", path, code, body, want)
		}
	}
	if code, _ := call(t, http.MethodPost, p.admin+"/purge/tag/all", "x"); code != http.StatusNotFound {
		t.Errorf("a purge with no token configured: %d; want 404", code)
	}
	code, metrics := call(t, http.MethodGet, p.admin+"/metrics", "")
	if code != http.StatusOK {
		t.Fatalf("/metrics: %d", code)
	}
	for _, want := range []string{
		`herd_http_requests_total{outcome="hit",route="GET /items/{id}"} 1`,
		`herd_http_requests_total{outcome="miss",route="GET /items/{id}"} 1`,
		`herd_http_requests_total{outcome="miss",route="other"} 1`,
		`herd_http_origin_duration_seconds_count{code="200",route="GET /items/{id}"} 1`,
		`herd_requests_total{cache="herd"`,
	} {
		if !strings.Contains(metrics, want) {
			t.Errorf("/metrics lacks %s", want)
		}
	}
	if code, _ := call(t, http.MethodGet, p.url+"/metrics", ""); code != http.StatusOK || o.calls("/metrics") != 1 {
		t.Errorf("/metrics on the public listener did not go to the origin")
	}
	rs.Kill()
	if code, body := call(t, http.MethodGet, p.admin+"/readyz", ""); code != http.StatusServiceUnavailable || !strings.Contains(body, "degraded") {
		t.Errorf("/readyz with Redis killed: %d %q; want 503 degraded", code, body)
	}
	if code, _ := call(t, http.MethodGet, p.admin+"/healthz", ""); code != http.StatusOK {
		t.Errorf("/healthz with Redis killed: %d; want 200", code)
	}
}

// Two fleets with their own --prefix share nothing on one Redis; two
// proxies with one prefix share responses.
func TestProxyPrefix(t *testing.T) {
	rs := startRedis(t)
	o := newTaggedOrigin(t)
	a := startOps(t, "--upstream", o.url, "--redis", rs.Addr(), "--prefix", "blue:")
	b := startOps(t, "--upstream", o.url, "--redis", rs.Addr(), "--prefix", "green:")
	a2 := startOps(t, "--upstream", o.url, "--redis", rs.Addr(), "--prefix", "blue:")
	for _, c := range []struct {
		p    opsProxy
		want string
	}{{a, "/x v1"}, {b, "/x v2"}, {a2, "/x v1"}} {
		if body, status := fetch(t, t.Context(), c.p.url+"/x"); body != c.want {
			t.Errorf("%s/x: %q (%s); want %q", c.p.url, body, status, c.want)
		}
	}
	// A prefix redisstore refuses stops the proxy before it serves; one
	// that served is stopped at the deadline.
	ctx, cancel := context.WithTimeout(t.Context(), proxyDeadline)
	defer cancel()
	var stdout, stderr strings.Builder
	code := run(ctx, []string{"proxy", "--listen", "127.0.0.1:0", "--upstream", "http://127.0.0.1:1", "--redis", rs.Addr(), "--prefix", "{x}"}, &stdout, &stderr)
	if code != exitFail || !strings.Contains(stderr.String(), "Prefix") {
		t.Errorf("--prefix with braces: %d %q; want 1 and redisstore's message", code, stderr.String())
	}
}

// The access log has one JSON line per answer with its Cache-Status,
// and an origin that cannot be reached is logged on stderr.
func TestProxyAccessLog(t *testing.T) {
	o := newTaggedOrigin(t)
	down := httptest.NewServer(http.NotFoundHandler())
	down.Close() // a port nothing listens on
	logFile := filepath.Join(t.TempDir(), "access.log")
	p := startOps(t, "--upstream", o.url, "--access-log", logFile, "--log-format", "json")
	for range 2 {
		fetch(t, t.Context(), p.url+"/a")
	}
	var entries []map[string]any
	// A line is written once its answer is sent: read until both are in.
	deadline := time.Now().Add(proxyDeadline)
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	for len(entries) < 2 && time.Now().Before(deadline) {
		<-tick.C
		f, err := os.Open(logFile)
		if err != nil {
			t.Fatal(err)
		}
		entries = entries[:0]
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			var m map[string]any
			if err := json.Unmarshal(sc.Bytes(), &m); err != nil {
				t.Fatalf("access log line %q: %v", sc.Text(), err)
			}
			entries = append(entries, m)
		}
		f.Close()
	}
	if len(entries) != 2 {
		t.Fatalf("%d access log lines; want 2", len(entries))
	}
	for i, want := range []string{"fwd=uri-miss", "hit"} {
		e := entries[i]
		if cs, _ := e["cache_status"].(string); !strings.Contains(cs, want) || e["uri"] != "/a" || e["status"] != float64(200) || e["method"] != "GET" {
			t.Errorf("access log line %d: %v; want GET /a 200 with Cache-Status %q", i, e, want)
		}
	}

	q := startOps(t, "--upstream", down.URL, "--log-format", "json")
	if code, _ := call(t, http.MethodGet, q.url+"/b", ""); code != http.StatusBadGateway {
		t.Errorf("GET with the origin down: %d; want 502", code)
	}
	select {
	case line := <-q.stderr:
		var m map[string]any
		if err := json.Unmarshal([]byte(line), &m); err != nil || m["msg"] != "origin request failed" || !strings.Contains(fmt.Sprint(m["url"]), "/b") {
			t.Errorf("stderr line %q: want a JSON origin error for /b", line)
		}
	case <-time.After(proxyDeadline):
		t.Error("nothing on stderr for a 502")
	}
}

// herd proxy --help documents each flag with its default, and refuses
// bad values of the operating flags.
func TestProxyHelpListsFlags(t *testing.T) {
	code, stdout, _ := herd(t, "proxy", "--help")
	if code != exitOK {
		t.Fatalf("herd proxy --help: %d", code)
	}
	for _, flag := range []string{"--upstream", "--listen", "--redis", "--forward-fields", "--prefix", "--key-header", "--route", "--admin", "--purge-token", "--access-log", "--log-format"} {
		i := strings.Index(stdout, "\n  "+flag+" ")
		if i < 0 {
			t.Errorf("--help does not document %s", flag)
			continue
		}
		rest := stdout[i+1:]
		if j := strings.Index(rest, "\n  --"); j >= 0 {
			rest = rest[:j]
		}
		if flag != "--upstream" && !strings.Contains(rest, "default") {
			t.Errorf("--help gives no default for %s: %q", flag, rest)
		}
	}
	for _, args := range [][]string{
		{"--log-format", "xml"},
		{"--key-header", "X A"},
		{"--route", "GET /a", "--route", "GET /a"},
		{"--access-log", filepath.Join(t.TempDir(), "missing", "x.log")},
	} {
		code, _, stderr := herd(t, append([]string{"proxy", "--upstream", "http://127.0.0.1:1"}, args...)...)
		if code != exitUsage || !strings.HasPrefix(stderr, "herd proxy: ") {
			t.Errorf("herd proxy %q: %d %q; want 2 and a message", args, code, stderr)
		}
	}
}

// The counters a route's outcomes are kept in count every record made
// at once from many goroutines, each outcome and route apart, with the
// labels the vectors give them.
func TestRouteMetricsCountersKept(t *testing.T) {
	m := newRouteMetrics()
	outcomes := []herdhttp.Outcome{herdhttp.OutcomeHit, herdhttp.OutcomeMiss, herdhttp.OutcomeRevalidation}
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 300 {
				m.RecordRoute([]string{"other", "GET /a"}[(g+i)%2], outcomes[i%3])
			}
		}()
	}
	wg.Wait()
	for _, c := range []struct {
		c    prometheus.Counter
		want float64
	}{
		{m.requests.WithLabelValues("other", "hit"), 400},
		{m.requests.WithLabelValues("GET /a", "hit"), 400},
		{m.requests.WithLabelValues("other", "miss"), 400},
		{m.revalidations.WithLabelValues("GET /a"), 400},
	} {
		if got := testutil.ToFloat64(c.c); got != c.want {
			t.Errorf("%s: %v, want %v", c.c.Desc(), got, c.want)
		}
	}
}
