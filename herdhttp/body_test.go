package herdhttp_test

import (
	"bufio"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/herdcache/herd/herdhttp"
)

// A body is streamed to the client that fetched it and to a request
// that joined the fetch, as it arrives: both read the first part while
// the origin still holds the rest.
func TestBodyStreamed(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		rest := make(chan struct{})
		f := newFixture(t, nil, func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Cache-Control", "max-age=60")
			io.WriteString(w, "first\n")
			w.(http.Flusher).Flush()
			<-rest
			io.WriteString(w, "second\n")
		})
		var rds []*bufio.Reader
		for i := range 2 { // the second once the first has read its first line
			resp, err := f.client.Get("http://proxy:80/a")
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			rd := bufio.NewReader(resp.Body)
			if line, _ := rd.ReadString('\n'); line != "first\n" {
				t.Fatalf("request %d: first line %q, read while the origin holds the rest; want %q", i, line, "first\n")
			}
			rds = append(rds, rd)
		}
		f.wantCalls(1, "two requests of one fetch")
		close(rest)
		for i, rd := range rds {
			if b, _ := io.ReadAll(rd); string(b) != "second\n" {
				t.Errorf("request %d: rest %q; want %q", i, b, "second\n")
			}
		}
	})
}

// A body larger than MaxBodyBytes reaches the client whole, and its key
// is passed from then on; one whose Content-Length says so passes at once.
func TestMaxBodyBytes(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		big := strings.Repeat("x", 100)
		f := newFixture(t, &herdhttp.Options{MaxBodyBytes: 64}, func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Cache-Control", "max-age=60")
			if r.URL.Path == "/chunked" {
				w.Write([]byte(big[:50]))
				w.(http.Flusher).Flush()
				w.Write([]byte(big[50:]))
				return
			}
			w.Header().Set("Content-Length", "100")
			w.Write([]byte(big))
		})
		for _, p := range []string{"/chunked", "/length"} {
			f.mustGet(p, 200, big)
			r := f.mustGet(p, 200, big)
			if !strings.Contains(r.cacheStatus(), "hit-for-pass") {
				t.Errorf("%s again: Cache-Status %q; want hit-for-pass", p, r.cacheStatus())
			}
		}
		f.wantCalls(4, "two large bodies twice")
		f.mustGet("/small", 200, big)
		f.wantCalls(5, "")
	})
}

// A body cut short by the origin reaches the client as a failed
// transfer and is never stored.
func TestTruncatedBodyNotStored(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var once sync.Once
		f := newFixture(t, nil, func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Cache-Control", "max-age=60")
			w.Header().Set("Content-Length", "10")
			cut := false
			once.Do(func() { cut = true })
			if cut {
				w.Write([]byte("01234"))
				w.(http.Flusher).Flush()
				panic(http.ErrAbortHandler)
			}
			w.Write([]byte("0123456789"))
		})
		if r := f.get("/a"); r.err == nil {
			t.Errorf("a truncated body was read whole: %d %q", r.status, r.body)
		}
		f.mustGet("/a", 200, "0123456789")
		f.wantCalls(2, "after a truncated body")
		f.mustGet("/a", 200, "0123456789")
		f.wantCalls(2, "after a whole body")
	})
}

// The local tier is bounded in bytes: bodies that fill it evict older
// ones, which are fetched again.
func TestLocalTierBytes(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		body := strings.Repeat("y", 10<<10)
		f := newFixture(t, &herdhttp.Options{MaxBytes: 100 << 10}, static(body, "Cache-Control: max-age=600"))
		for i := range 40 {
			f.mustGet(fmt.Sprintf("/%d", i), 200, body)
		}
		synctest.Wait()
		f.calls.Store(0)
		for i := range 40 {
			f.mustGet(fmt.Sprintf("/%d", i), 200, body)
		}
		if n := f.calls.Load(); n < 30 {
			t.Errorf("%d of 40 bodies of 10 KiB fetched again under a 100 KiB bound; want at least 30", n)
		}
		g := newFixture(t, &herdhttp.Options{MaxBytes: 1 << 20}, static(body, "Cache-Control: max-age=600"))
		for range 2 {
			for i := range 40 {
				g.mustGet(fmt.Sprintf("/%d", i), 200, body)
			}
		}
		g.wantCalls(40, "40 bodies of 10 KiB under 1 MiB")
	})
}

// A field that is not part of the key cannot change a stored response:
// it is not sent on fetches whose response may be stored.
func TestUnkeyedHeaderPoisoning(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newFixture(t, nil, func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Cache-Control", "max-age=60")
			fmt.Fprintf(w, "<a href=%q>", "http://"+r.Header.Get("X-Forwarded-Host-Evil")+r.Header.Get("X-Original-Url"))
		})
		f.mustGet("/a", 200, `<a href="http://">`, "X-Forwarded-Host-Evil: evil.example", "X-Original-Url: /admin")
		f.mustGet("/a", 200, `<a href="http://">`)
		if h := f.lastSeen().Header; h.Get("X-Forwarded-Host-Evil") != "" || h.Get("X-Original-Url") != "" {
			t.Errorf("the fetch carried unkeyed fields: %v", h)
		}
		// Passed requests carry them: their answers are stored nowhere.
		f.do(http.MethodPost, "proxy", "/a", "X-Original-Url: /admin")
		if h := f.lastSeen().Header; h.Get("X-Original-Url") != "/admin" {
			t.Errorf("a passed request lost its fields: %v", h)
		}
	})
}

// The query is keyed as sent, unless NormalizeQuery sorts it.
func TestNormalizeQuery(t *testing.T) {
	for _, norm := range []bool{false, true} {
		synctest.Test(t, func(t *testing.T) {
			f := newFixture(t, &herdhttp.Options{NormalizeQuery: norm}, static("v", "Cache-Control: max-age=60"))
			f.mustGet("/a?x=1&y=2", 200, "v")
			f.mustGet("/a?y=2&x=1", 200, "v")
			f.mustGet("/a?x=1&y=3", 200, "v")
			want := int64(3)
			if norm {
				want = 2
			}
			f.wantCalls(want, fmt.Sprintf("NormalizeQuery %v", norm))
		})
	}
}

// KeyHeaders are part of the key: tenants get their own responses, and
// host and path are keyed too.
func TestKeyHeaders(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newFixture(t, &herdhttp.Options{KeyHeaders: []string{"X-Tenant"}}, func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Cache-Control", "max-age=60")
			fmt.Fprintf(w, "%s %s", r.Header.Get("X-Tenant"), r.URL.Path)
		})
		f.mustGet("/a", 200, "t1 /a", "X-Tenant: t1")
		f.mustGet("/a", 200, "t2 /a", "X-Tenant: t2")
		f.mustGet("/a", 200, " /a")
		f.mustGet("/b", 200, "t1 /b", "X-Tenant: t1")
		f.mustGet("/a", 200, "t1 /a", "X-Tenant: t1")
		f.wantCalls(4, "")
		time.Sleep(time.Second)
	})
}
