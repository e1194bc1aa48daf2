package herdhttp_test

import (
	"fmt"
	"net/http"
	"strings"
	"testing"
	"testing/synctest"

	"github.com/herdcache/herd/herdhttp"
)

// Responses that vary on Accept-Encoding are stored apart, one per
// normalised value: codings in any order, case or spacing, and with q=0
// codings left out, select the same response.
func TestVaryAcceptEncoding(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newFixture(t, &herdhttp.Options{MaxVariants: 64}, func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Cache-Control", "max-age=60")
			w.Header().Set("Vary", "Accept-Encoding")
			fmt.Fprintf(w, "for %s", r.Header.Get("Accept-Encoding"))
		})
		f.mustGet("/a", 200, "for gzip, br", "Accept-Encoding: gzip, br")
		f.mustGet("/a", 200, "for identity", "Accept-Encoding: identity")
		f.wantCalls(2, "two encodings")
		f.mustGet("/a", 200, "for gzip, br", "Accept-Encoding: BR,gzip")
		f.mustGet("/a", 200, "for gzip, br", "Accept-Encoding: br ,  GZIP, zstd;q=0")
		f.mustGet("/a", 200, "for identity", "Accept-Encoding: identity")
		f.wantCalls(2, "the same encodings again, normalised")
		r := f.mustGet("/a", 200, "for zstd", "Accept-Encoding: zstd")
		if !strings.Contains(r.cacheStatus(), "vary-miss") {
			t.Errorf("a new variant's Cache-Status %q; want vary-miss", r.cacheStatus())
		}
	})
}

// A field a response varies on that is not forwarded on fetches is not
// sent on the URL's first fetch (its Vary is not known yet): the response
// stored is the one for requests without the field, and a request with
// it is fetched once more, the field forwarded, and that response stored
// for its value too. With ForwardAllFields the first fetch carries the
// field and is the only one.
func TestVaryOnUnforwardedField(t *testing.T) {
	for _, all := range []bool{false, true} {
		t.Run(fmt.Sprintf("ForwardAllFields %v", all), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				o := herdhttp.DefaultOptions()
				o.ForwardAllFields = all
				f := newFixture(t, o, func(w http.ResponseWriter, r *http.Request) {
					w.Header().Set("Cache-Control", "max-age=60")
					w.Header().Set("Vary", "X-V")
					fmt.Fprintf(w, "for %q", r.Header.Get("X-V"))
				})
				first := int64(2)
				if all {
					first = 1
				}
				f.mustGet("/a", 200, `for "1"`, "X-V: 1")
				f.wantCalls(first, "the first request")
				r := f.mustGet("/a", 200, `for "1"`, "X-V: 1")
				f.wantCalls(first, "the first request's value again")
				if !strings.HasPrefix(r.cacheStatus(), "herd; hit") {
					t.Errorf("Cache-Status %q; want a hit", r.cacheStatus())
				}
				f.mustGet("/a", 200, `for "2"`, "X-V: 2")
				f.mustGet("/a", 200, `for "2"`, "X-V: 2")
				f.wantCalls(first+1, "once the Vary is known")
			})
		})
	}
}

// A URL stores at most MaxVariants variants: with two, a round of ten
// values fetches all ten again; with many, none.
func TestVariantsCapped(t *testing.T) {
	for _, max := range []int{2, 1000} {
		synctest.Test(t, func(t *testing.T) {
			f := newFixture(t, &herdhttp.Options{MaxVariants: max, ForwardHeaders: []string{"X-V"}}, func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("Cache-Control", "max-age=60")
				w.Header().Set("Vary", "X-V")
				fmt.Fprintf(w, "for %s", r.Header.Get("X-V"))
			})
			for round := range 2 {
				for i := range 10 {
					f.mustGet("/a", 200, fmt.Sprintf("for %d", i), fmt.Sprintf("X-V: %d", i))
				}
				if round == 0 {
					f.wantCalls(10, "the first round")
				}
			}
			got := f.calls.Load() - 10
			if max == 2 && got < 8 || max == 1000 && got != 0 {
				t.Errorf("MaxVariants %d: the second round fetched %d of 10", max, got)
			}
		})
	}
}

// Vary: * is never served from the cache.
func TestVaryStar(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newFixture(t, nil, static("v", "Cache-Control: max-age=60", "Vary: *"))
		for range 3 {
			f.mustGet("/a", 200, "v")
		}
		f.wantCalls(3, "three requests of a Vary: * response")
	})
}
