package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/herdcache/herd/herdhttp"
	"github.com/herdcache/herd/herdprom"
	"github.com/herdcache/herd/observe"
	"github.com/herdcache/herd/redisstore"
)

// opsUsage documents the operating flags of herd proxy.
const opsUsage = `  --prefix P       the prefix of every Redis key and channel, so that
                   several fleets can share one Redis (default herd:)
  --key-header NAME
                   a request field whose value is part of every cache key,
                   such as a tenant header; repeat for more (default none)
  --route PATTERN  an http.ServeMux pattern, such as "GET /products/{id}",
                   that metrics are counted by; repeat for more (default
                   none: every request counts under route "other")
  --admin ADDR     serve the admin endpoints on ADDR, such as
                   127.0.0.1:9090, never on the public listener (default
                   none): /metrics (Prometheus), /healthz (200 while the
                   proxy runs), /readyz (200 when Redis answers, 503
                   "degraded" when it does not), and with a purge token
                   POST /purge/tag/{tag} and POST /purge/url?url=URL
  --purge-token T  the bearer token the purge endpoints require
                   (Authorization: Bearer T); default $HERD_PURGE_TOKEN,
                   and without one the purge endpoints are not served
  --access-log DEST
                   log each answer (method, URI, status, bytes, duration,
                   Cache-Status) to DEST: - for stderr, or a file, appended
                   to (default none). Without it, hits are answered on
                   each connection's own loop, not net/http's server
                   (herdhttp.Server); with it, every request goes
                   through net/http's server and the log
  --log-format F   text or json, for the access log and for the errors
                   logged on stderr, such as an origin that cannot be
                   reached (default text)
`

// ops holds the operating flags of herd proxy.
type ops struct {
	prefix, admin, purgeToken, accessLog, logFormat string
	keyHeaders, routes                              []string
}

// addOpsFlags defines the operating flags on fs.
func addOpsFlags(fs *flag.FlagSet) *ops {
	p := &ops{}
	fs.StringVar(&p.prefix, "prefix", "", "")
	fs.StringVar(&p.admin, "admin", "", "")
	fs.StringVar(&p.purgeToken, "purge-token", os.Getenv("HERD_PURGE_TOKEN"), "")
	fs.StringVar(&p.accessLog, "access-log", "", "")
	fs.StringVar(&p.logFormat, "log-format", "text", "")
	fs.Func("key-header", "", func(s string) error {
		if !validFieldName(s) {
			return fmt.Errorf("--key-header needs a field name, got %q", s)
		}
		p.keyHeaders = append(p.keyHeaders, s)
		return nil
	})
	fs.Func("route", "", func(s string) error {
		p.routes = append(p.routes, s)
		return nil
	})
	return p
}

// operated is what the operating flags made: the loggers, the metrics
// and the files to close.
type operated struct {
	*ops
	errLog  *slog.Logger // stderr
	access  *slog.Logger // nil: no access log
	closers []io.Closer
	metrics *routeMetrics
	reg     *prometheus.Registry
}

// apply checks the operating flags and sets o from them. A usage error
// is returned as such; the caller closes what the result holds.
func (p *ops) apply(o *herdhttp.Options, stderr io.Writer) (*operated, error) {
	r := &operated{ops: p, reg: prometheus.NewRegistry()}
	newLogger := func(w io.Writer) *slog.Logger {
		if p.logFormat == "json" {
			return slog.New(slog.NewJSONHandler(w, nil))
		}
		return slog.New(slog.NewTextHandler(w, nil))
	}
	if p.logFormat != "text" && p.logFormat != "json" {
		return nil, fmt.Errorf("--log-format needs text or json, got %q", p.logFormat)
	}
	r.errLog = newLogger(stderr)
	switch p.accessLog {
	case "":
	case "-":
		r.access = newLogger(stderr)
	default:
		f, err := os.OpenFile(p.accessLog, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o644)
		if err != nil {
			return nil, fmt.Errorf("--access-log: %w", err)
		}
		r.closers = append(r.closers, f)
		r.access = newLogger(f)
	}
	o.KeyHeaders = append(o.KeyHeaders, p.keyHeaders...)
	o.Routes = append(o.Routes, p.routes...)
	r.metrics = newRouteMetrics()
	r.reg.MustRegister(r.metrics)
	o.Recorder = r.metrics
	o.OnOriginError = func(req *http.Request, err error) {
		r.errLog.Warn("origin request failed", "method", req.Method, "url", req.URL.String(), "host", req.Host, "error", err.Error())
	}
	return r, nil
}

// close closes the access log file, if any.
func (r *operated) close() {
	for _, c := range r.closers {
		c.Close()
	}
}

// wrap logs each answer of h to the access log, if there is one.
func (r *operated) wrap(h http.Handler) http.Handler {
	if r.access == nil {
		return h
	}
	return http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		start := time.Now()
		lw := &loggedWriter{ResponseWriter: w}
		defer func() {
			status := lw.status
			if status == 0 {
				status = http.StatusOK
			}
			r.access.LogAttrs(req.Context(), slog.LevelInfo, "request",
				slog.String("method", req.Method), slog.String("uri", req.RequestURI), slog.String("host", req.Host),
				slog.Int("status", status), slog.Int64("bytes", lw.bytes),
				slog.Float64("duration_ms", float64(time.Since(start).Microseconds())/1000),
				slog.String("cache_status", strings.Join(lw.Header().Values("Cache-Status"), ", ")),
				slog.String("remote", req.RemoteAddr))
		}()
		h.ServeHTTP(lw, req)
	})
}

// loggedWriter counts what a handler writes.
type loggedWriter struct {
	http.ResponseWriter
	status int
	bytes  int64
}

func (w *loggedWriter) WriteHeader(code int) {
	if w.status == 0 && code >= 200 {
		w.status = code
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *loggedWriter) Write(p []byte) (int, error) {
	if w.status == 0 {
		w.status = http.StatusOK
	}
	n, err := w.ResponseWriter.Write(p)
	w.bytes += int64(n)
	return n, err
}

// Unwrap lets http.ResponseController reach the connection (Flush).
func (w *loggedWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// serveAdmin serves the admin endpoints of h on the --admin address, if
// any, and returns the function that shuts them down; remote is the
// Redis tier (nil without one).
func (r *operated) serveAdmin(h *herdhttp.Handler, remote *redisstore.Remote, stdout io.Writer) (func(context.Context) error, error) {
	if r.admin == "" {
		return func(context.Context) error { return nil }, nil
	}
	coll, err := herdprom.New(h)
	if err != nil {
		return nil, err
	}
	r.reg.MustRegister(coll)
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(r.reg, promhttp.HandlerOpts{}))
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		io.WriteString(w, "ok\n")
	})
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, req *http.Request) {
		if remote == nil {
			io.WriteString(w, "ready: memory only\n")
			return
		}
		ctx, cancel := context.WithTimeout(req.Context(), 2*time.Second)
		defer cancel()
		if err := remote.Ping(ctx); err != nil {
			http.Error(w, "degraded: redis does not answer: "+err.Error(), http.StatusServiceUnavailable)
			return
		}
		io.WriteString(w, "ready: redis answers\n")
	})
	if r.purgeToken != "" {
		mux.Handle("/purge/", herdhttp.PurgeHandler(h, r.purgeToken))
	}
	ln, err := net.Listen("tcp", r.admin)
	if err != nil {
		return nil, err
	}
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: proxyTimeout}
	go func() {
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			r.errLog.Error("admin listener failed", "error", err.Error())
		}
	}()
	purge := "no purge (no token)"
	if r.purgeToken != "" {
		purge = "purge"
	}
	fmt.Fprintf(stdout, "herd proxy: admin on http://%s (metrics, health, %s)\n", ln.Addr(), purge)
	return srv.Shutdown, nil
}

// routeMetrics exports herdhttp's outcomes and origin requests by route.
type routeMetrics struct {
	observe.NopRecorder
	requests, revalidations, originErrors *prometheus.CounterVec
	origin                                *prometheus.HistogramVec
	// byRoute holds a *routeCounters per route seen: a request's counter
	// is found without hashing its labels or locking the vector.
	byRoute sync.Map
}

// routeCounters are one route's counters by outcome, each looked up in
// its vector on the first request of its outcome and kept.
type routeCounters struct {
	outcomes [16]atomic.Pointer[prometheus.Counter]
}

func newRouteMetrics() *routeMetrics {
	return &routeMetrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "herd_http_requests_total",
			Help: "Requests answered by the proxy, by route and outcome (hit, stale, miss, collapsed, hit-for-pass, revalidated, pass, shed).",
		}, []string{"route", "outcome"}),
		revalidations: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "herd_http_revalidations_total",
			Help: "Conditional requests sent to the origin to revalidate a stored response, by route.",
		}, []string{"route"}),
		originErrors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "herd_http_origin_errors_total",
			Help: "Requests to the origin that failed without a response, by route.",
		}, []string{"route"}),
		origin: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "herd_http_origin_duration_seconds",
			Help:    "Time from sending a request to the origin to its response's fields, by route and status code (0: none came).",
			Buckets: prometheus.ExponentialBuckets(0.001, 2.5, 12),
		}, []string{"route", "code"}),
	}
}

func (m *routeMetrics) RecordRoute(route string, o herdhttp.Outcome) {
	m.counter(route, o).Inc()
}

// counter is the counter of route's outcome o.
func (m *routeMetrics) counter(route string, o herdhttp.Outcome) prometheus.Counter {
	vec := func() prometheus.Counter {
		if o == herdhttp.OutcomeRevalidation {
			return m.revalidations.WithLabelValues(route)
		}
		return m.requests.WithLabelValues(route, o.String())
	}
	rc, ok := m.byRoute.Load(route)
	if !ok {
		rc, _ = m.byRoute.LoadOrStore(route, new(routeCounters))
	}
	slots := &rc.(*routeCounters).outcomes
	if int(o) >= len(slots) {
		return vec()
	}
	if c := slots[o].Load(); c != nil {
		return *c
	}
	c := vec() // the vector's one counter for these labels, whoever stores it
	slots[o].Store(&c)
	return c
}

func (m *routeMetrics) RecordOrigin(route string, status int, d time.Duration) {
	if status == 0 {
		m.originErrors.WithLabelValues(route).Inc()
	}
	m.origin.WithLabelValues(route, strconv.Itoa(status)).Observe(d.Seconds())
}

func (m *routeMetrics) Describe(ch chan<- *prometheus.Desc) {
	m.requests.Describe(ch)
	m.revalidations.Describe(ch)
	m.originErrors.Describe(ch)
	m.origin.Describe(ch)
}

func (m *routeMetrics) Collect(ch chan<- prometheus.Metric) {
	m.requests.Collect(ch)
	m.revalidations.Collect(ch)
	m.originErrors.Collect(ch)
	m.origin.Collect(ch)
}
