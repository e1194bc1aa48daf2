package herd

import (
	"context"
	"errors"
	"slices"
	"sync"
	"time"

	"github.com/herdcache/herd/flight"
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
// the whole batch when its Store and Lease implement [BatchStore] and
// [BatchLease] (keys one call at a time otherwise): a batch the Store
// holds takes one round trip, a batch to load takes two. A loader error,
// panic or runtime.Goexit fails only the keys it was given. Stale keys
// served are refreshed together, in one background load per call.
//
// ctx bounds only this caller's wait: keys still loading when it ends get
// its error, and their loads go on for their other callers. Empty keys
// make no call.
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
	return items
}

// localMany serves keys from the local tier as Get would, into items. It
// returns the keys it could not serve, each once, with their positions in
// keys, and the values it served that are due for a refresh.
func (c *Cache[V]) localMany(ctx context.Context, keys []string, items []Item[V], opts []CallOption) (missed []string, at map[string][]int, stale []staleRead[V]) {
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
		if at == nil {
			at = make(map[string][]int)
		}
		if _, dup := at[key]; !dup {
			missed = append(missed, key)
		}
		at[key] = append(at[key], i)
	}
	return missed, at, stale
}

// fillMissed fills the keys missed in their flights, joined or led by
// this call, and puts each one's result at its positions at in items. A
// stale value a flight settled with is served, and refreshed, unless the
// call wants none: then the key is filled again, up to maxMissAttempts.
func (c *Cache[V]) fillMissed(ctx context.Context, missed []string, at map[string][]int, items []Item[V], load BatchLoadFunc[V], co callOpts) {
	var refresh []staleRead[V]
	for attempt := 0; len(missed) > 0; attempt++ {
		res := c.flyMissed(ctx, missed, load, co, attempt == 0)
		again := missed[:0]
		for j, key := range missed {
			e, err := res[j].Val, res[j].Err
			switch {
			case err == nil && e.stale(c.clk.now()) && co.noStale:
				if attempt+1 < maxMissAttempts && ctx.Err() == nil {
					again = append(again, key) // went stale before this caller took it
					continue
				}
				err = errNoFresh(key)
			case err == nil && e.stale(c.clk.now()):
				// Served stale by the flight (from the Store or as a lease loser).
				c.countStale(key)
				refresh = append(refresh, staleRead[V]{key: key, e: e, started: &c.st.staleRefreshes})
			}
			for _, i := range at[key] {
				if err != nil {
					items[i].Err = err
				} else {
					items[i] = itemOf(e.result())
				}
			}
		}
		missed = again
	}
	if len(refresh) > 0 {
		c.refreshMany(ctx, refresh, load)
	}
}

// flyMissed runs one attempt of fillMissed: the batch fill of the keys
// missed that no flight runs for. With count, each key counts as a miss,
// or as a hit when the Store served it fresh.
func (c *Cache[V]) flyMissed(ctx context.Context, missed []string, load BatchLoadFunc[V], co callOpts, count bool) []flight.Result[*entry[V]] {
	var (
		mu  sync.Mutex
		ran = make(map[string]bool) // the keys this call's fill counts
	)
	res := c.flyMany(ctx, missed, func(fctx context.Context, led []string, settle func(string, *entry[V], error)) {
		mu.Lock()
		for _, k := range led {
			ran[k] = true
		}
		mu.Unlock()
		c.fillMany(fctx, led, load, co, nil, settle, count)
	})
	if count {
		mu.Lock()
		defer mu.Unlock()
		for _, key := range missed {
			if !ran[key] {
				c.got(key, ResultMiss) // joined another caller's load
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

// flyMany runs fill in the flights of keys, or alone under
// DisableCoalescing.
func (c *Cache[V]) flyMany(ctx context.Context, keys []string, fill func(context.Context, []string, func(string, *entry[V], error))) []flight.Result[*entry[V]] {
	if c.cfg.DisableCoalescing {
		g := &flight.Group[string, *entry[V]]{Timeout: c.cfg.LoadTimeout} // nobody else joins it
		return g.DoMany(ctx, keys, fill)
	}
	return c.flights.DoMany(ctx, keys, fill)
}

// refreshMany starts one background refresh of the values reads served,
// with one batch load, for those that are due; without a batch loader each
// is refreshed on its own.
func (c *Cache[V]) refreshMany(ctx context.Context, reads []staleRead[V], load BatchLoadFunc[V]) {
	if load == nil {
		for _, r := range reads {
			c.refresh(ctx, r.key, nil, r.e, r.started)
		}
		return
	}
	olds := make(map[string]*entry[V], len(reads))
	var keys []string
	for _, r := range reads {
		if _, dup := olds[r.key]; dup || !c.refreshDue(r.key, r.e) || !c.claimRefresh(r.key, r.e) {
			continue
		}
		olds[r.key] = r.e
		keys = append(keys, r.key)
		r.started.add(1)
	}
	if len(keys) == 0 {
		return
	}
	unclaim := func() {
		for key, e := range olds {
			c.unclaimRefresh(key, e)
		}
	}
	bctx := context.WithoutCancel(ctx)
	if !c.onExecutor(nil, func() {
		defer unclaim()
		c.runRefreshMany(bctx, keys, olds, load)
	}) {
		unclaim()
	}
}

// runRefreshMany is one background refresh of the values olds holds: one
// limiter slot for the batch, then, in the keys' flights, the lease of
// each key and one load of the keys this replica leased.
func (c *Cache[V]) runRefreshMany(ctx context.Context, keys []string, olds map[string]*entry[V], load BatchLoadFunc[V]) {
	// The value nearest to the middle of its stale window decides the
	// slot's urgency; the others share its fate.
	first := olds[keys[0]]
	for _, e := range olds {
		if e.midStale() < first.midStale() {
			first = e
		}
	}
	release, ok := c.refreshSlot(ctx, first)
	if !ok {
		for _, e := range olds {
			e.shed.Store(first.shed.Load())
			e.retryAt.Store(max(e.retryAt.Load(), min(first.retryAt.Load(), e.midStale())))
		}
		return
	}
	defer release()
	res := c.flyMany(ctx, keys, func(fctx context.Context, led []string, settle func(string, *entry[V], error)) {
		c.fillMany(fctx, led, load, callOpts{}, olds, settle, false)
	})
	for j, key := range keys {
		if err := res[j].Err; err != nil {
			c.st.refreshFailures.add(1)
			c.event(EventRefreshFailed, key, err)
			c.backOff(olds[key], 0)
		}
	}
}

// batchFill is one batch's work inside its keys' flights: the stages of
// fill, each made for every key of the batch at once.
type batchFill[V any] struct {
	c      *Cache[V]
	load   BatchLoadFunc[V]
	settle func(string, *entry[V], error)
	// refresh is set for a background refresh, whose slot is taken.
	refresh bool
	leases  *leaseBatch
	// hits holds the keys the Store served fresh, with how: each counts so
	// (a hit or a negative) when the batch counts its keys, and every other
	// key as a miss.
	hits map[string]GetResult
}

// pendingLoad is a key of a batch that this replica loads: under held, or
// without a lease (held nil). early is set when its callers were served a
// stale value already and the load refreshes it.
type pendingLoad[V any] struct {
	f     *fillState[V]
	held  *heldLease
	early bool
}

// loser is a key of a batch whose lease another replica holds.
type loser[V any] struct {
	f *fillState[V]
	a attempt[V]
}

// fillMany fills the keys led, whose flights this batch started: a miss of
// each (olds nil) or the refresh of olds' values. It settles every key it
// can serve from the tiers, loads the keys this replica may load in one
// call per MaxBatch, and only then applies the loser policy to the keys
// another replica is loading (lose).
func (c *Cache[V]) fillMany(ctx context.Context, led []string, load BatchLoadFunc[V], co callOpts, olds map[string]*entry[V], settle func(string, *entry[V], error), count bool) {
	b := &batchFill[V]{c: c, load: load, settle: settle, refresh: olds != nil, leases: newLeaseBatch(), hits: map[string]GetResult{}}
	defer c.closeLeases(ctx, b.leases)
	if count {
		// Each key is counted before its callers see it: as a hit when the
		// Store served it fresh, as a miss otherwise, or as a miss when the
		// batch failed before settling it.
		counted := make(map[string]bool, len(led))
		var mu sync.Mutex
		countOnce := func(key string) {
			mu.Lock()
			defer mu.Unlock()
			if counted[key] {
				return
			}
			counted[key] = true
			if r, ok := b.hits[key]; ok {
				c.got(key, r)
				if r == ResultHit {
					c.st.remoteHits.add(1)
				}
			} else {
				c.got(key, ResultMiss)
			}
		}
		b.settle = func(key string, e *entry[V], err error) {
			countOnce(key)
			settle(key, e, err)
		}
		defer func() {
			for _, key := range led {
				countOnce(key)
			}
		}()
	}
	fs := make([]*fillState[V], 0, len(led))
	for _, key := range led {
		f := c.newFill(key, foreground, co)
		if old := olds[key]; old != nil {
			f.mode, f.old = background, old
		}
		if e := f.recheckLocal(); e != nil {
			b.settle(key, e, nil)
			continue
		}
		fs = append(fs, f)
	}
	if len(fs) == 0 {
		return
	}
	loads, losers := b.remote(ctx, fs)
	b.loadAll(ctx, loads)
	if len(losers) > 0 {
		b.lose(ctx, losers)
	}
}

// remote is the Store and lease stage of a batch: it settles the keys the
// remote tier serves and sorts the rest into those to load and the losers.
func (b *batchFill[V]) remote(ctx context.Context, fs []*fillState[V]) (loads []pendingLoad[V], losers []loser[V]) {
	c := b.c
	switch {
	case c.cfg.Store == nil || !c.brk.allow():
		for _, f := range fs {
			loads = b.plan(loads, f, nil)
		}
		return loads, nil
	case c.cfg.Lease == nil || b.load == nil:
		// Without a lease (or with nothing to load with, so taking no lease)
		// the Store's value settles a key, as in fill.
		for _, f := range b.fromReads(ctx, fs) {
			loads = b.plan(loads, f, nil)
		}
		return loads, nil
	}
	var ask, told []*fillState[V]
	held := make(map[*fillState[V]]attempt[V])
	for _, f := range fs {
		if a, ok := c.heldElsewhere(f.key, f.now); ok {
			told = append(told, f)
			held[f] = a
		} else {
			ask = append(ask, f)
		}
	}
	// No lease attempt for a key before its holder's notice or time: read
	// what the Store holds, to serve it or to serve it stale.
	for _, f := range b.fromReads(ctx, told) {
		if f.mode == background {
			b.settle(f.key, f.old, nil)
			continue
		}
		losers = append(losers, loser[V]{f: f, a: held[f]})
	}
	if len(ask) > 0 {
		return b.fromLeases(ctx, ask, loads, losers)
	}
	return loads, losers
}

// fromReads reads the keys of fs from the Store, settles those it serves
// and returns the others.
func (b *batchFill[V]) fromReads(ctx context.Context, fs []*fillState[V]) (rest []*fillState[V]) {
	if len(fs) == 0 {
		return nil
	}
	reads := b.c.loadMany(ctx, fs)
	for i, f := range fs {
		if e := f.recheckStore(ctx, reads[i]); e != nil {
			b.fromStore(f, e)
			continue
		}
		rest = append(rest, f)
	}
	return rest
}

// fromLeases asks for the leases of the keys of fs, settles those the
// answers serve, and adds the others to the keys to load (this replica's
// leases) and the losers (another's).
func (b *batchFill[V]) fromLeases(ctx context.Context, fs []*fillState[V], loads []pendingLoad[V], losers []loser[V]) ([]pendingLoad[V], []loser[V]) {
	c := b.c
	for i, got := range c.acquireMany(ctx, fs) {
		f := fs[i]
		a, err := c.grantAttempt(ctx, f.key, got.Grant, got.Err)
		if err != nil {
			b.settle(f.key, nil, err)
			continue
		}
		f.remoteUp = got.Err == nil
		if got.Stale != nil && f.mode == foreground {
			if e, ok := c.decode(f.key, got.Stale); ok && f.now < e.hard && c.usable(e) {
				f.candidate = e
			}
		}
		switch a.outcome {
		case leaseHeld:
			if f.mode == background {
				c.backOff(f.old, 0) // and grantAttempt remembered the holder
				b.settle(f.key, f.old, nil)
			} else {
				losers = append(losers, loser[V]{f: f, a: a})
			}
			continue
		case leaseFailed:
			if cand := f.candidate; cand != nil && f.mode == foreground && (f.now < cand.soft || f.staleOK()) {
				b.settle(f.key, cand, nil)
				continue
			}
		}
		held, e := f.settleAttempt(a)
		if e != nil {
			if f.mode == background {
				c.setLocal(f.key, e, f.gen)
			}
			b.fromStore(f, e)
			continue
		}
		loads = b.plan(loads, f, b.leases.hold(held))
	}
	return loads, losers
}

// fromStore settles f with e, a value the Store holds.
func (b *batchFill[V]) fromStore(f *fillState[V], e *entry[V]) {
	if f.mode == foreground && !e.stale(b.c.clk.now()) {
		b.hits[f.key] = e.freshResult()
	}
	b.settle(f.key, e, nil)
}

// plan adds f to the keys to load under held. A miss whose callers may be
// served the stale value the Store holds, and that took the lease, is
// settled with it now; its load goes on as a refresh of it.
func (b *batchFill[V]) plan(loads []pendingLoad[V], f *fillState[V], held *heldLease) []pendingLoad[V] {
	if b.load == nil {
		b.settle(f.key, nil, ErrNoLoader)
		return loads
	}
	p := pendingLoad[V]{f: f, held: held}
	if cand := f.candidate; held != nil && cand != nil && f.staleOK() && f.now < cand.hard && cand.refreshing.CompareAndSwap(false, true) {
		b.c.setLocal(f.key, cand, f.gen)
		b.settle(f.key, cand, nil)
		f.mode, f.old, p.early = background, cand, true
		b.c.st.staleRefreshes.add(1)
	}
	return append(loads, p)
}

// lose applies the loser policy to every loser at once, each on a
// goroutine of its own, and loads a key as soon as its wait ends with this
// replica to load it (the lease came here, or the wait timed out and
// LoadOnLeaseTimeout is set, or the tier failed), with the others whose
// waits have ended by then: a key leased here is never held while this
// batch waits for others. Were it held, two replicas that each took a
// lease the other waits on would stall each other until LeaseWait.
func (b *batchFill[V]) lose(ctx context.Context, losers []loser[V]) {
	// The holders may have finished while this batch loaded its own keys,
	// before a wait could hear of it: read what the Store holds first.
	fs := make([]*fillState[V], len(losers))
	for i, l := range losers {
		fs[i] = l.f
	}
	waiting := make(map[*fillState[V]]bool, len(fs))
	for _, f := range b.fromReads(ctx, fs) {
		waiting[f] = true
	}
	losers = slices.DeleteFunc(losers, func(l loser[V]) bool { return !waiting[l.f] })
	if len(losers) == 0 {
		return
	}
	ch := make(chan waited[V], len(losers))
	stops := make(map[*fillState[V]]context.CancelFunc, len(losers))
	for _, l := range losers {
		lctx, stop := context.WithCancel(ctx)
		stops[l.f] = stop
		go func() {
			a, err := l.f.lose(lctx, l.a)
			ch <- waited[V]{l, a, err}
		}()
	}
	left := len(losers)
	defer func() { b.abandon(ctx, ch, left, stops) }()
	// A holder may also finish between that read and the start of its
	// loser's wait, which then hears nothing until its first re-read: one
	// read of every key still waited for, soon after the waits begin, ends
	// those waits at once.
	recheck := time.NewTimer(loserRecheck)
	defer recheck.Stop()
	for left > 0 {
		select {
		case <-recheck.C:
			b.recheckLosers(ctx, stops)
			if len(stops) == 0 {
				return
			}
		case w := <-ch:
			var loads []pendingLoad[V]
			for more := true; more; {
				left--
				loads = b.arrived(ctx, loads, w, stops)
				select {
				case w = <-ch:
				default:
					more = false
				}
			}
			b.loadAll(ctx, loads)
		}
	}
}

// waited is how one loser's wait ended.
type waited[V any] struct {
	l   loser[V]
	a   attempt[V]
	err error
}

// arrived settles the loser whose wait ended with w, or adds it to loads
// when this replica must load it; a loser the re-read settled already
// (no longer in stops) gives back a lease its wait took.
func (b *batchFill[V]) arrived(ctx context.Context, loads []pendingLoad[V], w waited[V], stops map[*fillState[V]]context.CancelFunc) []pendingLoad[V] {
	stop, ok := stops[w.l.f]
	if !ok {
		if w.err == nil && w.a.outcome == leaseGranted {
			b.c.endLease(ctx, heldFrom(w.l.f.key, w.a.grant), nil, 0, nil)
		}
		return loads
	}
	delete(stops, w.l.f)
	stop()
	return b.lost(loads, w.l.f, w.a, w.err)
}

// abandon stops the left waits still running (after a panic of the
// loader, or once the re-read settled every loser) and, as they end, gives
// back any lease one of them took.
func (b *batchFill[V]) abandon(ctx context.Context, ch <-chan waited[V], left int, stops map[*fillState[V]]context.CancelFunc) {
	for _, stop := range stops {
		stop()
	}
	if left == 0 {
		return
	}
	go func() {
		for range left {
			if w := <-ch; w.err == nil && w.a.outcome == leaseGranted {
				b.c.endLease(ctx, heldFrom(w.l.f.key, w.a.grant), nil, 0, nil)
			}
		}
	}()
}

// loserRecheck is how soon after its losers begin to wait a batch reads
// their keys once more.
const loserRecheck = 5 * time.Millisecond

// recheckLosers reads the keys of the losers still waiting (stops holds
// their waits' stop functions) and settles each that the Store holds fresh
// now, stopping its wait.
func (b *batchFill[V]) recheckLosers(ctx context.Context, stops map[*fillState[V]]context.CancelFunc) {
	fs := make([]*fillState[V], 0, len(stops))
	for f := range stops {
		fs = append(fs, f)
	}
	c := b.c
	now := c.clk.now()
	for i, r := range c.loadMany(ctx, fs) {
		if e := r.e; e != nil && now < e.soft {
			f := fs[i]
			c.setLocal(f.key, e, r.gen)
			stops[f]()
			delete(stops, f)
			b.fromStore(f, e)
		}
	}
}

// lost settles a loser whose wait ended with a or err, or adds it to loads
// when this replica must load it.
func (b *batchFill[V]) lost(loads []pendingLoad[V], f *fillState[V], a attempt[V], err error) []pendingLoad[V] {
	if err != nil {
		if errors.Is(err, ErrLeaseTimeout) && b.c.cfg.LoadOnLeaseTimeout {
			f.remoteUp = false // load, and write nothing remotely
			return b.plan(loads, f, nil)
		}
		b.settle(f.key, nil, err)
		return loads
	}
	held, e := f.settleAttempt(a)
	if e != nil {
		b.settle(f.key, e, nil)
		return loads
	}
	return b.plan(loads, f, b.leases.hold(held))
}

// loadAll loads loads with one call of the batch loader per MaxBatch keys,
// each under one limiter slot (taken already by a background refresh), and
// settles each key with its value or error. One watchdog extends the
// batch's leases meanwhile; each call's values are written back together.
func (b *batchFill[V]) loadAll(ctx context.Context, loads []pendingLoad[V]) {
	if len(loads) == 0 {
		return
	}
	c := b.c
	defer func() {
		for _, p := range loads {
			c.endLease(ctx, p.held, nil, 0, nil) // unless its write-back ended it
			if p.early {
				p.f.old.refreshing.Store(false)
			}
		}
		c.flushLeases(ctx, b.leases)
	}()
	if slices.ContainsFunc(loads, func(p pendingLoad[V]) bool { return p.held != nil }) {
		defer c.watchLeases(ctx, b.leases)()
	}
	size := c.cfg.MaxBatch
	if size <= 0 {
		size = len(loads)
	}
	for start := 0; start < len(loads); start += size {
		chunk := loads[start:min(start+size, len(loads))]
		b.loadChunk(ctx, chunk)
		c.flushLeases(ctx, b.leases)
	}
}

// loadChunk makes one call of the batch loader, under one limiter slot,
// for chunk.
func (b *batchFill[V]) loadChunk(ctx context.Context, chunk []pendingLoad[V]) {
	c := b.c
	if !b.refresh {
		release, err := chunk[0].f.takeSlot(ctx)
		if err != nil {
			for _, p := range chunk {
				b.failed(ctx, p, err)
			}
			return
		}
		defer release()
	}
	keys := make([]string, len(chunk))
	for i, p := range chunk {
		keys[i] = p.f.key
	}
	vals, delta, ds, err := c.runBatchLoad(ctx, keys, b.load, b.refresh)
	if err == nil {
		var tags []string
		for _, k := range keys {
			tags = append(tags, ds.of(k).tags...)
		}
		c.learnTags(ctx, tags) // the versions as of now, to judge the loads by
	}
	for _, p := range chunk {
		v, lerr := vals[p.f.key], err
		if _, ok := vals[p.f.key]; !ok && lerr == nil {
			lerr = ErrNotFound
		}
		e, serr := p.f.stored(ctx, v, delta, ds.of(p.f.key), lerr, p.held)
		if p.early {
			if serr != nil {
				c.st.refreshFailures.add(1)
				c.event(EventRefreshFailed, p.f.key, serr)
				c.backOff(p.f.old, 0)
			}
			continue // settled already, with the stale value
		}
		b.settle(p.f.key, e, serr)
	}
}

// failed settles p, which could not be loaded, with err, or with its stale
// candidate when its callers may be served one.
func (b *batchFill[V]) failed(ctx context.Context, p pendingLoad[V], err error) {
	b.c.endLease(ctx, p.held, nil, 0, nil)
	if p.early {
		b.c.backOff(p.f.old, 0)
		return
	}
	b.settle(p.f.key, nil, err)
}

// runBatchLoad calls load with keys and measures it, as runLoad does for
// one key, with the decisions its load made for each key.
func (c *Cache[V]) runBatchLoad(ctx context.Context, keys []string, load BatchLoadFunc[V], background bool) (vals map[string]V, elapsed time.Duration, ds *batchDirectives, err error) {
	ds = &batchDirectives{}
	elapsed, err = c.timeLoad(context.WithValue(ctx, batchDirectivesKey{}, ds), keys, background, func(lctx context.Context) (err error) {
		vals, err = load(lctx, keys)
		return err
	})
	return vals, elapsed, ds, err
}

// oneOf is the load of key through a batch loader.
func oneOf[V any](key string, load BatchLoadFunc[V]) LoadFunc[V] {
	return func(ctx context.Context) (V, error) {
		ds := &batchDirectives{}
		vals, err := load(context.WithValue(ctx, batchDirectivesKey{}, ds), []string{key})
		if d, ok := ctx.Value(directivesKey{}).(*directives); ok {
			*d = ds.of(key)
		}
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
// SetTTL of the same load. Outside a batch load it does nothing.
func SetTTLFor(ctx context.Context, key string, soft, hard time.Duration) {
	if ds, ok := ctx.Value(batchDirectivesKey{}).(*batchDirectives); ok && soft > 0 {
		ds.update(key, false, func(d *directives) { d.soft, d.hard = soft, hard })
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

// loadMany reads the keys of fs from the Store: one call when it is a
// [BatchStore], one per key otherwise. The breaker records one outcome for
// the batch.
func (c *Cache[V]) loadMany(ctx context.Context, fs []*fillState[V]) []remoteRead[V] {
	reads := make([]remoteRead[V], len(fs))
	keys := make([]string, len(fs))
	for i, f := range fs {
		keys[i] = f.key
		reads[i].done = true
		reads[i].gen, reads[i].puts = c.gens.get(f.key)
	}
	var got []Loaded
	at := c.brk.at()
	if bs, ok := c.cfg.Store.(BatchStore); ok {
		got = bs.LoadMany(ctx, keys)
	} else {
		got = make([]Loaded, len(keys))
		for i, k := range keys {
			got[i].Value, got[i].Err = c.cfg.Store.Load(ctx, k)
		}
	}
	c.remoteDone(ctx, at, firstErr(got, func(l Loaded) error { return l.Err }))
	envs := make([][]byte, len(got))
	for i, l := range got {
		envs[i] = l.Value
	}
	c.fetchTags(ctx, envs...)
	for i, l := range got[:len(keys)] {
		c.readOf(&reads[i], keys[i], l.Value, l.Err)
	}
	return reads
}

// acquireMany asks for the leases of the keys of fs, each fresh after its
// fill's start (a miss) or its old value's soft expiry (a refresh): one
// call when the Lease is a [BatchLease], and otherwise one Acquire per key,
// with a read of the Store for each key whose value was not returned.
func (c *Cache[V]) acquireMany(ctx context.Context, fs []*fillState[V]) []Acquired {
	reqs := make([]LeaseRequest, len(fs))
	for i, f := range fs {
		after := f.now
		if f.old != nil {
			after = max(after, f.old.soft) // only a value refreshed meanwhile stops it
		}
		reqs[i] = LeaseRequest{Key: f.key, After: time.Unix(0, after)}
	}
	ttl := c.cfg.LeaseTTL
	var got []Acquired
	at := c.brk.at()
	if bl, ok := c.cfg.Lease.(BatchLease); ok {
		got = bl.AcquireMany(ctx, reqs, ttl)
	} else {
		got = make([]Acquired, len(reqs))
		for i, r := range reqs {
			got[i].Grant, got[i].Err = c.cfg.Lease.Acquire(ctx, r.Key, ttl, r.After)
			if got[i].Err == nil && got[i].Value == nil {
				got[i].Stale, _ = c.cfg.Store.Load(ctx, r.Key)
			}
		}
	}
	c.remoteDone(ctx, at, firstErr(got, func(a Acquired) error { return a.Err }))
	envs := make([][]byte, 0, 2*len(got))
	for _, a := range got {
		envs = append(envs, a.Value, a.Stale)
	}
	c.fetchTags(ctx, envs...)
	return got[:len(reqs)]
}

// firstErr returns the first error of a batch's outcomes, or nil.
func firstErr[T any](outs []T, err func(T) error) error {
	for _, o := range outs {
		if e := err(o); e != nil {
			return e
		}
	}
	return nil
}

// leaseBatch is the leases one batch holds: one watchdog extends them all,
// and their ends (write-back and release) are sent together.
type leaseBatch struct {
	mu   sync.Mutex
	live map[*heldLease]struct{} // held and not yet ended
	ends []leaseEnd              // ended, not yet sent
}

func newLeaseBatch() *leaseBatch { return &leaseBatch{live: make(map[*heldLease]struct{})} }

// hold adds h, a lease just taken, to the batch; a nil h is none.
func (b *leaseBatch) hold(h *heldLease) *heldLease {
	if h == nil {
		return nil
	}
	h.batch = b
	b.mu.Lock()
	b.live[h] = struct{}{}
	b.mu.Unlock()
	return h
}

// end records the end of a lease of the batch, to be sent by flush.
func (b *leaseBatch) end(e leaseEnd) {
	b.mu.Lock()
	delete(b.live, e.h)
	b.ends = append(b.ends, e)
	b.mu.Unlock()
}

// take returns the ends recorded so far, for the caller to send.
func (b *leaseBatch) take() []leaseEnd {
	b.mu.Lock()
	defer b.mu.Unlock()
	ends := b.ends
	b.ends = nil
	return ends
}

// snapshot returns the leases still held.
func (b *leaseBatch) snapshot() []*heldLease {
	b.mu.Lock()
	defer b.mu.Unlock()
	hs := make([]*heldLease, 0, len(b.live))
	for h := range b.live {
		hs = append(hs, h)
	}
	return hs
}

// lost drops h from the batch's live leases: its lease is gone.
func (b *leaseBatch) lost(h *heldLease) {
	b.mu.Lock()
	delete(b.live, h)
	b.mu.Unlock()
}

// flushLeases sends the ends of b's leases recorded so far.
func (c *Cache[V]) flushLeases(ctx context.Context, b *leaseBatch) {
	if ends := b.take(); len(ends) > 0 {
		c.flushEnds(ctx, ends)
	}
}

// closeLeases ends the batch b: a lease still held (its load never ran, as
// when the batch panicked) is released, and every end is sent.
func (c *Cache[V]) closeLeases(ctx context.Context, b *leaseBatch) {
	for _, h := range b.snapshot() {
		c.endLease(ctx, h, nil, 0, nil)
	}
	c.flushLeases(ctx, b)
}

// watchLeases starts b's watchdog, as watchdog does for one lease: every
// LeaseTTL/3 it extends the leases still held, in one call when the Lease
// is a [BatchLease], until none is.
func (c *Cache[V]) watchLeases(ctx context.Context, b *leaseBatch) (stop func()) {
	return c.everyThird(ctx, func() bool { return c.extendMany(ctx, b) })
}

// extendMany is one round of a batch's watchdog, each extension bounded by
// LeaseTTL/6 as a single lease's; it reports whether leases remain.
func (c *Cache[V]) extendMany(ctx context.Context, b *leaseBatch) bool {
	hs := b.snapshot()
	if len(hs) == 0 {
		return false
	}
	ttl := c.cfg.LeaseTTL
	ectx, cancel := context.WithTimeout(ctx, ttl/6)
	defer cancel()
	outs := make([]Outcome, len(hs))
	at := c.brk.at()
	if bl, ok := c.cfg.Lease.(BatchLease); ok {
		keys := make([]HeldKey, len(hs))
		for i, h := range hs {
			keys[i] = HeldKey{Key: h.key, Token: h.token}
		}
		copy(outs, bl.ExtendMany(ectx, keys, ttl))
	} else {
		for i, h := range hs {
			outs[i].OK, outs[i].Err = c.cfg.Lease.Extend(ectx, h.key, h.token, ttl)
		}
	}
	c.remoteDone(ectx, at, firstErr(outs, func(o Outcome) error { return o.Err }))
	for i, o := range outs {
		if !c.extended(hs[i].key, o.OK, o.Err) {
			b.lost(hs[i])
		}
	}
	return true
}

// flushEnds sends the ends of a batch's leases in the background: the
// write-back of each value loaded and the release of each lease.
func (c *Cache[V]) flushEnds(ctx context.Context, ends []leaseEnd) {
	c.goBackground(func() {
		rctx, cancel := c.remoteCtx(ctx)
		defer cancel()
		outs := make([]Outcome, len(ends))
		at := c.brk.at()
		if bl, ok := c.cfg.Lease.(BatchLease); ok {
			writes := make([]HeldWrite, len(ends))
			for i, e := range ends {
				writes[i] = HeldWrite{HeldKey: HeldKey{Key: e.h.key, Token: e.h.token}, Env: e.env, Fence: e.h.fence, TTL: e.ttl}
			}
			copy(outs, bl.WriteReleaseMany(rctx, writes))
		} else {
			for i, e := range ends {
				if e.env == nil {
					outs[i].Err = c.cfg.Lease.Release(rctx, e.h.key, e.h.token)
					continue
				}
				outs[i].OK, outs[i].Err = c.writeRelease(rctx, e.h, e.env, e.ttl)
			}
		}
		c.remoteDone(rctx, at, firstErr(outs, func(o Outcome) error { return o.Err }))
		for i, e := range ends {
			c.leaseEnded(e, outs[i].OK, outs[i].Err)
		}
	})
}
