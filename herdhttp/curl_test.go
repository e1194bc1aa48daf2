package herdhttp_test

import (
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os/exec"
	"strings"
	"testing"

	"github.com/herdcache/herd/herdhttp"
)

// On the wire, as curl sees it: a hit carries Age and Cache-Status, and
// no hop-by-hop field of the origin's.
func TestCurlWire(t *testing.T) {
	curl, err := exec.LookPath("curl")
	if err != nil {
		t.Skip("curl is not installed")
	}
	origin := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Cache-Control", "max-age=60")
		w.Header().Set("Connection", "X-Hop")
		w.Header().Set("X-Hop", "1")
		w.Header().Set("X-End", "2")
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
	var out []byte
	for range 2 {
		if out, err = exec.CommandContext(t.Context(), curl, "-sS", "-i", front.URL+"/a").CombinedOutput(); err != nil {
			t.Fatalf("curl: %v\n%s", err, out)
		}
	}
	head, body, _ := strings.Cut(strings.ReplaceAll(string(out), "\r\n", "\n"), "\n\n")
	lower := strings.ToLower(head)
	for _, want := range []string{"http/1.1 200", "\ncache-status: herd; hit; ttl=", "\nage: ", "\nx-end: 2", "\ncontent-length: 4"} {
		if !strings.Contains(lower, want) {
			t.Errorf("the hit's head lacks %q:\n%s", want, head)
		}
	}
	if strings.Contains(lower, "x-hop") {
		t.Errorf("the hit carries a hop-by-hop field:\n%s", head)
	}
	if body != "body" {
		t.Errorf("body %q", body)
	}
}
