package herdhttp

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httputil"
	"net/url"
	"strings"
	"sync"
	"time"
)

// Handler is an http.Handler that answers from the cache: the
// middleware that [Middleware] puts in front of a handler, or the
// reverse proxy of [NewProxy].
type Handler struct {
	e *engine
	// upgrade answers the requests that ask to switch protocols
	// (Connection: Upgrade, such as WebSocket): next for a Middleware, a
	// ReverseProxy to the upstream for a proxy. They never reach the cache.
	upgrade http.Handler
}

// Middleware returns a Handler that answers requests from the cache and
// passes what it cannot answer to next. The requests next is given to
// fill the cache carry only the forwarded fields (see
// Options.ForwardHeaders and ForwardAllFields); next must not keep the
// request's Body or the ResponseWriter past its return. A 1xx status it
// writes before its answer reaches the client that made the fetch.
// Invalid options give an error starting with "herdhttp: ".
func Middleware(next http.Handler, o *Options) (*Handler, error) {
	if next == nil {
		return nil, errors.New("herdhttp: Middleware needs a handler")
	}
	e, err := newEngine(handlerOrigin{next}, o, true)
	if err != nil {
		return nil, err
	}
	return &Handler{e: e, upgrade: next}, nil
}

// NewProxy returns a Handler that is a caching reverse proxy to
// upstream: each request is sent to upstream's scheme and host, its path
// appended to upstream's, with Host set to upstream's host and
// X-Forwarded-Proto and X-Forwarded-Host set (X-Forwarded-For too, on the
// requests passed uncached), over a transport of its own. Invalid options
// give an error starting with "herdhttp: ".
func NewProxy(upstream *url.URL, o *Options) (*Handler, error) {
	if upstream == nil || upstream.Scheme == "" || upstream.Host == "" {
		return nil, fmt.Errorf("herdhttp: NewProxy needs an absolute upstream URL, got %v", upstream)
	}
	t := http.DefaultTransport.(*http.Transport).Clone()
	t.MaxIdleConnsPerHost = 256
	t.MaxIdleConns = 1024
	return newProxy(upstream, t, o)
}

// newProxy is NewProxy over the transport rt.
func newProxy(upstream *url.URL, rt http.RoundTripper, o *Options) (*Handler, error) {
	e, err := newEngine(&proxyOrigin{up: upstream, rt: rt}, o, true)
	if err != nil {
		return nil, err
	}
	upgrade := &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.SetURL(upstream)
			pr.SetXForwarded()
		},
		Transport: rt,
	}
	return &Handler{e: e, upgrade: upgrade}, nil
}

// ServeHTTP answers r from the cache, or from the origin through it. An
// error the cache cannot answer otherwise is a 502; a client that went
// away gets nothing. The informational (1xx) responses the origin sends
// before the answer to the request's own fetch, such as 103 Early Hints,
// are forwarded to the client; they are never stored. A request that
// asks to switch protocols (Connection: Upgrade, such as a WebSocket
// handshake) passes to the origin untouched, and the connection with it
// once it answers 101.
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if isUpgrade(r.Header) {
		h.upgrade.ServeHTTP(w, r)
		return
	}
	done, p := h.e.serveHit(w, r)
	if done {
		return
	}
	in := newInterim(w, r)
	resp, err := h.e.serve(r, in, p)
	in.stop()
	if err != nil {
		if r.Context().Err() != nil {
			return // the client is gone
		}
		http.Error(w, http.StatusText(http.StatusBadGateway), http.StatusBadGateway)
		return
	}
	writeResponse(w, resp)
}

// Close stops the cache's background work and waits for it until ctx
// ends.
func (h *Handler) Close(ctx context.Context) error { return h.e.close(ctx) }

// writeResponse copies resp to w, flushing as a streamed body arrives. A
// body that fails midway aborts the connection, so that the client sees
// a truncated transfer rather than a short response.
func writeResponse(w http.ResponseWriter, resp *http.Response) {
	defer resp.Body.Close()
	wh := w.Header()
	for k, vs := range resp.Header {
		wh[k] = vs
	}
	stripHopByHop(wh)
	w.WriteHeader(resp.StatusCode)
	if resp.Body == http.NoBody {
		return
	}
	if _, ok := resp.Body.(*streamBody); !ok {
		if _, err := io.Copy(w, resp.Body); err != nil {
			panic(http.ErrAbortHandler)
		}
		return
	}
	rc := http.NewResponseController(w)
	buf := make([]byte, 32<<10)
	for {
		n, err := resp.Body.Read(buf)
		if n > 0 {
			if _, werr := w.Write(buf[:n]); werr != nil {
				return
			}
			_ = rc.Flush()
		}
		if err == io.EOF {
			return
		}
		if err != nil {
			panic(http.ErrAbortHandler)
		}
	}
}

// Transport is an http.RoundTripper that answers from the cache and
// sends what it cannot answer through the RoundTripper it wraps: for
// clients, and for reverse proxies such as httputil.ReverseProxy.
type Transport struct {
	e *engine
}

// NewTransport returns a Transport over next; nil means
// http.DefaultTransport. Requests should be absolute (a client's are):
// the key holds their URL's scheme and host. Invalid options give an
// error starting with "herdhttp: ".
func NewTransport(next http.RoundTripper, o *Options) (*Transport, error) {
	if next == nil {
		next = http.DefaultTransport
	}
	e, err := newEngine(next, o, false)
	if err != nil {
		return nil, err
	}
	return &Transport{e: e}, nil
}

// RoundTrip answers r from the cache or through the wrapped
// RoundTripper. A failure to reach the origin that no stale response
// covers is returned as the wrapped RoundTripper's error.
//
// A request that asks to switch protocols (Connection: Upgrade) goes to
// the wrapped RoundTripper untouched.
func (t *Transport) RoundTrip(r *http.Request) (*http.Response, error) {
	if isUpgrade(r.Header) {
		return t.e.origin.RoundTrip(r)
	}
	resp, err := t.e.serve(r, nil, peeked{})
	if err == nil {
		resp.Header = resp.Header.Clone() // the caller's to change; the stored fields are shared
	}
	return resp, err
}

// Close stops the cache's background work and waits for it until ctx
// ends.
func (t *Transport) Close(ctx context.Context) error { return t.e.close(ctx) }

// proxyOrigin sends requests to one upstream.
type proxyOrigin struct {
	up *url.URL
	rt http.RoundTripper
}

func (p *proxyOrigin) RoundTrip(r *http.Request) (*http.Response, error) {
	pr := &httputil.ProxyRequest{In: r, Out: r.Clone(r.Context())}
	pr.Out.RequestURI = ""
	pr.SetURL(p.up)
	pr.SetXForwarded()
	if r.Context().Value(fillKey{}) != nil {
		// a fill, whose answer may be stored for every client: the
		// client's address stays here
		pr.Out.Header.Del("X-Forwarded-For")
	}
	return p.rt.RoundTrip(pr.Out)
}

// handlerOrigin makes a handler the origin: each request runs it on a
// goroutine of its own, and its response is returned as soon as the
// handler writes the status, its body streamed as it writes it.
type handlerOrigin struct{ next http.Handler }

func (o handlerOrigin) RoundTrip(r *http.Request) (*http.Response, error) {
	pr, pw := io.Pipe()
	w := &pipeWriter{h: http.Header{}, pw: pw, head: make(chan struct{}), req: r}
	r = r.Clone(r.Context())
	if r.RequestURI == "" {
		r.RequestURI = r.URL.RequestURI()
	}
	go func() {
		defer func() {
			if p := recover(); p != nil {
				w.fail(fmt.Errorf("herdhttp: handler panicked: %v", p))
				return
			}
			w.finish()
		}()
		o.next.ServeHTTP(w, r)
	}()
	select {
	case <-w.head:
	case <-r.Context().Done():
		pr.CloseWithError(r.Context().Err())
		return nil, r.Context().Err()
	}
	if w.err != nil {
		return nil, w.err
	}
	resp := &http.Response{
		StatusCode: w.code, Status: statusText(w.code), Proto: "HTTP/1.1", ProtoMajor: 1, ProtoMinor: 1,
		Header: w.sent, Body: pr, ContentLength: -1, Request: r,
	}
	if cl := w.sent.Get("Content-Length"); cl != "" {
		fmt.Sscan(cl, &resp.ContentLength)
	}
	if r.Method == http.MethodHead {
		resp.Body = http.NoBody
		pr.Close()
	}
	return resp, nil
}

// pipeWriter is the ResponseWriter of a handler run as the origin.
type pipeWriter struct {
	h    http.Header
	pw   *io.PipeWriter
	req  *http.Request
	once sync.Once
	head chan struct{} // closed once code and sent are set
	code int
	sent http.Header
	err  error
}

func (w *pipeWriter) Header() http.Header { return w.h }

func (w *pipeWriter) WriteHeader(code int) {
	if code < 200 && code != http.StatusSwitchingProtocols {
		sendInterim(w.req.Context(), code, w.h)
		return
	}
	w.once.Do(func() {
		w.code, w.sent = code, w.h.Clone()
		if w.sent.Get("Date") == "" {
			w.sent.Set("Date", time.Now().UTC().Format(http.TimeFormat))
		}
		close(w.head)
	})
}

func (w *pipeWriter) Write(p []byte) (int, error) {
	w.WriteHeader(http.StatusOK)
	return w.pw.Write(p)
}

func (w *pipeWriter) Flush() {}

func (w *pipeWriter) finish() {
	w.WriteHeader(http.StatusOK)
	w.pw.Close()
}

func (w *pipeWriter) fail(err error) {
	w.once.Do(func() {
		w.err = err
		close(w.head)
	})
	w.pw.CloseWithError(err)
}

// isUpgrade reports whether a request with fields h asks to switch
// protocols (RFC 9110 §7.8): Connection lists upgrade and Upgrade names
// a protocol.
func isUpgrade(h http.Header) bool {
	if h.Get("Upgrade") == "" {
		return false
	}
	for _, v := range h.Values("Connection") {
		for tok := range strings.SplitSeq(v, ",") {
			if strings.EqualFold(strings.TrimSpace(tok), "upgrade") {
				return true
			}
		}
	}
	return false
}
