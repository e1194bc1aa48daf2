package herdhttp

import (
	"net/http"
	"strings"
	"time"
)

// describe decides whether resp, the answer to f's request, may be
// stored (RFC 9111 §3) and, when it may, returns the entry to store it
// as, without its body; otherwise it returns why not.
func (c *engine) describe(f *fetch, resp *http.Response, reqTime, respTime int64) (*entry, string) {
	cc, targeted := responseDirectives(resp.Header, c.o.TargetedFields)
	names, star := varyNames(resp.Header)
	switch {
	case !understood(resp.StatusCode):
		return nil, "status"
	case cc.has("must-understand") && !knownStatus(resp.StatusCode):
		return nil, "must-understand" // §5.2.2.3
	case cc.has("no-store") && !cc.has("must-understand"):
		return nil, "no-store"
	case cc.has("private") && cc.fields("private") == nil:
		return nil, "private"
	case f.auth && !cc.has("public") && !cc.has("s-maxage") && !cc.has("must-revalidate"):
		return nil, "authorization" // §3.5
	case star:
		return nil, "vary-star"
	case len(resp.Header.Values("Set-Cookie")) > 0 && !c.o.StoreSetCookie:
		return nil, "set-cookie"
	case resp.ContentLength > c.o.MaxBodyBytes:
		return nil, "too-large"
	}
	e := &entry{kind: kindResponse, status: resp.StatusCode, reqTime: reqTime, respTime: respTime}
	e.header = cleanHeader(resp.Header, cc)
	c.timing(e, cc, targeted, respTime)
	if e.lifetime < 0 && defaultCacheable[e.status] && e.keep > 0 && e.validator() {
		e.lifetime = 0 // stale at once: stored to be revalidated
	}
	if e.lifetime < 0 {
		return nil, "no-freshness"
	}
	if e.lifetime-e.currentAge(respTime) <= 0 && e.swr == 0 && e.sie == 0 && (e.keep == 0 || !e.validator()) {
		return nil, "stale"
	}
	if e.flags&flagNoCache != 0 && (e.keep == 0 || !e.validator()) {
		return nil, "no-cache" // every use needs a validation it could not make
	}
	e.varyNames = names
	e.varyValues = varyValues(f.out, names)
	return e, ""
}

// timing sets e's Date, Age, freshness lifetime, stale windows and flags
// from its fields (cc is their cache directives, from a targeted field
// when targeted); a lifetime of -1 means the response gives no freshness
// and none may be inferred.
func (c *engine) timing(e *entry, cc cacheControl, targeted bool, respTime int64) {
	if t, ok := parseHTTPDate(e.header.Get("Date")); ok {
		e.dateValue = t.UnixNano()
	} else {
		// RFC 9110 §6.6.1: a recipient with a clock adds Date when none.
		e.dateValue = respTime
		e.header.Set("Date", time.Unix(0, respTime).UTC().Format(http.TimeFormat))
	}
	e.ageValue = ageValue(e.header)
	e.flags = 0
	if cc.has("must-revalidate") || cc.has("proxy-revalidate") {
		e.flags |= flagMustRevalidate
	}
	if cc.has("no-cache") && cc.fields("no-cache") == nil {
		e.flags |= flagNoCache
	}
	e.swr, _ = cc.seconds("stale-while-revalidate")
	e.sie, _ = cc.seconds("stale-if-error")
	e.keep = c.o.KeepForRevalidation
	e.lifetime = c.lifetime(e, cc, targeted)
}

// lifetime is the freshness lifetime of §4.2.1: s-maxage, then max-age,
// then Expires less Date (an invalid Expires means already expired)
// unless the directives come from a targeted field, then the heuristic of
// §4.2.2 when configured; -1 when none applies.
func (c *engine) lifetime(e *entry, cc cacheControl, targeted bool) time.Duration {
	if d, ok := cc.seconds("s-maxage"); ok {
		return d
	}
	if d, ok := cc.seconds("max-age"); ok {
		return d
	}
	if vs := e.header.Values("Expires"); len(vs) > 0 && !targeted {
		t, ok := parseHTTPDate(vs[0])
		if !ok || len(vs) > 1 {
			return 0 // §5.3: invalid, and a list of dates is not a date
		}
		return max(time.Duration(t.UnixNano()-e.dateValue), 0)
	}
	if c.o.Heuristic > 0 && defaultCacheable[e.status] {
		if lm, ok := parseHTTPDate(e.header.Get("Last-Modified")); ok {
			since := time.Duration(e.dateValue - lm.UnixNano())
			return min(max(time.Duration(float64(since)*c.o.Heuristic), 0), c.o.HeuristicMax)
		}
	}
	return -1
}

// ageValue is the Age field of h (RFC 9111 §5.1): the first member of
// its first line, when that is delta-seconds; 0 when there is none or it
// is invalid. A value too large to represent is the largest one.
func ageValue(h http.Header) time.Duration {
	vs := h.Values("Age")
	if len(vs) == 0 {
		return 0
	}
	first, _, _ := strings.Cut(vs[0], ",")
	d, _ := deltaSeconds(strings.TrimSpace(first))
	return d
}

// cleanHeader copies the fields of a response to store: every field but
// the hop-by-hop ones, those that a qualified private or no-cache names
// (they may not be reused) and Set-Cookie (a client's own). Set-Cookie2,
// obsolete since RFC 6265 and acted on by no user agent, is kept.
func cleanHeader(h http.Header, cc cacheControl) http.Header {
	out := h.Clone()
	stripHopByHop(out)
	for _, f := range cc.fields("private") {
		out.Del(f)
	}
	for _, f := range cc.fields("no-cache") {
		out.Del(f)
	}
	out.Del("Set-Cookie")
	return out
}

// refreshed returns a copy of e updated by the fields of a 304 that
// validated it (RFC 9111 §4.3.4, §3.2): each field the 304 carries
// replaces the stored one, Content-Length and hop-by-hop fields aside,
// and the freshness is computed again from the new times.
func (c *engine) refreshed(e *entry, h http.Header, reqTime, respTime int64) *entry {
	n := *e
	n.header = e.header.Clone()
	upd := h.Clone()
	stripHopByHop(upd)
	upd.Del("Content-Length")
	upd.Del("Set-Cookie")
	for k, vs := range upd {
		n.header[k] = vs
	}
	n.reqTime, n.respTime = reqTime, respTime
	cc, targeted := responseDirectives(n.header, c.o.TargetedFields)
	for _, f := range cc.fields("private") {
		n.header.Del(f)
	}
	for _, f := range cc.fields("no-cache") {
		n.header.Del(f)
	}
	c.timing(&n, cc, targeted, respTime)
	if n.lifetime < 0 {
		n.lifetime = 0
	}
	return &n
}
