// Package notify hands change notices to a subscriber on its own goroutine,
// in order, without ever making the announcer wait, and lets goroutines wait
// for the next completion on a key.
//
// A Store author uses it to implement the remote tier's Notifier and
// Watcher: announce each change or completion the backend reports, and let
// the cache subscribe and wait.
package notify

import (
	"sync"
	"time"
)

// Notice is one change announced to a subscriber: Key changed under Fence,
// its value deleted when Dropped; or, with Live set, a proof that no notice
// before it was lost; or, with Held set, a hold of Key's lease. The zero Notice means "drop everything":
// changes may have been missed. Its fields are those of remote.Notice, in
// order, so that one converts to the other.
type Notice struct {
	Key     string
	Fence   uint64
	Dropped bool
	Tag     string
	Live    time.Time
	Held    time.Time
	Value   string
	Seq     uint64
}

// Subscription is one subscriber's queue and the goroutine that empties it
// into fn. Its methods are safe for concurrent use.
type Subscription struct {
	fn   func(Notice)
	max  int           // most messages queue holds, at least 1
	wake chan struct{} // holds a token when queue may be non-empty
	quit chan struct{} // closed by Stop
	done chan struct{} // closed when run has returned
	once sync.Once     // closes quit

	mu sync.Mutex
	// queue holds the messages not yet handed to fn, oldest first, never
	// more than max of them: each is the notices of one Push or PushAll,
	// which no one changes once queued.
	queue [][]Notice
	// overflowed is set while queue is the single zero Notice that replaced
	// a full queue: it stands for every later change until fn takes it.
	overflowed bool
}

// Start starts a goroutine that calls fn with each pushed notice, in order,
// until Stop is called. Up to queue messages wait for a slow fn, a message
// being the notice of one Push or the notices of one PushAll; a push to a
// full queue replaces the queued messages with one zero Notice, which then
// absorbs every push until fn takes it. A queue below 1 counts as 1.
func Start(fn func(Notice), queue int) *Subscription {
	s := &Subscription{
		fn:   fn,
		max:  max(queue, 1),
		wake: make(chan struct{}, 1),
		quit: make(chan struct{}),
		done: make(chan struct{}),
	}
	go s.run()
	return s
}

// Push queues n for fn, as one message, without blocking. After Stop it
// does nothing that fn will see.
func (s *Subscription) Push(n Notice) { s.PushAll([]Notice{n}) }

// PushAll queues ns for fn, in order, as one message, without blocking;
// ns must not be changed afterwards (several subscriptions may share it).
// An empty ns queues nothing. After Stop it does nothing that fn will see.
func (s *Subscription) PushAll(ns []Notice) {
	if len(ns) == 0 {
		return
	}
	s.mu.Lock()
	switch {
	case s.overflowed:
	case len(s.queue) >= s.max:
		clear(s.queue)
		s.queue = append(s.queue[:0], []Notice{{}})
		s.overflowed = true
	default:
		s.queue = append(s.queue, ns)
	}
	s.mu.Unlock()
	select {
	case s.wake <- struct{}{}:
	default:
	}
}

// Stop drops the notices still queued, waits until fn has returned and the
// goroutine has exited, and may be called more than once; it must not be
// called from fn.
func (s *Subscription) Stop() {
	s.once.Do(func() { close(s.quit) })
	<-s.done
}

// run hands queued notices to fn until quit is closed.
func (s *Subscription) run() {
	defer close(s.done)
	var batch [][]Notice
	for {
		select {
		case <-s.quit:
			return
		case <-s.wake:
		}
		s.mu.Lock()
		batch, s.queue = s.queue, batch[:0]
		s.overflowed = false
		s.mu.Unlock()
		for _, m := range batch {
			for _, n := range m {
				select {
				case <-s.quit:
					return
				default:
				}
				s.fn(n)
			}
		}
		clear(batch)
	}
}
