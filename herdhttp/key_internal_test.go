package herdhttp

import (
	"net/http"
	"net/http/httptest"
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
