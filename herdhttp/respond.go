package herdhttp

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/herdcache/herd"
)

// respond builds the response to q from e: its stored fields with Age
// (RFC 9111 §4.2.3) and Cache-Status (RFC 9211) added, and its body, or
// body when given (a stream). A GET that carries conditions e meets is
// answered 304; one with a single satisfiable byte range, 206; a HEAD
// gets no body.
func (c *engine) respond(q *request, e *entry, body io.ReadCloser, now int64, status string) *http.Response {
	h := make(http.Header, len(e.header)+3)
	for k, vs := range e.header {
		h[k] = vs
	}
	h["Age"] = []string{strconv.FormatInt(max(seconds(e.currentAge(now)), 0), 10)}
	addStatus(h, c.o.Name, status)
	resp := &http.Response{
		StatusCode: e.status, Status: statusText(e.status),
		Proto: "HTTP/1.1", ProtoMajor: 1, ProtoMinor: 1,
		Header: h, Request: q.r, ContentLength: -1,
	}
	if body == nil {
		h["Content-Length"] = []string{strconv.Itoa(len(e.body))}
		resp.ContentLength = int64(len(e.body))
	} else if cl, err := strconv.ParseInt(h.Get("Content-Length"), 10, 64); err == nil {
		resp.ContentLength = cl
	}
	if e.status == http.StatusOK && notModified(q.r, h) {
		if body != nil {
			body.Close()
		}
		return c.notModified(resp)
	}
	switch {
	case q.r.Method == http.MethodHead:
		if body != nil {
			body.Close()
		}
		resp.Body = http.NoBody
	case body != nil:
		resp.Body = body
	default:
		resp.Body = newStoredBody(e.body)
		if e.status == http.StatusOK && q.r.Header.Get("Range") != "" {
			serveRange(q.r, resp, e.body)
		}
	}
	return resp
}

func statusText(code int) string {
	if code >= 100 && code < 600 && statusTexts[code-100] != "" {
		return statusTexts[code-100]
	}
	return strconv.Itoa(code) + " " + http.StatusText(code)
}

// statusTexts holds the status lines of the codes net/http names, from
// 100: built once, so that a hit does not build its own.
var statusTexts = func() (t [500]string) {
	for code := 100; code < 600; code++ {
		if text := http.StatusText(code); text != "" {
			t[code-100] = strconv.Itoa(code) + " " + text
		}
	}
	return t
}()

// storedBody reads a stored body: a bytes.Reader that closes, in one
// allocation.
type storedBody struct{ bytes.Reader }

func newStoredBody(b []byte) *storedBody {
	sb := &storedBody{}
	sb.Reset(b)
	return sb
}

func (*storedBody) Close() error { return nil }

// addStatus appends this cache's member to h's Cache-Status: the list
// runs from the origin towards the client.
func addStatus(h http.Header, name, params string) {
	v := name + "; " + params
	if old := h["Cache-Status"]; len(old) > 0 {
		h["Cache-Status"] = append(old[:len(old):len(old)], v)
		return
	}
	h["Cache-Status"] = []string{v}
}

// notModified turns resp into a 304 with the fields RFC 9110 §15.4.5
// lists.
func (c *engine) notModified(resp *http.Response) *http.Response {
	h := http.Header{}
	for _, k := range notModifiedFields {
		if vs, ok := resp.Header[k]; ok {
			h[k] = vs
		}
	}
	h["Age"], h["Cache-Status"] = resp.Header["Age"], resp.Header["Cache-Status"]
	resp.StatusCode, resp.Status = http.StatusNotModified, statusText(http.StatusNotModified)
	resp.Header, resp.Body, resp.ContentLength = h, http.NoBody, 0
	return resp
}

// notModifiedFields are the stored fields a 304 carries, besides Age
// and Cache-Status.
var notModifiedFields = []string{"Cache-Control", "Content-Location", "Date", "Etag", "Expires", "Vary", "Last-Modified"}

// serveRange makes resp, a full 200 of body, answer r's Range when it
// asks for one satisfiable byte range (and If-Range, if any, holds): 206
// with that range, or 416 when none is satisfiable. Several ranges, or a
// Range it cannot parse, are answered with the whole body (RFC 9110
// §14.2 lets a server ignore Range).
func serveRange(r *http.Request, resp *http.Response, body []byte) {
	if ir := r.Header.Get("If-Range"); ir != "" {
		// An entity tag must match strongly, a date exactly (RFC 9110
		// §13.1.5); otherwise the whole body is sent.
		etag := resp.Header.Get("ETag")
		if strings.HasPrefix(ir, `"`) || strings.HasPrefix(ir, "W/") {
			if ir != etag || strings.HasPrefix(ir, "W/") {
				return
			}
		} else if ir != resp.Header.Get("Last-Modified") {
			return
		}
	}
	spec, ok := strings.CutPrefix(strings.TrimSpace(r.Header.Get("Range")), "bytes=")
	if !ok || strings.Contains(spec, ",") {
		return
	}
	first, last, ok := strings.Cut(strings.TrimSpace(spec), "-")
	if !ok {
		return
	}
	size := int64(len(body))
	var start, end int64
	if first == "" {
		n, err := strconv.ParseInt(last, 10, 64)
		if err != nil || n < 0 {
			return
		}
		start, end = max(size-n, 0), size-1
		if n == 0 {
			start = size // unsatisfiable
		}
	} else {
		s, err := strconv.ParseInt(first, 10, 64)
		if err != nil || s < 0 {
			return
		}
		start, end = s, size-1
		if last != "" {
			l, err := strconv.ParseInt(last, 10, 64)
			if err != nil || l < s {
				return
			}
			end = min(l, size-1)
		}
	}
	if start >= size {
		resp.StatusCode, resp.Status = http.StatusRequestedRangeNotSatisfiable, statusText(http.StatusRequestedRangeNotSatisfiable)
		resp.Header["Content-Range"] = []string{"bytes */" + strconv.FormatInt(size, 10)}
		resp.Header["Content-Length"] = []string{"0"}
		resp.Body, resp.ContentLength = http.NoBody, 0
		return
	}
	part := body[start : end+1]
	resp.StatusCode, resp.Status = http.StatusPartialContent, statusText(http.StatusPartialContent)
	resp.Header["Content-Range"] = []string{fmt.Sprintf("bytes %d-%d/%d", start, end, size)}
	resp.Header["Content-Length"] = []string{strconv.Itoa(len(part))}
	resp.Body, resp.ContentLength = io.NopCloser(bytes.NewReader(part)), int64(len(part))
}

// pass sends q to the origin as it is, every end-to-end field included,
// and returns the origin's answer uncached.
func (c *engine) pass(q *request, o Outcome, status string) (*http.Response, error) {
	c.rec.RecordRoute(q.route, o)
	out := q.r.Clone(q.in.trace(q.r.Context()))
	stripHopByHop(out.Header)
	resp, err := c.origin.RoundTrip(out)
	if err != nil {
		if !c.errResponses {
			return nil, err
		}
		return c.gatewayError(q, err), nil
	}
	stripHopByHop(resp.Header)
	addStatus(resp.Header, c.o.Name, status)
	return resp, nil
}

// unsafe forwards a request of an unsafe method, and when the origin
// answers it without error (2xx, 3xx) invalidates the stored responses of
// its target URI and of the URIs its Location and Content-Location give,
// when they are on the same host (RFC 9111 §4.4).
func (c *engine) unsafe(q *request) (*http.Response, error) {
	resp, err := c.pass(q, OutcomePass, "fwd=method")
	if err != nil || !unsafeMethod(q.r.Method) || resp.StatusCode >= 400 {
		return resp, err
	}
	ctx := context.WithoutCancel(q.r.Context())
	c.invalidate(ctx, q.r, q.r.URL)
	base := *q.r.URL
	if base.Host == "" {
		base.Host, base.Scheme = q.r.Host, c.scheme(q.r)
	}
	for _, f := range []string{"Location", "Content-Location"} {
		v := resp.Header.Get(f)
		if v == "" {
			continue
		}
		u, err := base.Parse(v)
		if err != nil || !strings.EqualFold(u.Host, base.Host) {
			continue
		}
		c.invalidate(ctx, q.r, u)
	}
	return resp, nil
}

func unsafeMethod(m string) bool {
	switch m {
	case http.MethodGet, http.MethodHead, http.MethodOptions, http.MethodTrace:
		return false
	}
	return true
}

// invalidate drops what is stored for u, as r's key fields give it: the
// response or Vary index under its key and every variant bucket.
func (c *engine) invalidate(ctx context.Context, r *http.Request, u *url.URL) {
	g := r.Clone(ctx)
	g.Method = http.MethodGet
	g.URL = &url.URL{Path: u.Path, RawPath: u.RawPath, RawQuery: u.RawQuery, ForceQuery: u.ForceQuery}
	if r.URL.Scheme != "" {
		g.URL.Scheme, g.URL.Host = u.Scheme, u.Host
	}
	if u.Host != "" {
		g.Host = u.Host
	}
	primary := c.primaryKey(g)
	_ = c.hc.Invalidate(ctx, primary)
	for i := range c.o.MaxVariants {
		_ = c.hc.Invalidate(ctx, herd.Key("vary", primary, strconv.Itoa(i)))
	}
}

// gatewayTimeout answers 504: nothing stored may answer q and it may not
// be fetched (only-if-cached, must-revalidate with the origin failing).
func (c *engine) gatewayTimeout(q *request, detail string) (*http.Response, error) {
	c.rec.RecordRoute(q.route, OutcomeMiss)
	return c.synthetic(q, http.StatusGatewayTimeout, "fwd=miss; detail="+detail, nil), nil
}

// gatewayError answers 502: the origin could not be reached.
func (c *engine) gatewayError(q *request, err error) *http.Response {
	return c.synthetic(q, http.StatusBadGateway, "fwd="+or(q.fwd, "bypass")+"; detail=origin-unreachable", nil)
}

func (c *engine) synthetic(q *request, code int, status string, h http.Header) *http.Response {
	if h == nil {
		h = http.Header{}
	}
	body := http.StatusText(code) + "\n"
	h.Set("Content-Type", "text/plain; charset=utf-8")
	h.Set("Content-Length", strconv.Itoa(len(body)))
	h.Set("Date", time.Now().UTC().Format(http.TimeFormat))
	addStatus(h, c.o.Name, status)
	return &http.Response{
		StatusCode: code, Status: statusText(code), Proto: "HTTP/1.1", ProtoMajor: 1, ProtoMinor: 1,
		Header: h, Body: io.NopCloser(strings.NewReader(body)), ContentLength: int64(len(body)), Request: q.r,
	}
}

// overloaded answers 503 with Retry-After: the limiter shed the fetch.
func (c *engine) overloaded(q *request, err error) *http.Response {
	rec := &headerRecorder{h: http.Header{}}
	herd.WriteOverloaded(rec, err)
	return c.synthetic(q, http.StatusServiceUnavailable, "detail=overloaded", http.Header{"Retry-After": rec.h["Retry-After"]})
}

// headerRecorder keeps what herd.WriteOverloaded writes.
type headerRecorder struct{ h http.Header }

func (r *headerRecorder) Header() http.Header         { return r.h }
func (r *headerRecorder) Write(p []byte) (int, error) { return len(p), nil }
func (r *headerRecorder) WriteHeader(int)             {}
