package herd

import (
	"context"
	"errors"
	"runtime/debug"
	"time"

	"github.com/herdcache/herd/flight"
)

// errLoadPanicked ends the span of a load that panicked or called
// runtime.Goexit.
var errLoadPanicked = errors.New("herd: load panicked")

// guard runs fn on a goroutine of its own and returns its error, or, when
// fn panics or calls runtime.Goexit, a [flight.PanicError] carrying the
// panic value and stack or [flight.ErrGoexit]: so one call of a batch
// loader that panics fails only the keys it was given, and the calls
// after it still run.
func guard(fn func() error) error {
	done := make(chan error, 1)
	go func() {
		normal := false
		defer func() {
			if normal {
				return
			}
			if r := recover(); r != nil {
				done <- &flight.PanicError{Value: r, Stack: debug.Stack()}
			} else {
				done <- flight.ErrGoexit
			}
		}()
		err := fn()
		normal = true
		done <- err
	}()
	return <-done
}

// remoteCtx bounds a remote call made on behalf of a load that may have used
// up its own time; it keeps ctx's values.
func (c *Cache[V]) remoteCtx(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.WithoutCancel(ctx), c.cfg.LoadTimeout)
}

// directives is what a load decided about one key's entry through SetTTL,
// NoCache and Tags (and their For forms in a batch load).
type directives struct {
	soft, hard time.Duration
	noCache    bool
	tags       []string
}

// SetTTL sets, from inside a load, the soft and hard TTL of the entry that
// load is making (before jitter); a hard TTL of zero means the soft one (no
// stale window). Inside a batch load it sets them for every key of the
// call ([SetTTLFor] sets one key's). A TTL above [MaxTTL] is taken as
// MaxTTL. TTLs that [New] would refuse as [Options.SoftTTL] and HardTTL
// otherwise (a soft TTL that is not positive, a negative hard TTL, a hard
// TTL shorter than the soft one) make the load fail, whatever it returns,
// with New's words ("herd: SetTTL: HardTTL (1s) must not be shorter than
// SoftTTL (1m0s)"): its callers get that error and nothing is cached.
// Outside a load it does nothing.
func SetTTL(ctx context.Context, soft, hard time.Duration) {
	if ds, ok := ctx.Value(batchDirectivesKey{}).(*batchDirectives); ok {
		if !ds.refuse(loadTTLError("herd: SetTTL: ", soft, hard)) {
			ds.update("", true, func(d *directives) { d.soft, d.hard = soft, hard })
		}
	}
}

// loadTTLError is ttlError for TTLs a load sets, which saturate at MaxTTL.
func loadTTLError(prefix string, soft, hard time.Duration) error {
	return ttlError(prefix, min(soft, MaxTTL), min(hard, MaxTTL))
}

// NoCache tells the cache, from inside a load, to return the value the load
// returns to its callers without caching it in either tier; inside a batch
// load, every value it returns ([NoCacheFor] tells it of one key's).
// Outside a load it does nothing.
func NoCache(ctx context.Context) {
	if ds, ok := ctx.Value(batchDirectivesKey{}).(*batchDirectives); ok {
		ds.update("", true, func(d *directives) { d.noCache = true })
	}
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
