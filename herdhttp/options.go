package herdhttp

import (
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/herdcache/herd"
	"github.com/herdcache/herd/limiter"
	"github.com/herdcache/herd/observe"
	"github.com/herdcache/herd/remote"
)

// Options configures a cache made by [Middleware], [NewTransport] or
// [NewProxy]. A nil *Options means [DefaultOptions]. In a non-nil one,
// every field means what it says; where a zero value would disable the
// cache, the field documents the default it stands for instead. The
// constructors never change the Options they are given.
type Options struct {
	// Name identifies the cache in metrics and in the Cache-Status field
	// (RFC 9211). Empty means "herd".
	Name string

	// MaxBytes bounds the local tier, the responses held in this process,
	// in bytes (bodies, fields and bookkeeping). Zero means 64 MiB.
	MaxBytes int64
	// MaxBodyBytes is the largest body stored, at most a quarter of
	// MaxBytes whatever it says, so that a response answered as stored
	// is kept. A response with a larger
	// body is still streamed to the request that fetched it and to the
	// requests waiting on it, and its key is marked hit-for-pass for the
	// whole fleet as soon as the body passes the bound. Zero means 1 MiB.
	MaxBodyBytes int64

	// MaxHeaderBytes is the largest response header stored, counted as
	// sent (names, values and separators), at most a quarter of MaxBytes
	// whatever it says; stored fields count against MaxBytes like bodies.
	// A response with a larger header is passed to the request that
	// fetched it and its key marked hit-for-pass (header-too-large).
	// Zero means 32 KiB.
	MaxHeaderBytes int64

	// Store is the shared tier, the same for every replica (for example a
	// redisstore.Remote, or a memory.Remote in one process). Nil means the
	// local tier is the only one. After five failed calls in a row the
	// replica stops asking it for a second at a time (herd's breaker),
	// serving from its local tier and fetching once per key per replica.
	Store remote.Store
	// Lease makes one replica of the fleet fetch a key while the others
	// wait for its notice. It needs a Store. Nil means one fetch per key
	// per replica.
	Lease remote.Lease
	// LeaseTTL is how long a lease lasts without extension (it is extended
	// while its fetch runs). Zero means 5 s.
	LeaseTTL time.Duration
	// NearTTL is how long, with a Store, this replica serves its own copy
	// of a response without asking the Store, as herd.Options.NearTTL.
	// Zero means 1 s.
	NearTTL time.Duration
	// Limiter caps concurrent fetches from the origin; a request it sheds
	// is answered 503 with a Retry-After field. Nil means no cap.
	Limiter *limiter.Limiter
	// FetchTimeout bounds one fetch from the origin, its body included,
	// whatever the client's context says. Zero means one minute.
	FetchTimeout time.Duration

	// KeyHeaders are request fields whose values are part of every cache
	// key, such as a tenant header. They are always forwarded on fetches.
	KeyHeaders []string
	// NormalizeQuery makes the key hold the query's parameters sorted by
	// name, so that their order does not matter. Off, the query is keyed
	// as sent: an origin that reads parameters in order, or twice, is
	// then never served a response for another order.
	NormalizeQuery bool
	// ForwardHeaders are request fields forwarded on the fetches whose
	// responses may be stored, besides Accept, Accept-Encoding,
	// Accept-Language, Authorization, Cookie, the KeyHeaders and the
	// fields the URL's stored responses vary on. Unless ForwardAllFields
	// is set, no other field of a client's request reaches the origin on
	// such a fetch, so none can change a stored response (unkeyed-header
	// poisoning). Requests that are passed to the origin uncached carry
	// every end-to-end field.
	ForwardHeaders []string
	// ForwardAllFields makes the fetches whose responses may be stored
	// carry every end-to-end field of the client's request, its
	// conditionals and Range aside, as most proxy caches do (RFC 9110
	// §7.6), instead of the fields ForwardHeaders describes. The origin
	// then sees what the client sent, but a field that is neither in the
	// key nor named by Vary can change a response that every client is
	// then served: an origin that reflects such a field (X-Forwarded-Host,
	// X-Original-URL, a debug header) into a cacheable page lets any
	// client poison that page for all (unkeyed-header poisoning). Set it
	// only for an origin whose cacheable responses depend on nothing
	// outside the key and their Vary.
	ForwardAllFields bool
	// MaxVariants is how many responses that vary (Vary) are stored per
	// URL at most. Zero means 16.
	MaxVariants int

	// Heuristic, when positive, makes a response without explicit
	// freshness fresh for that fraction of the time since its
	// Last-Modified (RFC 9111 §4.2.2), at most HeuristicMax, if its status
	// is cacheable by default. Zero means no heuristic freshness: such
	// responses are not stored. It must lie in [0, 1].
	Heuristic float64
	// HeuristicMax bounds heuristic freshness. Zero means one day.
	HeuristicMax time.Duration
	// KeepForRevalidation is how long past its freshness (and its stale
	// windows) a response with a validator (ETag or Last-Modified) is kept,
	// to be revalidated with a conditional request rather than fetched
	// again: a 304 then refreshes it, its body never sent twice. Such
	// responses count against MaxBytes like any other and are evicted
	// first by it when they are not used. Zero means not at all: a stale
	// response is dropped and fetched again whole. DefaultOptions keeps
	// them an hour.
	KeepForRevalidation time.Duration
	// TargetedFields are the targeted cache-control fields (RFC 9213)
	// that this cache obeys, most specific first, such as
	// "CDN-Cache-Control", or a field of its own name that only this
	// fleet reads. The first of them that a response carries, and that
	// parses as a Structured Fields Dictionary, gives its cache
	// directives in place of its Cache-Control and Expires; the response
	// still carries every one of those fields downstream. Nil means none:
	// Cache-Control and Expires alone. DefaultOptions obeys
	// CDN-Cache-Control, as a cache run by or for the origin, a gateway
	// or CDN, may.
	TargetedFields []string
	// RequestCacheControl makes the cache honour the Cache-Control of
	// requests: no-store and no-cache send the request to the origin (the
	// latter storing the response), max-age, min-fresh and max-stale bound
	// what is served, and only-if-cached answers 504 rather than fetch.
	// Off, clients cannot make the cache fetch what it holds.
	RequestCacheControl bool
	// StoreSetCookie stores responses that carry Set-Cookie, without that
	// field, instead of marking their key hit-for-pass.
	StoreSetCookie bool

	// PassTTL is how long a key stays hit-for-pass after a response that
	// may not be stored (no-store, private, Set-Cookie, Vary: *, an
	// uncacheable status, no freshness, a body over MaxBodyBytes): its
	// requests go to the origin at once, fleet-wide, without waiting on
	// each other. Origin errors (5xx) mark it for at most a second. A
	// response not stored only because its request carried Authorization
	// marks nothing. Zero means 30 s.
	PassTTL time.Duration
	// ErrorBackoff is how long, after a failed revalidation of a response
	// that stale-if-error lets be served, this replica serves it without
	// asking the origin again, and how long after a failed
	// stale-while-revalidate revalidation it starts no other for the key.
	// Zero means 1 s.
	ErrorBackoff time.Duration

	// ForwardTags makes the answers to clients carry the tag fields of the
	// origin's responses (Surrogate-Key, Cache-Tag), which the cache
	// reads to purge by tag. Off, they are removed from every answer, so
	// that clients never see how the origin groups its responses.
	ForwardTags bool
	// OnOriginError is called, when not nil, each time a request to the
	// origin fails without a response (it cannot be reached, the
	// connection breaks before the fields arrive, FetchTimeout passes),
	// with the request sent and the error, unless the client's own
	// request was canceled. It runs on the request's goroutine and must
	// be quick; a log call is.
	OnOriginError func(r *http.Request, err error)

	// Routes are http.ServeMux patterns, such as "GET /products/{id}",
	// that name the routes metrics are counted by; a request that matches
	// none counts under "other". Metrics are never labelled by raw path.
	Routes []string
	// Recorder receives the cache's events. When it implements
	// [RouteRecorder], it also receives herdhttp's per-route outcomes.
	// Nil means none.
	Recorder observe.Recorder
}

// DefaultOptions returns the recommended settings: a 64 MiB local tier,
// bodies stored up to 1 MiB, 16 variants per URL, responses with a
// validator kept an hour past their freshness to be revalidated,
// CDN-Cache-Control obeyed, hit-for-pass for 30 s, no heuristic freshness, request Cache-Control
// ignored and only the keyed request fields forwarded.
func DefaultOptions() *Options {
	return &Options{
		KeepForRevalidation: defaultKeepForRevalidation,
		TargetedFields:      []string{"CDN-Cache-Control"},
	}
}

// Defaults the zero values stand for.
const (
	defaultMaxBytes     = 64 << 20
	defaultMaxBodyBytes = 1 << 20
	defaultMaxHeader    = 32 << 10
	defaultLeaseTTL     = 5 * time.Second
	defaultNearTTL      = time.Second
	defaultFetchTimeout = time.Minute
	defaultMaxVariants  = 16
	defaultHeuristicMax = 24 * time.Hour
	defaultPassTTL      = 30 * time.Second
	defaultErrorBackoff = time.Second
	// defaultKeepForRevalidation is DefaultOptions' KeepForRevalidation.
	defaultKeepForRevalidation = time.Hour
	// errorPassTTL bounds the hit-for-pass of an origin error.
	errorPassTTL = time.Second
)

// config is Options with defaults resolved.
type config struct {
	Options
}

func (o *Options) validate() (config, error) {
	c := config{Options: *o}
	var errs []error
	bad := func(format string, args ...any) {
		errs = append(errs, fmt.Errorf("herdhttp: "+format, args...))
	}
	for _, d := range []struct {
		name string
		v    time.Duration
	}{
		{"LeaseTTL", o.LeaseTTL}, {"NearTTL", o.NearTTL}, {"FetchTimeout", o.FetchTimeout},
		{"HeuristicMax", o.HeuristicMax}, {"KeepForRevalidation", o.KeepForRevalidation},
		{"PassTTL", o.PassTTL}, {"ErrorBackoff", o.ErrorBackoff},
	} {
		switch {
		case d.v < 0:
			bad("%s must not be negative, got %v", d.name, d.v)
		case d.v > herd.MaxTTL:
			bad("%s must not exceed herd.MaxTTL, got %v", d.name, d.v)
		}
	}
	if o.MaxBytes < 0 {
		bad("MaxBytes must not be negative, got %d", o.MaxBytes)
	}
	if o.MaxBodyBytes < 0 {
		bad("MaxBodyBytes must not be negative, got %d", o.MaxBodyBytes)
	}
	if o.MaxHeaderBytes < 0 {
		bad("MaxHeaderBytes must not be negative, got %d", o.MaxHeaderBytes)
	}
	if o.MaxBodyBytes > 1<<30 {
		bad("MaxBodyBytes must not exceed 1 GiB, got %d", o.MaxBodyBytes)
	}
	if o.MaxVariants < 0 {
		bad("MaxVariants must not be negative, got %d", o.MaxVariants)
	}
	if !(o.Heuristic >= 0 && o.Heuristic <= 1) {
		bad("Heuristic must lie in [0, 1], got %v", o.Heuristic)
	}
	if o.Lease != nil && o.Store == nil {
		bad("a Lease needs a Store")
	}
	for _, h := range o.KeyHeaders {
		if h == "" {
			bad("KeyHeaders holds an empty field name")
		}
	}
	for _, h := range o.TargetedFields {
		if h == "" {
			bad("TargetedFields holds an empty field name")
		}
	}
	mux := http.NewServeMux()
	for _, p := range o.Routes {
		if err := registerRoute(mux, p); err != nil {
			bad("route %q: %v", p, err)
		}
	}
	c.Name = or(o.Name, "herd")
	c.MaxBytes = or(o.MaxBytes, defaultMaxBytes)
	c.MaxBodyBytes = min(or(o.MaxBodyBytes, defaultMaxBodyBytes), c.MaxBytes/4)
	c.MaxHeaderBytes = min(or(o.MaxHeaderBytes, defaultMaxHeader), c.MaxBytes/4)
	c.LeaseTTL = or(o.LeaseTTL, defaultLeaseTTL)
	c.NearTTL = or(o.NearTTL, defaultNearTTL)
	c.FetchTimeout = or(o.FetchTimeout, defaultFetchTimeout)
	c.MaxVariants = or(o.MaxVariants, defaultMaxVariants)
	c.HeuristicMax = or(o.HeuristicMax, defaultHeuristicMax)
	c.PassTTL = or(o.PassTTL, defaultPassTTL)
	c.ErrorBackoff = or(o.ErrorBackoff, defaultErrorBackoff)
	return c, errors.Join(errs...)
}

func or[T comparable](v, def T) T {
	var zero T
	if v == zero {
		return def
	}
	return v
}

// registerRoute adds pattern to mux, turning its panic on a bad or
// conflicting pattern into an error.
func registerRoute(mux *http.ServeMux, pattern string) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("%v", r)
		}
	}()
	mux.Handle(pattern, http.NotFoundHandler())
	return nil
}
