package herd

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/herdcache/herd/observe"
	"github.com/herdcache/herd/remote"
)

// The losers' wait: the keys of a batch that found other loads holding
// their leases wait for those loads' completions together, on the batch's
// own goroutine. A key whose holder completed takes the value the
// completion carried, from a Lease that is a remote.ValueWatcher, or
// re-reads the Store, and asks for its lease again when neither has a
// value; between announcements (an announcement can be lost) it re-reads
// the Store after a bounded backoff. The keys due at once are read, and
// asked for, in one call.

// Bounds of the fallback re-read of a Wait loser between completion notices.
const (
	minWaitBackoff = 50 * time.Millisecond
	maxWaitBackoff = time.Second
)

// firstRecheck is how soon after it began a wait re-reads the Store when
// the Lease is no Watcher: its holder may have finished between the
// attempt and the start of the wait, unheard.
const firstRecheck = 5 * time.Millisecond

// completion is a registration for the next completion of a key: made
// with the Lease's [remote.Watcher] before an attempt at the lease, or, for a
// wait on a Lease that is no Watcher, a Lease.Wait on a goroutine of its
// own. A nil completion registers nothing. Its owners (a wait, and what
// the replica remembers of the holder) each stop it once; the last one
// takes the registration back.
type completion struct {
	fired atomic.Bool
	refs  atomic.Int32
	// wake, when not nil, is called once the completion came: a batch's
	// wait hears of it so.
	wake func(*completion)
	// end takes the registration back; for one of many registered
	// together, endAt(at) does.
	end   func()
	endAt func(int)
	at    int32
	// slot is the place, plus one, in its batch's waits of the wait that
	// waits on the completion; 0 while none does. Written and read on that
	// batch's goroutine alone.
	slot int32
	// env is the envelope the completion carried, from a ValueWatcher:
	// the holder's value. Written before fired is set, read after.
	env []byte
}

// fire records that the completion came, once.
func (w *completion) fire() {
	if w.fired.CompareAndSwap(false, true) && w.wake != nil {
		w.wake(w)
	}
}

// watch registers for key's next completion when the Lease is a Watcher,
// with wake to call when it comes (nil: none); nil otherwise.
func (c *Cache[V]) watch(key string, wake func(*completion)) *completion {
	lw, ok := c.cfg.Lease.(remote.Watcher)
	if !ok {
		return nil
	}
	w := new(completion)
	w.register(lw, key, wake)
	return w
}

// watchAll is watch for each of keys, its registrations allocated
// together, and made in one call when the Lease is a
// [remote.BatchWatcher] (with the completions' values when it is a
// [remote.ValueWatcher]). keys must not change afterwards.
func (c *Cache[V]) watchAll(keys []string, wake func(*completion)) []*completion {
	ws := make([]*completion, len(keys))
	lw, ok := c.cfg.Lease.(remote.Watcher)
	if !ok {
		return ws
	}
	all := make([]completion, len(keys))
	vw, vals := lw.(remote.ValueWatcher)
	bw, many := lw.(remote.BatchWatcher)
	for i, key := range keys {
		ws[i] = &all[i]
		if !many && !vals {
			ws[i].register(lw, key, wake)
			continue
		}
		all[i].wake = wake // before the registration: it may be called at once
		all[i].refs.Store(1)
		all[i].at = int32(i)
	}
	var endAt func(int)
	switch {
	case len(keys) == 0:
		return ws
	case vals:
		endAt = vw.WatchValues(keys, func(i int, env []byte) {
			all[i].env = env
			all[i].fire()
		})
	case many:
		endAt = bw.WatchMany(keys, func(i int) { all[i].fire() })
	default:
		return ws
	}
	for i := range all {
		all[i].endAt = endAt
	}
	return ws
}

// register makes w, owned by its caller alone, lw's registration for key.
func (w *completion) register(lw remote.Watcher, key string, wake func(*completion)) {
	w.wake = wake
	w.refs.Store(1)
	w.end = lw.Watch(key, w.fire)
}

// share gives w another owner, who stops it too.
func (w *completion) share() *completion {
	if w != nil {
		w.refs.Add(1)
	}
	return w
}

// came reports whether the completion w registered for has come.
func (w *completion) came() bool { return w != nil && w.fired.Load() }

// stop ends one owner's hold of the registration, and takes it back when
// that was the last.
func (w *completion) stop() {
	if w == nil || w.refs.Add(-1) != 0 {
		return
	}
	switch {
	case w.endAt == nil:
		w.end()
	case !w.fired.Load(): // one its announcement called is spent already
		w.endAt(int(w.at))
	}
}

// waitVia registers for key's next completion through Lease.Wait, for a
// Lease that is no Watcher: a goroutine waits until the completion, the
// registration's stop, or the tier failing, which it records.
func (c *Cache[V]) waitVia(ctx context.Context, key string, wake func(*completion)) *completion {
	wctx, cancel := context.WithCancel(ctx)
	w := &completion{wake: wake, end: cancel}
	w.refs.Store(1)
	go func() {
		at := c.brk.at()
		err := c.cfg.Lease.Wait(wctx, key)
		switch {
		case err == nil:
			w.fire()
		case wctx.Err() == nil:
			c.remoteDone(wctx, at, err) // the tier failed
		}
	}()
	return w
}

// wakes is where a batch hears of the completions its waits registered
// for: fire calls wake, which may run under a Lease's locks, so it only
// records.
type wakes struct {
	mu    sync.Mutex
	fired []*completion
	// spare is what take last returned, whose array the next take hands
	// to add: the batch is done with it by then.
	spare []*completion
	// signal is ready while fired holds a completion.
	signal chan struct{}
	// wake is add, made once for the batch's registrations.
	wake func(*completion)
}

func newWakes() *wakes {
	k := &wakes{signal: make(chan struct{}, 1)}
	k.wake = k.add
	return k
}

// add records that w came.
func (k *wakes) add(w *completion) {
	k.mu.Lock()
	if k.fired == nil {
		k.fired = make([]*completion, 0, 16) // notices come in bursts
	}
	k.fired = append(k.fired, w)
	k.mu.Unlock()
	select {
	case k.signal <- struct{}{}:
	default:
	}
}

// take returns the completions that came since it was last called, valid
// until the next call.
func (k *wakes) take() []*completion {
	k.mu.Lock()
	defer k.mu.Unlock()
	fired := k.fired
	clear(k.spare)
	k.fired, k.spare = k.spare[:0], fired
	return fired
}

// waiter is one loser's wait for the load that holds its key's lease.
type waiter[V any] struct {
	f *fillState[V]
	// w is the holder's completion, registered for since before the
	// attempt that found it; nil after an attempt that failed.
	w *completion
	// until is when the holder's lease ends (Unix ns, on the cache's clock).
	until int64
	// start is when the wait began; deadline is LeaseWait after it, or
	// after the holder last changed: LeaseWait bounds the wait for each
	// holder, not their chain.
	start, deadline time.Time
	// next is when the wait next asks for the lease (its holder's time
	// has passed) or re-reads the Store; backoff the interval after it.
	next    time.Time
	backoff time.Duration
	end     func(error) // the wait's span
	// pushed and asked say how the wait's current move began: its holder's
	// completion came, and the lease is asked for again.
	pushed, asked bool
	// answer is what the move was answered.
	answer answer[V]
	done   bool
	// slot is the wait's place, plus one, in its batch's waits.
	slot int32
}

// waits is the batch's wait for its losers' holders.
type waits[V any] struct {
	b *batchFill[V]
	// all holds the waits, each at its slot less one; live holds the
	// waits not ended (and some ended since it was last swept), left
	// counts those not ended. A wait's registration holds its slot.
	all  []waiter[V]
	live []*waiter[V]
	left int
	// timer fires at the earliest next of the waits.
	timer *time.Timer
	at    time.Time
	// ask1 and peek1 are the arrays that act reuses.
	ask1, peek1 []*waiter[V]
}

// wait waits for the holders of the leases of ls, each for at most
// LeaseWait per holder, settling each key as its wait ends (a value, an
// error, or a load of its own when the lease came here) and loading the
// keys whose waits ended with this replica to load them together, at
// once: a key leased here is never held while this batch waits for
// others. Were it held, two replicas that each took a lease the other
// waits on would stall each other until LeaseWait.
func (b *batchFill[V]) wait(ctx context.Context, ls []loser[V]) {
	c := b.c
	n := len(ls)
	// live, the waits due at once, and those of them to re-read and to ask
	// are at most n each: one array holds the four. Both arrays are reused
	// by later batches once the wait has ended.
	blk, _ := c.waitBlocks.Get().(*waitBlock[V])
	if blk == nil || cap(blk.all) < n {
		blk = &waitBlock[V]{all: make([]waiter[V], n), lists: make([]*waiter[V], 4*n)}
	}
	all, lists := blk.all[:n], blk.lists[:4*n]
	defer func() {
		clear(all)
		clear(lists)
		c.waitBlocks.Put(blk)
	}()
	ws := &waits[V]{b: b, all: all, live: lists[:0:n], peek1: lists[n : n : 2*n], ask1: lists[2*n : 2*n : 3*n]}
	_, watcher := c.cfg.Lease.(remote.Watcher)
	now := time.Now()
	for i, l := range ls {
		wt := &ws.all[i]
		*wt = waiter[V]{f: l.f, until: l.a.until, start: now, deadline: now.Add(c.cfg.LeaseWait), backoff: minWaitBackoff, slot: int32(i + 1)}
		_, wt.end = c.span(ctx, "herd.lease_wait", l.f.key)
		first := minWaitBackoff
		if !watcher {
			l.a.watch = c.waitVia(ctx, l.f.key, b.wakes.wake)
			first = firstRecheck
		}
		ws.add(wt, l.a.watch)
		wt.next = wt.schedule(now, first)
		ws.live = append(ws.live, wt)
	}
	ws.timer = time.NewTimer(time.Hour)
	defer ws.timer.Stop()
	defer ws.abandon(nil) // after a panic of the loader: no wait lives on
	ws.left = len(ws.live)
	ws.arm(now)
	due := lists[3*n : 3*n : 4*n]
	for ws.left > 0 {
		due = due[:0]
		select {
		case <-b.wakes.signal:
			for _, w := range b.wakes.take() {
				if wt := ws.of(w); wt != nil && !wt.done {
					due = append(due, wt)
				}
			}
		case <-ws.timer.C:
			ws.at = time.Time{}
			due = ws.due(due, time.Now())
		case <-ctx.Done():
			ws.abandon(fmt.Errorf("herd: %w", ctx.Err()))
			return
		}
		ws.act(ctx, due)
	}
}

// waitBlock holds the waits of a batch's losers, and is reused by later
// batches.
type waitBlock[V any] struct {
	all   []waiter[V]
	lists []*waiter[V]
}

// schedule is when a wait last acted on at now acts next: after d, or
// sooner when its deadline or its holder's time comes first.
func (wt *waiter[V]) schedule(now time.Time, d time.Duration) time.Time {
	d = min(d, wt.deadline.Sub(now))
	if left := time.Duration(wt.until - wt.f.c.clk.at(now)); left > 0 && left < d {
		d = left
	}
	return now.Add(max(d, 0))
}

// add makes w the registration wt waits on.
func (ws *waits[V]) add(wt *waiter[V], w *completion) {
	if wt.w != nil {
		wt.w.slot = 0
		wt.w.stop()
	}
	wt.w = w
	if w != nil {
		w.slot = wt.slot
	}
}

// of returns the wait that waits on w, or nil when none does.
func (ws *waits[V]) of(w *completion) *waiter[V] {
	if w.slot == 0 {
		return nil
	}
	if wt := &ws.all[w.slot-1]; wt.w == w {
		return wt
	}
	return nil
}

// arm sets the timer for the earliest next of the live waits.
func (ws *waits[V]) arm(now time.Time) {
	var first time.Time
	for _, wt := range ws.live {
		if !wt.done && (first.IsZero() || wt.next.Before(first)) {
			first = wt.next
		}
	}
	ws.reset(now, first)
}

// reset moves the timer to t when it is sooner than the timer's time.
func (ws *waits[V]) reset(now, t time.Time) {
	if t.IsZero() || (!ws.at.IsZero() && !t.Before(ws.at)) {
		return
	}
	ws.at = t
	ws.timer.Reset(t.Sub(now))
}

// due appends to due the live waits whose next has come, drops the ended
// ones from live, and sets the timer for the rest.
func (ws *waits[V]) due(due []*waiter[V], now time.Time) []*waiter[V] {
	live := ws.live[:0]
	var first time.Time
	for _, wt := range ws.live {
		switch {
		case wt.done:
			continue
		case !wt.next.After(now):
			due = append(due, wt)
		case first.IsZero() || wt.next.Before(first):
			first = wt.next
		}
		live = append(live, wt)
	}
	clear(ws.live[len(live):])
	ws.live = live
	ws.reset(now, first)
	return due
}

// act makes the next move of each due wait: it takes the value its
// holder's completion carried or re-reads the Store, and asks for the
// lease again when its holder's time passed, or when its holder completed
// and left no value; then it settles the waits that ended, loads the keys
// leased here, and schedules the others.
func (ws *waits[V]) act(ctx context.Context, due []*waiter[V]) {
	if len(due) == 0 {
		return
	}
	b, c := ws.b, ws.b.c
	ask, peek := ws.ask1[:0], ws.peek1[:0]
	clk := c.clk.now()
	for _, wt := range due {
		wt.pushed = wt.w.came()
		wt.asked = !wt.pushed && clk >= wt.until
		switch {
		case wt.asked:
			ask = append(ask, wt)
		case wt.pushed && ws.carried(wt, clk):
		default:
			peek = append(peek, wt)
		}
	}
	ws.peek(ctx, peek)
	for _, wt := range peek {
		// A completion that left no value (the lease is free, or another
		// load took it), or a read that failed: the answer of the lease
		// says which.
		if wt.pushed && wt.answer.outcome != leaseFound {
			wt.asked = true
			ask = append(ask, wt)
		}
	}
	ws.ask(ctx, ask)
	ws.ask1, ws.peek1 = ask, peek // the waits they point to live in all
	now := time.Now()
	var loads []pendingLoad[V]
	for _, wt := range due {
		a := wt.answer
		wt.answer = answer[V]{}
		if a.err != nil {
			ws.abandonOne(wt, a.err)
			continue
		}
		var done bool
		if loads, done = ws.answered(ctx, loads, wt, a.attempt, now); !done {
			wt.backoff = min(2*wt.backoff, maxWaitBackoff)
			wt.next = wt.schedule(now, wt.backoff)
			ws.reset(now, wt.next)
		}
	}
	b.loadAll(ctx, loads)
}

// answered ends wt by a, the answer of its ask or of its re-read,
// settling its key or adding it to loads, or, when it waits on, takes
// what a tells of the holder; it reports whether the wait ended.
func (ws *waits[V]) answered(ctx context.Context, loads []pendingLoad[V], wt *waiter[V], a attempt[V], now time.Time) ([]pendingLoad[V], bool) {
	b, c := ws.b, ws.b.c
	switch {
	case a.outcome == leaseHeld && wt.asked:
		if wt.pushed {
			// The holder completed and another load took the lease:
			// LeaseWait bounds the wait for each holder, not their chain.
			wt.deadline = now.Add(c.cfg.LeaseWait)
		}
		wt.until = a.until
		ws.renew(ctx, wt, a.watch)
	case a.outcome == leaseHeld:
	case a.outcome == leaseFailed && !c.brk.open():
		if wt.asked {
			ws.add(wt, nil) // a hiccup: ask again after the backoff
		}
	default:
		if a.outcome == leaseFound {
			if wt.pushed || wt.w.came() { // the completion came while the Store was read
				c.st.wokenByPush.add(1)
			} else {
				c.st.wokenByPoll.add(1)
			}
			c.leaseEvent(observe.LeaseWoken, now.Sub(wt.start))
		}
		ws.finish(wt)
		return b.lost(loads, wt.f, a, nil), true
	}
	if !now.Before(wt.deadline) {
		c.st.leaseWaitTimeouts.add(1)
		c.leaseEvent(observe.LeaseWaitTimeout, now.Sub(wt.start))
		ws.finish(wt)
		return b.lost(loads, wt.f, attempt[V]{}, ErrLeaseTimeout), true
	}
	return loads, false
}

// renew makes w, registered before the ask that found a new holder, the
// registration wt waits on; without a Watcher, a new Lease.Wait.
func (ws *waits[V]) renew(ctx context.Context, wt *waiter[V], w *completion) {
	if w == nil {
		if _, ok := ws.b.c.cfg.Lease.(remote.Watcher); !ok {
			w = ws.b.c.waitVia(ctx, wt.f.key, ws.b.wakes.wake)
		}
	}
	ws.add(wt, w)
}

// finish ends wt: its registration is taken back and its span ended.
func (ws *waits[V]) finish(wt *waiter[V]) {
	wt.done = true
	ws.left--
	ws.add(wt, nil)
	wt.end(nil)
}

// abandonOne ends wt, which the caller's context ended, with err.
func (ws *waits[V]) abandonOne(wt *waiter[V], err error) {
	c := ws.b.c
	c.st.leaseWaitsAbandoned.add(1)
	c.leaseEvent(observe.LeaseWaitAbandoned, time.Since(wt.start))
	ws.finish(wt)
	ws.b.done(wt.f, nil, err)
}

// abandon ends every live wait: with err, the caller's context ending;
// with nil, after a panic, settling nothing (the flights fail them).
func (ws *waits[V]) abandon(err error) {
	for _, wt := range ws.live {
		if wt.done {
			continue
		}
		if err != nil {
			ws.abandonOne(wt, err)
		} else {
			ws.finish(wt)
		}
	}
	ws.live = nil
}

// answer is an ask's attempt, or the caller's context ending it.
type answer[V any] struct {
	attempt[V]
	err error
}

// ask asks for the leases of the keys of wts again, each fresh after now,
// registering for each holder's completion first: one call for them all
// when the Lease takes batches. Each wait's answer is put in it.
func (ws *waits[V]) ask(ctx context.Context, wts []*waiter[V]) {
	if len(wts) == 0 {
		return
	}
	c := ws.b.c
	reqs := room(&ws.b.scratch.reqs, len(wts))
	keys := make([]string, len(wts)) // the Watcher keeps them
	for i, wt := range wts {
		keys[i] = wt.f.key
	}
	watches := c.watchAll(keys, ws.b.wakes.wake)
	sent := c.clk.now()
	for i, key := range keys {
		reqs = append(reqs, remote.LeaseRequest{Key: key, After: time.Unix(0, wts[i].f.leaseAfter(sent))})
	}
	for i, got := range c.acquireMany(ctx, reqs, nil) {
		a, err := c.answerAttempt(ctx, wts[i].f.key, got, sent, watches[i])
		wts[i].answer = answer[V]{a, err}
	}
}

// carried answers wt, whose holder completed, with the value that the
// completion carried, when it has one that a re-read of the Store would
// have served at clk (leaseFound), and reports whether it did. A value
// with tags is left to the re-read, which learns their versions, and so is
// one that a change of the key on this replica since the fill began (a
// Set, an Invalidate) may have replaced in the Store.
func (ws *waits[V]) carried(wt *waiter[V], clk int64) bool {
	c, f := ws.b.c, wt.f
	env := wt.w.env
	if env == nil || c.gens.changedSince(f.key, f.gen) {
		return false
	}
	e, ok := c.decode(f.key, env, clk)
	if !ok || e.tags != nil || f.leaseAfter(clk) >= e.soft {
		return false
	}
	wt.answer.attempt = attempt[V]{outcome: leaseFound, e: e}
	return true
}

// peek is the re-read of the Store of the keys of wts between notices,
// one call for them all: leaseFound when a value fresh now has appeared,
// leaseHeld (with no new time) when none has, leaseFailed when the read
// failed. Each wait's answer is put in it.
func (ws *waits[V]) peek(ctx context.Context, wts []*waiter[V]) {
	if len(wts) == 0 {
		return
	}
	c := ws.b.c
	if !c.brk.allow() {
		for _, wt := range wts {
			wt.answer.outcome = leaseFailed
		}
		return
	}
	fs := make([]*fillState[V], len(wts))
	for i, wt := range wts {
		fs[i] = wt.f
	}
	now := c.clk.now()
	for i, r := range c.loadMany(ctx, fs, ws.b.scratch) {
		a := &wts[i].answer
		switch {
		case r.err != nil:
			a.outcome = leaseFailed
		case r.e != nil && wts[i].f.leaseAfter(now) < r.e.soft:
			a.attempt = attempt[V]{outcome: leaseFound, e: r.e}
		default:
			a.outcome = leaseHeld
		}
	}
}
