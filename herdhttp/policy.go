package herdhttp

import (
	"net/http"
	"strings"
	"time"
)

// reasonAuthorization is why a response to a request with Authorization
// that does not allow sharing is not stored (RFC 9111 §3.5).
const reasonAuthorization = "authorization"

// describe decides whether resp, the answer to f's request, may be
// stored (RFC 9111 §3) and, when it may, returns the entry to store it
// as, without its body; otherwise it returns why not.
func (c *engine) describe(f *fetch, resp *http.Response, reqTime, respTime int64) (*entry, string) {
	cc, targeted := responseDirectives(resp.Header, c.o.TargetedFields)
	names, _ := varyNames(resp.Header)
	if why := notStorable(f.auth, resp.StatusCode, resp.Header, cc, resp.ContentLength, c.o.StoreSetCookie, c.o.MaxBodyBytes); why != "" {
		return nil, why
	}
	e := &entry{kind: kindResponse, status: resp.StatusCode, reqTime: reqTime, respTime: respTime, hit: new(hitMemo)}
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
	e.lifetime = freshnessLifetime(e.status, e.header, cc, targeted, e.dateValue, c.o.Heuristic, c.o.HeuristicMax)
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
