// Command metrics serves items through a herd cache in front of a slow origin and exposes the cache's Prometheus metrics at /metrics.
//
//	go run ./examples/metrics [-addr 127.0.0.1:8080] [-delay 200ms]
//
// Then fire a stampede at one key and look at the metrics:
//
//	seq 200 | xargs -P 200 -I{} curl -s -o /dev/null 'http://127.0.0.1:8080/item?id=42'
//	curl -s http://127.0.0.1:8080/metrics | grep ^herd_
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/herdcache/herd"
	"github.com/herdcache/herd/herdprom"
	"github.com/herdcache/herd/herdslog"
	"github.com/herdcache/herd/limiter"
	"github.com/herdcache/herd/observe"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, os.Args[1:], os.Stderr); err != nil {
		log.Fatal(err)
	}
}

// run parses args, serves until ctx ends, then shuts down.
func run(ctx context.Context, args []string, stderr io.Writer) error {
	fs := flag.NewFlagSet("metrics", flag.ContinueOnError)
	fs.SetOutput(stderr)
	addr := fs.String("addr", "127.0.0.1:8080", "address to listen on")
	delay := fs.Duration("delay", 200*time.Millisecond, "how long the simulated origin takes per item")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *delay < 0 {
		return fmt.Errorf("metrics: -delay must not be negative, got %v", *delay)
	}
	logger := slog.New(slog.NewTextHandler(stderr, nil))
	events, err := herdslog.New(logger, herdslog.Options{})
	if err != nil {
		return err
	}
	s, err := newServer(config{origin: slowOrigin(*delay), recorder: events, limit: 8, queueTimeout: 500 * time.Millisecond})
	if err != nil {
		return err
	}
	defer s.cache.Close(context.Background())

	ln, err := net.Listen("tcp", *addr)
	if err != nil {
		return err
	}
	srv := &http.Server{Handler: s, ReadHeaderTimeout: 5 * time.Second}
	logger.Info("serving", "items", "http://"+ln.Addr().String()+"/item?id=42", "metrics", "http://"+ln.Addr().String()+"/metrics")
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	select {
	case err := <-served:
		return err
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := srv.Shutdown(sctx); err != nil {
		return err
	}
	if err := <-served; !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}

// slowOrigin stands in for a database: every item takes delay to fetch.
func slowOrigin(delay time.Duration) func(ctx context.Context, id string) (string, error) {
	return func(ctx context.Context, id string) (string, error) {
		t := time.NewTimer(delay)
		defer t.Stop()
		select {
		case <-t.C:
			return "item " + id + "\n", nil
		case <-ctx.Done():
			return "", ctx.Err()
		}
	}
}

// config is what newServer needs.
type config struct {
	origin   func(ctx context.Context, id string) (string, error)
	recorder observe.Recorder // nil: none
	// limit caps concurrent origin calls; a call that waits queueTimeout for
	// a slot is answered 503.
	limit        int
	queueTimeout time.Duration
}

// server answers /item?id=… from the cache and /metrics from its registry.
type server struct {
	cache  *herd.Cache[string]
	origin func(ctx context.Context, id string) (string, error)
	mux    *http.ServeMux
}

func newServer(c config) (*server, error) {
	lim, err := limiter.New(limiter.Options{Limit: c.limit, Reserve: c.limit / 4, QueueTimeout: c.queueTimeout})
	if err != nil {
		return nil, err
	}
	cache, err := herd.New(&herd.Options[string]{
		Name:       "items",
		MaxEntries: 10_000,
		SoftTTL:    10 * time.Second, // fresh for 10 s,
		HardTTL:    time.Minute,      // then served stale while one refresh runs
		Jitter:     0.1,
		Beta:       1,
		Limiter:    lim,
		HotKeys:    10,
		Recorder:   c.recorder,
	})
	if err != nil {
		return nil, err
	}
	col, err := herdprom.New(cache)
	if err != nil {
		return nil, err
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(col, collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))

	s := &server{cache: cache, origin: c.origin, mux: http.NewServeMux()}
	s.mux.HandleFunc("GET /item", s.item)
	s.mux.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	return s, nil
}

func (s *server) ServeHTTP(w http.ResponseWriter, r *http.Request) { s.mux.ServeHTTP(w, r) }

func (s *server) item(w http.ResponseWriter, r *http.Request) {
	id := r.URL.Query().Get("id")
	if id == "" {
		http.Error(w, "missing id", http.StatusBadRequest)
		return
	}
	// The key holds every input of the origin call: here, the id.
	v, err := s.cache.Get(r.Context(), herd.Key("item", id), func(ctx context.Context) (string, error) {
		return s.origin(ctx, id)
	})
	if herd.WriteOverloaded(w, err) {
		return
	}
	if err != nil {
		http.Error(w, "origin: "+err.Error(), http.StatusBadGateway)
		return
	}
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	io.WriteString(w, v)
}
