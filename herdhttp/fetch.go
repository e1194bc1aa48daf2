package herdhttp

import (
	"context"
	"errors"
	"io"
	"net/http"
	"slices"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/herdcache/herd"
)

// fetch is one request to the origin for a key, on behalf of a request
// (foreground, with a stream its readers read) or of a stale response
// (background, no stream). Its outgoing request is built when it is made,
// so that it never reads the client's request afterwards.
type fetch struct {
	c       *engine
	ctx     context.Context // the client request's values, not its cancellation
	key     string
	route   string
	primary string
	names   []string // the Vary index's names when key is a variant key
	out     *http.Request
	rcc     cacheControl
	auth    bool   // the request carried Authorization
	old     *entry // the stored response it revalidates; nil for none
	s       *stream
	used    atomic.Bool
	// revalidated is set when the origin answered 304.
	revalidated atomic.Bool
	// received is set when the whole body was streamed: the stream is
	// ended once the entry is stored, so that a reader that saw its end
	// finds the entry stored.
	received atomic.Bool
}

// fillKey marks the context of a fetch whose response may be stored.
type fillKey struct{}

// errFetchUsed is what a fetch's load returns when herd calls it again:
// one fetch makes at most one request to the origin.
var errFetchUsed = errors.New("herdhttp: fetch already made")

// originError is an origin's failure: it could not be reached (resp
// nil), or it answered a revalidation with 500, 502, 503 or 504 (resp
// holds that answer, its body read up to MaxBodyBytes).
type originError struct {
	err  error
	resp *entry
}

func (e *originError) Error() string {
	if e.resp != nil {
		return "herdhttp: origin answered " + strconv.Itoa(e.resp.status)
	}
	return "herdhttp: origin unreachable: " + e.err.Error()
}

func (e *originError) Unwrap() error { return e.err }

func (c *engine) newFetch(q *request, s *stream) *fetch {
	ctx := q.r.Context()
	if s != nil {
		ctx = q.in.trace(ctx) // the fetch a client waits for
	}
	f := &fetch{
		c: c, ctx: ctx, key: q.key, route: q.route, primary: q.primary, names: q.names,
		rcc: q.rcc, auth: q.r.Header.Get("Authorization") != "", old: q.old, s: s,
	}
	f.out = c.fillRequest(q)
	return f
}

// fillRequest is the GET a fetch for q sends: q's URL with the forwarded
// fields (see Options.ForwardHeaders and ForwardAllFields), and the
// validators of the stored response being revalidated.
func (c *engine) fillRequest(q *request) *http.Request {
	r := q.r
	out := r.Clone(context.Background())
	out.Method = http.MethodGet
	out.Body, out.ContentLength, out.GetBody = http.NoBody, 0, nil
	out.TransferEncoding, out.Close, out.Trailer = nil, false, nil
	if c.o.ForwardAllFields {
		out.Header = r.Header.Clone()
		stripHopByHop(out.Header)
		for _, k := range clientConditionals {
			delete(out.Header, k)
		}
	} else {
		out.Header = make(http.Header, len(c.forward)+len(q.names))
		for k, vs := range r.Header {
			if c.forward[k] || slices.Contains(q.names, k) {
				out.Header[k] = slices.Clone(vs)
			}
		}
	}
	if old := q.old; old != nil {
		if et := old.header.Get("ETag"); et != "" {
			out.Header.Set("If-None-Match", et)
		}
		if lm := old.header.Get("Last-Modified"); lm != "" {
			out.Header.Set("If-Modified-Since", lm)
		}
	}
	return out
}

// clientConditionals are the request fields that would make the origin
// answer a fill with less than a whole response to store (a 304, a 206,
// a 412): they are the client's to the cache, never forwarded on a fill.
var clientConditionals = []string{"If-Match", "If-None-Match", "If-Modified-Since", "If-Unmodified-Since", "If-Range", "Range"}

// result is what a fetch ended in: an entry to store for soft and hard
// (store false: serve it, store nothing), or an error.
type result struct {
	e          *entry
	store      bool
	soft, hard time.Duration
	err        error
}

// load is the fetch as a herd load: herd stores what it returns, for
// the TTLs it sets, under its lease.
func (f *fetch) load(ctx context.Context) (*entry, error) {
	if !f.used.CompareAndSwap(false, true) {
		return nil, errFetchUsed
	}
	res := f.run(ctx)
	if res.err != nil {
		return nil, res.err
	}
	if res.store {
		herd.SetTTL(ctx, res.soft, res.hard)
		if res.e.kind == kindResponse {
			herd.Tags(ctx, responseTags(res.e.header)...) // retired by a purge of any of them
		}
	} else {
		herd.NoCache(ctx)
	}
	return res.e, nil
}

// run makes the request and decides what to store.
func (f *fetch) run(ctx context.Context) result {
	c := f.c
	// The response may be read after the load returns (streamed to readers,
	// handed off): its request lives on until its body is closed.
	rctx, cancel := context.WithTimeout(context.WithValue(context.WithoutCancel(ctx), fillKey{}, true), c.o.FetchTimeout)
	out := f.out.WithContext(rctx)
	if f.old != nil {
		c.rec.RecordRoute(f.route, OutcomeRevalidation)
	}
	reqTime := time.Now().UnixNano()
	resp, err := c.origin.RoundTrip(out)
	if err != nil {
		cancel()
		return result{err: &originError{err: err}}
	}
	resp.Body = &cancelBody{ReadCloser: resp.Body, cancel: cancel}
	respTime := time.Now().UnixNano()
	if resp.StatusCode == http.StatusNotModified && f.old != nil {
		resp.Body.Close()
		f.revalidated.Store(true)
		e := c.refreshed(f.old, resp.Header, reqTime, respTime)
		return f.keep(e, respTime)
	}
	if f.old != nil && errorStatus(resp.StatusCode) {
		e, _ := c.describe(f, resp, reqTime, respTime)
		if e == nil {
			e = &entry{kind: kindResponse, status: resp.StatusCode, header: cleanHeader(resp.Header, nil)}
		}
		e.body, _ = io.ReadAll(io.LimitReader(resp.Body, c.o.MaxBodyBytes))
		resp.Body.Close()
		return result{err: &originError{err: errors.New(resp.Status), resp: e}}
	}
	e, reason := c.describe(f, resp, reqTime, respTime)
	if e != nil && headerBytes(resp.Header) > c.o.MaxHeaderBytes {
		e, reason = nil, "header-too-large"
	}
	if e == nil {
		return f.passOn(resp, reason, respTime)
	}
	return f.receive(e, resp, respTime)
}

// passOn ends a fetch whose response may not be stored: the key is
// marked hit-for-pass (unless only the request's Authorization kept the
// response from being stored), and the response goes to the request it was made
// for (when it still waits) or is dropped.
func (f *fetch) passOn(resp *http.Response, reason string, now int64) result {
	ttl := f.c.o.PassTTL
	if resp.StatusCode >= 500 {
		ttl = min(ttl, errorPassTTL)
	}
	if f.s != nil {
		// Forgotten first: a request that arrives from now on must not join
		// a stream whose response goes to its leader alone.
		f.c.fl.remove(f.key, f.s)
	}
	if f.s == nil || !f.s.handOff(resp) {
		resp.Body.Close()
	}
	mark := &entry{kind: kindPass, reason: reason, herdSoft: now + int64(ttl), header: http.Header{}}
	if reason == reasonAuthorization {
		// RFC 9111 §3.5 is about the request, not the URL: the requests
		// that waited for this fetch pass, and the key is not marked.
		return result{e: mark}
	}
	return result{e: mark, store: true, soft: ttl, hard: ttl}
}

// receive reads the body of a storable response, streaming it to the
// fetch's readers, and ends the fetch with the entry to store, or with a
// hit-for-pass mark when the body is larger than MaxBodyBytes. A body cut
// short is an error: nothing is stored.
func (f *fetch) receive(e *entry, resp *http.Response, now int64) result {
	c := f.c
	own := *e // the leader's answer: every end-to-end field
	own.header = resp.Header.Clone()
	stripHopByHop(own.header)
	if f.s != nil && !f.s.start(e, &own) {
		f.s = nil
	}
	limit := c.o.MaxBodyBytes
	var body []byte
	var n int64
	buf := make([]byte, 32<<10)
	for {
		m, err := resp.Body.Read(buf)
		if m > 0 {
			n += int64(m)
			switch {
			case f.s != nil:
				f.s.write(buf[:m])
			case n <= limit:
				body = append(body, buf[:m]...)
			}
			if n > limit {
				f.overflow(resp)
				return f.passOn(&http.Response{StatusCode: resp.StatusCode, Body: http.NoBody}, "too-large", now)
			}
		}
		if err == io.EOF {
			break
		}
		if err != nil {
			resp.Body.Close()
			if f.s != nil {
				f.s.end(err)
			}
			return result{err: &originError{err: err}}
		}
	}
	resp.Body.Close()
	if f.s != nil {
		body = f.s.bytes()
		f.received.Store(true)
	}
	e.body = body
	return f.keep(e, now)
}

// overflow hands the rest of a body larger than MaxBodyBytes to the
// stream's readers, in the background, or drops it.
func (f *fetch) overflow(resp *http.Response) {
	if f.s == nil {
		resp.Body.Close()
		return
	}
	s := f.s
	s.setOverflow()
	go func() {
		defer resp.Body.Close()
		buf := make([]byte, 32<<10)
		for {
			m, err := resp.Body.Read(buf)
			if m > 0 && !s.write(buf[:m]) {
				s.end(errors.New("herdhttp: no reader left"))
				return
			}
			if err == io.EOF {
				s.end(nil)
				return
			}
			if err != nil {
				s.end(err)
				return
			}
		}
	}()
}

// keep ends a fetch with e stored for as long as it may be used: its
// remaining freshness, then its stale windows, or as long as
// KeepForRevalidation allows a response with a validator, and at least
// minStored. The cache holds it fresh all that time (its soft and hard
// TTLs are one): whether it may answer a request is decided by the
// request, through Peek and Accept. A response fetched through a Vary index
// that no longer matches the URL's index, or one fetched under the URL's
// key that varies, is stored under its variant key and the index
// updated.
func (f *fetch) keep(e *entry, now int64) result {
	remaining := max(e.ttl(now), 0)
	if e.flags&flagNoCache != 0 {
		remaining = 0
	}
	stale := max(e.swr, e.sie)
	if e.flags&flagMustRevalidate != 0 {
		stale = 0
	}
	// herd refuses TTLs above MaxTTL; two delta-seconds of 2^31 add up to more.
	hard := min(max(remaining+max(stale, e.keep), minStored), herd.MaxTTL)
	soft := hard
	e.herdSoft = now + int64(soft)
	res := result{e: e, store: true, soft: soft, hard: hard}
	if slices.Equal(e.varyNames, f.names) && (f.key != f.primary || len(e.varyNames) == 0) {
		return res // stored under the key it was fetched for
	}
	c := f.c
	ctx := context.WithoutCancel(f.ctx)
	if len(e.varyNames) == 0 {
		if !c.setUntagged(ctx, f.primary, e, soft, hard) {
			_ = c.hc.Invalidate(ctx, f.primary) // the old index: the next request loads the URL
		}
		return result{e: e}
	}
	vk := c.variantKey(f.primary, e.varyValues)
	if vk != f.key {
		c.setUntagged(ctx, vk, e, soft, hard) // a tagged one is loaded under vk by its next request
	}
	index := &entry{kind: kindIndex, varyNames: e.varyNames, header: http.Header{}, herdSoft: now + int64(indexTTL)}
	if f.key == f.primary {
		return result{e: index, store: true, soft: indexTTL, hard: indexTTL}
	}
	_ = c.hc.SetWithTTL(ctx, f.primary, index, indexTTL, indexTTL)
	if vk == f.key {
		return res
	}
	return result{e: e}
}

// cancelBody ends a fetch's request context when its body is closed.
type cancelBody struct {
	io.ReadCloser
	cancel context.CancelFunc
}

func (b *cancelBody) Close() error {
	err := b.ReadCloser.Close()
	b.cancel()
	return err
}

// headerBytes is the size of h as sent: each value on its own line, with
// its name, ": " and CRLF.
func headerBytes(h http.Header) int64 {
	var n int64
	for k, vs := range h {
		for _, v := range vs {
			n += int64(len(k) + len(v) + 4)
		}
	}
	return n
}
