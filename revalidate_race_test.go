package herd_test

import (
	"context"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/herdcache/herd"
	"github.com/herdcache/herd/memory"
)

// heldLoads is a memory.Remote whose Load, while armed, reads the stored
// bytes at once but returns them only when gate is closed: a read of the
// Store that is slow to come back.
type heldLoads struct {
	*memory.Remote
	armed atomic.Bool
	gate  chan struct{}
}

func (h *heldLoads) Load(ctx context.Context, key string) ([]byte, error) {
	b, err := h.Remote.Load(ctx, key)
	if h.armed.Load() {
		<-h.gate
	}
	return b, err
}

// A background read of the Store that began before a refresh landed does
// not put its older value over the refreshed one.
func TestRevalidationDoesNotUndoRefresh(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := &heldLoads{Remote: memory.New(), gate: make(chan struct{})}
		c := newCache(t, &herd.Options[int]{
			NoBreaker:  true,
			MaxEntries: 10, SoftTTL: 10 * time.Second, HardTTL: 20 * time.Second,
			Store: h, Lease: h, LeaseTTL: 5 * time.Second, NearTTL: 8 * time.Second,
		})
		t0 := time.Now()
		fleetMustGet(t, c, "k", fleetValue(1), 1)

		// Past NearTTL: the read is served and one background read of the
		// Store starts; it reads value 1 and is slow to come back.
		sleepUntil(t0.Add(8*time.Second + 500*time.Millisecond))
		h.armed.Store(true)
		fleetMustGet(t, c, "k", fleetNoLoad(t, "a read past NearTTL"), 1)
		synctest.Wait()
		h.armed.Store(false)

		// Stale: served while a refresh loads value 2 and writes it back.
		sleepUntil(t0.Add(10*time.Second + time.Millisecond))
		fleetMustGet(t, c, "k", fleetValue(2), 1)
		synctest.Wait()

		close(h.gate) // the slow read of value 1 comes back
		synctest.Wait()
		fleetMustGet(t, c, "k", fleetNoLoad(t, "a read after the refresh"), 2)
	})
}
