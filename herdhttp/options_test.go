package herdhttp_test

import (
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/herdcache/herd"
	"github.com/herdcache/herd/herdhttp"
	"github.com/herdcache/herd/memory"
)

// Bad options are an error from every constructor, prefixed "herdhttp: ".
func TestOptionsErrors(t *testing.T) {
	up, _ := url.Parse("http://127.0.0.1:1")
	for _, o := range []herdhttp.Options{
		{MaxBytes: -1},
		{MaxBodyBytes: -1},
		{MaxBodyBytes: 2 << 30},
		{MaxVariants: -1},
		{Heuristic: 1.5},
		{Heuristic: -0.1},
		{PassTTL: -time.Second},
		{LeaseTTL: herd.MaxTTL + 1},
		{Lease: memory.New()},
		{KeyHeaders: []string{""}},
		{TargetedFields: []string{""}},
		{Routes: []string{"GET /a/{x"}},
		{Routes: []string{"/a", "/a"}},
	} {
		_, err1 := herdhttp.Middleware(http.NotFoundHandler(), &o)
		_, err2 := herdhttp.NewTransport(nil, &o)
		_, err3 := herdhttp.NewProxy(up, &o)
		for _, err := range []error{err1, err2, err3} {
			if err == nil || !strings.HasPrefix(err.Error(), "herdhttp: ") {
				t.Errorf("options %+v: error %v; want one starting with \"herdhttp: \"", o, err)
			}
		}
	}
	if _, err := herdhttp.NewProxy(&url.URL{Path: "/x"}, nil); err == nil || !strings.HasPrefix(err.Error(), "herdhttp: ") {
		t.Errorf("NewProxy of a relative URL: %v", err)
	}
	if _, err := herdhttp.Middleware(nil, nil); err == nil || !strings.HasPrefix(err.Error(), "herdhttp: ") {
		t.Errorf("Middleware(nil): %v", err)
	}
	h, err := herdhttp.Middleware(http.NotFoundHandler(), nil)
	if err != nil {
		t.Fatalf("nil options: %v", err)
	}
	h.Close(t.Context())
}
