package herdhttp

import (
	"context"
	"errors"
	"net/http"
	"time"
)

// OriginRecorder is an optional interface of an [Options.Recorder] that
// times the requests herdhttp sends to the origin, by route (as
// [RouteRecorder] names them): d runs from the request's start to the
// arrival of the response's fields, status is the response's status, or
// 0 when none came (the error went to Options.OnOriginError). It is
// called once per origin request, fetch, revalidation or pass alike; it
// must be cheap.
type OriginRecorder interface {
	RecordOrigin(route string, status int, d time.Duration)
}

// watchedOrigin is the origin of an engine with an OriginRecorder or an
// OnOriginError hook: it reports each request to them.
type watchedOrigin struct {
	next    http.RoundTripper
	c       *engine
	rec     OriginRecorder // nil: none
	onError func(*http.Request, error)
}

// watch returns origin, reporting to o's OriginRecorder and OnOriginError
// when it has either.
func (c *engine) watch(origin http.RoundTripper) http.RoundTripper {
	rec, _ := c.o.Recorder.(OriginRecorder)
	if rec == nil && c.o.OnOriginError == nil {
		return origin
	}
	return &watchedOrigin{next: origin, c: c, rec: rec, onError: c.o.OnOriginError}
}

func (w *watchedOrigin) RoundTrip(r *http.Request) (*http.Response, error) {
	start := time.Now()
	resp, err := w.next.RoundTrip(r)
	if w.rec != nil {
		status := 0
		if err == nil {
			status = resp.StatusCode
		}
		w.rec.RecordOrigin(w.c.route(r), status, time.Since(start))
	}
	if err != nil && w.onError != nil && !canceled(r, err) {
		w.onError(r, err)
	}
	return resp, err
}

// canceled reports whether err only says that r's context was canceled:
// the client went away, which is no fault of the origin's.
func canceled(r *http.Request, err error) bool {
	return errors.Is(err, context.Canceled) && errors.Is(r.Context().Err(), context.Canceled)
}
