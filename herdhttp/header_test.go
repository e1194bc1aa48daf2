package herdhttp_test

import (
	"fmt"
	"strings"
	"testing"
	"testing/synctest"

	"github.com/herdcache/herd/herdhttp"
)

// A response whose header is larger than MaxHeaderBytes reaches the
// client whole, is not stored, and marks its key hit-for-pass; one
// within the bound is stored.
func TestMaxHeaderBytes(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		big := strings.Repeat("h", 2<<10)
		f := newFixture(t, &herdhttp.Options{MaxHeaderBytes: 1 << 10}, static("body", "Cache-Control: max-age=60", "X-Big: "+big))
		r := f.mustGet("/a", 200, "body")
		if r.header.Get("X-Big") != big || strings.Contains(r.cacheStatus(), "; stored") {
			t.Errorf("GET /a with a 2 KiB field: X-Big of %d bytes, Cache-Status %q; want it whole and not stored", len(r.header.Get("X-Big")), r.cacheStatus())
		}
		synctest.Wait() // the fetch ends, and marks the key, a moment after its client has read it all
		r = f.mustGet("/a", 200, "body")
		if !strings.Contains(r.cacheStatus(), "hit-for-pass-header-too-large") {
			t.Errorf("GET /a again: Cache-Status %q; want hit-for-pass-header-too-large", r.cacheStatus())
		}
		f.wantCalls(2, "a header over the bound, twice")
		g := newFixture(t, &herdhttp.Options{MaxHeaderBytes: 4 << 10}, static("body", "Cache-Control: max-age=60", "X-Big: "+big))
		g.mustGet("/a", 200, "body")
		synctest.Wait()
		if r := g.mustGet("/a", 200, "body"); !strings.Contains(r.cacheStatus(), "hit") || r.header.Get("X-Big") != big {
			t.Errorf("GET /a again under a 4 KiB bound: Cache-Status %q; want a hit with the field", r.cacheStatus())
		}
		g.wantCalls(1, "a header within the bound, twice")
	})
}

// Stored fields count against MaxBytes: responses whose header is large
// and body small are evicted by it like large bodies.
func TestHeaderBytesCounted(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const budget = 64 << 10
		field := strings.Repeat("h", 4<<10)
		f := newFixture(t, &herdhttp.Options{MaxBytes: budget}, static("b", "Cache-Control: max-age=60", "X-Big: "+field))
		f.mustGet("/0", 200, "b")
		synctest.Wait() // stored as the fetch ends, a moment after its client has read it all
		if w := f.h.LocalWeight(); w < 4<<10 {
			t.Errorf("one response with a 4 KiB field weighs %d in the local tier; want at least 4 KiB", w)
		}
		for i := range 40 {
			f.mustGet(fmt.Sprintf("/%d", i), 200, "b")
		}
		synctest.Wait()
		if w := f.h.LocalWeight(); w > budget {
			t.Errorf("40 responses with 4 KiB fields leave %d bytes in the local tier; want at most %d", w, budget)
		}
		f.calls.Store(0)
		for i := range 40 {
			f.mustGet(fmt.Sprintf("/%d", i), 200, "b")
		}
		if n := f.calls.Load(); n < 20 {
			t.Errorf("%d of 40 responses with 4 KiB fields fetched again under a 64 KiB bound; want at least 20", n)
		}
	})
}
