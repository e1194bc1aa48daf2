package herdhttp

import (
	"net/http"
	"strings"
	"time"
)

// The decisions of RFC 9111 (and RFC 5861's stale windows, RFC 9110's
// conditional requests) as pure functions over a request, a response and
// a time: what the cache may store, how old and how long fresh a stored
// response is, whether it may answer a request fresh, stale or only after
// validation, and what a conditional request gets. They do no I/O and
// read no options but what they are given; the engine calls them, and
// rfc_test.go holds their tables.

// notStorable returns why a response may not be stored (§3), "" when it
// may: status and fields h (cc its cache directives), its announced
// Content-Length (-1 unknown), answering a request that carried
// Authorization when auth. storeSetCookie stores responses with
// Set-Cookie (without it); maxBody bounds a body.
func notStorable(auth bool, status int, h http.Header, cc cacheControl, contentLength int64, storeSetCookie bool, maxBody int64) string {
	_, star := varyNames(h)
	switch {
	case !understood(status):
		return "status"
	case cc.has("must-understand") && !knownStatus(status):
		return "must-understand" // §5.2.2.3
	case cc.has("no-store") && !cc.has("must-understand"):
		return "no-store"
	case cc.has("private") && cc.fields("private") == nil:
		return "private"
	case auth && !cc.has("public") && !cc.has("s-maxage") && !cc.has("must-revalidate"):
		return reasonAuthorization // §3.5
	case star:
		return "vary-star"
	case len(h.Values("Set-Cookie")) > 0 && !storeSetCookie:
		return "set-cookie"
	case contentLength > maxBody:
		return "too-large"
	}
	return ""
}

// freshnessLifetime is the freshness lifetime of a response with status
// and fields h (cc its cache directives, from a targeted field when
// targeted; date its Date, Unix ns), by §4.2.1: s-maxage, then max-age,
// then Expires less Date (an invalid Expires means already expired)
// unless the directives come from a targeted field, then the heuristic of
// §4.2.2 (heuristic of the time since Last-Modified, at most
// heuristicMax) when heuristic is set; -1 when none applies.
func freshnessLifetime(status int, h http.Header, cc cacheControl, targeted bool, date int64, heuristic float64, heuristicMax time.Duration) time.Duration {
	if d, ok := cc.seconds("s-maxage"); ok {
		return d
	}
	if d, ok := cc.seconds("max-age"); ok {
		return d
	}
	if vs := h.Values("Expires"); len(vs) > 0 && !targeted {
		t, ok := parseHTTPDate(vs[0])
		if !ok || len(vs) > 1 {
			return 0 // §5.3: invalid, and a list of dates is not a date
		}
		return max(time.Duration(t.UnixNano()-date), 0)
	}
	if heuristic > 0 && defaultCacheable[status] {
		if lm, ok := parseHTTPDate(h.Get("Last-Modified")); ok {
			since := time.Duration(date - lm.UnixNano())
			return min(max(time.Duration(float64(since)*heuristic), 0), heuristicMax)
		}
	}
	return -1
}

// currentAge is the age at now of a response received at respTime for a
// request sent at reqTime, with Date dateValue and Age ageValue (Unix ns),
// as §4.2.3 computes it; it saturates rather than wrap.
func currentAge(dateValue int64, ageValue time.Duration, reqTime, respTime, now int64) time.Duration {
	apparent := max(0, respTime-dateValue)
	corrected := int64(ageValue)
	if delay := respTime - reqTime; delay > 0 {
		corrected = sat(corrected + delay) // an Age at the largest value stays there
	}
	initial := max(apparent, corrected)
	return time.Duration(sat(initial + max(0, now-respTime)))
}

// use says how a stored response may answer a request.
type use uint8

const (
	useFresh use = iota // fresh: serve it
	useStale            // stale within stale-while-revalidate: serve it, revalidate behind
	useFetch            // fetch or revalidate first (stale-if-error may still serve it)
)

// usable decides how the stored response e may answer a request with
// the cache directives rcc at now (RFC 9111 §4.2, §5.2.1, RFC 5861 §3).
func usable(e *entry, rcc cacheControl, now int64) use {
	if e.flags&flagNoCache != 0 {
		return useFetch
	}
	age, ttl := e.currentAge(now), e.ttl(now)
	if rcc != nil {
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

// notModified reports whether r's conditions (RFC 9110 §13.1.2, §13.1.3)
// say that the client's copy is current: If-None-Match, or when it is
// absent If-Modified-Since, evaluated against the stored response's
// Last-Modified or, when it has none, its Date (RFC 9111 §4.3.2).
func notModified(r *http.Request, h http.Header) bool {
	if inm := r.Header.Get("If-None-Match"); inm != "" {
		etag := h.Get("ETag")
		if etag == "" {
			return false
		}
		for m := range strings.SplitSeq(inm, ",") {
			m = strings.TrimSpace(m)
			if m == "*" || weakEqual(m, etag) {
				return true
			}
		}
		return false
	}
	ims, ok := parseHTTPDate(r.Header.Get("If-Modified-Since"))
	if !ok {
		return false
	}
	last := h.Get("Last-Modified")
	if _, has := h["Last-Modified"]; !has {
		last = h.Get("Date")
	}
	lm, ok := parseHTTPDate(last)
	return ok && !lm.After(ims)
}

// weakEqual is the weak comparison of two entity tags.
func weakEqual(a, b string) bool {
	return strings.TrimPrefix(a, "W/") == strings.TrimPrefix(b, "W/")
}
