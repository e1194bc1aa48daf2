package herdhttp_test

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"net/http/httptrace"
	"net/textproto"
	"net/url"
	"strings"
	"testing"

	"github.com/herdcache/herd/herdhttp"
)

// earlyHints answers with a 103 carrying a Link, then a 200 that may be
// stored and does not carry it.
func earlyHints(w http.ResponseWriter, _ *http.Request) {
	w.Header().Set("Link", "</style.css>; rel=preload; as=style")
	w.WriteHeader(http.StatusEarlyHints)
	w.Header().Del("Link")
	w.Header().Set("Cache-Control", "max-age=60")
	io.WriteString(w, "v")
}

// interimGet gets u, and returns the informational responses received
// before the final one, by status, with their Link fields, and the final
// response's Link and Cache-Status.
func interimGet(t *testing.T, u string) (interim []string, link, status string) {
	t.Helper()
	trace := &httptrace.ClientTrace{Got1xxResponse: func(code int, h textproto.MIMEHeader) error {
		interim = append(interim, http.StatusText(code)+": "+h.Get("Link"))
		return nil
	}}
	req, err := http.NewRequestWithContext(httptrace.WithClientTrace(context.Background(), trace), http.MethodGet, u, nil)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if b, _ := io.ReadAll(resp.Body); resp.StatusCode != 200 || string(b) != "v" {
		t.Fatalf("GET %s = %d %q", u, resp.StatusCode, b)
	}
	return interim, resp.Header.Get("Link"), resp.Header.Get("Cache-Status")
}

// The 103 Early Hints of an origin reach the client that made the fetch,
// before the answer, and only it: the answer does not carry its fields,
// and a hit is sent none. As a proxy and as middleware, on loopback.
func TestEarlyHintsForwarded(t *testing.T) {
	for _, form := range []string{"proxy", "middleware"} {
		t.Run(form, func(t *testing.T) {
			var h *herdhttp.Handler
			var err error
			if form == "proxy" {
				origin := httptest.NewServer(http.HandlerFunc(earlyHints))
				defer origin.Close()
				up, _ := url.Parse(origin.URL)
				h, err = herdhttp.NewProxy(up, nil)
			} else {
				h, err = herdhttp.Middleware(http.HandlerFunc(earlyHints), nil)
			}
			if err != nil {
				t.Fatal(err)
			}
			defer h.Close(context.Background())
			front := httptest.NewServer(h)
			defer front.Close()

			interim, link, _ := interimGet(t, front.URL+"/a")
			if len(interim) != 1 || interim[0] != "Early Hints: </style.css>; rel=preload; as=style" {
				t.Errorf("the miss was preceded by %q; want one 103 with its Link", interim)
			}
			if link != "" {
				t.Errorf("the miss's answer carries the 103's Link %q", link)
			}
			interim, link, status := interimGet(t, front.URL+"/a")
			if len(interim) != 0 || link != "" || !strings.HasPrefix(status, "herd; hit") {
				t.Errorf("the second request got informational responses %q, Link %q, Cache-Status %q; want none, none, a hit", interim, link, status)
			}
		})
	}
}
