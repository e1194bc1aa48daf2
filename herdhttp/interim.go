package herdhttp

import (
	"context"
	"net/http"
	"net/http/httptrace"
	"net/textproto"
	"sync"
)

// interim forwards the informational (1xx) responses the origin sends
// before its final answer to a request's client (RFC 9110 §15.2), such
// as 103 Early Hints. They are never stored: a client served from the
// cache gets none.
type interim struct {
	mu   sync.Mutex
	w    http.ResponseWriter
	done bool // the final response is being written; guarded by mu
}

// newInterim returns the forwarder of the 1xx responses of the origin
// requests made for r to w, until its stop is called: the handler calls
// it before it writes the final response, so that a fetch that outlives
// the request (one whose client left) never writes to w. A client of
// HTTP/1.0 is sent none (nil). Its client trace is put only in the
// contexts of the origin requests made for r (trace), so that a hit
// costs nothing of it.
func newInterim(w http.ResponseWriter, r *http.Request) *interim {
	if !r.ProtoAtLeast(1, 1) {
		return nil
	}
	return &interim{w: w}
}

// trace returns ctx with the client trace that forwards 1xx responses
// through in; ctx itself when in is nil.
func (in *interim) trace(ctx context.Context) context.Context {
	if in == nil {
		return ctx
	}
	return httptrace.WithClientTrace(ctx, &httptrace.ClientTrace{Got1xxResponse: in.forward})
}

// forward sends one 1xx response to the client, unless it is 100
// Continue (which answers an expectation of the origin request, not of
// the client's) or the final response has begun.
func (in *interim) forward(code int, h textproto.MIMEHeader) error {
	if code == http.StatusContinue || code == http.StatusSwitchingProtocols {
		return nil
	}
	in.mu.Lock()
	defer in.mu.Unlock()
	if in.done {
		return nil
	}
	wh := in.w.Header()
	for k, vs := range h {
		wh[k] = vs
	}
	stripHopByHop(wh)
	in.w.WriteHeader(code)
	clear(wh) // net/http sends the header map with a 1xx and keeps it
	return nil
}

func (in *interim) stop() {
	if in == nil {
		return
	}
	in.mu.Lock()
	in.done = true
	in.mu.Unlock()
}

// sendInterim passes a 1xx response that a handler run as the origin
// wrote to the client trace of its request's context, as a Transport
// reports the 1xx responses it reads.
func sendInterim(ctx context.Context, code int, h http.Header) {
	if t := httptrace.ContextClientTrace(ctx); t != nil && t.Got1xxResponse != nil {
		_ = t.Got1xxResponse(code, textproto.MIMEHeader(h.Clone()))
	}
}
