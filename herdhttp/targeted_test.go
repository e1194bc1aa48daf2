package herdhttp_test

import (
	"net/http"
	"strconv"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/herdcache/herd/herdhttp"
)

// CDN-Cache-Control (RFC 9213), obeyed by DefaultOptions, replaces
// Cache-Control and Expires when it parses, and is ignored when it does
// not or when TargetedFields is empty; the client gets both fields.
func TestCDNCacheControl(t *testing.T) {
	for _, tc := range []struct {
		name   string
		o      *herdhttp.Options
		fields []string
		stored bool
	}{
		{"cdn max-age over cc no-store", nil, []string{"Cache-Control: no-store", "CDN-Cache-Control: max-age=60"}, true},
		{"cdn no-store over cc max-age", nil, []string{"Cache-Control: max-age=60", "CDN-Cache-Control: no-store"}, false},
		{"cdn private", nil, []string{"Cache-Control: max-age=60", "CDN-Cache-Control: private"}, false},
		{"expires ignored", nil, []string{"CDN-Cache-Control: max-age=60", "Expires: 0"}, true},
		{"malformed cdn ignored", nil, []string{"Cache-Control: no-store", "CDN-Cache-Control: max-age=60, &&&"}, false},
		{"not targeted", &herdhttp.Options{}, []string{"Cache-Control: no-store", "CDN-Cache-Control: max-age=60"}, false},
		{"own target first", &herdhttp.Options{TargetedFields: []string{"Herd-Cache-Control", "CDN-Cache-Control"}},
			[]string{"Herd-Cache-Control: max-age=60", "CDN-Cache-Control: no-store"}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				f := newFixture(t, tc.o, static("v", tc.fields...))
				f.mustGet("/a", 200, "v")
				time.Sleep(10 * time.Second)
				r := f.mustGet("/a", 200, "v")
				calls := int64(2)
				if tc.stored {
					calls = 1
				}
				f.wantCalls(calls, "two requests 10 s apart")
				for _, fl := range tc.fields {
					k, v, _ := strings.Cut(fl, ": ")
					if got := r.header.Get(k); got != v {
						t.Errorf("the answer's %s is %q; want %q", k, got, v)
					}
				}
			})
		})
	}
}

// must-understand (RFC 9111 §5.2.2.3) lets a response with a status whose
// caching rules the cache knows be stored despite no-store; with one it
// does not know, nothing is stored.
func TestMustUnderstand(t *testing.T) {
	for _, tc := range []struct {
		status int
		stored bool
	}{{200, true}, {404, true}, {299, false}} {
		t.Run(strconv.Itoa(tc.status), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				f := newFixture(t, nil, func(w http.ResponseWriter, r *http.Request) {
					w.Header().Set("Cache-Control", "max-age=60, no-store, must-understand")
					w.WriteHeader(tc.status)
					w.Write([]byte("v"))
				})
				f.mustGet("/a", tc.status, "v")
				f.mustGet("/a", tc.status, "v")
				calls := int64(2)
				if tc.stored {
					calls = 1
				}
				f.wantCalls(calls, "two requests")
			})
		})
	}
}
