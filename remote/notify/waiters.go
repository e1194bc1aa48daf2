package notify

import (
	"slices"
	"sync"
)

// Waiters is where goroutines wait for the next announcement on a key, and
// where callbacks are registered for it. Its owner serialises every call
// under its own lock; the channel Add returns is received from without it.
type Waiters struct {
	// m holds the current generation of each key that has waiters or
	// watches; an announcement ends it and removes it.
	m map[string]*generation
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
	// watches are called by the announcement, each once; next numbers
	// them.
	watches []watch
	next    uint64
}

// watch is one registration of Watch, or one key's of WatchMany.
type watch struct {
	id uint64
	fn func() // nil for a WatchMany registration, which calls many(i)
	// many and i are a WatchMany registration's callback and its key's
	// index.
	many func(int)
	i    int
}

// call calls the registration's callback.
func (w watch) call() {
	if w.many != nil {
		w.many(w.i)
	} else {
		w.fn()
	}
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
func (ws *Waiters) Wake(key string) {
	if g := ws.m[key]; g != nil {
		delete(ws.m, key)
		g.end()
	}
}

// WakeAll ends every key's current generation.
func (ws *Waiters) WakeAll() {
	for key, g := range ws.m {
		delete(ws.m, key)
		g.end()
	}
}

// end closes g's channel and calls its watches.
func (g *generation) end() {
	if g.ch != nil {
		close(g.ch)
	}
	watches := g.watches
	g.watches = nil
	for _, w := range watches {
		w.call()
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
	g := ws.current(key)
	g.next++
	id := g.next
	g.watches = append(g.watches, watch{id: id, fn: fn})
	return func() {
		mu.Lock()
		defer mu.Unlock()
		ws.unwatch(key, g, id)
	}
}

// unwatch takes the registration id of g, key's generation, back, unless
// it was called or taken back already.
func (ws *Waiters) unwatch(key string, g *generation, id uint64) {
	i := slices.IndexFunc(g.watches, func(w watch) bool { return w.id == id })
	if i < 0 {
		return // called, or taken back
	}
	g.watches = slices.Delete(g.watches, i, i+1)
	ws.leave(key, g)
}

// WatchMany is Watch for each of keys at once, with the allocations of
// the registrations shared: fn(i) is called once, under mu, by the next
// announcement on keys[i]. stop(i) takes the registration of keys[i] back,
// under mu; it may be called more than once and after fn(i). keys must
// not change until every registration is called or taken back.
func (ws *Waiters) WatchMany(mu sync.Locker, keys []string, fn func(i int)) (stop func(i int)) {
	type reg struct {
		g  *generation
		id uint64
	}
	regs := make([]reg, len(keys))
	gens := make([]generation, len(keys)) // for the keys that have none
	slots := make([]watch, len(keys))     // the first watch of each new generation
	for i, key := range keys {
		if ws.m == nil {
			ws.m = make(map[string]*generation, len(keys))
		}
		g := ws.m[key]
		if g == nil {
			g = &gens[i]
			g.watches = slots[i : i : i+1]
			ws.m[key] = g
		}
		g.n++
		g.next++
		g.watches = append(g.watches, watch{id: g.next, many: fn, i: i})
		regs[i] = reg{g, g.next}
	}
	return func(i int) {
		mu.Lock()
		defer mu.Unlock()
		ws.unwatch(keys[i], regs[i].g, regs[i].id)
	}
}
