package herdhttp

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strconv"
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

	// behind counts the revalidations running in the background
	// (revalidateBehind), and behindKeys holds their keys, one each;
	// close waits for them.
	behind     sync.WaitGroup
	behindKeys sync.Map
}

// maxBackoffKeys bounds engine.backoff, so that failures of many keys
// never asked for again cannot grow it without end.
const maxBackoffKeys = 10_000

// minStored is the shortest time a fetched response is stored, however
// short its freshness: the requests that waited for its fetch, on every
// replica, are answered with it (it was received after they were made),
// and a response no later request may reuse is kept no longer. Whether a
// stored response may answer a request is decided by the request (see
// acceptor), never by how long it is stored.
const minStored = time.Second

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
	c.origin = c.watch(origin)
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

func (c *engine) close(ctx context.Context) error {
	done := make(chan struct{})
	go func() {
		c.behind.Wait()
		close(done)
	}()
	select {
	case <-done:
	case <-ctx.Done():
	}
	return c.hc.Close(ctx)
}

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
	// peeked says that pre is what the tiers held under primary when the
	// request arrived: its first lookup takes it rather than ask again.
	peeked bool
	pre    *entry
	// vkey, when not empty, is a variant key the request's values gave
	// under the Vary index in pre, and vpre what the tiers held under it;
	// its first lookup of that key takes it rather than ask again.
	vkey string
	vpre *entry
	// in forwards the 1xx responses of its origin requests to its
	// client; nil: none are.
	in *interim
}

// roundTrip answers r from the cache or the origin; p is what the hit
// path found of it, if it looked.
func (c *engine) roundTrip(r *http.Request, in *interim, p peeked) (*http.Response, error) {
	q := &request{r: r, in: in, start: p.start, route: c.route(r)}
	if p.key == "" {
		q.start = time.Now().UnixNano()
	}
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
	if p.key != "" {
		q.primary, q.peeked, q.pre, q.vkey, q.vpre = p.key, true, p.e, p.vkey, p.ve
	} else {
		q.primary = c.primaryKey(r)
	}
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
	var e *entry
	if q.peeked {
		e, q.peeked, q.pre = q.pre, false, nil
	} else {
		e = c.peek(ctx, q.key)
	}
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
	if q.vkey != "" && q.vkey == q.key {
		e := q.vpre
		q.vkey, q.vpre = "", nil
		return c.answer(q, e)
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
	switch usable(e, q.rcc, now) {
	case useFresh:
		c.rec.RecordRoute(q.route, OutcomeHit)
		return c.respond(q, e, nil, now, "hit; ttl="+strconv.FormatInt(seconds(e.ttl(now)), 10)), nil
	case useStale:
		c.rec.RecordRoute(q.route, OutcomeStale)
		c.revalidateBehind(q, e)
		return c.respond(q, e, nil, now, "hit; ttl="+strconv.FormatInt(seconds(e.ttl(now)), 10)+"; detail=stale-while-revalidate"), nil
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

// peek returns what the tiers hold under key, without fetching,
// refreshing or waiting for a fetch in progress; nil for nothing.
func (c *engine) peek(ctx context.Context, key string) *entry {
	e, p, err := c.hc.Peek(ctx, key)
	if err != nil || p == herd.Absent {
		return nil
	}
	return e
}

// matches reports whether r selects the stored response e (RFC 9111
// §4.1): the fields e varies on have the same normalised values in r.
func (c *engine) matches(e *entry, r *http.Request) bool {
	return len(e.varyNames) == 0 || slices.Equal(e.varyValues, varyValues(r, e.varyNames))
}

// revalidateBehind starts one revalidation of q's stale response e in
// the background, one per key at a time in this process and one per
// fleet through the lease: a Get that takes only a response received
// after e's and loads with this fetch otherwise. After one fails, none
// starts for ErrorBackoff.
func (c *engine) revalidateBehind(q *request, e *entry) {
	if c.backingOff(q.key, time.Now().UnixNano()) {
		return // the last one failed less than ErrorBackoff ago
	}
	if _, running := c.behindKeys.LoadOrStore(q.key, struct{}{}); running {
		return
	}
	q.old = e
	f := c.newFetch(q, nil)
	newer := herd.Accept(herd.AcceptFunc[*entry](func(x *entry, _ bool) bool {
		return x.kind != kindResponse || x.respTime > e.respTime
	}))
	c.behind.Add(1)
	go func() {
		defer c.behind.Done()
		defer c.behindKeys.Delete(q.key)
		if _, err := c.hc.Get(context.WithoutCancel(f.ctx), q.key, f.load, newer); err != nil {
			c.backOff(q.key, time.Now().UnixNano())
		}
	}()
}

// acceptor is what the Get of q's fetch takes from the tiers rather than
// fetching (RFC 9111 §4): never the response q found and could not use,
// nor another variant of its bucket; a response q selects that was
// received after q arrived (another request's fetch, here or on another
// replica) or that q may use fresh; a hit-for-pass mark; a Vary index
// other than the one q found. What the fetch itself made is taken.
func (c *engine) acceptor(q *request) herd.AcceptFunc[*entry] {
	found := q.found
	return func(e *entry, _ bool) bool {
		switch e.kind {
		case kindPass:
			return true
		case kindIndex:
			return found == nil || found.kind != kindIndex
		}
		if sameResponse(e, found) {
			return false
		}
		if !c.matches(e, q.r) {
			return false // another variant in q's bucket
		}
		return e.respTime >= q.start || usable(e, q.rcc, time.Now().UnixNano()) == useFresh
	}
}

// fetch answers q from a fetch of its key: the one this process has in
// progress, or a new one that this request leads, through herd (one
// fetch per key fleet-wide, with the lease), unless the tiers hold by
// then a response q takes (acceptor).
func (c *engine) fetch(q *request) (*http.Response, error) {
	now := time.Now().UnixNano()
	if staleOnError(q.old, now) && c.backingOff(q.key, now) {
		return c.serveStale(q, 0, now)
	}
	s, b, leader := c.fl.join(q.key, c.o.MaxBodyBytes, q.old)
	var f *fetch // the leader's
	if leader {
		f = c.newFetch(q, s)
		go c.lead(f, c.acceptor(q))
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
			if leader {
				// The fetch stores head's variant as it ends, in a bucket q's
				// own variant may share: let it end before q looks again.
				_, _ = io.Copy(io.Discard, b)
			}
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

// lead runs the fetch of a stream, as the load of one Get that takes
// what accept takes from the tiers, and settles the stream with its
// outcome, unless the fetch already streamed or handed off a response.
func (c *engine) lead(f *fetch, accept herd.AcceptFunc[*entry]) {
	ctx := context.WithoutCancel(f.ctx)
	e, err := c.hc.Get(ctx, f.key, f.load, herd.Accept(accept))
	if !f.used.Load() && joinedOthers(e, err) {
		e, err = c.hc.Get(ctx, f.key, f.load, herd.Accept(accept))
	}
	// Forgotten before it ends: a request made after a reader saw the end
	// asks the tiers, which hold what this fetch stored.
	c.fl.remove(f.key, f.s)
	if f.received.Load() {
		f.s.end(nil)
	}
	f.s.finish(e, err)
}

// joinedOthers reports whether a Get whose own fetch never ran, which
// ended in e or err, joined another request's fetch whose outcome was that
// request's alone, so that the Get's own fetch must run: one that failed
// as this one began (its client may have seen it fail already), or one
// that passed because of that request's Authorization (this one's own
// response may be stored).
func joinedOthers(e *entry, err error) bool {
	var oe *originError
	if err != nil {
		return errors.As(err, &oe)
	}
	return e.kind == kindPass && e.reason == reasonAuthorization
}

// sameResponse reports whether a and b are one stored response: the
// same entry, or copies of it (decoded from the shared tier).
func sameResponse(a, b *entry) bool {
	return a != nil && b != nil && a.kind == kindResponse && b.kind == kindResponse &&
		a.reqTime == b.reqTime && a.respTime == b.respTime
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
