package herdhttp

import (
	"hash/fnv"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"

	"github.com/herdcache/herd"
)

// The key built in a buffer is herd.Key of the key's parts, for requests
// whose host, path, query and key fields hold the bytes herd.Key
// escapes, upper case, several lines and none.
func TestPrimaryKeyIsHerdKey(t *testing.T) {
	for _, norm := range []bool{false, true} {
		o := DefaultOptions()
		o.KeyHeaders = []string{"x-tenant", "X-Other"}
		o.NormalizeQuery = norm
		c, err := newEngine(http.DefaultTransport, o, true)
		if err != nil {
			t.Fatal(err)
		}
		for _, target := range []string{
			"http://www.example/page",
			"http://WWW.Example:8080/a%7Cb/c%5Cd?b=2&a=%7C1",
			"https://host/p|q\\r?x=|&y=\\",
			"http://host/empty?",
			"http://host/" + strings.Repeat("long/", 80) + "?q=" + strings.Repeat("v", 300),
			"/relative?z=1&a=2",
		} {
			for _, fields := range []http.Header{
				nil,
				{"X-Tenant": {"a|b"}},
				{"X-Tenant": {"one", "two\\"}, "X-Other": {""}},
			} {
				r := httptest.NewRequest(http.MethodGet, target, nil)
				if strings.HasPrefix(target, "/") {
					r.Host = "Front|Host"
				}
				for k, vs := range fields {
					r.Header[k] = vs
				}
				host := r.Host
				if host == "" {
					host = r.URL.Host
				}
				parts := []string{c.scheme(r), strings.ToLower(host), r.URL.EscapedPath(), c.query(r.URL)}
				for _, h := range c.keyHeaders {
					parts = append(parts, strings.Join(r.Header.Values(h), "\n"))
				}
				if got, want := c.primaryKey(r), herd.Key("http", parts...); got != want {
					t.Errorf("normalize=%v %s %v: key %q, want %q", norm, target, fields, got, want)
				}
			}
		}
		c.close(t.Context())
	}
}

// The variant key built in a buffer is herd.Key of "vary", the primary
// key and the bucket that the FNV-1a hash of the values gives.
func TestVariantKeyIsHerdKey(t *testing.T) {
	o := DefaultOptions()
	o.MaxVariants = 7
	c, err := newEngine(http.DefaultTransport, o, true)
	if err != nil {
		t.Fatal(err)
	}
	defer c.close(t.Context())
	for _, values := range [][]string{nil, {""}, {"gzip"}, {"br,gzip", "en"}, {"a|b", "c\\d\x00"}} {
		for _, primary := range []string{"http|http|host|/p|", "http|http|h\\|x|/|?a"} {
			h := fnv.New64a()
			for _, v := range values {
				h.Write([]byte(v))
				h.Write([]byte{0})
			}
			want := herd.Key("vary", primary, strconv.FormatUint(h.Sum64()%7, 10))
			if got := c.variantKey(primary, values); got != want {
				t.Errorf("variantKey(%q, %q) = %q, want %q", primary, values, got, want)
			}
		}
	}
}
