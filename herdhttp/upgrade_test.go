package herdhttp_test

import (
	"bufio"
	"context"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/herdcache/herd/herdhttp"
)

// An upgrade request (Connection: Upgrade) passes through the proxy to a
// real origin on loopback, which switches protocols with 101 and echoes
// bytes: the client talks to it over the proxy's connection, both ways,
// and a second upgrade reaches the origin too (nothing is cached).
func TestUpgradePassesThrough(t *testing.T) {
	var upgrades atomic.Int32
	origin := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !strings.EqualFold(r.Header.Get("Upgrade"), "echo") {
			w.Header().Set("Cache-Control", "max-age=60")
			io.WriteString(w, "not upgraded")
			return
		}
		upgrades.Add(1)
		conn, rw, err := http.NewResponseController(w).Hijack()
		if err != nil {
			t.Errorf("hijack: %v", err)
			return
		}
		defer conn.Close()
		rw.WriteString("HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: echo\r\n\r\n")
		rw.Flush()
		io.Copy(conn, rw) // echo until the client closes
	}))
	defer origin.Close()
	up, _ := url.Parse(origin.URL)
	h, err := herdhttp.NewProxy(up, nil)
	if err != nil {
		t.Fatal(err)
	}
	proxy := httptest.NewServer(h)
	defer proxy.Close()
	defer h.Close(context.Background())

	for i := range 2 {
		conn, err := net.Dial("tcp", proxy.Listener.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		conn.SetDeadline(time.Now().Add(time.Minute)) // a bound on a broken proxy, not a timing
		io.WriteString(conn, "GET /ws HTTP/1.1\r\nHost: www.example\r\nConnection: Upgrade\r\nUpgrade: echo\r\n\r\n")
		br := bufio.NewReader(conn)
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			t.Fatalf("upgrade %d: %v", i, err)
		}
		if resp.StatusCode != http.StatusSwitchingProtocols || !strings.EqualFold(resp.Header.Get("Upgrade"), "echo") {
			t.Fatalf("upgrade %d: %d, Upgrade %q; want 101, echo", i, resp.StatusCode, resp.Header.Get("Upgrade"))
		}
		for _, msg := range []string{"ping", "and a longer message"} {
			if _, err := io.WriteString(conn, msg); err != nil {
				t.Fatal(err)
			}
			got := make([]byte, len(msg))
			if _, err := io.ReadFull(br, got); err != nil || string(got) != msg {
				t.Fatalf("upgrade %d: echo of %q = %q, %v", i, msg, got, err)
			}
		}
		conn.Close()
	}
	if n := upgrades.Load(); n != 2 {
		t.Errorf("the origin switched protocols %d times; want 2", n)
	}

	// A plain request for the same URL is cached as usual.
	for range 2 {
		resp, err := proxy.Client().Get(proxy.URL + "/ws")
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if string(body) != "not upgraded" {
			t.Errorf("a plain request: %q", body)
		}
	}
}
