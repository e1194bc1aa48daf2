package herd

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/herdcache/herd/flight"
	"github.com/herdcache/herd/observe"
)

// BatchLoadFunc loads the values of keys from the backing store in one
// call. It returns the values it found; a key it leaves out is
// [ErrNotFound], and a key it returns but was not given is ignored. An
// error fails every key it was given. Its context is a [LoadFunc]'s; on it,
// [SetTTLFor] and [NoCacheFor] decide for one key, and [SetTTL] and
// [NoCache] for every key of the call.
type BatchLoadFunc[V any] func(ctx context.Context, keys []string) (map[string]V, error)

// Item is one key's result of [Cache.GetMany]: its value or its error.
type Item[V any] struct {
	Value V
	Err   error
}

// GetMany returns the values of keys, one Item per key, in order; a key
// given twice gets the same Item. Each key is served as [Cache.Get] would
// serve it, and the keys that neither tier can serve are loaded together:
// load (or [Options.LoadMany] when load is nil) is called with the keys
// this replica must load, at most MaxBatch at a time.
//
// A key already being loaded in this process, by a Get or another
// GetMany, is waited for, not loaded again. With a Lease, only the keys
// whose lease this replica took are loaded; a key another replica holds is
// served stale, waited for or failed by the loser policy, after this call
// has loaded its own keys. One limiter slot is taken per loader call. The
// remote tier is read, leased and written in one round trip per server for
// the whole batch when its Store and Lease implement [remote.BatchStore] and
// [remote.BatchLease] (keys one call at a time otherwise): a batch the Store
// holds takes one round trip, a batch to load takes two. A loader error,
// panic or runtime.Goexit fails only the keys it was given. Stale keys
// served are refreshed together, in one background load per call.
//
// ctx bounds only this caller's wait: keys still loading when it ends get
// its error, and their loads go on for their other callers. Empty keys
// make no call. Errors are as [Cache.Get] returns them.
func (c *Cache[V]) GetMany(ctx context.Context, keys []string, load BatchLoadFunc[V], opts ...CallOption) []Item[V] {
	items := make([]Item[V], len(keys))
	if c.closed.Load() {
		for i := range items {
			items[i].Err = ErrClosed
		}
		return items
	}
	if load == nil {
		load = c.cfg.LoadMany
	}
	missed, at, stale := c.localMany(ctx, keys, items, opts)
	if len(stale) > 0 {
		c.refreshMany(ctx, stale, load)
	}
	if len(missed) > 0 {
		c.fillMissed(ctx, missed, at, items, load, c.resolve(opts))
	}
	for i := range items {
		if items[i].Err != nil {
			items[i].Err = outward("get", keys[i], items[i].Err)
		}
	}
	return items
}

// localMany serves keys from the local tier as Get would, into items. It
// returns the keys it could not serve, with their positions in keys (a
// key given twice is missed twice: its flight, which finds it once,
// marks the second Repeat), and the values it served that are due for a
// refresh. Keys missed from the first on, with none served between, are
// keys' own prefix, their positions nil: a batch of misses copies nothing.
func (c *Cache[V]) localMany(ctx context.Context, keys []string, items []Item[V], opts []CallOption) (missed []string, at []int, stale []staleRead[V]) {
	prefix := 0 // while missed is nil, keys[:prefix] were all missed
	for i, key := range keys {
		if e, ok := c.localGet(key); ok {
			if now := c.hitClk.bound(); now < e.soft-e.lead && c.trusted(e, now) {
				c.hit(key, e)
				items[i] = itemOf(c.served(e))
				continue
			}
			if serve, started := c.near(ctx, key, e, opts); serve {
				items[i] = itemOf(c.served(e))
				if started != nil {
					stale = append(stale, staleRead[V]{key: key, e: e, started: started})
				}
				continue
			}
		}
		switch {
		case missed != nil:
		case prefix == i:
			prefix++
			continue
		default:
			// A miss after a key served: the misses get arrays of their own.
			missed = make([]string, prefix, prefix+len(keys)-i) // and the keys from i on
			at = make([]int, prefix, cap(missed))
			copy(missed, keys[:prefix])
			for p := range prefix {
				at[p] = p
			}
		}
		missed, at = append(missed, key), append(at, i)
	}
	if missed == nil {
		return keys[:prefix:prefix], nil, stale
	}
	return missed, at, stale
}

// fillMissed fills the keys missed in their flights, joined or led by
// this call, and puts each one's result at its position in at in items
// (missed[j] at j when at is nil). A stale value a flight settled with is
// served, and refreshed, unless the call wants none: then the key is
// filled again, up to maxMissAttempts.
func (c *Cache[V]) fillMissed(ctx context.Context, missed []string, at []int, items []Item[V], load BatchLoadFunc[V], co callOpts) {
	var refresh []staleRead[V]
	pos := func(j int) int {
		if at == nil {
			return j
		}
		return at[j]
	}
	for attempt := 0; len(missed) > 0; attempt++ {
		res := c.flyMissed(ctx, missed, load, co, attempt == 0)
		var (
			again   []string // not in missed's array, which may be the caller's keys
			againAt []int
		)
		now := c.clk.now() // after every remote wait of the flights
		for j, key := range missed {
			e, err := res[j].Val, res[j].Err
			switch {
			case err == nil && e.gone(now):
				if attempt+1 < maxMissAttempts && ctx.Err() == nil {
					again, againAt = append(again, key), append(againAt, pos(j)) // expired while remote calls were waited on
					continue
				}
				err = errNoFresh(key)
			case err == nil && e.stale(now) && co.noStale:
				if attempt+1 < maxMissAttempts && ctx.Err() == nil {
					again, againAt = append(again, key), append(againAt, pos(j)) // went stale before this caller took it
					continue
				}
				err = errNoFresh(key)
			case err == nil && e.stale(now) && !res[j].Repeat:
				// Served stale by the flight (from the Store or as a lease loser).
				c.countStale(key)
				refresh = append(refresh, staleRead[V]{key: key, e: e, started: &c.st.staleRefreshes})
			}
			if err != nil {
				items[pos(j)].Err = err
			} else {
				items[pos(j)] = itemOf(e.result())
			}
		}
		missed, at = again, againAt
	}
	if len(refresh) > 0 {
		c.refreshMany(ctx, refresh, load)
	}
}

// flyMissed runs one attempt of fillMissed: the batch fill of the keys
// missed that no flight runs for. With count, each key counts as a miss,
// or as a hit when the Store served it fresh: a key the fill led, by the
// fill; a key another caller's flight had, here.
func (c *Cache[V]) flyMissed(ctx context.Context, missed []string, load BatchLoadFunc[V], co callOpts, count bool) []flight.Result[*entry[V]] {
	res := c.flyMany(ctx, missed, func(fctx context.Context, led []string, settle func(string, *entry[V], error)) {
		fs, free := c.newFills(led, co, nil)
		defer free()
		c.fillMany(fctx, fs, load, false, settle, count)
	})
	if count {
		for i, key := range missed {
			if !res[i].Led && !res[i].Repeat {
				c.got(key, observe.ResultMiss) // joined another caller's load
			}
		}
	}
	return res
}

func itemOf[V any](v V, err error) Item[V] { return Item[V]{Value: v, Err: err} }

// staleRead is a local value served that is due for a refresh, with the
// counter of the refresh it starts.
type staleRead[V any] struct {
	key     string
	e       *entry[V]
	started *stripedCounter
}

// runBatchLoad calls load with keys and measures it, as runLoad does for
// one key, with the decisions its load made for each key.
func (c *Cache[V]) runBatchLoad(ctx context.Context, keys []string, load BatchLoadFunc[V], background bool) (vals map[string]V, elapsed time.Duration, ds *batchDirectives, err error) {
	ds = &batchDirectives{}
	elapsed, err = c.timeLoad(context.WithValue(ctx, batchDirectivesKey{}, ds), keys, background, func(lctx context.Context) (err error) {
		vals, err = load(lctx, keys)
		if err == nil {
			err = ds.refused()
		}
		return err
	})
	return vals, elapsed, ds, err
}

// oneOf is the load of key through a batch loader.
func oneOf[V any](key string, load BatchLoadFunc[V]) LoadFunc[V] {
	return func(ctx context.Context) (V, error) {
		// Every load runs as a batch's: SetTTLFor and the rest decide for
		// key in the batch that runs this one.
		vals, err := load(ctx, []string{key})
		var zero V
		if err != nil {
			return zero, err
		}
		v, ok := vals[key]
		if !ok {
			return zero, ErrNotFound
		}
		return v, nil
	}
}

// batchDirectives is what a batch load decided about its entries, for all
// of them (SetTTL, NoCache) and for each (SetTTLFor, NoCacheFor).
type batchDirectives struct {
	mu  sync.Mutex
	all directives
	per map[string]*directives
	// bad is the first invalid directive's error: it fails the load.
	bad error
}

// refuse keeps err, the error of an invalid directive, to fail the load
// with, and reports whether it is one (not nil).
func (ds *batchDirectives) refuse(err error) bool {
	if err == nil {
		return false
	}
	ds.mu.Lock()
	defer ds.mu.Unlock()
	if ds.bad == nil {
		ds.bad = err
	}
	return true
}

// refused is the error of the load's first invalid directive; nil when
// none was.
func (ds *batchDirectives) refused() error {
	ds.mu.Lock()
	defer ds.mu.Unlock()
	return ds.bad
}

type batchDirectivesKey struct{}

// of is what the batch load decided for key's entry.
func (ds *batchDirectives) of(key string) directives {
	ds.mu.Lock()
	defer ds.mu.Unlock()
	d := ds.all
	d.tags = slices.Clone(d.tags)
	if p := ds.per[key]; p != nil {
		if p.soft > 0 {
			d.soft, d.hard = p.soft, p.hard
		}
		d.noCache = d.noCache || p.noCache
		d.tags = append(d.tags, p.tags...)
	}
	return d
}

// update applies fn to the directives of key, or of every key when all.
func (ds *batchDirectives) update(key string, all bool, fn func(*directives)) {
	ds.mu.Lock()
	defer ds.mu.Unlock()
	if all {
		fn(&ds.all)
		return
	}
	if ds.per == nil {
		ds.per = make(map[string]*directives)
	}
	d := ds.per[key]
	if d == nil {
		d = &directives{}
		ds.per[key] = d
	}
	fn(d)
}

// SetTTLFor sets, from inside a batch load ([BatchLoadFunc]), the soft and
// hard TTL of key's entry, as [SetTTL] does inside a load; it overrides a
// SetTTL of the same load. TTLs that [New] would refuse fail the whole
// call, as SetTTL's do, for every key it was given. Outside a batch load
// it does nothing.
func SetTTLFor(ctx context.Context, key string, soft, hard time.Duration) {
	if ds, ok := ctx.Value(batchDirectivesKey{}).(*batchDirectives); ok {
		if !ds.refuse(loadTTLError(fmt.Sprintf("herd: SetTTLFor %q: ", key), soft, hard)) {
			ds.update(key, false, func(d *directives) { d.soft, d.hard = soft, hard })
		}
	}
}

// NoCacheFor tells the cache, from inside a batch load, to return key's
// value to its callers without caching it, as [NoCache] does inside a
// load. Outside a batch load it does nothing.
func NoCacheFor(ctx context.Context, key string) {
	if ds, ok := ctx.Value(batchDirectivesKey{}).(*batchDirectives); ok {
		ds.update(key, false, func(d *directives) { d.noCache = true })
	}
}
