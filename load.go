package herd

import (
	"context"
	"errors"
	"time"
)

// errLoadPanicked ends the span of a load that panicked or called
// runtime.Goexit.
var errLoadPanicked = errors.New("herd: load panicked")

// store puts a freshly loaded entry in the local tier and hands its remote
// write, with the release of the lease when one is held, to the background,
// so that the load's callers get the value as soon as the load returns.
// Nothing is written to either tier when key was set or invalidated in this
// process since gen was read: with a lease the fence would refuse the write,
// without one this process's own order refuses it.
func (c *Cache[V]) store(ctx context.Context, key string, e *entry[V], held *heldLease, remoteUp bool, gen uint64) {
	var env []byte
	if remoteUp {
		var err error
		if env, err = c.encode(e); err != nil {
			c.st.encodeErrors.add(1)
			return // a value the codec cannot encode is served, not cached
		}
		if held != nil {
			e.fence.Store(held.fence)
		}
		if c.cfg.NearTTL > 0 {
			e.near = addTime(c.clk.now(), c.cfg.NearTTL)
		}
	}
	unfenced := env != nil && held == nil
	if !c.publish(key, e, gen, unfenced) {
		return
	}
	ttl := time.Duration(e.hard - c.clk.now())
	switch {
	case held != nil:
		c.endLease(ctx, held, env, ttl, e)
	case unfenced:
		c.goBackground(func() {
			defer c.gens.endWrite(key)
			if ttl <= 0 {
				return
			}
			rctx, cancel := c.remoteCtx(ctx)
			defer cancel()
			at := c.brk.at()
			f, err := c.cfg.Store.Set(rctx, key, env, ttl)
			c.remoteDone(rctx, at, err)
			if err == nil {
				e.fence.Store(f)
			}
		})
	}
}

// remoteCtx bounds a remote call made on behalf of a load that may have used
// up its own time; it keeps ctx's values.
func (c *Cache[V]) remoteCtx(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.WithoutCancel(ctx), c.cfg.LoadTimeout)
}

// directives is what a load decided about its own entry through SetTTL and
// NoCache.
type directives struct {
	soft, hard time.Duration
	noCache    bool
	tags       []string
}

type directivesKey struct{}

// SetTTL sets, from inside a load, the soft and hard TTL of the entry that
// load is making (before jitter); hard below soft means no stale window.
// Inside a batch load it sets them for every key of the call ([SetTTLFor]
// sets one key's). Outside a load it does nothing.
func SetTTL(ctx context.Context, soft, hard time.Duration) {
	if ds, ok := ctx.Value(batchDirectivesKey{}).(*batchDirectives); ok && soft > 0 {
		ds.update("", true, func(d *directives) { d.soft, d.hard = soft, hard })
		return
	}
	if d, ok := ctx.Value(directivesKey{}).(*directives); ok && soft > 0 {
		d.soft, d.hard = soft, hard
	}
}

// NoCache tells the cache, from inside a load, to return the value the load
// returns to its callers without caching it in either tier; inside a batch
// load, every value it returns ([NoCacheFor] tells it of one key's).
// Outside a load it does nothing.
func NoCache(ctx context.Context) {
	if ds, ok := ctx.Value(batchDirectivesKey{}).(*batchDirectives); ok {
		ds.update("", true, func(d *directives) { d.noCache = true })
		return
	}
	if d, ok := ctx.Value(directivesKey{}).(*directives); ok {
		d.noCache = true
	}
}

// runLoad calls load, cancelled if the cache closes, and measures it.
func (c *Cache[V]) runLoad(ctx context.Context, key string, load LoadFunc[V], background bool) (v V, elapsed time.Duration, d directives, err error) {
	dp := &directives{}
	elapsed, err = c.timeLoad(context.WithValue(ctx, directivesKey{}, dp), []string{key}, background, func(lctx context.Context) (err error) {
		v, err = load(lctx)
		return err
	})
	return v, elapsed, *dp, err
}

// timeLoad runs call, the load of keys (one key, or a batch), cancelled if
// the cache closes, and measures it.
func (c *Cache[V]) timeLoad(ctx context.Context, keys []string, background bool, call func(context.Context) error) (elapsed time.Duration, err error) {
	lctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stop := context.AfterFunc(c.closeCtx, cancel)
	defer stop()
	op, key := "herd.load", keys[0]
	switch {
	case len(keys) > 1 && background:
		op, key = "herd.refresh_many", ""
	case len(keys) > 1:
		op, key = "herd.load_many", ""
	case background:
		op = "herd.refresh"
	}
	lctx, end := c.span(lctx, op, key)
	c.st.loads.add(int64(len(keys)))
	for _, k := range keys {
		c.countLoad(k)
		c.keyLoads.start(k)
	}
	start := time.Now()
	returned := false
	defer func() {
		elapsed = time.Since(start)
		for _, k := range keys {
			c.keyLoads.done(k)
		}
		c.loadDur.observe(elapsed)
		c.recorder.RecordLoad(elapsed, err, background)
		if !returned {
			end(errLoadPanicked) // the panic goes on to the flight
			return
		}
		end(err)
	}()
	err = call(lctx)
	returned = true
	return 0, err
}
