package main

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"

	"github.com/herdcache/herd/observe"
	"github.com/herdcache/herd/redisstore"
	"github.com/herdcache/herd/storetest/pgtest"
)

// deadline bounds every wait of the test: a request, a query, a miss.
const deadline = 30 * time.Second

// queries is a pgx.QueryTracer that counts the product queries a pool
// sends to PostgreSQL, tells of each on started, and holds each before it
// is sent while hold is set.
type queries struct {
	started chan struct{} // one value per query; buffered
	mu      sync.Mutex
	n       int
	hold    chan struct{} // nil: queries go through
}

func (q *queries) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	if d.SQL != productQuery {
		return ctx
	}
	q.mu.Lock()
	q.n++
	hold := q.hold
	q.mu.Unlock()
	q.started <- struct{}{}
	if hold != nil {
		select {
		case <-hold:
		case <-ctx.Done():
		}
	}
	return ctx
}

func (*queries) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

func (q *queries) count() int {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.n
}

// holdAll makes every query wait until the returned release is called.
func (q *queries) holdAll() (release func()) {
	hold := make(chan struct{})
	q.mu.Lock()
	q.hold = hold
	q.mu.Unlock()
	return func() {
		q.mu.Lock()
		q.hold = nil
		q.mu.Unlock()
		close(hold)
	}
}

// misses is a observe.Recorder that sends a value on c for each Get that
// missed.
type misses struct {
	observe.NopRecorder
	c chan struct{}
}

func (m misses) RecordGet(r observe.GetResult) {
	if r == observe.ResultMiss {
		select {
		case m.c <- struct{}{}:
		default: // more misses than the test counts
		}
	}
}

// drain empties m.c; no Get may be running.
func (m misses) drain() {
	for len(m.c) > 0 {
		<-m.c
	}
}

// await receives n values from ch, or fails the test at the deadline.
func await(t *testing.T, ch <-chan struct{}, n int, what string) {
	t.Helper()
	timer := time.NewTimer(deadline)
	defer timer.Stop()
	for i := range n {
		select {
		case <-ch:
		case <-timer.C:
			t.Fatalf("%s: %d of %d within %v", what, i, n, deadline)
		}
	}
}

var client = &http.Client{Timeout: deadline}

func get(t *testing.T, url string) (int, http.Header, string) {
	t.Helper()
	resp, err := client.Get(url)
	if err != nil {
		t.Errorf("GET %s: %v", url, err)
		return 0, nil, ""
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Errorf("GET %s: %v", url, err)
	}
	return resp.StatusCode, resp.Header, string(b)
}

// want is the body the service answers for p.
func want(t *testing.T, p product) string {
	t.Helper()
	b, err := json.Marshal(p)
	if err != nil {
		t.Fatal(err)
	}
	return string(b) + "\n"
}

// replica starts one replica of the service over PostgreSQL at dsn and
// Redis at addr, with a limiter of one slot and a short queue timeout, and
// returns its base URL. It is stopped when the test ends.
func replica(t *testing.T, dsn, addr string, q *queries, rec observe.Recorder) (*server, string) {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		t.Fatal(err)
	}
	cfg.ConnConfig.Tracer = q
	pool, err := pgxpool.NewWithConfig(t.Context(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	rdb := redisstore.NewClient(&redis.UniversalOptions{Addrs: []string{addr}})
	t.Cleanup(func() { rdb.Close() })
	s, err := newServer(config{
		db: pool, redis: rdb, log: slog.New(slog.DiscardHandler), recorder: rec,
		limit: 1, queueTimeout: 100 * time.Millisecond,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := s.Close(); err != nil {
			t.Error(err)
		}
	})
	ts := httptest.NewServer(s)
	t.Cleanup(ts.Close)
	return s, ts.URL
}

// TestService runs two replicas of the service over a PostgreSQL and a
// Redis of its own, and checks with real HTTP requests what the cache, the
// lease, the limiter and the metrics promise.
func TestService(t *testing.T) {
	dsn := pgtest.Start(t)
	addr := startRedis(t)
	ctx := t.Context()

	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	rows := []product{
		{"acme", 1, "Anvil", 1999}, {"globex", 1, "Globe", 4500},
		{"acme", 2, "Rocket skates", 12900}, {"acme", 3, "Giant magnet", 3100}, {"acme", 4, "Bird seed", 250},
	}
	if _, err := conn.Exec(ctx, schema); err != nil {
		t.Fatal(err)
	}
	for _, p := range rows {
		if _, err := conn.Exec(ctx, `INSERT INTO products VALUES ($1, $2, $3, $4)`, p.Tenant, p.ID, p.Name, p.PriceCents); err != nil {
			t.Fatal(err)
		}
	}

	q := &queries{started: make(chan struct{}, 100)}
	missed := misses{c: make(chan struct{}, 1000)}
	a, urlA := replica(t, dsn, addr, q, missed)
	b, urlB := replica(t, dsn, addr, q, missed)
	path := func(base, tenant string, id int) string {
		return base + "/tenants/" + tenant + "/products/" + strconv.Itoa(id)
	}
	check := func(url string, code int, body string) {
		t.Helper()
		if gotCode, _, gotBody := get(t, url); gotCode != code || body != "" && gotBody != body {
			t.Errorf("GET %s = %d %q, want %d %q", url, gotCode, gotBody, code, body)
		}
	}
	queried := func(n int, after string) {
		t.Helper()
		if got := q.count(); got != n {
			t.Fatalf("after %s: %d product queries, want %d", after, got, n)
		}
	}

	// A read goes to PostgreSQL once; then each replica serves it from the
	// cache (the other through Redis). Tenants do not share entries.
	check(path(urlA, "acme", 1), http.StatusOK, want(t, rows[0]))
	queried(1, "the first read")
	check(path(urlA, "acme", 1), http.StatusOK, want(t, rows[0]))
	check(path(urlB, "acme", 1), http.StatusOK, want(t, rows[0]))
	queried(1, "reads of a cached product on both replicas")
	check(path(urlA, "globex", 1), http.StatusOK, want(t, rows[1]))
	queried(2, "another tenant's product of the same id")
	check(path(urlA, "acme", 404), http.StatusNotFound, "")
	check(path(urlA, "acme", 404), http.StatusNotFound, "")
	queried(3, "two reads of a missing product")
	check(urlA+"/tenants/acme/products/01", http.StatusOK, want(t, rows[0]))
	check(urlA+"/tenants/acme/products/anvil", http.StatusBadRequest, "")
	queried(3, "bad requests")
	await(t, q.started, 3, "queries started")

	// A stampede of n readers of a cold key, half on each replica, all
	// missing while the one query is held: one query for the fleet.
	const n = 40
	missed.drain()
	release := q.holdAll()
	var wg sync.WaitGroup
	for i := range n {
		base := urlA
		if i%2 == 1 {
			base = urlB
		}
		wg.Go(func() { check(path(base, "acme", 2), http.StatusOK, want(t, rows[2])) })
	}
	await(t, q.started, 1, "the stampede's query")
	await(t, missed.c, n, "the stampede's misses")
	release()
	wg.Wait()
	queried(4, "a stampede of "+strconv.Itoa(n)+" readers on two replicas")

	// Replica A's one limiter slot is held by a query: the next miss waits
	// 100ms for it and is answered 503 with Retry-After, without a query.
	release = q.holdAll()
	wg.Go(func() { check(path(urlA, "acme", 3), http.StatusOK, want(t, rows[3])) })
	await(t, q.started, 1, "the query that holds the slot")
	code, h, _ := get(t, path(urlA, "acme", 4))
	if code != http.StatusServiceUnavailable || h.Get("Retry-After") != "1" {
		t.Errorf("a miss while the slot is held: %d, Retry-After %q; want 503, 1", code, h.Get("Retry-After"))
	}
	release()
	wg.Wait()
	queried(5, "a shed miss")
	check(path(urlA, "acme", 4), http.StatusOK, want(t, rows[4]))
	queried(6, "the shed product read again")

	// /metrics shows the cache's herd_ metrics, and the replicas' loads add
	// up to the queries PostgreSQL was sent.
	metricsA, metricsB := herdLines(t, urlA), herdLines(t, urlB)
	for _, line := range []string{
		`herd_shed_total{cache="products"} 1`,
		`herd_limiter_shed_total{cache="products",reason="queue-timeout"} 1`,
		`herd_limiter_limit{cache="products"} 1`,
		`herd_key_concurrency_max{cache="products"} 1`,
		`herd_degraded{cache="products"} 0`,
	} {
		if !strings.Contains(metricsA, line+"\n") {
			t.Errorf("replica A's /metrics has no line %s", line)
		}
	}
	loads := sumOf(t, metricsA, "herd_loads_total") + sumOf(t, metricsB, "herd_loads_total")
	if loads != q.count() {
		t.Errorf("herd_loads_total adds up to %d on the replicas, PostgreSQL was sent %d queries", loads, q.count())
	}
	if la, lb := a.cache.Stats().Loads, b.cache.Stats().Loads; la+lb != int64(q.count()) {
		t.Errorf("Stats: %d+%d loads on the replicas, %d queries", la, lb, q.count())
	}
	if t.Failed() {
		t.Logf("replica A:\n%s\nreplica B:\n%s", metricsA, metricsB)
	}

	t.Run("run", func(t *testing.T) { testRun(t, dsn, addr) })
}

// herdLines returns the herd_ lines of the replica's /metrics.
func herdLines(t *testing.T, base string) string {
	t.Helper()
	code, _, body := get(t, base+"/metrics")
	if code != http.StatusOK {
		t.Fatalf("/metrics: %d", code)
	}
	var b strings.Builder
	for line := range strings.Lines(body) {
		if strings.HasPrefix(line, "herd_") {
			b.WriteString(line)
		}
	}
	return b.String()
}

// sumOf adds up the values of the cache's samples of metric in lines.
func sumOf(t *testing.T, lines, metric string) int {
	t.Helper()
	sum := 0
	for line := range strings.Lines(lines) {
		name, value, ok := strings.Cut(strings.TrimSpace(line), " ")
		if !ok || !strings.HasPrefix(name, metric+`{cache="products"`) {
			continue
		}
		v, err := strconv.Atoi(value)
		if err != nil {
			t.Fatalf("%s: %v", line, err)
		}
		sum += v
	}
	return sum
}

// logLines is an io.Writer that sends each write, one log record, on its
// channel, or drops it when the channel is full.
type logLines chan string

func (l logLines) Write(p []byte) (int, error) {
	select {
	case l <- string(p):
	default:
	}
	return len(p), nil
}

// testRun runs the command itself, reads a product through the address it
// logs, and stops it.
func testRun(t *testing.T, dsn, addr string) {
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	logs := make(logLines, 100)
	done := make(chan error, 1)
	go func() { done <- run(ctx, []string{"-addr", "127.0.0.1:0", "-postgres", dsn, "-redis", addr}, logs) }()

	timer := time.NewTimer(deadline)
	defer timer.Stop()
	var url string
	for url == "" {
		select {
		case line := <-logs:
			for _, f := range strings.Fields(line) {
				if u, ok := strings.CutPrefix(f, "products="); ok {
					url = u
				}
			}
		case err := <-done:
			t.Fatalf("run returned before serving: %v", err)
		case <-timer.C:
			t.Fatalf("run not serving within %v", deadline)
		}
	}
	if code, _, body := get(t, url); code != http.StatusOK || !strings.Contains(body, `"name":"Anvil"`) {
		t.Errorf("GET %s from run: %d %q", url, code, body)
	}
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("run: %v", err)
		}
	case <-timer.C:
		t.Fatalf("run did not stop within %v", deadline)
	}
}

func TestRunBadFlags(t *testing.T) {
	for _, args := range [][]string{{"-nope"}, {"-postgres", "postgres://%zz"}} {
		var stderr bytes.Buffer
		if err := run(t.Context(), args, &stderr); err == nil {
			t.Errorf("run(%q) = nil, want an error", args)
		}
	}
}
