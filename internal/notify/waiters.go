package notify

import "sync"

// Waiters is where goroutines wait for the next announcement on a key. Its
// owner serialises every call under its own lock; the channel Add returns is
// received from without it.
type Waiters struct {
	// m holds the current generation of each key that has waiters; an
	// announcement closes its channel and removes it.
	m map[string]*generation
}

// generation is what the waiters of one key block on until the next
// announcement.
type generation struct {
	// ch is closed by the announcement that ends this generation.
	ch chan struct{}
	// n counts the waiters blocked on ch; the last one to leave removes the
	// generation, so abandoned waits leave nothing behind.
	n int
}

// Wait is one waiter's place in a key's current generation.
type Wait struct {
	key string
	g   *generation
}

// C is closed by the next announcement on the key after Add.
func (w Wait) C() <-chan struct{} { return w.g.ch }

// Add registers a waiter on key.
func (ws *Waiters) Add(key string) Wait {
	if ws.m == nil {
		ws.m = make(map[string]*generation)
	}
	g := ws.m[key]
	if g == nil {
		g = &generation{ch: make(chan struct{})}
		ws.m[key] = g
	}
	g.n++
	return Wait{key: key, g: g}
}

// Leave takes back a waiter that stopped waiting before its announcement.
func (ws *Waiters) Leave(w Wait) {
	w.g.n--
	if w.g.n == 0 && ws.m[w.key] == w.g {
		delete(ws.m, w.key)
	}
}

// Wake ends the current generation of key: its waiters return.
func (ws *Waiters) Wake(key string) {
	if g := ws.m[key]; g != nil {
		close(g.ch)
		delete(ws.m, key)
	}
}

// WakeAll ends every key's current generation.
func (ws *Waiters) WakeAll() {
	for key, g := range ws.m {
		close(g.ch)
		delete(ws.m, key)
	}
}

// Len returns how many keys have waiters.
func (ws *Waiters) Len() int { return len(ws.m) }

// Has reports whether key has waiters that no announcement has woken yet.
func (ws *Waiters) Has(key string) bool { return ws.m[key] != nil }

// Watch registers a waiter on key as Add does, for a caller that holds mu
// (the owner's lock), and returns the channel the next announcement closes
// and the function that takes the registration back, once, under mu.
func (ws *Waiters) Watch(mu sync.Locker, key string) (done <-chan struct{}, stop func()) {
	w := ws.Add(key)
	var once sync.Once
	return w.C(), func() {
		once.Do(func() {
			mu.Lock()
			defer mu.Unlock()
			ws.Leave(w)
		})
	}
}
