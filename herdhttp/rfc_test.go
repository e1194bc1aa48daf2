package herdhttp

import (
	"math"
	"net/http"
	"strings"
	"testing"
	"time"
)

// fields parses "Name: value" lines into a header.
func fields(lines ...string) http.Header {
	h := http.Header{}
	for _, l := range lines {
		k, v, _ := strings.Cut(l, ":")
		h.Add(k, strings.TrimSpace(v))
	}
	return h
}

// cc is the Cache-Control of one line.
func cc(v string) cacheControl {
	if v == "" {
		return nil
	}
	return parseCacheControl(fields("Cache-Control: " + v))
}

func TestNotStorable(t *testing.T) {
	const maxBody = 100
	for _, tc := range []struct {
		name      string
		auth      bool
		status    int
		h         []string
		length    int64
		setCookie bool
		want      string
	}{
		{name: "fresh 200", status: 200, h: []string{"Cache-Control: max-age=60"}, want: ""},
		{name: "206", status: 206, h: []string{"Cache-Control: max-age=60"}, want: "status"},
		{name: "304", status: 304, h: []string{"Cache-Control: max-age=60"}, want: "status"},
		{name: "no-store", status: 200, h: []string{"Cache-Control: no-store, max-age=60"}, want: "no-store"},
		{name: "no-store, must-understand, known status", status: 200, h: []string{"Cache-Control: no-store, must-understand, max-age=60"}, want: ""},
		{name: "must-understand, unknown status", status: 299, h: []string{"Cache-Control: must-understand, max-age=60"}, want: "must-understand"},
		{name: "private", status: 200, h: []string{"Cache-Control: private, max-age=60"}, want: "private"},
		{name: "qualified private", status: 200, h: []string{`Cache-Control: private="X-A", max-age=60`}, want: ""},
		{name: "Authorization", auth: true, status: 200, h: []string{"Cache-Control: max-age=60"}, want: reasonAuthorization},
		{name: "Authorization, public", auth: true, status: 200, h: []string{"Cache-Control: public, max-age=60"}, want: ""},
		{name: "Authorization, s-maxage", auth: true, status: 200, h: []string{"Cache-Control: s-maxage=60"}, want: ""},
		{name: "Authorization, must-revalidate", auth: true, status: 200, h: []string{"Cache-Control: must-revalidate, max-age=60"}, want: ""},
		{name: "Vary: *", status: 200, h: []string{"Cache-Control: max-age=60", "Vary: Accept, *"}, want: "vary-star"},
		{name: "Set-Cookie", status: 200, h: []string{"Cache-Control: max-age=60", "Set-Cookie: a=b"}, want: "set-cookie"},
		{name: "Set-Cookie stored", status: 200, h: []string{"Cache-Control: max-age=60", "Set-Cookie: a=b"}, setCookie: true, want: ""},
		{name: "announced too large", status: 200, h: []string{"Cache-Control: max-age=60"}, length: maxBody + 1, want: "too-large"},
		{name: "unknown length", status: 200, h: []string{"Cache-Control: max-age=60"}, length: -1, want: ""},
	} {
		h := fields(tc.h...)
		if got := notStorable(tc.auth, tc.status, h, parseCacheControl(h), tc.length, tc.setCookie, maxBody); got != tc.want {
			t.Errorf("%s: notStorable = %q; want %q", tc.name, got, tc.want)
		}
	}
}

func TestFreshnessLifetime(t *testing.T) {
	date := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	at := func(d time.Duration) string { return date.Add(d).Format(http.TimeFormat) }
	for _, tc := range []struct {
		name      string
		status    int
		h         []string
		targeted  bool
		heuristic float64
		want      time.Duration
	}{
		{name: "s-maxage over max-age", h: []string{"Cache-Control: max-age=5, s-maxage=10"}, want: 10 * time.Second},
		{name: "max-age over Expires", h: []string{"Cache-Control: max-age=5", "Expires: " + at(time.Hour)}, want: 5 * time.Second},
		{name: "Expires less Date", h: []string{"Expires: " + at(time.Minute)}, want: time.Minute},
		{name: "Expires before Date", h: []string{"Expires: " + at(-time.Minute)}, want: 0},
		{name: "invalid Expires", h: []string{"Expires: 0"}, want: 0},
		{name: "Expires with a doubled space", h: []string{"Expires: " + strings.Replace(at(time.Minute), " ", "  ", 1)}, want: 0},
		{name: "two Expires", h: []string{"Expires: " + at(time.Minute), "Expires: " + at(time.Hour)}, want: 0},
		{name: "Expires beside a targeted field", h: []string{"Expires: " + at(time.Minute)}, targeted: true, want: -1},
		{name: "nothing", h: nil, want: -1},
		{name: "heuristic", h: []string{"Last-Modified: " + at(-100*time.Second)}, heuristic: 0.1, want: 10 * time.Second},
		{name: "heuristic capped", h: []string{"Last-Modified: " + at(-1000*time.Hour)}, heuristic: 0.1, want: time.Hour},
		{name: "heuristic off", h: []string{"Last-Modified: " + at(-100*time.Second)}, want: -1},
		{name: "heuristic, status not cacheable by default", status: 302, h: []string{"Last-Modified: " + at(-100*time.Second)}, heuristic: 0.1, want: -1},
	} {
		h := fields(tc.h...)
		status := tc.status
		if status == 0 {
			status = 200
		}
		if got := freshnessLifetime(status, h, parseCacheControl(h), tc.targeted, date.UnixNano(), tc.heuristic, time.Hour); got != tc.want {
			t.Errorf("%s: freshnessLifetime = %v; want %v", tc.name, got, tc.want)
		}
	}
}

func TestCurrentAge(t *testing.T) {
	const s = int64(time.Second)
	t0 := int64(1_800_000_000) * s
	for _, tc := range []struct {
		name           string
		date           int64
		age            time.Duration
		req, resp, now int64
		want           time.Duration
	}{
		{name: "just received", date: t0, req: t0, resp: t0, now: t0, want: 0},
		{name: "resident", date: t0, req: t0, resp: t0, now: t0 + 5*s, want: 5 * time.Second},
		{name: "apparent age from Date", date: t0 - 3*s, req: t0, resp: t0, now: t0, want: 3 * time.Second},
		{name: "Age corrected by the delay", date: t0, age: 10 * time.Second, req: t0 - s, resp: t0, now: t0 + 2*s, want: 13 * time.Second},
		{name: "Date in the future", date: t0 + 60*s, req: t0, resp: t0, now: t0 + s, want: time.Second},
		{name: "saturates", date: t0, age: time.Duration(math.MaxInt64), req: t0 - s, resp: t0, now: t0 + s, want: time.Duration(math.MaxInt64)},
	} {
		if got := currentAge(tc.date, tc.age, tc.req, tc.resp, tc.now); got != tc.want {
			t.Errorf("%s: currentAge = %v; want %v", tc.name, got, tc.want)
		}
	}
}

// stored is a response received at t0, fresh for lifetime, with flags
// and a stale-while-revalidate and stale-if-error window.
func stored(t0 int64, lifetime time.Duration, flags uint8, swr, sie time.Duration) *entry {
	return &entry{kind: kindResponse, status: 200, header: http.Header{}, dateValue: t0, reqTime: t0, respTime: t0,
		lifetime: lifetime, flags: flags, swr: swr, sie: sie}
}

func TestUsable(t *testing.T) {
	const s = int64(time.Second)
	t0 := int64(1_800_000_000) * s
	minute := time.Minute
	for _, tc := range []struct {
		name string
		e    *entry
		rcc  string
		now  int64
		want use
	}{
		{name: "fresh", e: stored(t0, minute, 0, 0, 0), now: t0 + 30*s, want: useFresh},
		{name: "at its lifetime", e: stored(t0, minute, 0, 0, 0), now: t0 + 60*s, want: useFetch},
		{name: "within stale-while-revalidate", e: stored(t0, minute, 0, minute, 0), now: t0 + 90*s, want: useStale},
		{name: "past stale-while-revalidate", e: stored(t0, minute, 0, minute, 0), now: t0 + 120*s, want: useFetch},
		{name: "must-revalidate stale", e: stored(t0, minute, flagMustRevalidate, minute, 0), now: t0 + 90*s, want: useFetch},
		{name: "no-cache stored", e: stored(t0, minute, flagNoCache, 0, 0), now: t0, want: useFetch},
		{name: "request no-cache", e: stored(t0, minute, 0, 0, 0), rcc: "no-cache", now: t0, want: useFetch},
		{name: "request max-age older", e: stored(t0, minute, 0, 0, 0), rcc: "max-age=2", now: t0 + 5*s, want: useFetch},
		{name: "request max-age younger", e: stored(t0, minute, 0, 0, 0), rcc: "max-age=10", now: t0 + 5*s, want: useFresh},
		{name: "request min-fresh unmet", e: stored(t0, minute, 0, 0, 0), rcc: "min-fresh=30", now: t0 + 40*s, want: useFetch},
		{name: "request min-fresh met", e: stored(t0, minute, 0, 0, 0), rcc: "min-fresh=10", now: t0 + 40*s, want: useFresh},
		{name: "request max-stale", e: stored(t0, minute, 0, 0, 0), rcc: "max-stale=10", now: t0 + 65*s, want: useFresh},
		{name: "request max-stale exceeded", e: stored(t0, minute, 0, 0, 0), rcc: "max-stale=10", now: t0 + 75*s, want: useFetch},
		{name: "request max-stale, must-revalidate", e: stored(t0, minute, flagMustRevalidate, 0, 0), rcc: "max-stale=10", now: t0 + 65*s, want: useFetch},
	} {
		if got := usable(tc.e, cc(tc.rcc), tc.now); got != tc.want {
			t.Errorf("%s: usable = %d; want %d", tc.name, got, tc.want)
		}
	}
}

func TestStaleOnError(t *testing.T) {
	const s = int64(time.Second)
	t0 := int64(1_800_000_000) * s
	minute := time.Minute
	for _, tc := range []struct {
		name string
		e    *entry
		now  int64
		want bool
	}{
		{name: "nothing stored", e: nil, now: t0, want: false},
		{name: "within stale-if-error", e: stored(t0, minute, 0, 0, minute), now: t0 + 90*s, want: true},
		{name: "past stale-if-error", e: stored(t0, minute, 0, 0, minute), now: t0 + 120*s, want: false},
		{name: "no stale-if-error", e: stored(t0, minute, 0, minute, 0), now: t0 + 90*s, want: false},
		{name: "must-revalidate", e: stored(t0, minute, flagMustRevalidate, 0, minute), now: t0 + 90*s, want: false},
		{name: "no-cache", e: stored(t0, minute, flagNoCache, 0, minute), now: t0 + 90*s, want: false},
		{name: "a hit-for-pass mark", e: &entry{kind: kindPass, sie: minute}, now: t0, want: false},
	} {
		if got := staleOnError(tc.e, tc.now); got != tc.want {
			t.Errorf("%s: staleOnError = %v; want %v", tc.name, got, tc.want)
		}
	}
}

func TestNotModified(t *testing.T) {
	lm := "Fri, 02 Jan 2026 03:04:05 GMT"
	for _, tc := range []struct {
		name   string
		req    []string
		stored []string
		want   bool
	}{
		{name: "If-None-Match met", req: []string{`If-None-Match: "a"`}, stored: []string{`ETag: "a"`}, want: true},
		{name: "If-None-Match weak", req: []string{`If-None-Match: W/"a"`}, stored: []string{`ETag: "a"`}, want: true},
		{name: "If-None-Match list", req: []string{`If-None-Match: "b", "a"`}, stored: []string{`ETag: W/"a"`}, want: true},
		{name: "If-None-Match star", req: []string{`If-None-Match: *`}, stored: []string{`ETag: "a"`}, want: true},
		{name: "If-None-Match unmet", req: []string{`If-None-Match: "b"`}, stored: []string{`ETag: "a"`}, want: false},
		{name: "If-None-Match, no ETag", req: []string{`If-None-Match: "a"`}, want: false},
		{name: "If-None-Match unmet wins over If-Modified-Since", req: []string{`If-None-Match: "b"`, "If-Modified-Since: " + lm}, stored: []string{`ETag: "a"`, "Last-Modified: " + lm}, want: false},
		{name: "If-Modified-Since met", req: []string{"If-Modified-Since: " + lm}, stored: []string{"Last-Modified: " + lm}, want: true},
		{name: "If-Modified-Since before", req: []string{"If-Modified-Since: Thu, 01 Jan 2026 00:00:00 GMT"}, stored: []string{"Last-Modified: " + lm}, want: false},
		{name: "If-Modified-Since invalid", req: []string{"If-Modified-Since: yesterday"}, stored: []string{"Last-Modified: " + lm}, want: false},
		{name: "If-Modified-Since, no Last-Modified: Date met", req: []string{"If-Modified-Since: " + lm}, stored: []string{"Date: " + lm}, want: true},
		{name: "If-Modified-Since, no Last-Modified: Date later", req: []string{"If-Modified-Since: " + lm}, stored: []string{"Date: Sat, 03 Jan 2026 00:00:00 GMT"}, want: false},
		{name: "If-Modified-Since, Last-Modified later than Date", req: []string{"If-Modified-Since: " + lm}, stored: []string{"Date: " + lm, "Last-Modified: Sat, 03 Jan 2026 00:00:00 GMT"}, want: false},
		{name: "If-Modified-Since, invalid Last-Modified", req: []string{"If-Modified-Since: " + lm}, stored: []string{"Date: " + lm, "Last-Modified: yesterday"}, want: false},
		{name: "If-Modified-Since, neither Last-Modified nor Date", req: []string{"If-Modified-Since: " + lm}, want: false},
		{name: "no conditions", stored: []string{`ETag: "a"`}, want: false},
	} {
		r := &http.Request{Header: fields(tc.req...)}
		if got := notModified(r, fields(tc.stored...)); got != tc.want {
			t.Errorf("%s: notModified = %v; want %v", tc.name, got, tc.want)
		}
	}
}
