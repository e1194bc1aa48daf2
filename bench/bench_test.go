package bench

import (
	"context"
	"slices"
	"testing"
	"testing/synctest"
	"time"
)

// patience bounds, in fake time, every wait of a test, so that a broken
// library fails the test instead of hanging it.
const patience = time.Hour

// TestColdOverlap runs one round of BenchmarkBatchColdOverlap on a small
// scale for each library, every load held until every caller is loading
// or waiting for a load: each caller gets the value of every key, each key
// is loaded exactly once in the process, and herd's GetMany makes at most
// one loader call.
func TestColdOverlap(t *testing.T) {
	const keys, callers, size = 40, 6, 10
	for _, im := range impls {
		t.Run(im.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				ctx, cancel := context.WithTimeout(context.Background(), patience)
				defer cancel()
				gate := make(chan struct{})
				d := (&db{gate: gate}).track()
				r := im.local(d)
				defer r.close()
				ring := newRing("cold", keys)

				wait := storm(ctx, []replica{r}, ring, callers, size)
				synctest.Wait() // every caller is loading or joined to a load
				close(gate)
				if err := wait(); err != nil {
					t.Fatal(err)
				}
				for _, k := range ring.keys() {
					if n := d.loadsOf(k); n != 1 {
						t.Errorf("%q loaded %d times in one process, want 1", k, n)
					}
				}
				if calls := d.calls.Load(); im.name == "herd" && calls > callers {
					t.Errorf("%d loader calls for %d GetMany calls, want at most one each", calls, callers)
				}
			})
		})
	}
}

// TestFleet runs one round of BenchmarkFleetBatch on a small scale for each
// library, every load held until every caller is loading or waiting: each
// caller gets the value of every key; herd, whose replicas share a
// memory.Remote with a lease, loads each key exactly once across the fleet;
// each peer, whose replicas share nothing, loads each key on every replica
// that read it, as designed, and once there.
func TestFleet(t *testing.T) {
	const replicas, callers, keys, size = 3, 3, 30, 10
	for _, im := range impls {
		t.Run(im.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				ctx, cancel := context.WithTimeout(context.Background(), patience)
				defer cancel()
				gate := make(chan struct{})
				dbs := make([]*db, replicas)
				for i := range dbs {
					dbs[i] = (&db{gate: gate}).track()
				}
				rs := im.fleet(dbs)
				defer closeAll(rs)
				ring := newRing("fleet", keys)

				wait := storm(ctx, rs, ring, callers, size)
				synctest.Wait() // every caller is loading or waiting
				close(gate)
				if err := wait(); err != nil {
					t.Fatal(err)
				}
				for _, k := range ring.keys() {
					total := 0
					for i, d := range dbs {
						n := d.loadsOf(k)
						total += n
						if im.fleetWide {
							continue
						}
						switch read := readBy(ring, i, replicas, callers, size, k); {
						case read && n < 1:
							t.Errorf("replica %d read %q and never loaded it", i, k)
						case read && n > 1:
							t.Errorf("replica %d loaded %q %d times, want once per process", i, k, n)
						case !read && n > 0:
							t.Errorf("replica %d loaded %q, which it never read", i, k)
						}
					}
					if im.fleetWide && total != 1 {
						t.Errorf("%q loaded %d times across the fleet, want 1", k, total)
					}
				}
			})
		})
	}
}

// readBy reports whether a caller of replica i read key in a storm of r.
func readBy(r ring, i, replicas, callers, size int, key string) bool {
	for j := range callers {
		if slices.Contains(r.batch(i, replicas, j, callers, size), key) {
			return true
		}
	}
	return false
}
