package flight

import (
	"context"
	"errors"
	"math"
	"runtime/debug"
	"sync/atomic"
	"time"
)

// ErrUnsettled is the error of a key that a [Group.DoMany] function led but
// returned without settling.
var ErrUnsettled = errors.New("flight: function returned without settling the key")

// Result is one key's outcome of [Group.DoMany].
type Result[V any] struct {
	// Val and Err are the key's value and error, as Do returns them.
	Val V
	Err error
	// Shared reports, as Do's shared does, whether the result went to more
	// than one caller.
	Shared bool
	// Repeat reports that the key at this position appeared earlier in the
	// call's keys: its result is that earlier position's.
	Repeat bool
	// Led reports that this call led the key's flight: it started it, and
	// gave the key to its function.
	Led bool
}

// linearMax is the most keys for which DoMany finds a key by scanning its
// distinct keys; with more it builds a map from key to entry.
const linearMax = 16

// DoMany is Do for several keys at once, with one function for all the keys
// that need a flight. In one pass under the group's lock it joins the
// running flight of each key that has one and starts a flight for each key
// that has none; callers of Do, TryDo and DoMany for those keys join these
// flights as they would join one that Do started. Those are the led keys.
// If there is at least one, fn runs once and is given them in the order of
// their first appearance in keys; otherwise fn is not called. A key that
// appears more than once in keys is led or joined once, and each of its
// positions gets its result.
//
// fn hands out results with settle: settle(key, v, err) gives v and err to
// every caller of that led key's flight at once, and frees the key for a
// new flight. settle is safe for concurrent use, also from goroutines that
// fn starts. Only the first settle of a key counts; settling a key that
// this call does not lead, or settling after fn has returned, does nothing.
// When fn returns, each led key it has not settled gets [ErrUnsettled]; when
// it panics, each gets one [*PanicError]; when it calls runtime.Goexit, each
// gets [ErrGoexit]. Keys settled before keep their results. fn may keep and
// change led, which is its own copy.
//
// fn runs with a context that carries the values of ctx but not its
// cancellation, ends after [Group.Timeout], and ends once fn has returned.
// With [Group.CancelWhenAbandoned], a led key whose callers have all left
// is freed at once, as in Do, and fn's context is cancelled once every led
// key has been settled or abandoned (so also once fn has settled them all).
//
// ctx bounds only this caller's wait, as in Do: DoMany returns once every
// key has its result (even if fn has not returned yet) or ctx has ended.
// Each key whose result has not come by then gets an error wrapping
// ctx.Err() (and context.Cause(ctx) if different), and its flight goes on
// for its other callers, fn included. A ctx that is already done gives
// every key that error without starting or joining any flight. If ctx can
// never end, fn runs on this caller's goroutine (which exits if fn calls
// runtime.Goexit, as in Do); otherwise fn runs on a new goroutine so that
// the caller can leave when ctx ends.
//
// The result has one element for each element of keys, in the same order;
// it is nil when keys is empty. Shared is true for a joined key, and for a
// led key when another caller joined its flight. [Group.Waiters] counts
// this caller once for each distinct key, led or joined, and
// [Group.InFlight] counts each led key until it is settled or fn has
// returned.
//
// fn must not wait for a flight of a key that it leads and has not settled
// (by Do, for instance): it would wait for itself.
//
// DoMany allocates the result, one block of entries (each holding the
// flight of a led key) and a few small values for the call. With at most
// 16 keys it finds repeated keys, and the key of each settle, by scanning;
// with more it builds a map for that.
func (g *Group[K, V]) DoMany(ctx context.Context, keys []K, fn func(ctx context.Context, led []K, settle func(key K, v V, err error))) []Result[V] {
	if len(keys) == 0 {
		return nil
	}
	res := make([]Result[V], len(keys))
	m := &many[K, V]{g: g}
	fail := func(err error) []Result[V] {
		m.distinct(keys)
		for i := range res {
			res[i].Err = err
			res[i].Repeat = m.repeat != nil && m.repeat[i]
		}
		return res
	}
	if ctx == nil {
		return fail(errNilContext)
	}
	if fn == nil {
		return fail(errNilFunc)
	}
	timeout := g.Timeout
	if timeout <= 0 {
		if timeout < 0 {
			return fail(errNegativeTimeout)
		}
		timeout = DefaultTimeout
	}
	done := ctx.Done()
	if done != nil {
		select {
		case <-done:
			return fail(waitError(ctx))
		default:
		}
	}

	m.distinct(keys)
	g.mu.Lock()
	nled := m.enter(done == nil)
	g.mu.Unlock()
	m.announce()
	if nled > 0 {
		m.prepare(ctx, done == nil, timeout, nled)
		if done == nil {
			// As in Do: ctx can never end, so this caller runs fn itself.
			// If fn calls Goexit the caller exits with it, and stops
			// waiting for the flights it joined on the way.
			returned := false
			defer func() {
				if !returned {
					m.stopWaiting()
				}
			}()
			m.run(fn)
			returned = true
		} else {
			go m.run(fn)
		}
	}
	if !m.wait(done) {
		m.stopWaiting()
	}
	m.fill(ctx, res)
	return res
}

// many is one call of DoMany.
type many[K comparable, V any] struct {
	g *Group[K, V]

	// Written by the DoMany caller before fn runs, read-only afterwards.
	// entries has one entry for each distinct key, in the order of its
	// first appearance; pos maps a position in keys to its entry and is nil
	// while no key repeats (position i is entry i); index maps a key to its
	// entry when there are more than linearMax keys, and is nil otherwise.
	entries []entry[K, V]
	pos     []int
	index   map[K]int
	led     []K // fn's copy of the led keys
	// repeat marks the positions whose key appeared earlier in keys; nil
	// while no key repeats.
	repeat []bool

	fctx     batch[V]      // the context fn runs with
	returned atomic.Bool   // fn has returned; settle does nothing now
	pending  atomic.Int32  // led keys whose results are not published yet
	allDone  chan struct{} // closed when pending reaches zero; nil if no key is led
}

// entry is one distinct key of a DoMany call.
type entry[K comparable, V any] struct {
	key K
	// c is the flight this caller waits for: &own when the key is led here,
	// another caller's flight when it was joined. Set in the pass under the
	// group's lock, read-only afterwards.
	c   *call[V]
	own call[V] // the flight of a led key; unused when the key was joined

	// state tells, for a led key, how far settling it has gone: it moves
	// from unsettled to claimed once, by the settle that wins, and to
	// published once own holds the result and has left the map.
	state atomic.Uint32

	// Written and read by the DoMany caller alone.
	gaveUp    bool // the caller stopped waiting before the result came
	abandoned bool // and left the flight without callers (CancelWhenAbandoned)
}

// States of a led entry.
const (
	unsettled uint32 = iota
	claimed
	published
)

func (e *entry[K, V]) isLed() bool { return e.c == &e.own }

// batch is the context a DoMany function runs with: a call that no map
// holds and no caller waits for, used for its context alone.
type batch[V any] struct {
	call[V]
	ctx fnCtx // the call's
	// live counts, with CancelWhenAbandoned, the led flights whose own
	// contexts have not ended: each ends once, when it is settled or
	// abandoned. The last one to end cancels the batch's context.
	live atomic.Int32
}

// keyEnded is called once by each led flight of the batch when its own
// context ends.
func (b *batch[V]) keyEnded() {
	if b.live.Add(-1) == 0 {
		b.end(ctxCanceled)
	}
}

// distinct fills m.entries with the distinct keys and, if some key repeats,
// m.pos with each position's entry.
func (m *many[K, V]) distinct(keys []K) {
	m.entries = make([]entry[K, V], 0, len(keys))
	if len(keys) > linearMax {
		m.index = make(map[K]int, len(keys))
	}
	for i, k := range keys {
		if j := m.lookup(k); j >= 0 {
			if m.pos == nil {
				m.pos = make([]int, len(keys))
				for p := range i {
					m.pos[p] = p
				}
				m.repeat = make([]bool, len(keys))
			}
			m.pos[i] = j
			m.repeat[i] = true
			continue
		}
		j := len(m.entries)
		// Re-slicing instead of appending: an entry holds locks and must
		// not be copied.
		m.entries = m.entries[:j+1]
		m.entries[j].key = k
		if m.index != nil {
			m.index[k] = j
		}
		if m.pos != nil {
			m.pos[i] = j
		}
	}
}

// lookup returns the index of key's entry, or -1 if it has none.
func (m *many[K, V]) lookup(key K) int {
	if m.index != nil {
		if j, ok := m.index[key]; ok {
			return j
		}
		return -1
	}
	for j := range m.entries {
		if m.entries[j].key == key {
			return j
		}
	}
	return -1
}

// at returns the entry of position i of keys.
func (m *many[K, V]) at(i int) *entry[K, V] {
	if m.pos != nil {
		i = m.pos[i]
	}
	return &m.entries[i]
}

// enter is the pass under g.mu: it joins the running flight of each
// distinct key and starts one for each key that has none. block says that
// this caller will wait without a context that can end. It returns the
// number of led keys.
func (m *many[K, V]) enter(block bool) (nled int) {
	g := m.g
	if g.m == nil {
		g.m = make(map[K]*call[V])
		g.base = time.Now()
	}
	for i := range m.entries {
		e := &m.entries[i]
		if c, ok := g.m[e.key]; ok {
			c.enlist(block)
			e.c = c
			continue
		}
		c := &e.own
		c.waiters = 1
		c.inMap = true
		if g.CancelWhenAbandoned {
			c.batch = &m.fctx
		}
		g.m[e.key] = c
		e.c = c
		nled++
	}
	g.inFlight += nled
	if g.CancelWhenAbandoned {
		m.fctx.live.Store(int32(nled))
	}
	return nled
}

// announce calls OnStart for each led key and OnJoin for each joined one,
// in the order of the keys' first appearance.
func (m *many[K, V]) announce() {
	g := m.g
	if g.OnStart == nil && g.OnJoin == nil {
		return
	}
	for i := range m.entries {
		e := &m.entries[i]
		if e.isLed() {
			if g.OnStart != nil {
				g.OnStart(e.key)
			}
		} else if g.OnJoin != nil {
			g.OnJoin(e.key)
		}
	}
}

// prepare readies fn's context, fn's copy of the led keys and the count of
// results to publish. block says that ctx can never end.
func (m *many[K, V]) prepare(ctx context.Context, block bool, timeout time.Duration, nled int) {
	c := &m.fctx.ctx
	m.fctx.fc = c
	if block {
		c.parent = ctx
	} else {
		c.parent = context.WithoutCancel(ctx)
	}
	// As in Do: measured from the group's base, saturating.
	c.base = &m.g.base
	c.deadline = time.Since(m.g.base)
	c.deadline += min(timeout, math.MaxInt64-c.deadline)

	m.led = make([]K, 0, nled)
	for i := range m.entries {
		if e := &m.entries[i]; e.isLed() {
			m.led = append(m.led, e.key)
		}
	}
	m.pending.Store(int32(nled))
	m.allDone = make(chan struct{})
}

// run calls fn and, whatever way fn ends, gives each led key it has not
// settled its error.
func (m *many[K, V]) run(fn func(context.Context, []K, func(K, V, error))) {
	normal := false
	defer func() {
		err := ErrUnsettled
		if !normal {
			if r := recover(); r != nil {
				err = &PanicError{Value: r, Stack: debug.Stack()}
			} else {
				err = ErrGoexit
			}
		}
		m.returned.Store(true)
		m.fctx.end(ctxCanceled)
		var zero V
		for i := range m.entries {
			if e := &m.entries[i]; e.isLed() {
				m.publish(e, zero, err)
			}
		}
	}()
	fn(&m.fctx.call, m.led, m.settle)
	normal = true
}

// settle is the settle function fn is given.
func (m *many[K, V]) settle(key K, v V, err error) {
	if m.returned.Load() {
		return
	}
	j := m.lookup(key)
	if j < 0 {
		return
	}
	if e := &m.entries[j]; e.isLed() {
		m.publish(e, v, err)
	}
}

// publish gives v and err to every caller of e's flight unless e has been
// settled already.
func (m *many[K, V]) publish(e *entry[K, V], v V, err error) {
	if !e.state.CompareAndSwap(unsettled, claimed) {
		return
	}
	e.own.val, e.own.err = v, err
	m.g.finish(&e.own, e.key)
	// Only now, with the key free, may this caller see the result.
	e.state.Store(published)
	if m.pending.Add(-1) == 0 {
		close(m.allDone)
	}
}

// wait waits until every key has its result, or until done is closed, and
// reports whether every key has its result. A nil done is never closed.
func (m *many[K, V]) wait(done <-chan struct{}) bool {
	if m.allDone != nil {
		if done == nil {
			<-m.allDone
		} else {
			select {
			case <-m.allDone:
			case <-done:
				return false
			}
		}
	}
	for i := range m.entries {
		e := &m.entries[i]
		if e.isLed() {
			continue
		}
		if done == nil {
			e.c.wg.Wait()
			continue
		}
		select {
		case <-e.c.done:
		case <-done:
			return false
		}
	}
	return true
}

// stopWaiting makes this caller stop counting as a waiter of each flight
// whose result has not come, marking those entries gaveUp, and ends the
// context of each flight that is abandoned now.
func (m *many[K, V]) stopWaiting() {
	g := m.g
	anyAbandoned := false
	g.mu.Lock()
	for i := range m.entries {
		e := &m.entries[i]
		if e.arrived() {
			continue
		}
		e.gaveUp = true
		if g.leave(e.c, e.key) {
			e.abandoned = true
			anyAbandoned = true
		}
	}
	g.mu.Unlock()
	if !anyAbandoned {
		return
	}
	for i := range m.entries {
		if e := &m.entries[i]; e.abandoned {
			e.c.end(ctxCanceled)
		}
	}
}

// arrived reports whether e's result has come. The group's lock is held,
// which guards the done channel of a joined flight.
func (e *entry[K, V]) arrived() bool {
	if e.isLed() {
		return e.state.Load() == published
	}
	select {
	case <-e.c.done: // nil, and so never ready, if nobody selects on it
		return true
	default:
		return false
	}
}

// fill writes each position's result.
func (m *many[K, V]) fill(ctx context.Context, res []Result[V]) {
	var werr error
	for i := range res {
		e := m.at(i)
		res[i].Repeat, res[i].Led = m.repeat != nil && m.repeat[i], e.isLed()
		if e.gaveUp {
			if werr == nil {
				werr = waitError(ctx)
			}
			res[i].Err = werr
			continue
		}
		c := e.c
		res[i].Val, res[i].Err, res[i].Shared = c.val, c.err, !e.isLed() || c.joins > 0
	}
}
