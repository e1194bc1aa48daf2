package herd

import (
	"context"
	"testing"
	"testing/synctest"
	"time"

	"github.com/herdcache/herd/internal/topk"
)

// A hot pin that the sampled count missed in one soft TTL, but whose copy
// was read, keeps its place; a pin whose copy went unread gives up its own
// to a key that the count found.
func TestHotPinKeptWhileRead(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const soft = time.Hour
		c, err := New(&Options[int]{
			MaxEntries: 100, SoftTTL: soft, HardTTL: 2 * soft,
			MaxRefreshAhead: 2, RefreshAheadHot: 2,
			Load: func(context.Context, string) (int, error) { return 1, nil },
		})
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close(context.Background())
		for _, key := range []string{"a", "b"} {
			if _, err := c.Get(t.Context(), key, nil); err != nil {
				t.Fatal(err)
			}
			c.pins.mu.Lock()
			c.addPin(key, c.loader(key, nil), true)
			c.pins.mu.Unlock()
		}
		synctest.Wait()
		if _, err := c.Get(t.Context(), "a", nil); err != nil { // a's copy is read, b's is not
			t.Fatal(err)
		}
		c.hot.Reset()
		c.hot.Add("c", topk.Counts{Traffic: 100})
		c.scanHot()
		if !c.pinned("a") || c.pinned("b") || !c.pinned("c") {
			t.Errorf("after the scan: a pinned %v, b %v, c %v; want a and c", c.pinned("a"), c.pinned("b"), c.pinned("c"))
		}
	})
}
