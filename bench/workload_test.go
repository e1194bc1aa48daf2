package bench

import (
	"context"
	"errors"
	"fmt"
	"sync"
)

// ring is one round's key set written twice, so that every rotation of it
// is a subslice and no caller copies keys.
type ring []string

// newRing returns n keys named after prefix, none read before.
func newRing(prefix string, n int) ring {
	r := make(ring, 2*n)
	for i := range n {
		r[i] = fmt.Sprintf("%s/k%03d", prefix, i)
		r[n+i] = r[i]
	}
	return r
}

// keys returns the key set, once.
func (r ring) keys() []string { return r[:len(r)/2] }

// batch returns what caller j of callers on replica i of n reads: size
// keys from j×(len−size)/(callers−1) on, in the key set rotated by
// i×len/n. A replica's callers overlap and together read every key; each
// replica starts its batches at a different key.
func (r ring) batch(i, n, j, callers, size int) []string {
	k := len(r) / 2
	view := r[i*k/n:][:k]
	lo := 0
	if callers > 1 {
		lo = j * (k - size) / (callers - 1)
	}
	return view[lo : lo+size]
}

// storm starts callers goroutines on each replica of rs, each reading its
// batch of r once, all released together, and returns a function that
// waits for them and returns the errors and wrong values they got.
func storm(ctx context.Context, rs []replica, r ring, callers, size int) (wait func() error) {
	var wg sync.WaitGroup
	errs := make(chan error, len(rs)*callers)
	start := make(chan struct{})
	for i, rep := range rs {
		for j := range callers {
			keys := r.batch(i, len(rs), j, callers, size)
			wg.Go(func() {
				<-start
				dst := make([]int, len(keys))
				if err := rep.read(ctx, keys, dst); err != nil {
					errs <- fmt.Errorf("replica %d, caller %d: %w", i, j, err)
					return
				}
				for n, k := range keys {
					if dst[n] != valueOf(k) {
						errs <- fmt.Errorf("replica %d, caller %d: %q = %d, want %d", i, j, k, dst[n], valueOf(k))
						return
					}
				}
			})
		}
	}
	close(start)
	return func() error {
		wg.Wait()
		close(errs)
		var all []error
		for err := range errs {
			all = append(all, err)
		}
		return errors.Join(all...)
	}
}

// totals returns the loader calls and the keys given to loaders, over dbs.
func totals(dbs []*db) (calls, keys int64) {
	for _, d := range dbs {
		calls += d.calls.Load()
		keys += d.keys.Load()
	}
	return calls, keys
}

func closeAll(rs []replica) {
	for _, r := range rs {
		r.close()
	}
}
