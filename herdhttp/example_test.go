package herdhttp_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"

	"github.com/herdcache/herd/herdhttp"
)

// The middleware in front of a handler: the second request is a hit.
func ExampleMiddleware() {
	app := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Cache-Control", "max-age=60, stale-while-revalidate=600, stale-if-error=86400")
		io.WriteString(w, "hello")
	})
	h, err := herdhttp.Middleware(app, nil)
	if err != nil {
		panic(err)
	}
	defer h.Close(context.Background())
	srv := httptest.NewServer(h)
	defer srv.Close()
	for range 2 {
		resp, err := http.Get(srv.URL + "/greeting")
		if err != nil {
			panic(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		status := strings.Split(resp.Header.Get("Cache-Status"), "; ")
		fmt.Printf("%s: %s\n", body, status[1]) // after the cache's name; ttl and the rest follow
	}
	// Output:
	// hello: fwd=uri-miss
	// hello: hit
}
