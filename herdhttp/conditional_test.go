package herdhttp_test

import (
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"sync/atomic"
	"testing"
	"time"

	"github.com/herdcache/herd/herdhttp"
)

// A client's If-Modified-Since is answered 304 from a stored response
// without Last-Modified when the response's Date is not later (RFC 9111
// §4.3.2), and 200 when it is; neither reaches the origin.
func TestIfModifiedSinceByDate(t *testing.T) {
	date := time.Now().Add(-time.Minute).UTC().Truncate(time.Second)
	var calls atomic.Int64
	origin := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		calls.Add(1)
		w.Header().Set("Cache-Control", "max-age=3600")
		w.Header().Set("Date", date.Format(http.TimeFormat))
		io.WriteString(w, "body")
	}))
	defer origin.Close()
	up, _ := url.Parse(origin.URL)
	h, err := herdhttp.NewProxy(up, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close(t.Context())
	front := httptest.NewServer(h)
	defer front.Close()
	get := func(ims time.Time) (int, string) {
		t.Helper()
		req, _ := http.NewRequestWithContext(t.Context(), http.MethodGet, front.URL+"/a", nil)
		if !ims.IsZero() {
			req.Header.Set("If-Modified-Since", ims.Format(http.TimeFormat))
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	if s, b := get(time.Time{}); s != 200 || b != "body" {
		t.Fatalf("first GET: %d %q; want 200 body", s, b)
	}
	for _, tc := range []struct {
		ims  time.Time
		want int
		body string
	}{
		{date, http.StatusNotModified, ""},
		{date.Add(time.Second), http.StatusNotModified, ""},
		{date.Add(-time.Second), http.StatusOK, "body"},
	} {
		if s, b := get(tc.ims); s != tc.want || b != tc.body {
			t.Errorf("If-Modified-Since Date%+v: %d %q; want %d %q", tc.ims.Sub(date), s, b, tc.want, tc.body)
		}
	}
	if n := calls.Load(); n != 1 {
		t.Errorf("%d origin requests; want 1", n)
	}
}
