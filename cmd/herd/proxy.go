package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"net/url"
	"os"
	"runtime/debug"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/herdcache/herd/herdhttp"
	"github.com/herdcache/herd/limiter"
	"github.com/herdcache/herd/redisstore"
)

const proxyUsage = `Usage: herd proxy --upstream URL [--listen ADDR] [--redis ADDR] [--forward-fields MODE] [--admin ADDR] [flags]

Runs a caching reverse proxy in front of the HTTP service at URL: a shared
cache as RFC 9111 describes it, with stale-while-revalidate and
stale-if-error (RFC 5861), that keeps what the service's Cache-Control
allows and collapses concurrent misses into one request to the service.
Every answer carries Age and a Cache-Status field. With --redis, the
replicas that share the Redis share its responses and fetch each key once
for the whole fleet. It stops on SIGINT or SIGTERM, once the requests in
progress are answered.

Flags:
  --upstream URL   the service to proxy (required), e.g. http://127.0.0.1:8080
  --listen ADDR    the address to serve on (default 127.0.0.1:8081)
  --redis ADDR     a Redis shared by the replicas (default: none, the
                   proxy's own memory only)
  --forward-fields MODE
                   which fields of a client's request reach the service on
                   the requests whose answers may be stored (default keyed):
                   keyed   only those the cache keys on: Accept,
                           Accept-Encoding, Accept-Language, Authorization,
                           Cookie and the fields a URL's answers Vary on;
                           no other field can change a stored answer
                   all     every end-to-end field, as most proxy caches
                           send; a field the service reflects into a
                           cacheable answer (X-Forwarded-Host, say) lets
                           one client poison that answer for every client
                   NAMES   the keyed fields and these, comma-separated
                           (e.g. X-Request-Id,Traceparent)
                   Requests passed to the service uncached carry every
                   end-to-end field in every mode.
  --max-concurrency N
                   the most requests to the service at once for answers
                   that may be stored (default 256); a request that finds
                   no slot within --queue-timeout is answered 503 with
                   Retry-After. At most twice N requests are answered
                   at once: one past that is answered 503 with
                   Retry-After at once. 0 means no cap on either
  --queue-timeout D
                   how long a request waits for such a slot (default 1s)
  --max-conns N    the most client connections open at once (default
                   1024); one past that waits, unserved, until one closes,
                   and while one waits the proxy keeps no connection open
                   past its answer. 0 means no limit
  --max-bytes N    the bytes of responses kept in memory (default 67108864,
                   64 MiB); bodies are stored up to 1 MiB, at most N/4.
` + opsUsage + "\n" + memUsage

// memUsage states the memory bound of herd proxy; memBound computes it.
const memUsage = `The proxy's memory (RSS) stays within
  1.5 x max-bytes + 32 MiB + 40 KiB x max-conns + 64 KiB x max-concurrency
(184 MiB with the defaults), plus the bodies of answers in flight; with
--max-conns or --max-concurrency 0 it has no bound. Unless GOMEMLIMIT is
set, the Go runtime's memory limit is 32 MiB under that bound (under the
bound of the default limits where there is none).
`

// The memory herd proxy is bounded by, beyond 1.5× --max-bytes (Go's
// collector lets the heap grow past what is live) and the bodies in
// flight; memBound adds them up.
const (
	// memFixed is the runtime, the binary's pages, the admin listener and
	// the cache's bookkeeping; it is also the headroom between the bound
	// and Go's memory limit, a soft one.
	memFixed = 32 << 20
	// memPerConn is an open client connection: its goroutine's stack,
	// its read and write buffers and a request header of up to
	// maxHeaderBytes.
	memPerConn = 40 << 10
	// memPerFetch is a fetch from the service: the request waiting for
	// its slot, its connection to the service and its buffers.
	memPerFetch = 64 << 10
)

// The defaults of --max-concurrency, --max-conns and --max-bytes.
const (
	defaultMaxConc  = 256
	defaultMaxConns = 1024
	defaultMaxBytes = 64 << 20
)

// memBound is the RSS herd proxy stays within, bodies in flight aside,
// with the given flags; conns or conc 0 (no limit) has no bound: 0.
func memBound(maxBytes int64, conns, conc int) int64 {
	if conns == 0 || conc == 0 {
		return 0
	}
	b := satAdd(maxBytes, maxBytes/2)
	b = satAdd(b, memFixed)
	b = satAdd(b, satMul(int64(conns), memPerConn))
	return satAdd(b, satMul(int64(conc), memPerFetch))
}

// satAdd is a+b for a, b ≥ 0, or math.MaxInt64 where that overflows.
func satAdd(a, b int64) int64 {
	if a > math.MaxInt64-b {
		return math.MaxInt64
	}
	return a + b
}

// satMul is a×b for a ≥ 0 and b > 0, or math.MaxInt64 where that
// overflows.
func satMul(a, b int64) int64 {
	if a > math.MaxInt64/b {
		return math.MaxInt64
	}
	return a * b
}

// proxyTimeout bounds the Redis check at start and the shutdown.
const proxyTimeout = 10 * time.Second

// runProxy is herd proxy: it serves until ctx ends, then shuts down.
func runProxy(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("herd proxy", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	upstream := fs.String("upstream", "", "")
	listen := fs.String("listen", "127.0.0.1:8081", "")
	redisAddr := fs.String("redis", "", "")
	forward := fs.String("forward-fields", "keyed", "")
	// Bounds under floods.
	maxConc := fs.Int("max-concurrency", defaultMaxConc, "")
	maxConns := fs.Int("max-conns", defaultMaxConns, "")
	queueTimeout := fs.Duration("queue-timeout", time.Second, "")
	maxBytes := fs.Int64("max-bytes", defaultMaxBytes, "")
	opsFlags := addOpsFlags(fs)
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			fmt.Fprint(stdout, proxyUsage)
			return exitOK
		}
		fmt.Fprintf(stderr, "herd proxy: %v\n\n%s", err, proxyUsage)
		return exitUsage
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "herd proxy: unexpected argument %q\n\n%s", fs.Arg(0), proxyUsage)
		return exitUsage
	}
	up, err := url.Parse(*upstream)
	if *upstream == "" || err != nil || (up.Scheme != "http" && up.Scheme != "https") || up.Host == "" {
		fmt.Fprintf(stderr, "herd proxy: --upstream needs an absolute http or https URL, got %q\n\n%s", *upstream, proxyUsage)
		return exitUsage
	}
	o := herdhttp.DefaultOptions()
	if err := setForward(o, *forward); err != nil {
		fmt.Fprintf(stderr, "herd proxy: %v\n\n%s", err, proxyUsage)
		return exitUsage
	}
	if err := setBounds(o, *maxConc, *maxConns, *queueTimeout, *maxBytes); err != nil {
		fmt.Fprintf(stderr, "herd proxy: %v\n\n%s", err, proxyUsage)
		return exitUsage
	}
	op, err := opsFlags.apply(o, stderr)
	if err != nil {
		fmt.Fprintf(stderr, "herd proxy: %v\n\n%s", err, proxyUsage)
		return exitUsage
	}
	defer op.close()
	var store *redisstore.Remote // nil: no Redis
	if *redisAddr != "" {
		redis.SetLogger(quietRedis{}) // the error below says what went wrong
		client := redisstore.NewClient(&redis.UniversalOptions{Addrs: []string{*redisAddr}})
		defer client.Close()
		pctx, cancel := context.WithTimeout(ctx, proxyTimeout)
		err := client.Ping(pctx).Err()
		cancel()
		if err != nil {
			fmt.Fprintf(stderr, "herd proxy: redis at %s does not answer: %v\n", *redisAddr, err)
			return exitFail
		}
		remote, err := redisstore.New(redisstore.Options{Client: client, Prefix: op.prefix})
		if err != nil {
			fmt.Fprintf(stderr, "herd proxy: %v\n", err)
			return exitFail
		}
		defer remote.Close()
		o.Store, o.Lease, store = remote, remote, remote
	}
	h, err := herdhttp.NewProxy(up, o)
	if err != nil {
		fmt.Fprintf(stderr, "herd proxy: %v\n", err)
		return exitUsage
	}
	stopAdmin, err := op.serveAdmin(h, store, stdout)
	if err != nil {
		fmt.Fprintf(stderr, "herd proxy: admin: %v\n", err)
		_ = h.Close(context.Background())
		return exitFail
	}
	ln, err := net.Listen("tcp", *listen)
	if err != nil {
		fmt.Fprintf(stderr, "herd proxy: %v\n", err)
		_ = stopAdmin(context.Background())
		_ = h.Close(context.Background())
		return exitFail
	}
	admitted, gate := admit(h, *maxConc)
	srv, ln := newServer(op.wrap(admitted), ln, *maxConns)
	var server proxyServer = srv
	if op.access == nil { // the access log wraps srv's handler alone
		server = hitServer(srv, ln, h, gate)
	}
	fmt.Fprintf(stdout, "herd proxy: serving http://%s, caching %s\n", ln.Addr(), up)
	done := make(chan error, 1)
	go func() { done <- server.Serve(ln) }()
	select {
	case err = <-done:
		_ = stopAdmin(context.Background())
	case <-ctx.Done():
		sctx, cancel := context.WithTimeout(context.Background(), proxyTimeout)
		err = errors.Join(server.Shutdown(sctx), stopAdmin(sctx))
		cancel()
	}
	cctx, cancel := context.WithTimeout(context.Background(), proxyTimeout)
	cerr := h.Close(cctx) // waits for the writes to Redis
	cancel()
	if err != nil && !errors.Is(err, http.ErrServerClosed) || cerr != nil {
		fmt.Fprintf(stderr, "herd proxy: %v\n", errors.Join(err, cerr))
		return exitFail
	}
	return exitOK
}

// setForward sets o's forwarding of request fields from the value of
// --forward-fields.
func setForward(o *herdhttp.Options, mode string) error {
	switch mode {
	case "keyed":
		return nil
	case "all":
		o.ForwardAllFields = true
		return nil
	}
	for name := range strings.SplitSeq(mode, ",") {
		name = strings.TrimSpace(name)
		if !validFieldName(name) {
			return fmt.Errorf("--forward-fields needs keyed, all or field names separated by commas, got %q", mode)
		}
		o.ForwardHeaders = append(o.ForwardHeaders, name)
	}
	return nil
}

// validFieldName reports whether s is a field name: a token (RFC 9110 §5.1).
func validFieldName(s string) bool {
	if s == "" {
		return false
	}
	for _, c := range []byte(s) {
		if c <= ' ' || c >= 0x7f || strings.IndexByte(`"(),/:;<=>?@[\]{}`, c) >= 0 {
			return false
		}
	}
	return true
}

// admit caps the requests h answers at once at 2×conc: as many again as
// the fetches --max-concurrency lets through may wait for one. A request
// past the cap is answered 503 with Retry-After at once, so that
// a flood of misses costs a bounded number of goroutines, connections'
// buffers and fetch buffers rather than queueing without bound in the
// server. It returns h so capped, and gate, which takes one of the same
// slots (ok false when none is free) for a hit answered elsewhere. conc 0
// means no cap, and gate nil.
func admit(h http.Handler, conc int) (capped http.Handler, gate func() (release func(), ok bool)) {
	if conc == 0 {
		return h, nil
	}
	slots := make(chan struct{}, 2*conc)
	release := func() { <-slots }
	gate = func() (func(), bool) {
		select {
		case slots <- struct{}{}:
			return release, true
		default:
			return nil, false
		}
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if release, ok := gate(); ok {
			defer release()
			h.ServeHTTP(w, r)
			return
		}
		w.Header().Set("Retry-After", "1")
		w.Header().Set("Cache-Status", "herd; fwd=bypass; detail=overloaded")
		http.Error(w, http.StatusText(http.StatusServiceUnavailable), http.StatusServiceUnavailable)
	}), gate
}

// quietRedis drops go-redis's own log lines (pool dial errors).
type quietRedis struct{}

func (quietRedis) Printf(context.Context, string, ...any) {}

// setBounds sets o's byte budget and its limiter on fetches from the
// flags --max-concurrency, --max-conns, --queue-timeout and --max-bytes,
// and Go's memory limit from them.
func setBounds(o *herdhttp.Options, conc, conns int, queue time.Duration, maxBytes int64) error {
	if conc < 0 || conns < 0 || queue <= 0 || maxBytes <= 0 {
		return fmt.Errorf("--max-concurrency and --max-conns must not be negative, --queue-timeout and --max-bytes must be positive")
	}
	o.MaxBytes = maxBytes
	// Go's collector lets the heap grow to twice what is live: held under
	// the bound, the heap of a full cache stays near 1.5× the budget (a
	// soft limit, unless GOMEMLIMIT is set). Without a bound, it is held
	// where the bound of the default limits would put it.
	if os.Getenv("GOMEMLIMIT") == "" {
		limit := memBound(maxBytes, conns, conc)
		if limit == 0 {
			limit = memBound(maxBytes, defaultMaxConns, defaultMaxConc)
		}
		debug.SetMemoryLimit(limit - memFixed)
	}
	if conc == 0 {
		return nil
	}
	lo := limiter.DefaultOptions(conc)
	lo.QueueTimeout = queue
	l, err := limiter.New(lo)
	if err != nil {
		return err
	}
	o.Limiter = l
	return nil
}
