package herdhttp

import (
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

// HTTP-dates in their three forms parse; values that bend the grammar
// do not, so that an Expires holding one counts as already expired.
func TestParseHTTPDate(t *testing.T) {
	at := func(y int, m time.Month, d, h, mi, s int) time.Time { return time.Date(y, m, d, h, mi, s, 0, time.UTC) }
	for _, tc := range []struct {
		in   string
		want time.Time // zero: invalid
	}{
		{"Sun, 06 Nov 1994 08:49:37 GMT", at(1994, 11, 6, 8, 49, 37)},
		{"Sunday, 06-Nov-94 08:49:37 GMT", at(1994, 11, 6, 8, 49, 37)},
		{"Sun Nov  6 08:49:37 1994", at(1994, 11, 6, 8, 49, 37)},
		{"Sun Nov 16 08:49:37 1994", at(1994, 11, 16, 8, 49, 37)},
		{"THU, 18 AUG 2050 02:01:18 gmt", at(2050, 8, 18, 2, 1, 18)}, // names in any case
		{"Thursday, 18-Aug-50 02:01:18 GMT", at(2050, 8, 18, 2, 1, 18)},
		{"Thursday, 18-Aug-77 02:01:18 GMT", at(1977, 8, 18, 2, 1, 18)}, // more than 50 years ahead: the century before
		{"Tue, 19 Jan 2038 03:14:08 GMT", at(2038, 1, 19, 3, 14, 8)},
		{"Thu, 31 Dec 1998 23:59:60 GMT", at(1999, 1, 1, 0, 0, 0)}, // a leap second
		{"  Sun, 06 Nov 1994 08:49:37 GMT ", at(1994, 11, 6, 8, 49, 37)},
		{"Thu, 18  Aug  2050 02:01:18 GMT", time.Time{}}, // doubled spaces
		{"Thu, 18 Aug 2050 2:01:18 GMT", time.Time{}},    // one-digit hour
		{"Thu 18 Aug 2050 02:01:18 GMT", time.Time{}},    // no comma
		{"Thu, 18 Aug 2050 02:01:18 UTC", time.Time{}},
		{"Thu, 18 Aug 2050 02:01:18 AEST", time.Time{}},
		{"Thu, 18 Aug 50 02:01:18 GMT", time.Time{}},
		{"Thu, 18-Aug-2050 02:01:18 GMT", time.Time{}},
		{"Thu, 18 Aug 2050 02.01.18 GMT", time.Time{}},
		{"Thu, 31 Feb 2050 02:01:18 GMT", time.Time{}},
		{"Thu, 18 Aug 2050 24:00:00 GMT", time.Time{}},
		{"Thu, 18 Foo 2050 02:01:18 GMT", time.Time{}},
		{"Thu, 18 Aug 2050 02:01:18 GMT, Thu, 18 Aug 2050 02:01:19 GMT", time.Time{}},
		{"0", time.Time{}},
		{"", time.Time{}},
	} {
		got, ok := parseHTTPDateIn(strings.TrimSpace(tc.in), 2026)
		if ok != !tc.want.IsZero() || !got.Equal(tc.want) {
			t.Errorf("parseHTTPDate(%q) = %v, %v; want %v", tc.in, got, ok, tc.want)
		}
	}
}

// Age is the first member of its first line, when that is
// delta-seconds; anything else counts as none.
func TestAgeValue(t *testing.T) {
	for _, tc := range []struct {
		lines []string
		want  time.Duration
	}{
		{nil, 0},
		{[]string{"60"}, time.Minute},
		{[]string{"7200, 0"}, 2 * time.Hour},
		{[]string{"0, 7200"}, 0},
		{[]string{"7200", "0"}, 2 * time.Hour},
		{[]string{"abc"}, 0},
		{[]string{"-7200"}, 0},
		{[]string{"7200.0"}, 0},
		{[]string{"2147483649"}, maxDeltaSeconds * time.Second},
	} {
		if got := ageValue(http.Header{"Age": tc.lines}); got != tc.want {
			t.Errorf("ageValue(%q) = %v, want %v", tc.lines, got, tc.want)
		}
	}
}

// A targeted field (RFC 9213) that parses as a Dictionary replaces
// Cache-Control; an empty or malformed one is ignored; directives of the
// wrong type are left out.
func TestResponseDirectives(t *testing.T) {
	targets := []string{"Herd-Cache-Control", "CDN-Cache-Control"}
	for _, tc := range []struct {
		name     string
		h        http.Header
		want     cacheControl
		targeted bool
	}{
		{"none", http.Header{"Cache-Control": {"max-age=60"}}, cacheControl{"max-age": "60"}, false},
		{"cdn", http.Header{"Cache-Control": {"no-store"}, "Cdn-Cache-Control": {"max-age=600, stale-if-error=60"}},
			cacheControl{"max-age": "600", "stale-if-error": "60"}, true},
		{"first target wins", http.Header{"Cdn-Cache-Control": {"max-age=600"}, "Herd-Cache-Control": {"no-store"}},
			cacheControl{"no-store": ""}, true},
		{"malformed target skipped", http.Header{"Cdn-Cache-Control": {"max-age=600"}, "Herd-Cache-Control": {"max-age=1, &&&"}},
			cacheControl{"max-age": "600"}, true},
		{"empty target ignored", http.Header{"Cache-Control": {"max-age=60"}, "Cdn-Cache-Control": {""}}, cacheControl{"max-age": "60"}, false},
		{"string where an integer belongs", http.Header{"Cdn-Cache-Control": {`max-age="10000", private`}}, cacheControl{"private": ""}, true},
		{"qualified no-cache", http.Header{"Cdn-Cache-Control": {`max-age=60, no-cache="X-A"`}}, cacheControl{"max-age": "60", "no-cache": "X-A"}, true},
		{"false is absent", http.Header{"Cdn-Cache-Control": {`max-age=60, no-store=?0`}}, cacheControl{"max-age": "60"}, true},
		{"negative", http.Header{"Cdn-Cache-Control": {`max-age=-1`}}, cacheControl{}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, targeted := responseDirectives(tc.h, targets)
			if diff := cmp.Diff(tc.want, got); diff != "" || targeted != tc.targeted {
				t.Errorf("targeted %v, want %v; directives (-want +got):\n%s", targeted, tc.targeted, diff)
			}
		})
	}
}
