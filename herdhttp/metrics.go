package herdhttp

import (
	"net/http"
	"strconv"
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
	// OutcomeRevalidated: the request's conditional fetch was answered 304
	// and the stored response served.
	OutcomeRevalidated
	// OutcomePass: sent to the origin uncached for another reason (an
	// unsafe method, a Range or HEAD that nothing stored answers, the
	// client's no-store, a Vary mismatch).
	OutcomePass
	// OutcomeShed: answered 503 because the limiter shed the fetch.
	OutcomeShed
)

var outcomeNames = [...]string{"", "hit", "stale", "miss", "collapsed", "hit-for-pass", "revalidated", "pass", "shed"}

func (o Outcome) String() string {
	if int(o) < len(outcomeNames) && o != 0 {
		return outcomeNames[o]
	}
	return "outcome(" + strconv.Itoa(int(o)) + ")"
}

// RouteRecorder is an optional interface of an [Options.Recorder] that
// counts herdhttp's outcomes by route: route is the Options.Routes pattern
// the request matched, or "other". herd.Recorder keeps its methods; a
// recorder gains this one by implementing it. It is called once per
// request, on the request's goroutine, and must be cheap.
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
