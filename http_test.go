package herd_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"testing"
	"testing/synctest"
	"time"

	"github.com/herdcache/herd"
	"github.com/herdcache/herd/limiter"
)

// spyWriter records whether a handler wrote a status or a body.
type spyWriter struct {
	*httptest.ResponseRecorder
	wroteHeader, wroteBody bool
}

func (s *spyWriter) WriteHeader(code int) {
	s.wroteHeader = true
	s.ResponseRecorder.WriteHeader(code)
}

func (s *spyWriter) Write(b []byte) (int, error) {
	s.wroteBody = true
	return s.ResponseRecorder.Write(b)
}

func TestWriteOverloaded(t *testing.T) {
	overload := func(d time.Duration) error {
		return &limiter.OverloadError{Reason: limiter.ReasonQueueTimeout, RetryAfter: d}
	}
	tests := []struct {
		name  string
		err   error
		retry string
	}{
		{"OverloadError", overload(time.Second), "1"},
		{"wrapped", fmt.Errorf("get user 7: %w", overload(3*time.Second)), "3"},
		{"wrapped twice", fmt.Errorf("handler: %w", fmt.Errorf("get: %w", overload(1500*time.Millisecond))), "2"},
		{"rounds up a nanosecond", overload(2*time.Second + time.Nanosecond), "3"},
		{"under a second", overload(250 * time.Millisecond), "1"},
		{"no hint", overload(0), "1"},
		{"negative hint", overload(-time.Second), "1"},
		{"bare sentinel", fmt.Errorf("get: %w", herd.ErrOverloaded), "1"},
		{"joined", errors.Join(errors.New("other"), overload(4*time.Second)), "4"},
		{"background", &limiter.OverloadError{Reason: limiter.ReasonReserve, Background: true, RetryAfter: 10 * time.Second}, "10"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			rec := httptest.NewRecorder()
			if !herd.WriteOverloaded(rec, tt.err) {
				t.Fatalf("WriteOverloaded(%v) = false, want true", tt.err)
			}
			res := rec.Result()
			if res.StatusCode != http.StatusServiceUnavailable {
				t.Errorf("status = %d, want 503", res.StatusCode)
			}
			if got := res.Header.Get("Retry-After"); got != tt.retry {
				t.Errorf("Retry-After = %q, want %q", got, tt.retry)
			}
			if got, want := rec.Body.String(), "Service Unavailable\n"; got != want {
				t.Errorf("body = %q, want %q", got, want)
			}
		})
	}
}

func TestWriteOverloadedIgnoresOtherErrors(t *testing.T) {
	for _, err := range []error{
		nil,
		errors.New("limiter: overloaded"), // same text, different error
		context.Canceled,
		fmt.Errorf("limiter: waiting for a slot: %w", context.DeadlineExceeded),
		herd.ErrNotFound,
		fmt.Errorf("get: %w", herd.ErrLeaseHeld),
	} {
		w := &spyWriter{ResponseRecorder: httptest.NewRecorder()}
		if herd.WriteOverloaded(w, err) {
			t.Errorf("WriteOverloaded(%v) = true, want false", err)
		}
		if w.wroteHeader || w.wroteBody || len(w.Header()) != 0 {
			t.Errorf("WriteOverloaded(%v) wrote: header %v, body %q", err, w.Header(), w.Body.String())
		}
	}
}

// TestWriteOverloadedFromLimiter takes the error from a call a real limiter
// shed.
func TestWriteOverloadedFromLimiter(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		l, err := limiter.New(limiter.Options{Limit: 1, QueueTimeout: 1200 * time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		if err := l.Acquire(context.Background()); err != nil {
			t.Fatal(err)
		}
		defer l.Release()
		shed := l.Acquire(context.Background()) // waits 1.2s, then is shed
		rec := httptest.NewRecorder()
		if !herd.WriteOverloaded(rec, fmt.Errorf("load: %w", shed)) {
			t.Fatalf("WriteOverloaded(%v) = false", shed)
		}
		if rec.Code != http.StatusServiceUnavailable || rec.Header().Get("Retry-After") != "2" {
			t.Errorf("got %d, Retry-After %q; want 503, \"2\"", rec.Code, rec.Header().Get("Retry-After"))
		}
	})
}
