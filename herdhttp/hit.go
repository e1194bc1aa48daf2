package herdhttp

import (
	"net/http"
	"slices"
	"strconv"
	"sync/atomic"
	"time"
)

// peeked is what the hit path learnt of a request it did not answer, for
// the full path to go on from: when it arrived, its primary key and what
// the tiers held under it (nil for nothing), and when that was a Vary
// index, the variant key of the request's values and what they held
// under it. Its zero value says that nothing was looked up.
type peeked struct {
	start int64
	key   string
	e     *entry
	vkey  string
	ve    *entry
}

// serveHit answers r from the cache when it is a plain hit, writing the
// stored response straight to w, or 304 when r's conditions say the
// client's copy is current: a GET or HEAD without Range (and without
// Cache-Control or Pragma when RequestCacheControl is set), whose key has no fetch running in this process, and whose stored
// response is fresh and selected by the request: stored under its
// primary key, or under the variant key that the URL's Vary index and
// the request's values give. Its fields are copied into
// w's header as they are stored, and Age, Cache-Status and
// Content-Length added from values kept with the entry (see hitMemo);
// the answer is the one the full path gives, field for field. It reports
// false, having written nothing, for any other request, with what it
// found when it looked in the tiers.
func (c *engine) serveHit(w http.ResponseWriter, r *http.Request) (bool, peeked) {
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		return false, peeked{}
	}
	rh := r.Header
	if rh["Range"] != nil {
		return false, peeked{}
	}
	if c.o.RequestCacheControl && (rh["Cache-Control"] != nil || rh["Pragma"] != nil) {
		return false, peeked{}
	}
	wh := w.Header()
	if len(wh) != 0 {
		return false, peeked{} // fields set by a handler around this one
	}
	var buf [keyBuf]byte
	p := peeked{start: time.Now().UnixNano(), key: string(c.appendPrimaryKey(buf[:0], r))}
	if c.fl.running(p.key) {
		return false, peeked{}
	}
	e := c.peek(r.Context(), p.key)
	p.e = e
	if e != nil && e.kind == kindIndex {
		// The URL's responses vary: its variant bucket is looked up as
		// lookupVariant looks it up.
		// The values are normalised on the stack when they can be.
		var vbuf [hitVaryBuf]byte
		var kbuf [keyBuf]byte
		var values []string
		var vkey string
		v, stacked := hitVaryValues(vbuf[:], r, e.varyNames)
		if stacked {
			vkey = string(c.appendVariantBucket(kbuf[:0], p.key, v.fnv()))
		} else {
			values = varyValues(r, e.varyNames)
			vkey = string(c.appendVariantKey(kbuf[:0], p.key, values))
		}
		if c.fl.running(vkey) {
			return false, p
		}
		e = c.peek(r.Context(), vkey)
		p.vkey, p.ve = vkey, e
		if e == nil || e.kind != kindResponse {
			return false, p
		}
		if stacked && !v.equal(e.varyValues) || !stacked && !slices.Equal(e.varyValues, values) {
			return false, p
		}
	} else if e == nil || e.kind != kindResponse || !c.matches(e, r) {
		return false, p
	}
	now := time.Now().UnixNano()
	if usable(e, nil, now) != useFresh {
		return false, p
	}
	c.rec.RecordRoute(c.route(r), OutcomeHit)
	v := c.hitValues(e, max(seconds(e.currentAge(now)), 0), seconds(e.ttl(now)))
	if e.status == http.StatusOK && (rh["If-None-Match"] != nil || rh["If-Modified-Since"] != nil) && notModified(r, e.header) {
		// 304 with the fields RFC 9110 §15.4.5 lists (see notModified)
		for _, k := range notModifiedFields {
			if vs, ok := e.header[k]; ok {
				wh[k] = vs
			}
		}
		wh["Age"], wh["Cache-Status"] = v.ageV, v.status
		w.WriteHeader(http.StatusNotModified)
		return true, peeked{}
	}
	for k, vs := range e.header {
		if !c.o.ForwardTags && (k == "Surrogate-Key" || k == "Cache-Tag") {
			continue // see tagFields
		}
		wh[k] = vs
	}
	wh["Age"], wh["Cache-Status"], wh["Content-Length"] = v.ageV, v.status, v.length
	w.WriteHeader(e.status)
	if r.Method == http.MethodGet && len(e.body) > 0 {
		_, _ = w.Write(e.body) // an error is the client's going
	}
	return true, peeked{}
}

// hitMemo keeps, with a stored response, the values of the fields a hit
// adds for the second they hold: a response served many times a second
// formats them once a second. Copies of an entry share it; the values
// say what they were made for, and one that does not fit is made again.
type hitMemo struct{ v atomic.Pointer[hitFields] }

// hitFields are the values of Age, Cache-Status and Content-Length of a
// hit on a response whose age is age and ttl ttl (whole seconds), whose
// body is n bytes long, from the cache called name, when the stored
// response has no Cache-Status. They are shared by the answers: never
// modified.
type hitFields struct {
	age, ttl int64
	n        int
	name     string

	ageV, status, length []string
}

// hitValues returns the values of the fields a hit on e adds, taken from
// e's memo when they fit.
func (c *engine) hitValues(e *entry, age, ttl int64) *hitFields {
	_, upstream := e.header["Cache-Status"]
	if m := e.hit; m != nil && !upstream {
		if v := m.v.Load(); v != nil && v.age == age && v.ttl == ttl && v.n == len(e.body) && v.name == c.o.Name {
			return v
		}
	}
	v := &hitFields{
		age: age, ttl: ttl, n: len(e.body), name: c.o.Name,
		ageV:   []string{strconv.FormatInt(age, 10)},
		length: []string{strconv.Itoa(len(e.body))},
	}
	h := http.Header{"Cache-Status": e.header["Cache-Status"]}
	addStatus(h, c.o.Name, "hit; ttl="+strconv.FormatInt(ttl, 10))
	v.status = h["Cache-Status"]
	if e.hit != nil && !upstream {
		e.hit.v.Store(v)
	}
	return v
}
