package herdhttp_test

import (
	"bufio"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/herdcache/herd/herdhttp"
)

// A hit's bytes on the wire are what the stored response says: its
// status line, every stored field with each of its lines in order, Age
// and Cache-Status (after an upstream cache's member, when the response
// came with one), Content-Length and the body, for a response stored
// under its URL and for one stored as the variant the request's
// Accept-Encoding selects; a request whose If-None-Match or
// If-Modified-Since the stored response meets gets 304 with the fields
// RFC 9110 §15.4.5 lists, one it does not meet the whole response; a
// HEAD gets the same
// fields and no body; the tag fields stay behind. Read off a real
// loopback connection, several requests on one connection, so that the
// values a hit keeps for later hits are checked too.
func TestHitWritten(t *testing.T) {
	body := strings.Repeat("0123456789abcdef", 64) + "end"
	origin := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h := w.Header()
		h.Set("Cache-Control", "max-age=600")
		h.Set("Content-Type", "text/plain; charset=utf-8")
		h.Set("ETag", `"v1"`)
		h.Set("Last-Modified", "Sun, 06 Nov 1994 08:49:37 GMT")
		h["X-Multi"] = []string{"a", "b, c"}
		h.Set("Link", "</style.css>; rel=preload")
		h.Set("Surrogate-Key", "page t1")
		switch r.URL.Path {
		case "/listed":
			h.Set("Cache-Status", "upstream; hit")
		case "/varied":
			h.Set("Vary", "Accept-Encoding")
		}
		io.WriteString(w, body)
	}))
	defer origin.Close()
	up, _ := url.Parse(origin.URL)
	p, err := herdhttp.NewProxy(up, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close(t.Context())
	front := httptest.NewServer(p)
	defer front.Close()

	conn, err := net.Dial("tcp", front.Listener.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	br := bufio.NewReader(conn)
	statusRE := regexp.MustCompile(`^herd; hit; ttl=(\d+)$`)
	for _, path := range []string{"/plain", "/listed", "/varied"} {
		miss, err := http.Get(front.URL + path)
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, miss.Body)
		miss.Body.Close()
		if cs := strings.Join(miss.Header.Values("Cache-Status"), ", "); !strings.Contains(cs, "stored") {
			t.Fatalf("%s: first answer's Cache-Status %q, want it stored", path, cs)
		}
		// The fetch ends a moment after its client has the whole answer:
		// until then a request joins it (collapsed). Ask until one hits.
		for try := 0; ; try++ {
			resp, err := http.Get(front.URL + path)
			if err != nil {
				t.Fatal(err)
			}
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if strings.Contains(strings.Join(resp.Header.Values("Cache-Status"), ", "), "herd; hit") {
				break
			}
			if try == 1000 {
				t.Fatalf("%s: no hit in %d requests after it was stored", path, try)
			}
		}
		want := []string{
			"Cache-Control: max-age=600",
			"Content-Length: " + strconv.Itoa(len(body)),
			"Content-Type: text/plain; charset=utf-8",
			"Date: " + miss.Header.Get("Date"),
			`Etag: "v1"`,
			"Last-Modified: Sun, 06 Nov 1994 08:49:37 GMT",
			"Link: </style.css>; rel=preload",
			"X-Multi: a",
			"X-Multi: b, c",
		}
		// The client's requests ask for gzip (net/http's client adds it):
		// /varied is stored as the variant for gzip.
		field := ""
		if path == "/varied" {
			want = append(want, "Vary: Accept-Encoding")
			field = "Accept-Encoding: gzip\r\n"
		}
		sortFields(want)
		var upstream []string
		if path == "/listed" {
			upstream = []string{"upstream; hit"}
		}
		// A 304 carries the stored fields RFC 9110 §15.4.5 lists.
		var want304 []string
		for _, l := range want {
			switch name, _, _ := strings.Cut(l, ":"); name {
			case "Cache-Control", "Date", "Etag", "Last-Modified", "Vary":
				want304 = append(want304, l)
			}
		}
		for i, rq := range []struct{ method, cond string }{
			{"GET", ""}, {"GET", ""}, {"HEAD", ""}, {"GET", ""},
			{"GET", "If-None-Match: \"v1\"\r\n"}, {"HEAD", "If-None-Match: W/\"v1\", \"v0\"\r\n"},
			{"GET", "If-None-Match: \"v2\"\r\n"},
			{"GET", "If-Modified-Since: Sun, 06 Nov 1994 08:49:37 GMT\r\n"},
			{"GET", "If-Modified-Since: Sat, 05 Nov 1994 08:49:37 GMT\r\n"},
		} {
			method := rq.method
			io.WriteString(conn, method+" "+path+" HTTP/1.1\r\nHost: "+front.Listener.Addr().String()+"\r\n"+field+rq.cond+"\r\n")
			status, lines := readHead(t, br)
			current := strings.Contains(rq.cond, `"v1"`) || strings.Contains(rq.cond, "Sun, 06")
			want := want
			if current {
				want = want304
				if status != "HTTP/1.1 304 Not Modified" {
					t.Fatalf("%s %s #%d with %q: status line %q", method, path, i, rq.cond, status)
				}
			} else if status != "HTTP/1.1 200 OK" {
				t.Fatalf("%s %s #%d: status line %q", method, path, i, status)
			}
			var fields, age, cacheStatus []string
			for _, l := range lines {
				switch name, v, _ := strings.Cut(l, ": "); name {
				case "Age":
					age = append(age, v)
				case "Cache-Status":
					cacheStatus = append(cacheStatus, v)
				default:
					fields = append(fields, l)
				}
			}
			sortFields(fields)
			if d := cmp.Diff(want, fields); d != "" {
				t.Errorf("%s %s #%d: fields (-want +got):\n%s", method, path, i, d)
			}
			if len(age) != 1 || len(cacheStatus) != len(upstream)+1 || !slices.Equal(cacheStatus[:len(upstream)], upstream) {
				t.Fatalf("%s %s #%d: Age %q, Cache-Status %q", method, path, i, age, cacheStatus)
			}
			m := statusRE.FindStringSubmatch(cacheStatus[len(upstream)])
			a, aerr := strconv.Atoi(age[0])
			if m == nil || aerr != nil {
				t.Fatalf("%s %s #%d: Age %q, Cache-Status %q", method, path, i, age, cacheStatus)
			}
			// Both are whole seconds rounded down: they sum to the lifetime
			// or one less.
			if ttl, _ := strconv.Atoi(m[1]); a+ttl != 600 && a+ttl != 599 {
				t.Errorf("%s %s #%d: Age %d and ttl %d do not make the 600 s lifetime", method, path, i, a, ttl)
			}
			if method == "HEAD" || current {
				continue
			}
			got := make([]byte, len(body))
			if _, err := io.ReadFull(br, got); err != nil || string(got) != body {
				t.Fatalf("%s %s #%d: body %q, %v", method, path, i, got, err)
			}
		}
	}
}

// sortFields sorts field lines by name, keeping the lines of one field
// in their order.
func sortFields(lines []string) {
	slices.SortStableFunc(lines, func(a, b string) int {
		an, _, _ := strings.Cut(a, ":")
		bn, _, _ := strings.Cut(b, ":")
		return strings.Compare(an, bn)
	})
}

// readHead reads a response's status line and field lines.
func readHead(t *testing.T, br *bufio.Reader) (status string, lines []string) {
	t.Helper()
	for {
		l, err := br.ReadString('\n')
		if err != nil {
			t.Fatal(err)
		}
		l = strings.TrimSuffix(l, "\r\n")
		if l == "" {
			return status, lines
		}
		if status == "" {
			status = l
		} else {
			lines = append(lines, l)
		}
	}
}
