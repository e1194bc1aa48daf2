package notify

import (
	"hash/maphash"
	"sync"
	"sync/atomic"
)

// Waiters is where goroutines wait for the next announcement on a key, and
// where callbacks are registered for it. Its owner serialises every call
// under its own lock; the channel Add returns is received from without it.
type Waiters struct {
	// m holds the current generation of each key that has waiters or
	// watches; an announcement ends it and removes it.
	m map[string]*generation
	// counts counts the announcements, by slot of the keys' hashes; nil
	// until the first Count.
	counts atomic.Pointer[countTable]
}

// countSlots is how many counters a Waiters' Count shares among the keys.
// With k keys announced while a count is watched, another key's
// announcement moves it with a chance of about k/countSlots.
const countSlots = 1 << 13

// countTable is the counters of Count.
type countTable struct {
	seed maphash.Seed
	all  atomic.Uint64 // WakeAll calls
	n    [countSlots]atomic.Uint64
}

// slot is the counter of key.
func (t *countTable) slot(key string) *atomic.Uint64 {
	return &t.n[maphash.String(t.seed, key)%countSlots]
}

// Count returns a number that every later Wake of key, and every WakeAll,
// moves: a caller that kept it knows, by comparing, that key was announced
// since, with no registration. Keys share counters, so a Wake of another
// key may move it too. Count may be called without the owner's lock.
func (ws *Waiters) Count(key string) uint64 {
	t := ws.counts.Load()
	if t == nil {
		t = &countTable{seed: maphash.MakeSeed()}
		if !ws.counts.CompareAndSwap(nil, t) {
			t = ws.counts.Load()
		}
	}
	return t.all.Load() + t.slot(key).Load()
}

// generation is what the waiters of one key block on, and the watches
// called, until the next announcement.
type generation struct {
	// ch is closed by the announcement that ends this generation; nil
	// until the first Add.
	ch chan struct{}
	// n counts the waiters blocked on ch and the watches not taken back;
	// the last one to leave removes the generation, so abandoned waits
	// leave nothing behind.
	n int
	// first and last end the list of the watches the announcement calls,
	// each once, in the order they were registered.
	first, last *watch
}

// watch is one registration of Watch, or one key's of WatchMany, linked
// in its generation's list while neither called nor taken back.
type watch struct {
	// g is the generation whose list holds the watch; nil once it was
	// called or taken back.
	g          *generation
	prev, next *watch
	// call is called with i, the key's index in a WatchMany or
	// WatchManyValues registration (0 for Watch), and the envelope the
	// announcement carries.
	call func(i int, env []byte)
	i    int
}

// link appends w to g's list.
func (g *generation) link(w *watch) {
	w.g, w.prev = g, g.last
	if g.last != nil {
		g.last.next = w
	} else {
		g.first = w
	}
	g.last = w
}

// unlink takes w out of its generation's list.
func (w *watch) unlink() {
	g := w.g
	if w.prev != nil {
		w.prev.next = w.next
	} else {
		g.first = w.next
	}
	if w.next != nil {
		w.next.prev = w.prev
	} else {
		g.last = w.prev
	}
	w.g, w.prev, w.next = nil, nil, nil
}

// Wait is one waiter's place in a key's current generation.
type Wait struct {
	key string
	g   *generation
}

// C is closed by the next announcement on the key after Add.
func (w Wait) C() <-chan struct{} { return w.g.ch }

// current returns key's current generation, made when it has none.
func (ws *Waiters) current(key string) *generation {
	if ws.m == nil {
		ws.m = make(map[string]*generation)
	}
	g := ws.m[key]
	if g == nil {
		g = &generation{}
		ws.m[key] = g
	}
	g.n++
	return g
}

// leave takes one waiter or watch out of g, and g out of the map when it
// was the last.
func (ws *Waiters) leave(key string, g *generation) {
	g.n--
	if g.n == 0 && ws.m[key] == g {
		delete(ws.m, key)
	}
}

// Add registers a waiter on key.
func (ws *Waiters) Add(key string) Wait {
	g := ws.current(key)
	if g.ch == nil {
		g.ch = make(chan struct{})
	}
	return Wait{key: key, g: g}
}

// Leave takes back a waiter that stopped waiting before its announcement.
func (ws *Waiters) Leave(w Wait) { ws.leave(w.key, w.g) }

// Wake ends the current generation of key: its waiters return and its
// watches are called.
func (ws *Waiters) Wake(key string) { ws.WakeWith(key, nil) }

// WakeWith is Wake for an announcement that carries env, the envelope
// the completion stored: WatchManyValues registrations are given it.
func (ws *Waiters) WakeWith(key string, env []byte) {
	if t := ws.counts.Load(); t != nil {
		t.slot(key).Add(1)
	}
	if g := ws.m[key]; g != nil {
		delete(ws.m, key)
		g.end(env)
	}
}

// WakeAll ends every key's current generation.
func (ws *Waiters) WakeAll() {
	if t := ws.counts.Load(); t != nil {
		t.all.Add(1)
	}
	for key, g := range ws.m {
		delete(ws.m, key)
		g.end(nil)
	}
}

// end closes g's channel and calls its watches, each taken out of the
// list before it is called, with env.
func (g *generation) end(env []byte) {
	if g.ch != nil {
		close(g.ch)
	}
	for w := g.first; w != nil; w = g.first {
		w.unlink()
		w.call(w.i, env)
	}
}

// Len returns how many keys have waiters or watches.
func (ws *Waiters) Len() int { return len(ws.m) }

// Has reports whether key has waiters or watches that no announcement has
// woken yet.
func (ws *Waiters) Has(key string) bool { return ws.m[key] != nil }

// Watch registers fn, for a caller that holds mu (the owner's lock), to be
// called once by the next announcement on key, under mu; it returns the
// function that takes the registration back, under mu, which may be
// called more than once and after fn was called.
func (ws *Waiters) Watch(mu sync.Locker, key string, fn func()) (stop func()) {
	w := &watch{call: func(int, []byte) { fn() }}
	ws.current(key).link(w)
	return func() {
		mu.Lock()
		defer mu.Unlock()
		ws.unwatch(key, w)
	}
}

// unwatch takes w, a registration for key, back, unless it was called or
// taken back already.
func (ws *Waiters) unwatch(key string, w *watch) {
	g := w.g
	if g == nil {
		return // called, or taken back
	}
	w.unlink()
	ws.leave(key, g)
}

// WatchMany is Watch for each of keys at once, with the allocations of
// the registrations shared: fn(i) is called once, under mu, by the next
// announcement on keys[i]. stop(i) takes the registration of keys[i] back,
// under mu; it may be called more than once and after fn(i). keys must
// not change until every registration is called or taken back.
func (ws *Waiters) WatchMany(mu sync.Locker, keys []string, fn func(i int)) (stop func(i int)) {
	return ws.watchMany(mu, keys, func(i int, _ []byte) { fn(i) })
}

// WatchManyValues is WatchMany with fn given the envelope that the
// announcement carries: WakeWith's env, nil for one that carries none.
func (ws *Waiters) WatchManyValues(mu sync.Locker, keys []string, fn func(i int, env []byte)) (stop func(i int)) {
	return ws.watchMany(mu, keys, fn)
}

// watchMany registers fn for each of keys, called with the key's index.
func (ws *Waiters) watchMany(mu sync.Locker, keys []string, fn func(i int, env []byte)) (stop func(i int)) {
	regs := make([]watch, len(keys))
	if ws.m == nil {
		ws.m = make(map[string]*generation, len(keys))
	}
	for i, key := range keys {
		g := ws.m[key]
		if g == nil {
			// One at a time: most keys of a batch that others load have
			// a generation already, their holders' other losers' own.
			g = new(generation)
			ws.m[key] = g
		}
		g.n++
		regs[i] = watch{call: fn, i: i}
		g.link(&regs[i])
	}
	return func(i int) {
		mu.Lock()
		defer mu.Unlock()
		ws.unwatch(keys[i], &regs[i])
	}
}
