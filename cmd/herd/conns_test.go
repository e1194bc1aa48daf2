package main

import (
	"bufio"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime/debug"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/herdcache/herd/herdhttp"
)

// client is one raw HTTP/1.1 connection to a server.
type client struct {
	c net.Conn
	r *bufio.Reader
}

func dial(t *testing.T, addr string) *client {
	t.Helper()
	c, err := net.DialTimeout("tcp", addr, proxyDeadline)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	c.SetDeadline(time.Now().Add(proxyDeadline))
	return &client{c, bufio.NewReader(c)}
}

// send writes a GET of path.
func (c *client) send(t *testing.T, path string) {
	t.Helper()
	if _, err := fmt.Fprintf(c.c, "GET %s HTTP/1.1\r\nHost: test\r\n\r\n", path); err != nil {
		t.Fatal(err)
	}
}

// answer reads an answer and reports whether the server keeps the
// connection open past it.
func (c *client) answer(t *testing.T, path string) (keepAlive bool) {
	t.Helper()
	resp, err := http.ReadResponse(c.r, nil)
	if err != nil {
		t.Fatalf("GET %s: %v", path, err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET %s: %d", path, resp.StatusCode)
	}
	return !resp.Close
}

// closed waits until the server closes c.
func (c *client) closed(t *testing.T) {
	t.Helper()
	if _, err := c.r.ReadByte(); err != io.EOF {
		t.Fatalf("read on a connection the server should close: %v; want EOF", err)
	}
}

// TestConnLimit serves on a real listener limited to 2 connections, with
// a handler that holds each request until its gate opens: a third
// connection waits unserved while two are open. Then the server keeps
// no connection open past its answer, so the first, once answered, is
// closed and the third is served; once a connection is accepted below the
// limit, keep-alives are back. Idle connections give way at once to one
// that waits.
func TestConnLimit(t *testing.T) {
	var mu sync.Mutex
	gates := map[string]chan struct{}{}
	gate := func(path string) chan struct{} {
		mu.Lock()
		defer mu.Unlock()
		if gates[path] == nil {
			gates[path] = make(chan struct{})
		}
		return gates[path]
	}
	entered := make(chan string, 10)
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		entered <- r.URL.Path
		<-gate(r.URL.Path)
		io.WriteString(w, "ok")
	})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv, lim := newServer(h, ln, 2)
	waiting := make(chan struct{}, 10)
	lim.(*limitListener).waiting = func() { waiting <- struct{}{} }
	idle := make(chan struct{}, 10)
	srv.ConnState = func(_ net.Conn, s http.ConnState) {
		if s == http.StateIdle {
			idle <- struct{}{}
		}
	}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(lim) }()
	t.Cleanup(func() {
		srv.Close()
		if err := <-served; err != http.ErrServerClosed {
			t.Errorf("Serve: %v", err)
		}
	})
	addr := ln.Addr().String()
	expect := func(want string) {
		t.Helper()
		select {
		case p := <-entered:
			if p != want {
				t.Fatalf("the handler got %s; want %s", p, want)
			}
		case <-time.After(proxyDeadline):
			t.Fatalf("%s not served within %v", want, proxyDeadline)
		}
	}

	c1, c2 := dial(t, addr), dial(t, addr)
	c1.send(t, "/1")
	expect("/1")
	c2.send(t, "/2")
	expect("/2")
	c3 := dial(t, addr)
	c3.send(t, "/3")
	select {
	case <-waiting:
	case p := <-entered:
		t.Fatalf("%s served while 2 connections are open; want it to wait", p)
	case <-time.After(proxyDeadline):
		t.Fatalf("the third connection did not wait within %v", proxyDeadline)
	}
	select {
	case p := <-entered:
		t.Fatalf("%s served while it waits for a slot", p)
	default:
	}

	close(gate("/1"))
	if c1.answer(t, "/1") {
		t.Error("/1 answered with keep-alive while a connection waits; want Connection: close")
	}
	c1.closed(t)
	expect("/3") // the slot /1 left
	close(gate("/3"))
	close(gate("/2"))
	if c3.answer(t, "/3") || c2.answer(t, "/2") {
		t.Error("an answer kept its connection open while the listener was full")
	}
	c3.closed(t)
	c2.closed(t)

	// Below the limit again: keep-alives are back.
	c4 := dial(t, addr)
	close(gate("/4"))
	c4.send(t, "/4")
	expect("/4")
	if !c4.answer(t, "/4") {
		t.Error("/4 answered with Connection: close below the limit; want keep-alive")
	}
	c5 := dial(t, addr)
	close(gate("/5"))
	c5.send(t, "/5")
	expect("/5")
	if !c5.answer(t, "/5") {
		t.Error("/5 answered with Connection: close with a slot taken but none waiting; want keep-alive")
	}
	for range 2 {
		select {
		case <-idle:
		case <-time.After(proxyDeadline):
			t.Fatalf("/4 and /5 not idle within %v", proxyDeadline)
		}
	}
	// Both slots held by idle connections: one that waits closes them.
	c6 := dial(t, addr)
	close(gate("/6"))
	c6.send(t, "/6")
	expect("/6")
	c6.answer(t, "/6")
	c4.closed(t)
	c5.closed(t)
}

// TestProxyHelpStatesMemoryBound reads the memory bound herd proxy --help
// states and checks it against the constants memBound and setBounds use:
// the formula's terms, its value with the defaults, and the distance of
// Go's memory limit under it.
func TestProxyHelpStatesMemoryBound(t *testing.T) {
	code, help, _ := herd(t, "proxy", "--help")
	if code != exitOK {
		t.Fatalf("herd proxy --help exited %d", code)
	}
	help = strings.Join(strings.Fields(help), " ")
	m := regexp.MustCompile(`within ([0-9.]+) x max-bytes \+ (\d+) MiB \+ (\d+) KiB x max-conns \+ (\d+) KiB x max-concurrency \((\d+) MiB with the defaults\)`).FindStringSubmatch(help)
	if m == nil {
		t.Fatalf("herd proxy --help states no memory bound of the form 1.5 x max-bytes + F MiB + C KiB x max-conns + R KiB x max-concurrency (D MiB with the defaults):\n%s", help)
	}
	num := func(s string) int64 {
		n, err := strconv.ParseInt(s, 10, 64)
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	factor, err := strconv.ParseFloat(m[1], 64)
	if err != nil {
		t.Fatal(err)
	}
	const mb = int64(1 << 20)
	if got := float64(memBound(2*mb, 1, 1)-memBound(0, 1, 1)) / float64(2*mb); got != factor {
		t.Errorf("memBound grows by %v per byte of --max-bytes; help says %v", got, factor)
	}
	if got, want := memBound(0, 1, 1), num(m[2])<<20+num(m[3])<<10+num(m[4])<<10; got != want {
		t.Errorf("memBound(0, 1, 1) = %d; the help's formula gives %d", got, want)
	}
	if got, want := memBound(0, 2, 1)-memBound(0, 1, 1), num(m[3])<<10; got != want {
		t.Errorf("memBound grows by %d per connection; help says %d", got, want)
	}
	if got, want := memBound(0, 1, 2)-memBound(0, 1, 1), num(m[4])<<10; got != want {
		t.Errorf("memBound grows by %d per fetch; help says %d", got, want)
	}
	bound := memBound(defaultMaxBytes, defaultMaxConns, defaultMaxConc)
	if got, want := (bound+mb/2)/mb, num(m[5]); got != want {
		t.Errorf("memBound with the defaults is %d MiB; help says %d MiB", got, want)
	}
	for _, d := range []string{
		fmt.Sprintf("(default %d)", defaultMaxConc),
		fmt.Sprintf("(default %d)", defaultMaxConns),
		fmt.Sprintf("(default %d,", defaultMaxBytes),
	} {
		if !strings.Contains(help, d) {
			t.Errorf("herd proxy --help does not say %q", d)
		}
	}

	under := regexp.MustCompile(`memory limit is (\d+) MiB under that bound`).FindStringSubmatch(help)
	if under == nil {
		t.Fatal("herd proxy --help does not say how far under the bound Go's memory limit is")
	}
	t.Setenv("GOMEMLIMIT", "")
	old := debug.SetMemoryLimit(-1)
	defer debug.SetMemoryLimit(old)
	if err := setBounds(herdhttp.DefaultOptions(), defaultMaxConc, defaultMaxConns, time.Second, defaultMaxBytes); err != nil {
		t.Fatal(err)
	}
	if got, want := debug.SetMemoryLimit(-1), bound-num(under[1])<<20; got != want {
		t.Errorf("Go's memory limit with the defaults is %d; want the bound %d less %s MiB, %d", got, bound, under[1], want)
	}
}

// TestProxyMemoryBoundedByMaxConns runs herd proxy, built apart so that
// the race detector does not count, with small bounds and floods it with
// connections that each make a request and then stay open, idle, with
// distinct misses over pooled connections besides, for bodies several
// times the byte budget: the proxy's peak RSS stays within the bound its
// help states. Without --max-conns the idle connections alone take it
// well past.
func TestProxyMemoryBoundedByMaxConns(t *testing.T) {
	if testing.Short() {
		t.Skip("builds herd proxy and floods it")
	}
	const (
		maxBytes = 8 << 20
		conns    = 128
		conc     = 16
		idlers   = 3000 // connections that stay open
		misses   = 1600 // of 32 KiB each: 50 MiB
		workers  = 32
	)
	bound := memBound(maxBytes, conns, conc)
	bin := filepath.Join(t.TempDir(), "herd")
	build := exec.Command("go", "build", "-o", bin, ".")
	// Built without the race detector, whatever builds this test: its
	// shadow memory would count in the RSS.
	build.Env = slices.DeleteFunc(os.Environ(), func(e string) bool { return strings.HasPrefix(e, "GOFLAGS=") })
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	body := strings.Repeat("x", 32<<10)
	origin := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Cache-Control", "max-age=60")
		io.WriteString(w, body)
	}))
	t.Cleanup(origin.Close)

	proxy := exec.Command(bin, "proxy", "--upstream", origin.URL, "--listen", "127.0.0.1:0",
		"--max-bytes", strconv.Itoa(maxBytes), "--max-conns", strconv.Itoa(conns), "--max-concurrency", strconv.Itoa(conc))
	proxy.Env = slices.DeleteFunc(os.Environ(), func(e string) bool { return strings.HasPrefix(e, "GOMEMLIMIT=") })
	stdout, err := proxy.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := proxy.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- proxy.Wait() }()
	t.Cleanup(func() {
		proxy.Process.Signal(os.Interrupt)
		select {
		case <-exited:
		case <-time.After(proxyDeadline):
			proxy.Process.Kill()
			t.Errorf("herd proxy did not stop within %v", proxyDeadline)
		}
	})
	addrs := make(chan string, 1)
	go func() {
		line, _ := bufio.NewReader(stdout).ReadString('\n')
		addrs <- line
		io.Copy(io.Discard, stdout)
	}()
	var addr string
	select {
	case line := <-addrs:
		_, rest, ok := strings.Cut(line, "http://")
		addr, _, _ = strings.Cut(rest, ",")
		if !ok || addr == "" {
			t.Fatalf("herd proxy printed %q; want its address", line)
		}
	case <-time.After(proxyDeadline):
		t.Fatalf("herd proxy not serving within %v", proxyDeadline)
	}

	var (
		mu       sync.Mutex
		held     []net.Conn // the idle connections, closed at the end
		answered = map[int]int{}
	)
	t.Cleanup(func() {
		for _, c := range held {
			c.Close()
		}
	})
	count := func(code int) {
		mu.Lock()
		answered[code]++
		mu.Unlock()
	}
	idle := func(i int) {
		c, err := net.DialTimeout("tcp", addr, proxyDeadline)
		if err != nil {
			t.Error(err)
			return
		}
		mu.Lock()
		held = append(held, c)
		mu.Unlock()
		c.SetDeadline(time.Now().Add(proxyDeadline))
		fmt.Fprintf(c, "GET /idle/%d HTTP/1.1\r\nHost: test\r\n\r\n", i)
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil {
			t.Errorf("GET /idle/%d: %v", i, err)
			return
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		count(resp.StatusCode)
	}
	client := &http.Client{Timeout: proxyDeadline, Transport: &http.Transport{MaxIdleConnsPerHost: workers}}
	defer client.CloseIdleConnections()
	miss := func(i int) {
		resp, err := client.Get(fmt.Sprintf("http://%s/miss/%d", addr, i))
		if err != nil {
			t.Errorf("GET /miss/%d: %v", i, err)
			return
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		count(resp.StatusCode)
	}
	jobs := make(chan func(), workers)
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			for job := range jobs {
				job()
			}
		})
	}
	for i := range max(idlers, misses) {
		if i < idlers {
			jobs <- func() { idle(i) }
		}
		if i < misses {
			jobs <- func() { miss(i) }
		}
	}
	close(jobs)
	wg.Wait()

	hwm := vmHWM(t, proxy.Process.Pid)
	t.Logf("peak RSS %.1f MiB, bound %.1f MiB; answers %v", float64(hwm)/(1<<20), float64(bound)/(1<<20), answered)
	if answered[http.StatusOK] < misses/2 {
		t.Errorf("%d of %d requests answered 200; want at least %d", answered[http.StatusOK], idlers+misses, misses/2)
	}
	if hwm > bound {
		t.Errorf("herd proxy's peak RSS %d (%.1f MiB) is over its stated bound %d (%.1f MiB)", hwm, float64(hwm)/(1<<20), bound, float64(bound)/(1<<20))
	}
}

// vmHWM is the peak RSS of process pid, in bytes.
func vmHWM(t *testing.T, pid int) int64 {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Skipf("no /proc: %v", err)
	}
	for line := range strings.SplitSeq(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "VmHWM:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
			if err != nil {
				t.Fatalf("VmHWM %q: %v", v, err)
			}
			return kb << 10
		}
	}
	t.Fatalf("no VmHWM in /proc/%d/status", pid)
	return 0
}

// TestMemBoundSaturates checks that memBound neither overflows on huge
// flags nor states a bound without limits.
func TestMemBoundSaturates(t *testing.T) {
	for _, c := range []struct {
		maxBytes    int64
		conns, conc int
		want        int64
	}{
		{math.MaxInt64, 1, 1, math.MaxInt64},
		{1 << 20, math.MaxInt, 1, math.MaxInt64},
		{1 << 20, 1, math.MaxInt, math.MaxInt64},
		{1 << 20, 0, 1, 0},
		{1 << 20, 1, 0, 0},
		{2 << 20, 1, 1, 3<<20 + memFixed + memPerConn + memPerFetch},
	} {
		if got := memBound(c.maxBytes, c.conns, c.conc); got != c.want {
			t.Errorf("memBound(%d, %d, %d) = %d; want %d", c.maxBytes, c.conns, c.conc, got, c.want)
		}
	}
}
