package herd

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/herdcache/herd/remote"
)

// WarmReport says what [Cache.Warm] did.
type WarmReport struct {
	Loaded int // keys whose load ran and succeeded
	Fresh  int // keys that already had a value and needed no load
	Failed int // keys whose load failed
	// Errors holds the error of each failed key.
	Errors map[string]error
}

// Warm preloads keys, calling load (or [Options.Load] when load is nil) for
// each key without a fresh value, through the same coalescing, lease and
// limiter as Get. It runs as many loads at once as the limiter allows (eight
// without a limiter), tolerates individual failures and reports them. It
// returns early, reporting the keys it did not reach as failed, when ctx ends.
// When load and Options.Load are nil and [Options.LoadMany] is set, the keys
// are loaded as [Cache.GetMany] loads them, in batches of MaxBatch (100
// when MaxBatch is zero), as many batches at once as there would be loads.
func (c *Cache[V]) Warm(ctx context.Context, keys []string, load func(ctx context.Context, key string) (V, error)) WarmReport {
	workers := 8
	if c.cfg.Limiter != nil {
		workers = c.cfg.Limiter.Limit()
	}
	t := &warmTally{WarmReport: WarmReport{Errors: map[string]error{}}}
	if load == nil && c.cfg.Load == nil && c.cfg.LoadMany != nil {
		size := cmp.Or(c.cfg.MaxBatch, warmBatch)
		batches := (len(keys) + size - 1) / size
		parallel(workers, batches, func(b int) {
			c.warmMany(ctx, keys[b*size:min((b+1)*size, len(keys))], t)
		})
		return t.WarmReport
	}
	parallel(workers, len(keys), func(i int) { c.warmOne(ctx, keys[i], load, t) })
	return t.WarmReport
}

// warmOne warms key with load (or Options.Load) through Get.
func (c *Cache[V]) warmOne(ctx context.Context, key string, load func(ctx context.Context, key string) (V, error), t *warmTally) {
	var called atomic.Bool
	var lf LoadFunc[V]
	if load == nil {
		load = c.cfg.Load
	}
	if load != nil {
		lf = func(ctx context.Context) (V, error) {
			called.Store(true)
			return load(ctx, key)
		}
	}
	err := notReached(ctx)
	if err == nil {
		_, err = c.Get(ctx, key, lf)
	}
	t.add(key, err, called.Load())
}

// warmBatch is how many keys one batch of a Warm with Options.LoadMany
// holds when MaxBatch is zero.
const warmBatch = 100

// warmMany warms a batch of keys with Options.LoadMany through GetMany.
func (c *Cache[V]) warmMany(ctx context.Context, batch []string, t *warmTally) {
	var (
		mu     sync.Mutex
		loaded = map[string]bool{}
	)
	load := func(ctx context.Context, ks []string) (map[string]V, error) {
		mu.Lock()
		for _, k := range ks {
			loaded[k] = true
		}
		mu.Unlock()
		return c.cfg.LoadMany(ctx, ks)
	}
	var items []Item[V]
	if err := notReached(ctx); err == nil {
		items = c.GetMany(ctx, batch, load)
	} else {
		items = make([]Item[V], len(batch))
		for i := range items {
			items[i].Err = err
		}
	}
	mu.Lock()
	defer mu.Unlock()
	for i, it := range items {
		t.add(batch[i], it.Err, loaded[batch[i]])
	}
}

// notReached is the error of a key that Warm did not reach because ctx
// had ended; nil while ctx is live.
func notReached(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("herd: warm: not reached: %w", err)
	}
	return nil
}

// warmTally is the report of a Warm under way.
type warmTally struct {
	mu sync.Mutex
	WarmReport
}

// add records the warming of key: its error, or whether its load ran.
func (t *warmTally) add(key string, err error, loaded bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	switch {
	case err != nil:
		t.Failed++
		t.Errors[key] = err
	case loaded:
		t.Loaded++
	default:
		t.Fresh++
	}
}

// parallel calls fn with each of 0 … n-1 on up to workers goroutines, and
// returns once every call has.
func parallel(workers, n int, fn func(int)) {
	var (
		next atomic.Int64
		wg   sync.WaitGroup
	)
	for range min(workers, n) {
		wg.Go(func() {
			for i := int(next.Add(1)) - 1; i < n; i = int(next.Add(1)) - 1 {
				fn(i)
			}
		})
	}
	wg.Wait()
}

// WarmHot warms this replica with the keys the fleet reads most: up to n
// keys of the Store's hot set ([remote.HotSet]), which replicas fill with
// [Options.ShareHotKeys], loaded as [Cache.Warm] loads them. A key that
// another replica keeps in the Store is read from there, not loaded. Call
// it before the replica takes traffic, with the ShareHotKeysEvery (or
// SoftTTL) the fleet uses: it names the periods of the hot set. It loads
// nothing and fails when n is not positive, when the Store keeps no hot
// set and when the set cannot be read.
func (c *Cache[V]) WarmHot(ctx context.Context, n int, load func(ctx context.Context, key string) (V, error)) (WarmReport, error) {
	hs, ok := c.cfg.Store.(remote.HotSet)
	switch {
	case c.closed.Load():
		return WarmReport{}, ErrClosed
	case !ok:
		return WarmReport{}, errors.New("herd: WarmHot: the Store keeps no hot set (it is not a HotSet)")
	case n <= 0:
		return WarmReport{}, fmt.Errorf("herd: WarmHot: n must be positive, got %d", n)
	}
	at := c.brk.at()
	keys, err := hs.Hot(ctx, n, c.sharePeriod())
	c.remoteDone(ctx, at, err)
	if err != nil {
		return WarmReport{}, fmt.Errorf("herd: WarmHot: %w", err)
	}
	return c.Warm(ctx, keys, load), nil
}

// shareHot runs every sharePeriod with ShareHotKeys: it adds the reads of
// the keys read most since the last run to the fleet's hot set, in the
// background (nothing when there are none, or while the breaker is open),
// and starts the count again.
func (c *Cache[V]) shareHot() {
	top := c.shared.Top()
	c.shared.Reset()
	c.pins.mu.Lock()
	if !c.closed.Load() {
		c.pins.share.Reset(c.sharePeriod())
	}
	c.pins.mu.Unlock()
	if len(top) == 0 || c.closed.Load() || c.brk.open() {
		return
	}
	reads := make(map[string]uint64, len(top))
	for _, it := range top {
		reads[it.Key] = it.Traffic
	}
	hs := c.cfg.Store.(remote.HotSet)
	c.goBackground(func() {
		ctx, cancel := context.WithTimeout(c.closeCtx, c.cfg.LoadTimeout)
		defer cancel()
		at := c.brk.at()
		c.remoteDone(ctx, at, hs.AddHot(ctx, reads, c.cfg.ShareHotKeys, c.sharePeriod()))
	})
}

// sharePeriod is the period of the hot set: ShareHotKeysEvery, or SoftTTL.
func (c *Cache[V]) sharePeriod() time.Duration {
	return cmp.Or(c.cfg.ShareHotKeysEvery, c.cfg.SoftTTL)
}
