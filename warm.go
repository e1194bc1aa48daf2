package herd

import (
	"context"
	"sync"
	"sync/atomic"
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
func (c *Cache[V]) Warm(ctx context.Context, keys []string, load func(ctx context.Context, key string) (V, error)) WarmReport {
	workers := 8
	if c.cfg.Limiter != nil {
		workers = c.cfg.Limiter.Limit()
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
