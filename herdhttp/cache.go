package herdhttp

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"sync"
	"time"

	"github.com/herdcache/herd"
)

// engine is the cache behind Middleware, Transport and Proxy: it answers
// requests from the tiers of a herd.Cache of entries, and fetches from
// origin what they cannot answer.
type engine struct {
	o      config
	hc     *herd.Cache[*entry]
	origin http.RoundTripper
	fl     flights
	// errResponses makes failures responses (502, 504) rather than errors:
	// a handler must answer, a Transport returns the origin's error.
	errResponses bool

	keyHeaders []string        // canonical KeyHeaders
	forward    map[string]bool // canonical fields forwarded on fetches that may be stored
	routes     *http.ServeMux  // nil: no routes
	rec        RouteRecorder   // nopRoutes unless Options.Recorder is a RouteRecorder

	backoffMu sync.Mutex
	// backoff holds, per key, when this replica may next ask the origin
	// to revalidate a response that stale-if-error lets it serve, after a
	// failed attempt (Unix ns); guarded by backoffMu. It holds at most
	// maxBackoffKeys keys: past that, expired ones are swept out, and a
	// key that still finds no room is not backed off.
	backoff map[string]int64
}

// maxBackoffKeys bounds engine.backoff, so that failures of many keys
// never asked for again cannot grow it without end.
const maxBackoffKeys = 10_000

// minHerdSoft is the shortest soft TTL an entry is given in the herd
// cache, however short its freshness: the cache hands a fetched entry to
// the requests that waited for it (on every replica) only while it is
// fresh by that TTL. A response stale before it (max-age=0, no-cache) is
// revalidated per request meanwhile, collapsed in each process.
const minHerdSoft = time.Second

// indexTTL is how long a Vary index is kept.
const indexTTL = time.Hour

func newEngine(origin http.RoundTripper, o *Options, errResponses bool) (*engine, error) {
	if o == nil {
		o = DefaultOptions()
	}
	cfg, err := o.validate()
	if err != nil {
		return nil, err
	}
	c := &engine{o: cfg, origin: origin, errResponses: errResponses, rec: nopRoutes{}, backoff: map[string]int64{}}
	for _, h := range cfg.KeyHeaders {
		c.keyHeaders = append(c.keyHeaders, http.CanonicalHeaderKey(h))
	}
	c.forward = map[string]bool{}
	for _, h := range slices.Concat([]string{"Accept", "Accept-Encoding", "Accept-Language", "Authorization", "Cookie"}, cfg.KeyHeaders, cfg.ForwardHeaders) {
		c.forward[http.CanonicalHeaderKey(h)] = true
	}
	if r, ok := cfg.Recorder.(RouteRecorder); ok {
		c.rec = r
	}
	if len(cfg.Routes) > 0 {
		c.routes = http.NewServeMux()
		for _, p := range cfg.Routes {
			_ = registerRoute(c.routes, p) // validated
		}
	}
	ho := &herd.Options[*entry]{
		Name:      cfg.Name,
		MaxWeight: uint64(cfg.MaxBytes),
		Weigher: func(k string, e *entry) uint32 {
			if e == nil {
				return uint32(64 + len(k))
			}
			return e.weight(k)
		},
		SoftTTL:            time.Minute, // every fetch sets its own
		PreciseClock:       true,
		LoadTimeout:        cfg.FetchTimeout,
		RefreshBackoff:     cfg.ErrorBackoff,
		Limiter:            cfg.Limiter,
		Store:              cfg.Store,
		Lease:              cfg.Lease,
		OnLeaseHeld:        herd.Wait,
		LoadOnLeaseTimeout: true,
		Recorder:           cfg.Recorder,
		Codec:              codec{},
	}
	if cfg.Store != nil {
		ho.NearTTL = cfg.NearTTL
		ho.BreakerThreshold, ho.BreakerCooldown = 5, time.Second
	}
	if cfg.Lease != nil {
		ho.LeaseTTL = cfg.LeaseTTL
	}
	if c.hc, err = herd.New(ho); err != nil {
		return nil, fmt.Errorf("herdhttp: %w", err)
	}
	return c, nil
}

func (c *engine) close(ctx context.Context) error { return c.hc.Close(ctx) }

// request is one request's state on its way through the cache.
type request struct {
	r       *http.Request
	route   string
	start   int64 // when it arrived, Unix ns
	rcc     cacheControl
	primary string // the key of its URL
	// key is the key it is answered under: primary, or the variant key its
	// Vary index gives; names are the index's names then.
	key   string
	names []string
	// old is the stored response it found, stale or to be revalidated;
	// found is whatever entry it found under key, usable or not.
	old, found *entry
	// fwd is the Cache-Status fwd reason of a fetch it makes.
	fwd string
	// restarts counts the lookups made again after a fetch gave an index.
	restarts int
}

// roundTrip answers r from the cache or the origin.
func (c *engine) roundTrip(r *http.Request) (*http.Response, error) {
	q := &request{r: r, start: time.Now().UnixNano(), route: c.route(r)}
	switch r.Method {
	case http.MethodGet, http.MethodHead:
	default:
		return c.unsafe(q)
	}
	if c.o.RequestCacheControl {
		q.rcc = parseCacheControl(r.Header)
		if q.rcc == nil && r.Header.Get("Pragma") == "no-cache" {
			q.rcc = cacheControl{"no-cache": ""}
		}
		if q.rcc.has("no-store") {
			return c.pass(q, OutcomePass, "fwd=request")
		}
	}
	q.primary = c.primaryKey(r)
	return c.lookup(q)
}

// lookup answers q from what the tiers hold under its key, or fetches.
func (c *engine) lookup(q *request) (*http.Response, error) {
	ctx := q.r.Context()
	q.key, q.names, q.old, q.found, q.fwd = q.primary, nil, nil, nil, "uri-miss"
	// A fetch of the key in progress here is joined before the tiers are
	// asked: herd would make the question wait for that fetch's end.
	if s, b := c.fl.get(q.key); s != nil {
		return c.follow(q, s, b, nil)
	}
	e := c.peek(ctx, q.key)
	if e != nil && e.kind == kindIndex {
		return c.lookupVariant(q, e.varyNames)
	}
	return c.answer(q, e)
}

// lookupVariant answers q from what the tiers hold under the variant key
// its values of names give, or fetches it there.
func (c *engine) lookupVariant(q *request, names []string) (*http.Response, error) {
	q.names = names
	q.key = c.variantKey(q.primary, varyValues(q.r, q.names))
	q.old, q.found, q.fwd = nil, nil, "vary-miss"
	if s, b := c.fl.get(q.key); s != nil {
		return c.follow(q, s, b, nil)
	}
	return c.answer(q, c.peek(q.r.Context(), q.key))
}

// answer answers q with e, what the tiers hold under its key (nil for
// nothing), or fetches.
func (c *engine) answer(q *request, e *entry) (*http.Response, error) {
	q.found = e
	if e != nil && e.kind == kindResponse && !c.matches(e, q.r) {
		e, q.fwd = nil, "vary-miss" // another variant shares the bucket
	}
	if e != nil && e.kind == kindPass {
		return c.pass(q, OutcomeHitForPass, "fwd=bypass; detail=hit-for-pass-"+e.reason)
	}
	if e != nil && e.kind == kindIndex {
		e = nil // an index under a variant key: fetch
	}
	ranged := q.r.Method == http.MethodGet && q.r.Header.Get("Range") != ""
	now := time.Now().UnixNano()
	if e == nil {
		if q.rcc.has("only-if-cached") {
			return c.gatewayTimeout(q, "only-if-cached")
		}
		if ranged || q.r.Method == http.MethodHead {
			return c.pass(q, OutcomePass, "fwd="+q.fwd+"; detail=not-stored")
		}
		return c.fetch(q)
	}
	switch c.judge(e, q, now) {
	case useFresh:
		c.rec.RecordRoute(q.route, OutcomeHit)
		return c.respond(q, e, nil, now, fmt.Sprintf("hit; ttl=%d", seconds(e.ttl(now)))), nil
	case useStale:
		c.rec.RecordRoute(q.route, OutcomeStale)
		c.revalidateBehind(q, e)
		return c.respond(q, e, nil, now, fmt.Sprintf("hit; ttl=%d; detail=stale-while-revalidate", seconds(e.ttl(now)))), nil
	}
	if q.rcc.has("only-if-cached") {
		return c.gatewayTimeout(q, "only-if-cached")
	}
	q.old, q.fwd = e, "stale"
	if q.rcc.has("no-cache") || q.rcc.has("max-age") || q.rcc.has("min-fresh") {
		q.fwd = "request"
	}
	if ranged || q.r.Method == http.MethodHead {
		return c.pass(q, OutcomePass, "fwd="+q.fwd+"; detail=not-stored")
	}
	return c.fetch(q)
}

// peek returns what the tiers hold under key, fresh or stale, without
// fetching or refreshing anything: a Get with no load function serves
// what it finds and starts no refresh.
func (c *engine) peek(ctx context.Context, key string) *entry {
	e, err := c.hc.Get(ctx, key, nil)
	if err != nil {
		return nil
	}
	return e
}

// matches reports whether r selects the stored response e (RFC 9111
// §4.1): the fields e varies on have the same normalised values in r.
func (c *engine) matches(e *entry, r *http.Request) bool {
	return len(e.varyNames) == 0 || slices.Equal(e.varyValues, varyValues(r, e.varyNames))
}

// use says how a stored response may answer a request.
type use uint8

const (
	useFresh use = iota // fresh: serve it
	useStale            // stale within stale-while-revalidate: serve it, revalidate behind
	useFetch            // fetch or revalidate first (stale-if-error may still serve it)
)

// judge decides how e may answer q at now (RFC 9111 §4.2, §5.2.1, RFC
// 5861 §3).
func (c *engine) judge(e *entry, q *request, now int64) use {
	if e.flags&flagNoCache != 0 {
		return useFetch
	}
	age, ttl := e.currentAge(now), e.ttl(now)
	if rcc := q.rcc; rcc != nil {
		if rcc.has("no-cache") {
			return useFetch
		}
		if d, ok := rcc.seconds("max-age"); ok && age > d {
			return useFetch
		}
		if d, ok := rcc.seconds("min-fresh"); ok && ttl < d {
			return useFetch
		}
		if d, ok := rcc.seconds("max-stale"); ok && ttl <= 0 && -ttl <= d && e.flags&flagMustRevalidate == 0 {
			return useFresh // the client accepts it stale
		}
	}
	switch {
	case ttl > 0:
		return useFresh
	case e.flags&flagMustRevalidate != 0:
		return useFetch
	case -ttl < e.swr:
		return useStale
	}
	return useFetch
}

// staleOnError reports whether e may be served at now because its
// revalidation failed (RFC 5861 §4).
func staleOnError(e *entry, now int64) bool {
	return e != nil && e.kind == kindResponse && e.flags&(flagMustRevalidate|flagNoCache) == 0 && -e.ttl(now) < e.sie
}

// revalidateBehind starts one revalidation of q's stale response in the
// background, fleet-wide through the lease: herd serves the stale entry
// and refreshes it with this fetch. Nothing starts while the entry is
// still fresh by herd's soft TTL (see minHerdSoft).
func (c *engine) revalidateBehind(q *request, e *entry) {
	q.old = e
	f := c.newFetch(q, nil)
	_, _ = c.hc.Get(context.WithoutCancel(q.r.Context()), q.key, f.load)
}

// fetch answers q from a fetch of its key: the one this process has in
// progress, or a new one that this request leads. The leader fetches
// through herd (one fetch per key fleet-wide, with the lease) when herd's
// soft TTL of the stored entry has passed, and directly otherwise.
func (c *engine) fetch(q *request) (*http.Response, error) {
	now := time.Now().UnixNano()
	if staleOnError(q.old, now) && c.backingOff(q.key, now) {
		return c.serveStale(q, 0, now)
	}
	s, b, leader := c.fl.join(q.key, c.o.MaxBodyBytes, q.old)
	var f *fetch // the leader's
	if leader {
		f = c.newFetch(q, s)
		// herd would hand back an entry it holds as fresh: a response the
		// request may not use (it needs validating, or is another variant
		// of its bucket) is replaced by a direct fetch.
		viaHerd := q.found == nil || now >= q.found.herdSoft
		go c.lead(f, q.found, viaHerd)
	}
	return c.follow(q, s, b, f)
}

// follow answers q from s, a fetch of its key, whose body b reads; f is
// the fetch when q leads it, nil otherwise.
func (c *engine) follow(q *request, s *stream, b *streamBody, f *fetch) (*http.Response, error) {
	leader := f != nil
	if leader {
		defer s.leaderDone()
	}
	streamed := false
	defer func() {
		if !streamed {
			b.Close()
		}
	}()
	b.ctx = q.r.Context()
	st, err := s.wait(q.r.Context())
	if err != nil {
		return nil, err
	}
	switch st {
	case streaming:
		head, _ := s.result()
		if !c.matches(head, q.r) {
			return c.varyMismatch(q, head)
		}
		streamed = true
		status := fmt.Sprintf("fwd=%s; fwd-status=%d; stored", q.fwd, head.status)
		if !leader {
			status = fmt.Sprintf("fwd=%s; collapsed", q.fwd)
			c.rec.RecordRoute(q.route, OutcomeCollapsed)
		} else {
			head = s.leaderHead()
			c.rec.RecordRoute(q.route, OutcomeMiss)
		}
		return c.respond(q, head, b, time.Now().UnixNano(), status), nil
	case handedOff:
		if leader {
			if live := s.take(); live != nil {
				c.rec.RecordRoute(q.route, OutcomeMiss)
				addStatus(live.Header, c.o.Name, fmt.Sprintf("fwd=%s; fwd-status=%d; detail=not-stored", q.fwd, live.StatusCode))
				return live, nil
			}
		}
		return c.pass(q, OutcomeHitForPass, "fwd=bypass; detail=hit-for-pass")
	}
	e, err := s.result()
	if err != nil {
		if q.old == nil {
			q.old = s.old // a reader that joined before looking at the tiers
		}
		return c.fetchFailed(q, err)
	}
	// A leader whose fetch never ran was answered by another replica's.
	own := leader && f.used.Load()
	return c.settled(q, e, own, own && f.revalidated.Load())
}

// lead runs the fetch of a stream and settles the stream with its
// outcome, unless the fetch already streamed or handed off a response.
// found is what the leading request found under the key and could not
// use, if anything.
func (c *engine) lead(f *fetch, found *entry, viaHerd bool) {
	ctx := context.WithoutCancel(f.ctx)
	var e *entry
	var err error
	if viaHerd {
		// A Get with a load may join the flight of a peek (a Get without
		// one) that began just before, and share its ErrNoLoader: ask again.
		for range 4 {
			if e, err = c.hc.Get(ctx, f.key, f.load, herd.NoStale()); !errors.Is(err, herd.ErrNoLoader) {
				break
			}
		}
		// herd's soft expiry of an entry is set when it is stored, a little
		// after herdSoft: just past herdSoft, herd may hand back the very
		// response the request could not use.
		if err == nil && !f.used.Load() && sameResponse(e, found) {
			e, err = f.direct(ctx)
		}
	} else {
		e, err = f.direct(ctx)
	}
	// Forgotten before it ends: a request made after a reader saw the end
	// asks the tiers, which hold what this fetch stored.
	c.fl.remove(f.key, f.s)
	if f.received.Load() {
		f.s.end(nil)
	}
	f.s.finish(e, err)
}

// varyMismatch answers q, which waited for a fetch whose response e
// varies and does not match q: fetched for another request, or without
// the fields it varies on (those that are not forwarded). q is looked up,
// and if need be fetched and stored, under the variant key of its own
// values, once; a second mismatch passes it to the origin.
func (c *engine) varyMismatch(q *request, e *entry) (*http.Response, error) {
	if q.restarts++; q.restarts > 1 || len(e.varyNames) == 0 {
		return c.pass(q, OutcomePass, "fwd=vary-miss; detail=vary-mismatch")
	}
	return c.lookupVariant(q, e.varyNames)
}

// sameResponse reports whether a and b are one stored response: the
// same entry, or copies of it (decoded from the shared tier).
func sameResponse(a, b *entry) bool {
	return a != nil && b != nil && a.kind == kindResponse && b.kind == kindResponse &&
		a.reqTime == b.reqTime && a.respTime == b.respTime
}

// settled answers q with e, the entry its fetch ended in without
// streaming: a revalidated response, another replica's fetch, a mark.
func (c *engine) settled(q *request, e *entry, own, revalidated bool) (*http.Response, error) {
	now := time.Now().UnixNano()
	switch e.kind {
	case kindPass:
		return c.pass(q, OutcomeHitForPass, "fwd=bypass; detail=hit-for-pass-"+e.reason)
	case kindIndex:
		if q.restarts++; q.restarts > 1 {
			return c.pass(q, OutcomePass, "fwd=vary-miss; detail=vary-changed")
		}
		return c.lookup(q)
	}
	if !c.matches(e, q.r) {
		return c.varyMismatch(q, e)
	}
	// A response received after q arrived answers it, fresh or not: it is
	// as recent as a fetch of q's own would have been.
	if e.ttl(now) <= 0 && e.respTime < q.start {
		return c.pass(q, OutcomePass, "fwd="+q.fwd+"; detail=stale-answer")
	}
	status := fmt.Sprintf("fwd=%s; collapsed", q.fwd)
	switch {
	case revalidated:
		status = fmt.Sprintf("fwd=%s; fwd-status=304", q.fwd)
		c.rec.RecordRoute(q.route, OutcomeRevalidated)
	case own:
		status = fmt.Sprintf("fwd=%s; stored", q.fwd)
		c.rec.RecordRoute(q.route, OutcomeMiss)
	default:
		c.rec.RecordRoute(q.route, OutcomeCollapsed)
	}
	return c.respond(q, e, nil, now, status), nil
}

// fetchFailed answers q whose fetch failed with err: stale if
// stale-if-error allows it, else the origin's error response, 503 when
// the limiter shed the fetch, or a gateway error.
func (c *engine) fetchFailed(q *request, err error) (*http.Response, error) {
	now := time.Now().UnixNano()
	var oe *originError
	isOrigin := errors.As(err, &oe)
	if staleOnError(q.old, now) && (isOrigin || errors.Is(err, herd.ErrOverloaded)) {
		c.backOff(q.key, now)
		fwdStatus := 0
		if isOrigin && oe.resp != nil {
			fwdStatus = oe.resp.status
		}
		return c.serveStale(q, fwdStatus, now)
	}
	if errors.Is(err, herd.ErrOverloaded) {
		c.rec.RecordRoute(q.route, OutcomeShed)
		return c.overloaded(q, err), nil
	}
	if isOrigin && oe.resp != nil {
		c.rec.RecordRoute(q.route, OutcomeMiss)
		return c.respond(q, oe.resp, nil, now, fmt.Sprintf("fwd=%s; fwd-status=%d", q.fwd, oe.resp.status)), nil
	}
	if q.old != nil && q.old.flags&flagMustRevalidate != 0 {
		return c.gatewayTimeout(q, "must-revalidate") // RFC 9111 §5.2.2.2
	}
	if !c.errResponses {
		return nil, err
	}
	c.rec.RecordRoute(q.route, OutcomeMiss)
	return c.gatewayError(q, err), nil
}

// backOff keeps key from revalidating for ErrorBackoff after now.
func (c *engine) backOff(key string, now int64) {
	c.backoffMu.Lock()
	defer c.backoffMu.Unlock()
	if _, ok := c.backoff[key]; !ok && len(c.backoff) >= maxBackoffKeys {
		for k, until := range c.backoff {
			if now >= until {
				delete(c.backoff, k)
			}
		}
		if len(c.backoff) >= maxBackoffKeys {
			return
		}
	}
	c.backoff[key] = now + int64(c.o.ErrorBackoff)
}

// backingOff reports whether a revalidation of key failed less than
// ErrorBackoff ago.
func (c *engine) backingOff(key string, now int64) bool {
	c.backoffMu.Lock()
	defer c.backoffMu.Unlock()
	until, ok := c.backoff[key]
	if ok && now >= until {
		delete(c.backoff, key)
	}
	return ok && now < until
}

// serveStale answers q with its stale response under stale-if-error.
func (c *engine) serveStale(q *request, fwdStatus int, now int64) (*http.Response, error) {
	c.rec.RecordRoute(q.route, OutcomeStale)
	status := fmt.Sprintf("fwd=stale; ttl=%d; detail=stale-if-error", seconds(q.old.ttl(now)))
	if fwdStatus != 0 {
		status = fmt.Sprintf("fwd=stale; fwd-status=%d; ttl=%d; detail=stale-if-error", fwdStatus, seconds(q.old.ttl(now)))
	}
	return c.respond(q, q.old, nil, now, status), nil
}

// seconds rounds d down to whole seconds, towards minus infinity.
func seconds(d time.Duration) int64 {
	s := int64(d / time.Second)
	if d < 0 && d%time.Second != 0 {
		s--
	}
	return s
}
