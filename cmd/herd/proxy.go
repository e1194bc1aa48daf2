package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/herdcache/herd/herdhttp"
	"github.com/herdcache/herd/redisstore"
)

const proxyUsage = `Usage: herd proxy --upstream URL [--listen ADDR] [--redis ADDR]

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
`

// proxyTimeout bounds the Redis check at start and the shutdown.
const proxyTimeout = 10 * time.Second

// runProxy is herd proxy: it serves until ctx ends, then shuts down.
func runProxy(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("herd proxy", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	upstream := fs.String("upstream", "", "")
	listen := fs.String("listen", "127.0.0.1:8081", "")
	redisAddr := fs.String("redis", "", "")
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
		remote, err := redisstore.New(redisstore.Options{Client: client})
		if err != nil {
			fmt.Fprintf(stderr, "herd proxy: %v\n", err)
			return exitFail
		}
		defer remote.Close()
		o.Store, o.Lease = remote, remote
	}
	h, err := herdhttp.NewProxy(up, o)
	if err != nil {
		fmt.Fprintf(stderr, "herd proxy: %v\n", err)
		return exitUsage
	}
	ln, err := net.Listen("tcp", *listen)
	if err != nil {
		fmt.Fprintf(stderr, "herd proxy: %v\n", err)
		_ = h.Close(context.Background())
		return exitFail
	}
	srv := &http.Server{Handler: h, ReadHeaderTimeout: proxyTimeout}
	fmt.Fprintf(stdout, "herd proxy: serving http://%s, caching %s\n", ln.Addr(), up)
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ln) }()
	select {
	case err = <-done:
	case <-ctx.Done():
		sctx, cancel := context.WithTimeout(context.Background(), proxyTimeout)
		err = srv.Shutdown(sctx)
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

// quietRedis drops go-redis's own log lines (pool dial errors).
type quietRedis struct{}

func (quietRedis) Printf(context.Context, string, ...any) {}
