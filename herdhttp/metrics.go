package herdhttp

import (
	"net/http"
	"strconv"
	"sync"

	"github.com/herdcache/herd/observe"
)

// Outcome is how herdhttp answered one request.
type Outcome uint8

const (
	// OutcomeHit: a fresh stored response.
	OutcomeHit Outcome = iota + 1
	// OutcomeStale: a stale stored response, under stale-while-revalidate
	// (one revalidation runs behind it) or stale-if-error.
	OutcomeStale
	// OutcomeMiss: the request's own fetch from the origin.
	OutcomeMiss
	// OutcomeCollapsed: the answer of a fetch another request made, in
	// this process or on another replica.
	OutcomeCollapsed
	// OutcomeHitForPass: sent to the origin uncached, because its key is
	// marked hit-for-pass.
	OutcomeHitForPass
	// OutcomeRevalidated: the request waited for a conditional fetch of its
	// stored response that the origin answered 304, and was served the
	// stored response.
	OutcomeRevalidated
	// OutcomePass: sent to the origin uncached for another reason (an
	// unsafe method, a Range or HEAD that nothing stored answers, the
	// client's no-store, a Vary mismatch).
	OutcomePass
	// OutcomeShed: answered 503 because the limiter shed the fetch.
	OutcomeShed
	// OutcomeRevalidation is an event, not a request's outcome: a
	// conditional fetch of a stored response was sent to the origin, for a
	// request waiting on it or behind a stale response served at once
	// (stale-while-revalidate). It is recorded once per fetch.
	OutcomeRevalidation
)

var outcomeNames = [...]string{"", "hit", "stale", "miss", "collapsed", "hit-for-pass", "revalidated", "pass", "shed", "revalidation"}

func (o Outcome) String() string {
	if int(o) < len(outcomeNames) && o != 0 {
		return outcomeNames[o]
	}
	return "outcome(" + strconv.Itoa(int(o)) + ")"
}

// RouteRecorder is an optional interface of an [Options.Recorder] that
// counts herdhttp's outcomes by route: route is the Options.Routes pattern
// the request matched, or "other". observe.Recorder keeps its methods; a
// recorder gains this one by implementing it. It is called once per
// request with the request's outcome, and once per revalidation sent to
// the origin with OutcomeRevalidation; it must be cheap.
type RouteRecorder interface {
	RecordRoute(route string, o Outcome)
}

type nopRoutes struct{}

func (nopRoutes) RecordRoute(string, Outcome) {}

// route is the Routes pattern r matches, or "other".
func (c *engine) route(r *http.Request) string {
	if c.routes == nil {
		return "other"
	}
	if _, p := c.routes.Handler(r); p != "" {
		return p
	}
	return "other"
}

// Counts is a Recorder that counts outcomes by route in memory, for tests
// and for metrics systems that read counters. Its zero value is ready to
// use; it is safe for concurrent use.
type Counts struct {
	observe.NopRecorder
	mu sync.Mutex
	m  map[string]*[outcomeCount]int64
}

const outcomeCount = int(OutcomeRevalidation) + 1

// RecordRoute counts one outcome of route.
func (c *Counts) RecordRoute(route string, o Outcome) {
	if int(o) >= outcomeCount {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.m == nil {
		c.m = map[string]*[outcomeCount]int64{}
	}
	n := c.m[route]
	if n == nil {
		n = new([outcomeCount]int64)
		c.m[route] = n
	}
	n[o]++
}

// Snapshot returns the counts so far: route, then outcome, then count.
// Outcomes never recorded are left out.
func (c *Counts) Snapshot() map[string]map[Outcome]int64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make(map[string]map[Outcome]int64, len(c.m))
	for r, n := range c.m {
		m := map[Outcome]int64{}
		for o, v := range n {
			if v != 0 {
				m[Outcome(o)] = v
			}
		}
		out[r] = m
	}
	return out
}
