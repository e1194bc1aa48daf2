package herd

import (
	"cmp"
	"context"
	"errors"
	"slices"
	"sync/atomic"
	"time"

	"github.com/herdcache/herd/flight"
	"github.com/herdcache/herd/limiter"
	"github.com/herdcache/herd/observe"
	"github.com/herdcache/herd/remote"
)

// The fill: the one pipeline of a miss (Get's, as a batch of one key, or
// GetMany's) and of a refresh (one value or many). It runs inside the
// flights of its keys, and its stages read top to bottom, each made for
// every key of the batch at once, each settling the keys it can and
// passing the others on:
//
//	recheckLocal   a flight that finished just before put a value here
//	remote         the Store (fromReads) or, with a Lease, the lease
//	               (fromLeases): a value, a lease to load under, or a loser
//	loadAll        a limiter slot and one loader call per MaxBatch keys
//	stored         the value handed to the flight's callers, then store:
//	               the local tier and the write-back with the lease's end
//	lose           the loser policy for keys another replica loads (losers.go)
//
// A background refresh takes its limiter slot before its flights
// (refresh.go), so that a refresh that would be shed touches no remote key.

// mode says whom a fill works for.
type mode uint8

const (
	// foreground: a miss, whose callers wait for the result.
	foreground mode = iota
	// background: a refresh, whose readers are served the old entry
	// meanwhile.
	background
)

// fillState is what the stages of one fill share.
type fillState[V any] struct {
	c    *Cache[V]
	key  string
	mode mode
	co   callOpts
	// old is the entry a background refresh replaces; nil for a miss.
	old *entry[V]
	// gen and puts are key's generation and its stripe's count of local puts
	// when the fill began; now is when it began.
	gen, puts uint64
	now       int64
	// candidate is a stale entry, served to lease losers and on load errors.
	candidate *entry[V]
	// remoteUp says the fill uses the remote tier (lease and write-back);
	// it is decided once, so that a half-open breaker's probe goes on using
	// the remote tier for the rest of its fill.
	remoteUp bool
	// pre is the Store read a Get made just before starting the fill's
	// flight; zero when there was none.
	pre remoteRead[V]
	// mark is the key's count when the batch counts its keys.
	mark atomic.Uint32
}

func (c *Cache[V]) newFill(key string, m mode, co callOpts) *fillState[V] {
	f := new(fillState[V])
	c.initFill(f, key, m, co)
	return f
}

func (c *Cache[V]) initFill(f *fillState[V], key string, m mode, co callOpts) {
	c.initFillAt(f, key, m, co, c.clk.now())
}

// initFillAt is initFill for a fill that began at now.
func (c *Cache[V]) initFillAt(f *fillState[V], key string, m mode, co callOpts, now int64) {
	*f = fillState[V]{c: c, key: key, mode: m, co: co, now: now}
	f.gen, f.puts = c.gens.get(key)
}

// preCurrent reports whether pre is a read of the Store made before the
// fill that is still current: no load put a value in key's stripe since,
// so what the Store holds is what it read.
func (f *fillState[V]) preCurrent() bool { return f.pre.done && f.pre.puts == f.puts }

// wantsStale reports whether the fill needs the stale value the Store
// holds from its lease's answer: a miss that has not just read the Store.
// A refresh has its old value.
func (f *fillState[V]) wantsStale() bool { return f.mode == foreground && !f.preCurrent() }

// staleOK reports whether this fill may settle with a stale value.
// A miss with Accept serves only what its caller accepts.
func (f *fillState[V]) staleOK() bool {
	return f.mode == foreground && !f.co.noStale && f.co.accept == nil
}

// settles reports whether e, found in a tier, settles the fill: for a miss
// a value it may serve, for a refresh a value newer than the one it
// replaces.
func (f *fillState[V]) settles(e *entry[V]) bool {
	if f.mode == background {
		return e != f.old && e.soft > f.old.soft
	}
	if f.co.accept != nil {
		return f.accepted(e)
	}
	return f.now < e.soft || f.staleOK()
}

// batchFill is one batch's work inside its keys' flights: the stages of
// fill, each made for every key of the batch at once.
type batchFill[V any] struct {
	c      *Cache[V]
	load   BatchLoadFunc[V]
	settle func(string, *entry[V], error)
	// refresh is set for a background refresh, whose slot is taken.
	refresh bool
	leases  *leaseSet
	// wakes hears of the completions that the batch's losers wait for.
	wakes *wakes
	// counting is set when the batch counts its keys before their callers
	// see them: each key the Store served fresh counts so (a hit or a
	// negative), every other key as a miss (fillState.mark).
	counting bool
	scratch  *scratch[V]
}

// scratch holds arrays that a batch's fill uses and is done with before
// the batch ends, no call it makes keeping them, recycled by later
// batches: each is taken (room) by one step at a time.
type scratch[V any] struct {
	reqs   []remote.LeaseRequest
	loads  []pendingLoad[V]
	losers []loser[V]
	reads  []remoteRead[V]
	keys   []string
}

// maxKeptScratch is the most keys whose arrays are recycled: a larger
// batch's are left to the garbage collector.
const maxKeptScratch = 1024

func (c *Cache[V]) newScratch() *scratch[V] {
	if s, ok := c.scratches.Get().(*scratch[V]); ok {
		return s
	}
	return new(scratch[V])
}

// freeScratch empties s and keeps it for a later batch.
func (c *Cache[V]) freeScratch(s *scratch[V]) {
	if max(cap(s.reqs), cap(s.loads), cap(s.losers), cap(s.reads), cap(s.keys)) > maxKeptScratch {
		return
	}
	clear(s.reqs[:cap(s.reqs)])
	clear(s.loads[:cap(s.loads)])
	clear(s.losers[:cap(s.losers)])
	clear(s.reads[:cap(s.reads)])
	clear(s.keys[:cap(s.keys)])
	c.scratches.Put(s)
}

// room returns *a emptied, with room for n elements, making it anew when
// it has less.
func room[T any](a *[]T, n int) []T {
	if cap(*a) < n {
		*a = make([]T, 0, n)
	}
	return (*a)[:0]
}

// Bits of fillState.mark, the count of a counting batch's key: counted
// once it was counted, servedFresh when the Store served it fresh, with
// how (an observe.GetResult) in the bits from resultShift up.
const (
	markCounted uint32 = 1 << iota
	markServedFresh
	resultShift = iota
)

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

// fly runs fn in key's flight, or alone under DisableCoalescing: every load
// runs through flight's one run loop, panics and Goexit handled there.
func (c *Cache[V]) fly(ctx context.Context, key string, fn func(context.Context) (*entry[V], error)) (*entry[V], error) {
	if c.cfg.DisableCoalescing {
		return c.flights.DoUnshared(ctx, key, fn)
	}
	e, err, _ := c.flights.Do(ctx, key, fn)
	return e, err
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

// fill is a miss's work inside its flight: the fill of a batch of one
// key (fillMany), with pre, the Store read its caller made just before
// starting the flight, used instead of reading again while it is current.
func (c *Cache[V]) fill(ctx context.Context, key string, load LoadFunc[V], co callOpts, pre remoteRead[V]) (e *entry[V], err error) {
	f := c.newFill(key, foreground, co)
	f.pre = pre
	err = errUnsettled
	c.fillMany(ctx, []*fillState[V]{f}, batchOf(key, load), false, func(_ string, v *entry[V], verr error) { e, err = v, verr }, false)
	return e, err
}

// errUnsettled is the error of a fill that ended without settling its key,
// which a fill does not do.
var errUnsettled = errors.New("herd: fill ended without a result")

// batchOf is load as the batch loader of key alone; nil for a nil load.
// Inside it, SetTTL, NoCache and Tags decide for key.
func batchOf[V any](key string, load LoadFunc[V]) BatchLoadFunc[V] {
	if load == nil {
		return nil
	}
	return func(ctx context.Context, _ []string) (map[string]V, error) {
		v, err := load(ctx)
		if err != nil {
			return nil, err
		}
		return map[string]V{key: v}, nil
	}
}

// fillMany fills fs, the fills of the keys whose flights this batch
// started: misses (foreground) or the refresh of their old values
// (background, with refresh set). It settles every key it can serve from
// the tiers, loads the keys this replica may load in one call per
// MaxBatch, and only then applies the loser policy to the keys another
// replica is loading (lose). With count, each key is counted as a hit or
// a miss before its callers see it.
func (c *Cache[V]) fillMany(ctx context.Context, fs []*fillState[V], load BatchLoadFunc[V], refresh bool, settle func(string, *entry[V], error), count bool) {
	b := &batchFill[V]{c: c, load: load, settle: settle, refresh: refresh, leases: newLeaseSet(), wakes: newWakes(), counting: count}
	b.scratch = c.newScratch()
	defer c.freeScratch(b.scratch)
	defer c.closeSet(ctx, b.leases)
	if count {
		defer b.countRest(fs)
	}
	rest := make([]*fillState[V], 0, len(fs))
	for _, f := range fs {
		if e := f.recheckLocal(); e != nil {
			b.done(f, e, nil)
			continue
		}
		rest = append(rest, f)
	}
	if len(rest) == 0 {
		return
	}
	loads, losers := b.remote(ctx, rest)
	b.loadAll(ctx, loads)
	if len(losers) > 0 {
		b.lose(ctx, losers, len(loads) > 0)
	}
}

// done settles f's key with e or err, counting it first when the batch
// counts its keys.
func (b *batchFill[V]) done(f *fillState[V], e *entry[V], err error) {
	if b.counting {
		f.countOnce()
	}
	b.settle(f.key, e, err)
}

// countRest counts each key of fs not counted yet, at the batch's end: a
// batch that failed before settling a key counts it as a miss.
func (b *batchFill[V]) countRest(fs []*fillState[V]) {
	for _, f := range fs {
		f.countOnce()
	}
}

// countOnce counts f's key once: as the Store served it fresh, or as a
// miss.
func (f *fillState[V]) countOnce() {
	m := f.mark.Load()
	for {
		if m&markCounted != 0 {
			return
		}
		if f.mark.CompareAndSwap(m, m|markCounted) {
			break
		}
		m = f.mark.Load()
	}
	c := f.c
	if m&markServedFresh == 0 {
		c.got(f.key, observe.ResultMiss)
		return
	}
	r := observe.GetResult(m >> resultShift)
	c.got(f.key, r)
	if r == observe.ResultHit {
		c.st.remoteHits.add(1)
	}
}

// servedFresh records, unless f's key was counted already, that the Store
// served it fresh, as r.
func (f *fillState[V]) servedFresh(r observe.GetResult) {
	for m := f.mark.Load(); m&markCounted == 0; m = f.mark.Load() {
		if f.mark.CompareAndSwap(m, markServedFresh|uint32(r)<<resultShift) {
			return
		}
	}
}

// newFills returns the fills of keys: misses with co, or, for each key
// olds holds, the refresh of its old value; free gives them back once the
// batch's fill has ended (nothing keeps a fill past its batch), to be
// reused by a later batch.
func (c *Cache[V]) newFills(keys []string, co callOpts, olds map[string]*entry[V]) (fs []*fillState[V], free func()) {
	blk, _ := c.fillBlocks.Get().(*fillBlock[V])
	if blk == nil || cap(blk.states) < len(keys) {
		blk = &fillBlock[V]{fs: make([]*fillState[V], len(keys)), states: make([]fillState[V], len(keys))}
	}
	fs, states := blk.fs[:len(keys)], blk.states[:len(keys)]
	now := c.clk.now() // the batch's fills begin together
	for i, key := range keys {
		fs[i] = &states[i]
		c.initFillAt(fs[i], key, foreground, co, now)
		if old := olds[key]; old != nil {
			fs[i].mode, fs[i].old = background, old
		}
	}
	return fs, func() {
		clear(states)
		clear(fs)
		c.fillBlocks.Put(blk)
	}
}

// fillBlock holds the fills of a batch, and is reused by later batches.
type fillBlock[V any] struct {
	fs     []*fillState[V]
	states []fillState[V]
}

// recheckLocal returns what a flight that finished just before this one put
// in the local tier, when it settles the fill; a stale or untrusted entry
// there becomes the candidate.
func (f *fillState[V]) recheckLocal() *entry[V] {
	e, ok := f.c.localGet(f.key)
	if !ok || f.now >= e.hard {
		return nil
	}
	if f.c.trusted(e, f.now) && f.settles(e) {
		return e
	}
	f.candidate = e
	return nil
}

// remote is the Store and lease stage of a batch: it settles the keys the
// remote tier serves and sorts the rest into those to load and the losers.
func (b *batchFill[V]) remote(ctx context.Context, fs []*fillState[V]) (loads []pendingLoad[V], losers []loser[V]) {
	c := b.c
	if c.cfg.Store == nil || !c.brk.allow() {
		for _, f := range fs {
			loads = b.plan(loads, f, nil)
		}
		return loads, nil
	}
	// When the breaker let this batch through as its probe and the batch
	// makes no remote call (what it read and heard settled every key), the
	// next call probes: a probe left open would keep every call away.
	defer c.brk.probeEnded(c.brk.at(), false)
	if c.cfg.Lease == nil || b.load == nil {
		// Without a lease (or with nothing to load with, so taking no lease)
		// the Store's value settles a key, as in fill.
		for _, f := range b.fromReads(ctx, fs) {
			loads = b.plan(loads, f, nil)
		}
		return loads, nil
	}
	ask, told, held := b.heldElsewhere(fs)
	// No lease attempt for a key before its holder's completion, notice or
	// time: read what the Store holds, to serve it or to serve it stale,
	// unless only the holder's value can settle the key (readsTold).
	var read []*fillState[V]
	for _, f := range told {
		if f.readsTold() {
			read = append(read, f)
		} else {
			f.remoteUp = true // the breaker let this fill use the remote tier
		}
	}
	rest := b.fromReads(ctx, read)
	for i, f := range told {
		switch {
		case !f.readsTold():
			losers = append(losers, loser[V]{f: f, a: held[i]})
		case len(rest) == 0 || rest[0] != f:
			held[i].giveUp() // the Store served it
		case f.mode == background:
			rest = rest[1:]
			held[i].giveUp()
			b.done(f, f.old, nil)
		default:
			rest = rest[1:]
			losers = append(losers, loser[V]{f: f, a: held[i]})
		}
	}
	if len(ask) > 0 {
		l, ls := b.fromLeases(ctx, ask)
		loads, losers = joined(loads, l), joined(losers, ls)
	}
	return loads, losers
}

// readsTold reports whether a fill whose key another load is known to hold
// reads the Store before it waits. A miss whose callers wait for the
// holder's value (the Wait policy, or NoStale), with no stale copy here,
// does not: the Store can hold no value it would serve, and the holder's
// completion, watched since before the hold was checked, ends its wait.
func (f *fillState[V]) readsTold() bool {
	return f.mode == background || f.candidate != nil || f.co.policy != Wait
}

// joined is append(a, b...), which is b itself when a is empty.
func joined[T any](a, b []T) []T {
	if len(a) == 0 {
		return b
	}
	return append(a, b...)
}

// fromReads reads the keys of fs from the Store, settles those it serves
// and returns the others.
func (b *batchFill[V]) fromReads(ctx context.Context, fs []*fillState[V]) (rest []*fillState[V]) {
	var ask []*fillState[V]
	for _, f := range fs {
		if !f.preCurrent() {
			ask = append(ask, f)
		}
	}
	reads := b.c.loadMany(ctx, ask, b.scratch)
	for _, f := range fs {
		rr := f.pre
		if !f.preCurrent() {
			rr, reads = reads[0], reads[1:]
		}
		if e := f.recheckStore(ctx, rr); e != nil {
			b.fromStore(f, e)
			continue
		}
		rest = append(rest, f)
	}
	return rest
}

// recheckStore returns a value from the Store that settles the fill,
// from rr, a current read of key, or read now when rr is zero; it decides
// whether the fill uses the remote tier. A failed read still tries the
// lease, unless it opened the breaker: one slow read must not make this
// replica load on its own. rr's gen predates the read, so an entry it
// found is refused by the local tier after any change since.
func (f *fillState[V]) recheckStore(ctx context.Context, rr remoteRead[V]) *entry[V] {
	c := f.c
	if !rr.done && c.cfg.Store != nil && c.brk.allow() {
		rr = c.loadRemote(ctx, f.key)
	}
	f.remoteUp = rr.done && (rr.err == nil || !c.brk.open())
	switch re := rr.e; {
	case !rr.done:
	case rr.err != nil:
		if cand := f.servableCandidate(); cand != nil {
			return cand
		}
	case rr.gone:
		f.candidate = nil // gone remotely: the local copy is not to be trusted
	case re != nil && f.now < re.hard:
		if f.settles(re) {
			c.setLocal(f.key, re, rr.gen)
			return re
		}
		f.candidate = re
	}
	return nil
}

// servableCandidate is the candidate, when a miss may serve it now that a
// remote call failed: fresh, or stale when the miss may serve stale, and
// never past its hard expiry, judged by the time after the call.
func (f *fillState[V]) servableCandidate() *entry[V] {
	cand := f.candidate
	if cand == nil || f.mode != foreground {
		return nil
	}
	now := f.c.clk.now()
	switch {
	case now >= cand.hard:
		return nil
	case f.co.accept != nil:
		if f.accepted(cand) {
			return cand
		}
		return nil
	case now < cand.soft || f.staleOK():
		return cand
	}
	return nil
}

// fromLeases asks for the leases of the keys of fs, settles those the
// answers serve, and adds the others to the keys to load (this replica's
// leases) and the losers (another's).
func (b *batchFill[V]) fromLeases(ctx context.Context, fs []*fillState[V]) (loads []pendingLoad[V], losers []loser[V]) {
	c := b.c
	if fs, loads = b.fromPre(ctx, fs); len(fs) == 0 {
		return loads, nil
	}
	reqs := leaseRequests(room(&b.scratch.reqs, len(fs)), fs)
	if loads == nil {
		loads = room(&b.scratch.loads, len(fs))
	}
	loads, losers = slices.Grow(loads, len(fs)), room(&b.scratch.losers, len(fs))
	keys := make([]string, len(reqs))
	for i, r := range reqs {
		keys[i] = r.Key
	}
	watches := c.watchAll(keys, b.wakes.wake) // before the attempts
	sent := c.clk.now()
	for i, got := range c.acquireMany(ctx, reqs, func(i int) bool { return fs[i].wantsStale() }) {
		f := fs[i]
		a, err := c.answerAttempt(ctx, f.key, got, sent, watches[i])
		if err != nil {
			b.done(f, nil, err)
			continue
		}
		loads, losers = b.answered(f, a, got, loads, losers)
	}
	return loads, losers
}

// fromPre settles the keys of fs whose caller has just read the Store by
// that read, when it can, as without a lease; it returns the keys to ask
// the lease for, and adds to loads those to load without it (the read
// opened the breaker).
func (b *batchFill[V]) fromPre(ctx context.Context, fs []*fillState[V]) (ask []*fillState[V], loads []pendingLoad[V]) {
	ask = make([]*fillState[V], 0, len(fs))
	for _, f := range fs {
		if !f.preCurrent() {
			ask = append(ask, f)
		} else if e := f.recheckStore(ctx, f.pre); e != nil {
			b.fromStore(f, e)
		} else if !f.remoteUp {
			loads = b.plan(loads, f, nil)
		} else {
			ask = append(ask, f)
		}
	}
	return ask, loads
}

// answered settles f by a, the lease's answer got, or adds it to the keys
// to load (this replica's lease) or to the losers (another's).
func (b *batchFill[V]) answered(f *fillState[V], a attempt[V], got remote.Acquired, loads []pendingLoad[V], losers []loser[V]) ([]pendingLoad[V], []loser[V]) {
	c := b.c
	f.remoteUp = got.Err == nil
	if got.Stale != nil && f.mode == foreground {
		if e, ok := c.decode(f.key, got.Stale, c.clk.now()); ok && f.now < e.hard && c.usable(e) {
			f.candidate = e
		}
	}
	switch a.outcome {
	case leaseHeld:
		if f.mode == foreground {
			return loads, append(losers, loser[V]{f: f, a: a})
		}
		a.giveUp()
		c.backOff(f.old, 0) // and grantAttempt remembered the holder
		b.done(f, f.old, nil)
		return loads, losers
	case leaseFailed:
		if cand := f.servableCandidate(); cand != nil {
			b.done(f, cand, nil)
			return loads, losers
		}
	}
	held, e := f.settleAttempt(a)
	if e == nil {
		return b.plan(loads, f, b.leases.add(held)), losers
	}
	if f.mode == background {
		c.setLocal(f.key, e, f.gen)
	}
	b.fromStore(f, e)
	return loads, losers
}

// settleAttempt is what a miss does with the last answer of the lease
// (not leaseHeld): the lease this replica took, or a value to serve, or
// neither, to load without a lease (written unfenced over an undecodable
// value, or not at all when the tier failed).
func (f *fillState[V]) settleAttempt(a attempt[V]) (*heldLease, *entry[V]) {
	switch a.outcome {
	case leaseGranted:
		return a.held, nil
	case leaseFound:
		if !a.e.stale(f.c.clk.now()) {
			f.c.setLocal(f.key, a.e, f.gen)
		}
		if f.mode == foreground && !f.accepted(a.e) {
			f.remoteUp = false // refused by Accept: load, and keep it here
			return nil, nil
		}
		return nil, a.e
	case leaseFailed:
		f.remoteUp = false
	}
	return nil, nil
}

// fromStore settles f with e, a value the Store holds.
func (b *batchFill[V]) fromStore(f *fillState[V], e *entry[V]) {
	if b.counting && f.mode == foreground && !e.stale(b.c.clk.now()) {
		f.servedFresh(e.freshResult())
	}
	b.done(f, e, nil)
}

// plan adds f to the keys to load under held. A miss whose callers may be
// served the stale value the Store holds, and that took the lease, is
// settled with it now; its load goes on as a refresh of it.
func (b *batchFill[V]) plan(loads []pendingLoad[V], f *fillState[V], held *heldLease) []pendingLoad[V] {
	if b.load == nil {
		b.done(f, nil, ErrNoLoader)
		return loads
	}
	p := pendingLoad[V]{f: f, held: held}
	if cand := f.candidate; held != nil && cand != nil && f.staleOK() && f.now < cand.hard && cand.refreshing.CompareAndSwap(false, true) {
		b.c.setLocal(f.key, cand, f.gen)
		b.done(f, cand, nil)
		f.mode, f.old, p.early = background, cand, true
		b.c.st.staleRefreshes.add(1)
	}
	return append(loads, p)
}

// takeSlot takes a foreground limiter slot, waiting in the limiter's queue;
// it comes after the lease, so that a loser never holds a slot while it
// waits. A background refresh took its slot before its flight.
func (f *fillState[V]) takeSlot(ctx context.Context) (release func(), err error) {
	l := f.c.cfg.Limiter
	if l == nil {
		return func() {}, nil
	}
	start := time.Now()
	err = l.Acquire(ctx)
	f.c.queueDur.observe(time.Since(start))
	if err != nil {
		var oe *limiter.OverloadError
		if errors.As(err, &oe) {
			f.c.shed(oe.Reason, false)
		}
		return nil, err
	}
	return l.Release, nil
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
			b.leases.release(p.held) // unless its write-back ended it
			if p.early {
				p.f.old.refreshing.Store(false)
			}
		}
		c.flushSet(ctx, b.leases)
	}()
	c.watchSet(ctx, b.leases)
	size := c.cfg.MaxBatch
	if size <= 0 {
		size = len(loads)
	}
	for start := 0; start < len(loads); start += size {
		chunk := loads[start:min(start+size, len(loads))]
		b.loadChunk(ctx, chunk, len(loads) > size)
		c.flushSet(ctx, b.leases)
	}
}

// loadChunk makes one call of the batch loader, under one limiter slot,
// for chunk. The slot is given back when the call returns, before the
// write-back: the limiter guards the backing store, and an adaptive one
// takes the time a slot is held for the store's latency. When the batch makes several (guarded), a call that panics or
// calls runtime.Goexit fails the keys of chunk only, and the batch's other
// calls still run; a batch's only call panics into its flights, as a Get's
// load does.
func (b *batchFill[V]) loadChunk(ctx context.Context, chunk []pendingLoad[V], guarded bool) {
	c := b.c
	release := func() {}
	if !b.refresh {
		r, err := chunk[0].f.takeSlot(ctx)
		if err != nil {
			for _, p := range chunk {
				b.failed(ctx, p, err)
			}
			return
		}
		release = r
	}
	keys := make([]string, len(chunk))
	for i, p := range chunk {
		keys[i] = p.f.key
	}
	var (
		vals  map[string]V
		delta time.Duration
		ds    *batchDirectives
	)
	call := func() (err error) {
		defer release() // when the load returns, or panics
		vals, delta, ds, err = c.runBatchLoad(ctx, keys, b.load, b.refresh)
		return err
	}
	var err error
	if guarded {
		err = guard(call)
	} else {
		err = call()
	}
	if ds == nil {
		ds = &batchDirectives{} // the load panicked or called runtime.Goexit
	}
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
		e, serr := p.f.stored(ctx, v, delta, ds.of(p.f.key), lerr, p.held, b.leases)
		if p.early {
			if serr != nil {
				c.st.refreshFailures.add(1)
				c.event(observe.EventRefreshFailed, p.f.key, serr)
				c.backOff(p.f.old, 0)
			}
			continue // settled already, with the stale value
		}
		b.done(p.f, e, serr)
	}
}

// failed settles p, which could not be loaded, with err, or with its stale
// candidate when its callers may be served one.
func (b *batchFill[V]) failed(ctx context.Context, p pendingLoad[V], err error) {
	b.leases.release(p.held)
	if p.early {
		b.c.backOff(p.f.old, 0)
		return
	}
	b.done(p.f, nil, err)
}

// stored settles a fill with what its load returned: v, or err, measured
// as delta, with the load's own decisions d.
func (f *fillState[V]) stored(ctx context.Context, v V, delta time.Duration, d directives, err error, held *heldLease, set *leaseSet) (*entry[V], error) {
	c := f.c
	now := c.clk.now()
	if err != nil {
		return f.loadFailed(ctx, err, held, set, now)
	}
	e := &entry[V]{value: v, delta: int64(delta)}
	if prev := cmp.Or(f.old, f.candidate); prev != nil {
		e.delta = max(e.delta, prev.delta/10*9) // see entry.delta
	}
	if d.noCache || !c.tagged(e, d, f.since(held)) {
		e.uncached = true // or invalidated by a tag while it loaded
		return e, nil
	}
	soft, hard := c.cfg.SoftTTL, c.cfg.HardTTL
	if d.soft > 0 {
		soft, hard = min(d.soft, MaxTTL), min(max(d.hard, d.soft), MaxTTL)
	}
	soft, hard = c.cfg.jitter.Pair(soft, hard, c.jitterDraw())
	e.soft, e.hard = addTime(now, soft), addTime(now, hard)
	c.setLead(f.key, e)
	c.store(ctx, f.key, e, held, set, f.remoteUp, f.gen)
	return e, nil
}

// since is when the fill's load began on the clock of tag versions: the
// fence of its lease, which the Store's clock gives, or else the
// replica's own clock at the fill's start.
func (f *fillState[V]) since(held *heldLease) uint64 {
	if held != nil && f.c.cfg.Store != nil {
		return held.fence
	}
	return uint64(max(f.now/1000, 0))
}

// loadFailed settles a fill whose load returned err: a not-found is
// remembered for NegativeTTL, a miss that may serve stale is served its
// candidate (stale-if-error), and any other error goes to the callers.
func (f *fillState[V]) loadFailed(ctx context.Context, err error, held *heldLease, set *leaseSet, now int64) (*entry[V], error) {
	c := f.c
	notFound := errors.Is(err, ErrNotFound)
	if notFound {
		c.st.loadsNotFound.add(1)
	} else {
		c.st.loadErrors.add(1)
	}
	if notFound && c.cfg.NegativeTTL > 0 {
		exp := addTime(now, c.cfg.NegativeTTL)
		e := &entry[V]{soft: exp, hard: exp, negative: true}
		c.store(ctx, f.key, e, held, set, f.remoteUp, f.gen)
		return e, nil
	}
	if cand := f.candidate; cand != nil && f.staleOK() && now < cand.hard {
		c.st.staleIfError.add(1)
		return cand, nil
	}
	return nil, err
}

// ttlLeft is how long e has left until its hard expiry, now.
func (c *Cache[V]) ttlLeft(e *entry[V]) time.Duration { return time.Duration(e.hard - c.clk.now()) }

// store puts a freshly loaded entry in the local tier and hands its remote
// write, with the end of held (a lease of set, nil when none is held), to
// the background, so that the load's callers get the value as soon as the
// load returns. Nothing is written to either tier when key was set or
// invalidated in this process since gen was read: with a lease the fence
// would refuse the write, without one this process's own order refuses it.
// A value loaded under a lease that could have lapsed meanwhile enters the
// local tier only once the Store has taken its write: another replica may
// have taken the lease over, or a change fenced it.
func (c *Cache[V]) store(ctx context.Context, key string, e *entry[V], held *heldLease, set *leaseSet, remoteUp bool, gen uint64) {
	var env []byte
	if remoteUp {
		var err error
		if env, err = c.encode(e); err != nil {
			c.st.encodeErrors.add(1)
			c.encodeFailed(ctx, key, err)
			return // a value the codec cannot encode is served, not cached
		}
		if held != nil {
			e.fence.Store(held.fence)
		}
		if c.cfg.NearTTL > 0 {
			e.near = addTime(c.clk.now(), c.cfg.NearTTL)
		}
	}
	if held != nil && env != nil && !held.heldAt(c.clk.now()) {
		if c.gens.changedSince(key, gen) {
			return // the fence refuses it, and the local tier must not take it
		}
		set.end(leaseEnd{h: held, env: env, ttl: c.ttlLeft(e), accepted: func() { c.setLocal(key, e, gen) }})
		return
	}
	unfenced := env != nil && held == nil
	if !c.publish(key, e, gen, unfenced) {
		return
	}
	switch {
	case held != nil:
		set.end(leaseEnd{h: held, env: env, ttl: c.ttlLeft(e), refused: func() { c.unpublish(key, e) }})
	case unfenced:
		c.goBackground(func() {
			defer c.gens.endWrite(key)
			ttl := c.ttlLeft(e)
			if ttl <= 0 {
				return
			}
			rctx, cancel := c.remoteCtx(ctx)
			defer cancel()
			at := c.brk.at()
			f, err := c.cfg.Store.Set(rctx, key, env, ttl)
			c.remoteDone(rctx, at, err)
			c.writeBackFailed(key, err)
			if err == nil {
				e.fence.Store(f)
			}
		})
	}
}
