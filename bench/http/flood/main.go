// Command flood sends an open-loop flood of distinct cache misses to a
// proxy: requests leave at a fixed rate whether or not earlier ones were
// answered, each for a URL never asked before. It reports the latency
// (from each request's scheduled start) at p50 and p99, the answers by
// status, and the peak RSS of the proxy process read from /proc. With
// -idle N, it first opens N connections that each make one request and
// then stay open, idle, until the flood ends.
package main

import (
	"bufio"
	"flag"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"net/url"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
)

func main() {
	base := flag.String("url", "", "the proxy's base URL, e.g. http://127.0.0.1:8081")
	rate := flag.Int("rate", 2000, "requests per second")
	dur := flag.Duration("duration", 10*time.Second, "how long to send")
	pid := flag.Int("pid", 0, "the proxy's process id, for its RSS")
	timeout := flag.Duration("timeout", 30*time.Second, "a request's timeout")
	idle := flag.Int("idle", 0, "connections opened before the flood that make one request each and stay open")
	flag.Parse()
	if *base == "" {
		log.Fatal("flood: --url is required")
	}
	run := strconv.FormatInt(time.Now().UnixNano(), 36)
	idled := openIdle(*base, run, *idle, *timeout)
	defer idled.close()
	client := &http.Client{
		Timeout:   *timeout,
		Transport: &http.Transport{MaxIdleConnsPerHost: 4096, MaxIdleConns: 4096, DisableCompression: true},
	}
	type result struct {
		code int // 0: an error
		lat  time.Duration
	}
	var (
		mu       sync.Mutex
		results  []result
		firstErr error // the first request's error, if any
		wg       sync.WaitGroup
	)
	var peakRSS int64
	stop := make(chan struct{})
	sampled := make(chan struct{})
	go func() { // samples RSS, as VmHWM misses nothing between samples but is kept too
		defer close(sampled)
		t := time.NewTicker(50 * time.Millisecond)
		defer t.Stop()
		for {
			peakRSS = max(peakRSS, rss(*pid, "VmRSS"))
			select {
			case <-t.C:
			case <-stop:
				return
			}
		}
	}()
	interval := time.Second / time.Duration(*rate)
	n := int(*dur / interval)
	start := time.Now()
	for i := range n {
		at := start.Add(time.Duration(i) * interval)
		if d := time.Until(at); d > 0 {
			time.Sleep(d)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := result{}
			resp, err := client.Get(fmt.Sprintf("%s/flood/%s/%d", *base, run, i))
			if err != nil {
				mu.Lock()
				if firstErr == nil {
					firstErr = err
				}
				mu.Unlock()
			} else {
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				r.code = resp.StatusCode
				if r.code == http.StatusServiceUnavailable && resp.Header.Get("Retry-After") == "" {
					r.code = -503 // a 503 without Retry-After
				}
			}
			r.lat = time.Since(at)
			mu.Lock()
			results = append(results, r)
			mu.Unlock()
		}()
	}
	sent := time.Since(start)
	wg.Wait()
	close(stop)
	<-sampled
	hwm := rss(*pid, "VmHWM")
	counts := map[int]int{}
	lats := make([]time.Duration, 0, len(results))
	byCode := map[int][]time.Duration{}
	for _, r := range results {
		counts[r.code]++
		lats = append(lats, r.lat)
		byCode[r.code] = append(byCode[r.code], r.lat)
	}
	if *idle > 0 {
		fmt.Printf("idle connections: %d opened, answers %v, %d errors\n", *idle, idled.codes, idled.errors)
	}
	fmt.Printf("sent %d in %v (%.0f/s), open loop, each URL distinct\n", n, sent.Round(time.Millisecond), float64(n)/sent.Seconds())
	fmt.Printf("latency p50 %v p99 %v max %v\n", pct(lats, 50), pct(lats, 99), pct(lats, 100))
	codes := make([]int, 0, len(counts))
	for c := range counts {
		codes = append(codes, c)
	}
	slices.Sort(codes)
	for _, c := range codes {
		name := strconv.Itoa(c)
		switch c {
		case 0:
			name = "error"
		case -503:
			name = "503 without Retry-After"
		}
		fmt.Printf("  %-24s %6d  p50 %v p99 %v\n", name, counts[c], pct(byCode[c], 50), pct(byCode[c], 99))
	}
	if firstErr != nil {
		fmt.Printf("first error: %v\n", firstErr)
	}
	if *pid != 0 {
		fmt.Printf("proxy RSS peak %.1f MiB (sampled), VmHWM %.1f MiB\n", float64(peakRSS)/(1<<20), float64(hwm)/(1<<20))
	}
}

// pct is the p-th percentile of ds.
func pct(ds []time.Duration, p int) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	slices.Sort(ds)
	i := min(len(ds)*p/100, len(ds)-1)
	return ds[i].Round(100 * time.Microsecond)
}

// rss reads a field of /proc/pid/status in bytes; 0 when it cannot.
func rss(pid int, field string) int64 {
	if pid == 0 {
		return 0
	}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0
	}
	for line := range strings.SplitSeq(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, field+":"); ok {
			kb, _ := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
			return kb << 10
		}
	}
	return 0
}

// idlers are connections held open, idle, during the flood.
type idlers struct {
	conns  []net.Conn
	codes  map[int]int // their first answers by status
	errors int
}

// openIdle opens n connections to base, 64 at a time, each of which sends
// one GET for a URL of its own and reads the answer; they stay open until
// close.
func openIdle(base, run string, n int, timeout time.Duration) *idlers {
	u, err := url.Parse(base)
	if err != nil {
		log.Fatal(err)
	}
	ids := &idlers{codes: map[int]int{}}
	var mu sync.Mutex
	next := make(chan int)
	var wg sync.WaitGroup
	for range min(n, 64) {
		wg.Go(func() {
			for i := range next {
				code, c := idleOne(u.Host, fmt.Sprintf("/idle/%s/%d", run, i), timeout)
				mu.Lock()
				if code == 0 {
					ids.errors++
				} else {
					ids.codes[code]++
				}
				if c != nil {
					ids.conns = append(ids.conns, c)
				}
				mu.Unlock()
			}
		})
	}
	for i := range n {
		next <- i
	}
	close(next)
	wg.Wait()
	return ids
}

// idleOne opens a connection to host, GETs path on it and returns the
// status (0: an error) and the connection, left open.
func idleOne(host, path string, timeout time.Duration) (int, net.Conn) {
	c, err := net.DialTimeout("tcp", host, timeout)
	if err != nil {
		return 0, nil
	}
	c.SetDeadline(time.Now().Add(timeout))
	fmt.Fprintf(c, "GET %s HTTP/1.1\r\nHost: %s\r\n\r\n", path, host)
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		return 0, c
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	c.SetDeadline(time.Time{})
	return resp.StatusCode, c
}

func (ids *idlers) close() {
	for _, c := range ids.conns {
		c.Close()
	}
}
