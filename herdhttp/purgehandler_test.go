package herdhttp_test

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"net/url"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/herdcache/herd"
	"github.com/herdcache/herd/herdhttp"
	"github.com/herdcache/herd/redisstore"
)

// post sends a POST to u with the bearer token (none when empty) and
// returns its status.
func post(t *testing.T, client *http.Client, method, u, token string) int {
	t.Helper()
	req, err := http.NewRequest(method, u, nil)
	if err != nil {
		t.Fatal(err)
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	return resp.StatusCode
}

// PurgeHandler purges by tag and by URL with the right token only, over
// POST; a PURGE on the public handler goes to the origin and purges
// nothing.
func TestPurgeHandler(t *testing.T) {
	origin, up, stop := newVersioned(map[string]string{"/items": "Surrogate-Key: /items", "/items/1": "Surrogate-Key: /items/1"})
	defer stop()
	h, err := herdhttp.NewProxy(up, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close(context.Background())
	public := httptest.NewServer(h)
	defer public.Close()
	admin := httptest.NewServer(herdhttp.PurgeHandler(h, "s3cret"))
	defer admin.Close()
	get(t, public, "/items")
	get(t, public, "/items/1")

	tagURL := admin.URL + "/purge/tag/" + url.PathEscape("/items")
	for _, c := range []struct {
		method, u, token string
		want             int
	}{
		{"POST", tagURL, "", http.StatusUnauthorized},
		{"POST", tagURL, "wrong", http.StatusForbidden},
		{"GET", tagURL, "s3cret", http.StatusMethodNotAllowed},
		{"POST", admin.URL + "/purge/tag/", "s3cret", http.StatusBadRequest},
		{"POST", admin.URL + "/purge/url?url=/items", "s3cret", http.StatusBadRequest},
		{"PURGE", public.URL + "/items", "s3cret", http.StatusMethodNotAllowed}, // the origin's answer
	} {
		if got := post(t, admin.Client(), c.method, c.u, c.token); got != c.want {
			t.Errorf("%s %s with token %q: %d; want %d", c.method, c.u, c.token, got, c.want)
		}
	}
	if r := get(t, public, "/items"); r.body != "/items v1" {
		t.Fatalf("/items after refused purges: %q; want the stored v1", r.body)
	}
	if got := post(t, admin.Client(), "POST", tagURL, "s3cret"); got != http.StatusOK {
		t.Fatalf("purge of tag /items: %d", got)
	}
	if r := get(t, public, "/items"); r.body != "/items v2" {
		t.Errorf("/items after a purge of its tag: %q; want v2", r.body)
	}
	if r := get(t, public, "/items/1"); r.body != "/items/1 v1" {
		t.Errorf("/items/1 after a purge of tag /items: %q; want the stored v1", r.body)
	}
	purgeURL := admin.URL + "/purge/url?url=" + url.QueryEscape("http://www.example/items/1")
	if got := post(t, admin.Client(), "POST", purgeURL, "s3cret"); got != http.StatusOK {
		t.Fatalf("purge of /items/1: %d", got)
	}
	if r := get(t, public, "/items/1"); r.body != "/items/1 v2" {
		t.Errorf("/items/1 after a purge of its URL: %q; want v2", r.body)
	}
	if n := origin.calls("/items"); n != 2 {
		t.Errorf("/items: %d origin GETs; want 2", n)
	}

	empty := httptest.NewServer(herdhttp.PurgeHandler(h, ""))
	defer empty.Close()
	for _, token := range []string{"", "x"} {
		if got := post(t, empty.Client(), "POST", empty.URL+"/purge/tag/x", token); got == http.StatusOK {
			t.Errorf("PurgeHandler with no token, request with %q: %d; want a refusal", token, got)
		}
	}
}

// Purges when the Store cannot be reached wrap herd.ErrDegraded.
func TestPurgeDegraded(t *testing.T) {
	client := redisstore.NewClient(&redis.UniversalOptions{Addrs: []string{"127.0.0.1:1"}, DialTimeout: 100 * time.Millisecond, MaxRetries: -1})
	defer client.Close()
	remote, err := redisstore.New(redisstore.Options{Client: client})
	if err != nil {
		t.Fatal(err)
	}
	defer remote.Close()
	h, err := herdhttp.NewProxy(&url.URL{Scheme: "http", Host: "127.0.0.1:1"}, &herdhttp.Options{Store: remote})
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close(context.Background())
	if err := h.PurgeTag(t.Context(), "x"); !errors.Is(err, herd.ErrDegraded) {
		t.Errorf("PurgeTag with Redis down: %v; want herd.ErrDegraded", err)
	}
	if err := h.PurgeURL(t.Context(), "http://www.example/x", nil); !errors.Is(err, herd.ErrDegraded) {
		t.Errorf("PurgeURL with Redis down: %v; want herd.ErrDegraded", err)
	}
	srv := httptest.NewServer(herdhttp.PurgeHandler(h, "secret"))
	defer srv.Close()
	for _, p := range []string{"/purge/tag/x", "/purge/url?url=http://www.example/x"} {
		req, _ := http.NewRequest(http.MethodPost, srv.URL+p, nil)
		req.Header.Set("Authorization", "Bearer secret")
		resp, err := srv.Client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusServiceUnavailable || resp.Header.Get("Retry-After") == "" {
			t.Errorf("POST %s with Redis down: %d, Retry-After %q; want 503 with Retry-After", p, resp.StatusCode, resp.Header.Get("Retry-After"))
		}
	}
}
