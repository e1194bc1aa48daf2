// Command service serves products from PostgreSQL through a herd cache shared over Redis: one query per key per fleet, 503 with Retry-After when the database is busy, Prometheus metrics at /metrics.
//
//	go run ./examples/service -postgres postgres://127.0.0.1/shop -redis 127.0.0.1:6379 [-addr 127.0.0.1:8080]
//
// The flags default to $DATABASE_URL, $REDIS_ADDR and $LISTEN_ADDR. The
// products table is the one [schema] creates. Run two replicas on two
// ports, then read a product through either and look at the metrics:
//
//	curl -s http://127.0.0.1:8080/tenants/acme/products/1
//	curl -s http://127.0.0.1:8080/metrics | grep ^herd_
package main

import (
	"context"
	"encoding/json"
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
	"strconv"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/redis/go-redis/v9"

	"github.com/herdcache/herd"
	"github.com/herdcache/herd/herdprom"
	"github.com/herdcache/herd/herdslog"
	"github.com/herdcache/herd/limiter"
	"github.com/herdcache/herd/observe"
	"github.com/herdcache/herd/redisstore"
)

// schema creates the table the service reads.
const schema = `CREATE TABLE IF NOT EXISTS products (
	tenant      text   NOT NULL,
	id          bigint NOT NULL,
	name        text   NOT NULL,
	price_cents bigint NOT NULL,
	PRIMARY KEY (tenant, id)
)`

// productQuery is the one query a load makes.
const productQuery = `SELECT name, price_cents FROM products WHERE tenant = $1 AND id = $2`

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, os.Args[1:], os.Stderr); err != nil {
		log.Fatal(err)
	}
}

// run parses args, serves until ctx ends, then shuts down.
func run(ctx context.Context, args []string, stderr io.Writer) error {
	fs := flag.NewFlagSet("service", flag.ContinueOnError)
	fs.SetOutput(stderr)
	addr := fs.String("addr", envOr("LISTEN_ADDR", "127.0.0.1:8080"), "address to listen on ($LISTEN_ADDR)")
	dsn := fs.String("postgres", os.Getenv("DATABASE_URL"), "PostgreSQL connection string ($DATABASE_URL)")
	redisAddr := fs.String("redis", envOr("REDIS_ADDR", "127.0.0.1:6379"), "Redis address ($REDIS_ADDR)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	logger := slog.New(slog.NewTextHandler(stderr, nil))
	events, err := herdslog.New(logger, herdslog.Options{})
	if err != nil {
		return err
	}
	pool, err := pgxpool.New(ctx, *dsn)
	if err != nil {
		return fmt.Errorf("service: -postgres: %w", err)
	}
	defer pool.Close()
	pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if err := pool.Ping(pctx); err != nil {
		return fmt.Errorf("service: postgres: %w", err)
	}
	rdb := redisstore.NewClient(&redis.UniversalOptions{Addrs: []string{*redisAddr}})
	defer rdb.Close()

	// One load per pool connection: a load never waits for a connection,
	// and a load that cannot have a slot within a second is answered 503.
	s, err := newServer(config{
		db: pool, redis: rdb, log: logger, recorder: events,
		limit: int(pool.Config().MaxConns), queueTimeout: time.Second,
	})
	if err != nil {
		return err
	}
	defer s.Close()

	ln, err := net.Listen("tcp", *addr)
	if err != nil {
		return err
	}
	srv := &http.Server{Handler: s, ReadHeaderTimeout: 5 * time.Second}
	logger.Info("serving", "products", "http://"+ln.Addr().String()+"/tenants/acme/products/1", "metrics", "http://"+ln.Addr().String()+"/metrics")
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	select {
	case err := <-served:
		return err
	case <-ctx.Done():
	}
	sctx, scancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer scancel()
	if err := srv.Shutdown(sctx); err != nil {
		return err
	}
	if err := <-served; !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}

func envOr(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}

// config is what newServer needs.
type config struct {
	db       *pgxpool.Pool
	redis    redis.UniversalClient
	log      *slog.Logger
	recorder observe.Recorder // nil: none
	// limit caps concurrent loads (database queries) on this replica; a
	// load that waits queueTimeout for a slot is answered 503.
	limit        int
	queueTimeout time.Duration
}

// product is one row of the products table, as the cache keeps it (JSON
// in Redis) and as the service answers it.
type product struct {
	Tenant     string `json:"tenant"`
	ID         int64  `json:"id"`
	Name       string `json:"name"`
	PriceCents int64  `json:"price_cents"`
}

// server answers /tenants/{tenant}/products/{id} from the cache and
// /metrics from its registry.
type server struct {
	cache  *herd.Cache[product]
	remote *redisstore.Remote
	db     *pgxpool.Pool
	log    *slog.Logger
	mux    *http.ServeMux
}

func newServer(c config) (*server, error) {
	remote, err := redisstore.New(redisstore.Options{Client: c.redis})
	if err != nil {
		return nil, err
	}
	lim, err := limiter.New(limiter.Options{Limit: c.limit, Reserve: c.limit / 4, QueueTimeout: c.queueTimeout})
	if err != nil {
		remote.Close()
		return nil, err
	}
	o := herd.DefaultOptions[product]() // near-cache 1 s, 5 s lease, breaker
	o.Name = "products"
	o.SoftTTL = 30 * time.Second    // fresh for 30 s,
	o.HardTTL = 5 * time.Minute     // then served stale while one refresh runs
	o.NegativeTTL = 5 * time.Second // a missing product is asked for once per 5 s
	o.Limiter = lim
	o.Store, o.Lease = remote, remote // one load per key per fleet, fenced
	o.Recorder = c.recorder
	cache, err := herd.New(o)
	if err != nil {
		remote.Close()
		return nil, err
	}
	s := &server{cache: cache, remote: remote, db: c.db, log: c.log, mux: http.NewServeMux()}

	col, err := herdprom.New(cache)
	if err != nil {
		s.Close()
		return nil, err
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(col, collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	s.mux.HandleFunc("GET /tenants/{tenant}/products/{id}", s.product)
	s.mux.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	return s, nil
}

func (s *server) ServeHTTP(w http.ResponseWriter, r *http.Request) { s.mux.ServeHTTP(w, r) }

// Close waits for the cache's pending writes to Redis, then stops the
// Remote. It closes neither the pool nor the Redis client.
func (s *server) Close() error {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	return errors.Join(s.cache.Close(ctx), s.remote.Close())
}

func (s *server) product(w http.ResponseWriter, r *http.Request) {
	// In a real service the tenant comes from the caller's credentials.
	tenant := r.PathValue("tenant")
	id, err := strconv.ParseInt(r.PathValue("id"), 10, 64)
	if err != nil {
		http.Error(w, "bad product id", http.StatusBadRequest)
		return
	}
	// The key holds every input of the query, the tenant included; the id
	// in canonical form, so that "01" and "1" share an entry.
	key := herd.Key("product", tenant, strconv.FormatInt(id, 10))
	p, err := s.cache.Get(r.Context(), key, func(ctx context.Context) (product, error) {
		return s.load(ctx, tenant, id)
	})
	switch {
	case herd.WriteOverloaded(w, err): // 503, Retry-After
		return
	case errors.Is(err, herd.ErrNotFound):
		http.Error(w, "no such product", http.StatusNotFound)
		return
	case err != nil:
		s.log.Error("load product", "tenant", tenant, "id", id, "err", err)
		http.Error(w, "database unavailable", http.StatusBadGateway)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(p)
}

// load reads one product from PostgreSQL; a missing row is herd.ErrNotFound,
// which the cache remembers for NegativeTTL.
func (s *server) load(ctx context.Context, tenant string, id int64) (product, error) {
	p := product{Tenant: tenant, ID: id}
	err := s.db.QueryRow(ctx, productQuery, tenant, id).Scan(&p.Name, &p.PriceCents)
	if errors.Is(err, pgx.ErrNoRows) {
		return product{}, herd.ErrNotFound
	}
	return p, err
}
