package herd

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/herdcache/herd/limiter"
)

// The miss path. Get comes here when its local tier has nothing to serve:
// it reads the Store once per key per replica (readShared), and when that
// has nothing usable either, one flight per key runs fill, whose stages
// read top to bottom: re-check the local tier, re-check the Store, take the
// lease, take a limiter slot, load, write back. Each stage either settles
// the miss or passes it on. A background refresh (refresh.go) takes its
// slot and its lease before its flight, and runs the same stages after.

// mode says whom a fill works for.
type mode uint8

const (
	// foreground: a miss, whose callers wait for the result.
	foreground mode = iota
	// background: a refresh, whose readers are served the old entry
	// meanwhile.
	background
)

// miss serves key from the Store or, when it has nothing usable, from a
// flight of fill that it starts or joins.
func (c *Cache[V]) miss(ctx context.Context, key string, load LoadFunc[V], co callOpts) (V, error) {
	var zero V
	load = c.loader(key, load) // nil: serve what the tiers hold, or ErrNoLoader
	e, pre := c.readShared(ctx, key, co)
	if e != nil {
		if e.stale(c.clk.now()) {
			c.got(key, ResultStale)
			c.refresh(ctx, key, load, e, &c.st.staleRefreshes)
		} else {
			c.got(key, e.freshResult())
			if !pre.local && !e.negative {
				c.st.remoteHits.add(1)
			}
		}
		return c.served(e)
	}
	c.got(key, ResultMiss)
	for attempt := range maxMissAttempts {
		if attempt > 0 {
			if err := ctx.Err(); err != nil {
				return zero, fmt.Errorf("herd: %w", err)
			}
			pre = remoteRead[V]{} // out of date: the flight reads again
		}
		e, err := c.fly(ctx, key, func(fctx context.Context) (*entry[V], error) {
			return c.fill(fctx, key, load, co, pre)
		})
		if err != nil {
			return zero, err
		}
		if !e.stale(c.clk.now()) {
			return e.result()
		}
		// Served stale by the flight (from the Store or as a lease loser).
		if !co.noStale {
			c.countStale(key)
			c.refresh(ctx, key, load, e, &c.st.staleRefreshes)
			return e.result()
		}
	}
	return zero, errNoFresh(key)
}

// errNoFresh is the error of a NoStale miss of key that found no fresh
// value in maxMissAttempts.
func errNoFresh(key string) error {
	return fmt.Errorf("%w: %q: no fresh value after %d attempts", ErrNoFreshValue, key, maxMissAttempts)
}

// maxMissAttempts bounds the flights of one NoStale miss that keep finding
// a value that went stale before this caller could take it.
const maxMissAttempts = 4

// remoteRead is what one read of the Store found.
type remoteRead[V any] struct {
	done bool   // the read was made; the rest is unset otherwise
	gen  uint64 // the local generation read before it
	puts uint64 // the stripe's count of local puts read before it
	// local is set when no read was made: e was found in the local tier,
	// put there by a read that ended just before.
	local bool
	err   error
	// e is the decoded value; nil when there is none (gone) or it does not
	// decode.
	e    *entry[V]
	gone bool
}

// readShared reads key from the Store before any load's flight, sharing one
// read among the callers of key that arrive while it runs: a value another
// replica wrote is served at the cost of one round trip. It returns the
// entry to serve, or nil when the caller must go on to the flight (no
// Store, breaker open, nothing usable stored), with what the read found so
// that a flight this caller starts need not read again.
func (c *Cache[V]) readShared(ctx context.Context, key string, co callOpts) (*entry[V], remoteRead[V]) {
	if c.cfg.Store == nil || c.brk.open() {
		return nil, remoteRead[V]{} // a half-open breaker's probe is made inside the flight
	}
	r, err, _ := c.reads.Do(ctx, key, func(rctx context.Context) (remoteRead[V], error) {
		return c.sharedRead(rctx, key), nil
	})
	if err != nil || !r.local {
		c.st.remoteWaits.add(1)
	}
	if err != nil {
		return nil, remoteRead[V]{} // this caller's ctx ended: the flight reads again, or the caller leaves
	}
	if e := r.e; e != nil {
		now := c.clk.now()
		if now < e.soft || now < e.hard && !co.noStale {
			return e, r
		}
	}
	return nil, r
}

// sharedRead is the read of key that readShared and revalidate share: a
// value found is put in the local tier. A caller that missed the local tier
// just before the last shared read put its value there would start a read
// of its own: it re-checks the local tier first.
func (c *Cache[V]) sharedRead(ctx context.Context, key string) remoteRead[V] {
	if e, ok := c.localGet(key); ok {
		if now := c.clk.now(); now < e.hard && c.trusted(e, now) {
			r := remoteRead[V]{done: true, local: true, e: e}
			r.gen, r.puts = c.gens.get(key)
			return r
		}
	}
	r := c.loadRemote(ctx, key)
	if r.e != nil && c.clk.now() < r.e.hard {
		c.setLocal(key, r.e, r.gen)
		_, r.puts = c.gens.get(key) // the read is as new as its own put
	}
	return r
}

// revalidate replaces e, a copy of key served past NearTTL or superseded by
// a notice, with what the Store holds: one read in the background per copy,
// shared with any read of key on the reader's path. When the Store no
// longer holds a usable value, e is dropped; when the read fails, e is not
// revalidated again, and readers re-read once it is 2×NearTTL old.
func (c *Cache[V]) revalidate(ctx context.Context, key string, e *entry[V]) {
	if c.closed.Load() || !e.revalidating.CompareAndSwap(false, true) {
		return
	}
	bctx := context.WithoutCancel(ctx)
	c.goBackground(func() {
		r, _, _ := c.reads.Do(bctx, key, func(rctx context.Context) (remoteRead[V], error) {
			return c.sharedRead(rctx, key), nil
		})
		c.st.revalidations.add(1)
		if r.err == nil && r.e == nil {
			c.unpublish(key, e) // gone, or undecodable: the next read misses
		}
	})
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

// fill is a miss's work inside its flight. pre is the Store read its caller
// made just before starting the flight, used instead of reading again; a
// zero pre means read.
func (c *Cache[V]) fill(ctx context.Context, key string, load LoadFunc[V], co callOpts, pre remoteRead[V]) (*entry[V], error) {
	f := c.newFill(key, foreground, co)
	if e := f.recheckLocal(); e != nil {
		return e, nil
	}
	if e := f.recheckStore(ctx, pre); e != nil {
		return e, nil
	}
	if load == nil {
		// Nothing to load with: take neither the lease (which would advance
		// the fence) nor a limiter slot.
		return nil, ErrNoLoader
	}
	held, e, err := f.takeLease(ctx)
	if e != nil || err != nil {
		return e, err
	}
	defer c.endLease(ctx, held, nil, 0, nil) // unless the write-back ended it
	release, err := f.takeSlot(ctx)
	if err != nil {
		return nil, err
	}
	defer release()
	return f.loadAndStore(ctx, load, held)
}

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
}

func (c *Cache[V]) newFill(key string, m mode, co callOpts) *fillState[V] {
	f := &fillState[V]{c: c, key: key, mode: m, co: co, now: c.clk.now()}
	f.gen, f.puts = c.gens.get(key)
	return f
}

// staleOK reports whether this fill may settle with a stale value.
func (f *fillState[V]) staleOK() bool { return f.mode == foreground && !f.co.noStale }

// settles reports whether e, found in a tier, settles the fill: for a miss
// a value it may serve, for a refresh a value newer than the one it
// replaces.
func (f *fillState[V]) settles(e *entry[V]) bool {
	if f.mode == background {
		return e != f.old && e.soft > f.old.soft
	}
	return f.now < e.soft || f.staleOK()
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

// recheckStore returns a value from the Store that settles the fill, read
// now or taken from pre when no load put a value in key's stripe since; it
// decides whether the fill uses the remote tier. A failed read still tries
// the lease, unless it opened the breaker: one slow read must not make this
// replica load on its own.
func (f *fillState[V]) recheckStore(ctx context.Context, pre remoteRead[V]) *entry[V] {
	c := f.c
	rr := pre // its gen predates it: an entry it found is refused locally after any change since
	if rr.done && rr.puts != f.puts {
		rr = remoteRead[V]{} // a load finished since: what the Store holds may have changed
	}
	if !rr.done && c.cfg.Store != nil && c.brk.allow() {
		rr = c.loadRemote(ctx, f.key)
	}
	f.remoteUp = rr.done && (rr.err == nil || !c.brk.open())
	switch re := rr.e; {
	case !rr.done:
	case rr.err != nil:
		if cand := f.candidate; cand != nil && f.mode == foreground && (f.now < cand.soft || f.staleOK()) {
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

// takeLease settles a miss at the lease, when the fill uses the remote
// tier: it returns the lease this replica took (nil when it loads without
// one), or a value to serve, or an error. A replica that was told another
// holds the lease does not try it again before the holder's notice or its
// time; it goes straight to the loser policy.
func (f *fillState[V]) takeLease(ctx context.Context) (*heldLease, *entry[V], error) {
	c := f.c
	if !f.remoteUp || c.cfg.Lease == nil {
		return nil, nil, nil
	}
	a, told := c.heldElsewhere(f.key, f.now)
	if !told {
		// A value counts as fresh by both clocks, the Store's and this
		// replica's, so that a replica whose clock runs ahead loads instead
		// of being handed, again and again, a value it finds stale.
		var err error
		if a, err = c.tryLease(ctx, f.key, f.now); err != nil {
			return nil, nil, err
		}
	}
	if a.outcome == leaseHeld {
		var err error
		if a, err = f.lose(ctx, a); err != nil {
			if errors.Is(err, ErrLeaseTimeout) && c.cfg.LoadOnLeaseTimeout {
				f.remoteUp = false // load, and write nothing remotely
				return nil, nil, nil
			}
			return nil, nil, err
		}
	}
	held, e := f.settleAttempt(a)
	if held != nil {
		c.hold(ctx, held)
	}
	return held, e, nil
}

// settleAttempt is what a miss does with the last answer of the lease
// (not leaseHeld): the lease this replica took, with no watchdog yet, or a
// value to serve, or neither, to load without a lease (written unfenced
// over an undecodable value, or not at all when the tier failed).
func (f *fillState[V]) settleAttempt(a attempt[V]) (*heldLease, *entry[V]) {
	switch a.outcome {
	case leaseGranted:
		return heldFrom(f.key, a.grant), nil
	case leaseFound:
		if !a.e.stale(f.c.clk.now()) {
			f.c.setLocal(f.key, a.e, f.gen)
		}
		return nil, a.e
	case leaseFailed:
		f.remoteUp = false
	}
	return nil, nil
}

// lose applies the loser policy to a lease another replica holds: serve the
// candidate, fail fast, or wait for the holder.
func (f *fillState[V]) lose(ctx context.Context, a attempt[V]) (attempt[V], error) {
	c, co := f.c, f.co
	if cand := f.candidate; cand != nil && !co.noStale && co.policy != Wait && c.clk.now() < cand.hard {
		return attempt[V]{outcome: leaseFound, e: cand}, nil
	}
	if co.policy == FailFast {
		return a, ErrLeaseHeld
	}
	return c.waitHolder(ctx, f.key, a.until)
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

// loadAndStore is the last stage of a fill: it loads, hands the value to
// the flight's callers and the local tier, and writes it back under held
// (nil: unfenced, or not at all when the fill does not use the remote tier).
func (f *fillState[V]) loadAndStore(ctx context.Context, load LoadFunc[V], held *heldLease) (*entry[V], error) {
	c := f.c
	v, delta, d, err := c.runLoad(ctx, f.key, load, f.mode == background)
	if err == nil {
		c.learnTags(ctx, d.tags) // the versions as of now, to judge the load by
	}
	return f.stored(ctx, v, delta, d, err, held)
}

// stored settles a fill with what its load returned: v, or err, measured
// as delta, with the load's own decisions d.
func (f *fillState[V]) stored(ctx context.Context, v V, delta time.Duration, d directives, err error, held *heldLease) (*entry[V], error) {
	c := f.c
	now := c.clk.now()
	if err != nil {
		return f.loadFailed(ctx, err, held, now)
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
	c.store(ctx, f.key, e, held, f.remoteUp, f.gen)
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
func (f *fillState[V]) loadFailed(ctx context.Context, err error, held *heldLease, now int64) (*entry[V], error) {
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
		c.store(ctx, f.key, e, held, f.remoteUp, f.gen)
		return e, nil
	}
	if cand := f.candidate; cand != nil && f.staleOK() && now < cand.hard {
		c.st.staleIfError.add(1)
		return cand, nil
	}
	return nil, err
}

// loadRemote reads key from the Store and decodes what it finds.
func (c *Cache[V]) loadRemote(ctx context.Context, key string) remoteRead[V] {
	r := remoteRead[V]{done: true}
	r.gen, r.puts = c.gens.get(key)
	at := c.brk.at()
	env, err := c.cfg.Store.Load(ctx, key)
	c.remoteDone(ctx, at, err)
	c.fetchTags(ctx, env)
	c.readOf(&r, key, env, err)
	return r
}

// readOf fills r with what one read of key from the Store returned.
func (c *Cache[V]) readOf(r *remoteRead[V], key string, env []byte, err error) {
	switch {
	case errors.Is(err, ErrRejected):
		c.st.decodeErrors.add(1) // the key holds nothing this cache can use
	case err != nil:
		r.err = err
	case env == nil:
		r.gone = true
	default:
		if e, ok := c.decode(key, env); ok && c.usable(e) {
			r.e = e // a value a tag retired is of no use either
		}
	}
}
