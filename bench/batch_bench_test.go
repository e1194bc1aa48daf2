package bench

import (
	"context"
	"fmt"
	"testing"
	"time"
)

// The workloads' shape, and the cost of one query to the backing store,
// whatever its number of keys.
const (
	batchSize     = 50  // keys per read
	keySetSize    = 200 // keys per cold round
	coldCallers   = 16  // callers per cold round, in one process
	fleetReplicas = 10
	fleetCallers  = 5 // callers per replica per fleet round
	queryCost     = time.Millisecond
)

// BenchmarkBatchHit reads a batch of batchSize keys, every one cached, from
// parallel goroutines: ns/op and allocs/op are per batch.
func BenchmarkBatchHit(b *testing.B) {
	keys := newRing("hit", batchSize).keys()
	for _, im := range impls {
		b.Run("impl="+im.name, func(b *testing.B) {
			ctx := context.Background()
			d := &db{cost: queryCost}
			r := im.local(d)
			defer r.close()
			if err := r.read(ctx, keys, make([]int, len(keys))); err != nil {
				b.Fatal(err)
			}
			b.ReportAllocs()
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				dst := make([]int, len(keys))
				for pb.Next() {
					if err := r.read(ctx, keys, dst); err != nil {
						b.Error(err)
						return
					}
				}
			})
			b.StopTimer()
			if n := d.keys.Load(); n != int64(len(keys)) {
				b.Errorf("%d keys loaded, want the %d of the warm-up only", n, len(keys))
			}
		})
	}
}

// BenchmarkBatchColdOverlap: each op is a round of coldCallers goroutines
// in one process, each reading a batch of batchSize overlapping keys of a
// set of keySetSize that none has read before. loads/key is keys given to
// loaders per distinct key, calls/batch loader calls per batch read.
func BenchmarkBatchColdOverlap(b *testing.B) {
	for _, im := range impls {
		b.Run("impl="+im.name, func(b *testing.B) {
			d := &db{cost: queryCost}
			r := im.local(d)
			defer r.close()
			benchRounds(b, []*db{d}, []replica{r}, coldCallers)
		})
	}
}

// BenchmarkFleetBatch: each op is a round of fleetCallers goroutines on
// each of fleetReplicas replicas, each reading a batch of batchSize
// overlapping keys of a set of keySetSize that none has read before; each
// replica's callers read every key. herd's replicas share one memory.Remote
// with a lease (losers wait); each peer's replicas are instances that
// share nothing. loads/key is over the fleet.
func BenchmarkFleetBatch(b *testing.B) {
	for _, im := range impls {
		b.Run("impl="+im.name, func(b *testing.B) {
			dbs := make([]*db, fleetReplicas)
			for i := range dbs {
				dbs[i] = &db{cost: queryCost}
			}
			rs := im.fleet(dbs)
			defer closeAll(rs)
			benchRounds(b, dbs, rs, fleetCallers)
		})
	}
}

// benchRounds runs b.N storms of callers per replica of rs, each over a
// new key set, and reports loads/key and calls/batch; for a fleet of
// herd's replicas also poll-wakes/op, the lease waits that the holder's
// completion notice did not end and that the loser's first re-read of the
// Store, 50 ms after the wait began, or a later one ended.
func benchRounds(b *testing.B, dbs []*db, rs []replica, callers int) {
	rings := make([]ring, b.N)
	for n := range rings {
		rings[n] = newRing(fmt.Sprintf("r%d", n), keySetSize)
	}
	ctx := context.Background()
	b.ReportAllocs()
	b.ResetTimer()
	for n := range b.N {
		if err := storm(ctx, rs, rings[n], callers, batchSize)(); err != nil {
			b.Fatal(err)
		}
	}
	b.StopTimer()
	calls, keys := totals(dbs)
	b.ReportMetric(float64(keys)/float64(b.N*keySetSize), "loads/key")
	b.ReportMetric(float64(calls)/float64(b.N*len(rs)*callers), "calls/batch")
	if len(rs) == 1 {
		return
	}
	var polled int64
	for _, r := range rs {
		p, ok := r.(interface{ pollWakes() int64 })
		if !ok {
			return
		}
		polled += p.pollWakes()
	}
	b.ReportMetric(float64(polled)/float64(b.N), "poll-wakes/op")
}
