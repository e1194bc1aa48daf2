package herd

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"
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
	if load == nil && c.cfg.Load == nil && c.cfg.LoadMany != nil {
		return c.warmMany(ctx, keys, workers)
	}
	workers = min(workers, len(keys))

	var (
		mu     sync.Mutex
		report = WarmReport{Errors: map[string]error{}}
		next   atomic.Int64
		wg     sync.WaitGroup
	)
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := int(next.Add(1)) - 1
				if i >= len(keys) {
					return
				}
				key := keys[i]
				var called atomic.Bool
				var lf LoadFunc[V]
				if load != nil {
					lf = func(ctx context.Context) (V, error) {
						called.Store(true)
						return load(ctx, key)
					}
				} else if c.cfg.Load != nil {
					lf = func(ctx context.Context) (V, error) {
						called.Store(true)
						return c.cfg.Load(ctx, key)
					}
				}
				err := ctx.Err()
				if err == nil {
					_, err = c.Get(ctx, key, lf)
				}
				mu.Lock()
				switch {
				case err != nil:
					report.Failed++
					report.Errors[key] = err
				case called.Load():
					report.Loaded++
				default:
					report.Fresh++
				}
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	return report
}

// WarmHot warms this replica with the keys the fleet reads most: up to n
// keys of the Store's hot set ([HotSet]), which replicas fill with
// [Options.ShareHotKeys], loaded as [Cache.Warm] loads them. A key that
// another replica keeps in the Store is read from there, not loaded. Call
// it before the replica takes traffic, with the ShareHotKeysEvery (or
// SoftTTL) the fleet uses: it names the periods of the hot set. It loads
// nothing and fails when n is not positive, when the Store keeps no hot
// set and when the set cannot be read.
func (c *Cache[V]) WarmHot(ctx context.Context, n int, load func(ctx context.Context, key string) (V, error)) (WarmReport, error) {
	hs, ok := c.cfg.Store.(HotSet)
	switch {
	case c.closed.Load():
		return WarmReport{}, ErrClosed
	case !ok:
		return WarmReport{}, errors.New("herd: WarmHot: the Store keeps no hot set (it is not a HotSet)")
	case n <= 0:
		return WarmReport{}, fmt.Errorf("herd: WarmHot: n must be positive, got %d", n)
	}
	keys, err := hs.Hot(ctx, n, c.sharePeriod())
	c.remoteDone(ctx, err)
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
	hs := c.cfg.Store.(HotSet)
	c.goBackground(func() {
		ctx, cancel := context.WithTimeout(c.closeCtx, c.cfg.LoadTimeout)
		defer cancel()
		c.remoteDone(ctx, hs.AddHot(ctx, reads, c.cfg.ShareHotKeys, c.sharePeriod()))
	})
}

// sharePeriod is the period of the hot set: ShareHotKeysEvery, or SoftTTL.
func (c *Cache[V]) sharePeriod() time.Duration {
	return cmp.Or(c.cfg.ShareHotKeysEvery, c.cfg.SoftTTL)
}

// warmBatch is how many keys one batch of a Warm with Options.LoadMany
// holds when MaxBatch is zero.
const warmBatch = 100

// warmMany is Warm with Options.LoadMany: workers GetMany calls at once,
// each over one batch of keys.
func (c *Cache[V]) warmMany(ctx context.Context, keys []string, workers int) WarmReport {
	size := cmp.Or(c.cfg.MaxBatch, warmBatch)
	var (
		mu     sync.Mutex
		report = WarmReport{Errors: map[string]error{}}
		next   atomic.Int64
		wg     sync.WaitGroup
	)
	batches := (len(keys) + size - 1) / size
	for range min(workers, batches) {
		wg.Go(func() {
			for {
				b := int(next.Add(1)) - 1
				if b >= batches {
					return
				}
				batch := keys[b*size : min((b+1)*size, len(keys))]
				loaded := map[string]bool{}
				var lmu sync.Mutex
				load := func(ctx context.Context, ks []string) (map[string]V, error) {
					lmu.Lock()
					for _, k := range ks {
						loaded[k] = true
					}
					lmu.Unlock()
					return c.cfg.LoadMany(ctx, ks)
				}
				var items []Item[V]
				if err := ctx.Err(); err == nil {
					items = c.GetMany(ctx, batch, load)
				} else {
					items = make([]Item[V], len(batch))
					for i := range items {
						items[i].Err = err
					}
				}
				mu.Lock()
				lmu.Lock()
				for i, it := range items {
					switch {
					case it.Err != nil:
						report.Failed++
						report.Errors[batch[i]] = it.Err
					case loaded[batch[i]]:
						report.Loaded++
					default:
						report.Fresh++
					}
				}
				lmu.Unlock()
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	return report
}
