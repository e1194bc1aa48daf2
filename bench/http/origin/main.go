// Command origin is the HTTP origin of the proxy benchmarks in bench/http:
// it answers every GET with a cacheable body of a fixed size after a fixed
// delay, and reports on /_stats how many requests it served and the most
// it served at once.
package main

import (
	"flag"
	"fmt"
	"log"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync/atomic"
	"time"
)

func main() {
	listen := flag.String("listen", "127.0.0.1:0", "the address to serve on")
	addrFile := flag.String("addr-file", "", "a file to write the address served on to")
	size := flag.Int("size", 1024, "the body's size in bytes")
	delay := flag.Duration("delay", 0, "how long each answer takes")
	maxAge := flag.Int("max-age", 3600, "the answers' max-age in seconds")
	flag.Parse()
	body := []byte(strings.Repeat("x", *size))
	cc := "public, max-age=" + strconv.Itoa(*maxAge)
	var served, inflight, peak atomic.Int64
	mux := http.NewServeMux()
	mux.HandleFunc("/_stats", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Cache-Control", "no-store")
		fmt.Fprintf(w, "served %d peak %d\n", served.Load(), peak.Load())
	})
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		n := inflight.Add(1)
		defer inflight.Add(-1)
		for p := peak.Load(); n > p && !peak.CompareAndSwap(p, n); p = peak.Load() {
		}
		served.Add(1)
		if *delay > 0 {
			select {
			case <-time.After(*delay):
			case <-r.Context().Done():
				return
			}
		}
		w.Header().Set("Cache-Control", cc)
		w.Header().Set("Content-Type", "text/plain")
		w.Header().Set("Content-Length", strconv.Itoa(len(body)))
		w.Write(body)
	})
	ln, err := net.Listen("tcp", *listen)
	if err != nil {
		log.Fatal(err)
	}
	if *addrFile != "" {
		if err := os.WriteFile(*addrFile, []byte(ln.Addr().String()), 0o644); err != nil {
			log.Fatal(err)
		}
	}
	log.Fatal(http.Serve(ln, mux))
}
