// Command flood sends an open-loop flood of distinct cache misses to a
// proxy: requests leave at a fixed rate whether or not earlier ones were
// answered, each for a URL never asked before. It reports the latency
// (from each request's scheduled start) at p50 and p99, the answers by
// status, and the peak RSS of the proxy process read from /proc.
package main

import (
	"flag"
	"fmt"
	"io"
	"log"
	"net/http"
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
	flag.Parse()
	if *base == "" {
		log.Fatal("flood: --url is required")
	}
	client := &http.Client{
		Timeout:   *timeout,
		Transport: &http.Transport{MaxIdleConnsPerHost: 4096, MaxIdleConns: 4096, DisableCompression: true},
	}
	type result struct {
		code int // 0: an error
		lat  time.Duration
	}
	var (
		mu      sync.Mutex
		results []result
		wg      sync.WaitGroup
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
	run := strconv.FormatInt(time.Now().UnixNano(), 36)
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
			if err == nil {
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
