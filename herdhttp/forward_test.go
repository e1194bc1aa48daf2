package herdhttp_test

import (
	"fmt"
	"testing"
	"testing/synctest"

	"github.com/herdcache/herd/herdhttp"
)

// A fetch whose response may be stored carries the keyed fields only, or
// with ForwardAllFields every end-to-end field; in both modes never the
// client's conditionals or Range (the fill must bring a whole response)
// nor a hop-by-hop field.
func TestForwardFields(t *testing.T) {
	for _, all := range []bool{false, true} {
		t.Run(fmt.Sprintf("ForwardAllFields %v", all), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				o := herdhttp.DefaultOptions()
				o.ForwardAllFields = all
				f := newFixture(t, o, static("v", "Cache-Control: max-age=60", `ETag: "1"`))
				f.mustGet("/a", 200, "v", "Accept: text/plain", "X-Custom: 1", "Req-Num: 7",
					`If-None-Match: "0"`, "If-Modified-Since: Sun, 06 Nov 1994 08:49:37 GMT", "Connection: X-Hop", "X-Hop: 1")
				seen := f.lastSeen().Header
				if seen.Get("Accept") != "text/plain" {
					t.Errorf("the fill's Accept is %q; want text/plain", seen.Get("Accept"))
				}
				for _, k := range []string{"X-Custom", "Req-Num"} {
					if got := seen.Get(k) != ""; got != all {
						t.Errorf("the fill carries %s: %v, want %v", k, got, all)
					}
				}
				for _, k := range []string{"If-None-Match", "If-Modified-Since", "X-Hop"} {
					if v := seen.Get(k); v != "" {
						t.Errorf("the fill carries %s: %q", k, v)
					}
				}
			})
		})
	}
}
