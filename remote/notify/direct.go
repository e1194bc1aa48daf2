package notify

import (
	"sync"
	"sync/atomic"
)

// Direct is a set of subscribers that an announcer calls itself, on its own
// goroutine, before it goes on: what they do in fn happens before anything
// the announcer does next. A Store author uses it for hold announcements
// (remote.HoldNotifier), whose subscribers register for the holder's
// completion before it can be announced. The zero Direct is empty and
// ready; its methods are safe for concurrent use.
type Direct struct {
	mu   sync.Mutex
	subs map[*directSub]struct{}
	// list is subs as a slice, made anew at each change, for Call to read
	// without the lock or an allocation.
	list atomic.Pointer[[]*directSub]
}

// directSub is one subscriber of a Direct; mu is held while fn runs, so
// that once stop has returned fn is not running and is never called again.
type directSub struct {
	mu      sync.Mutex
	fn      func(Notice)
	stopped bool
}

// Add subscribes fn. stop removes it, waiting for a call of fn in progress;
// it may be called more than once, and must not be called from fn.
func (d *Direct) Add(fn func(Notice)) (stop func()) {
	s := &directSub{fn: fn}
	d.mu.Lock()
	if d.subs == nil {
		d.subs = make(map[*directSub]struct{})
	}
	d.subs[s] = struct{}{}
	d.relist()
	d.mu.Unlock()
	return func() {
		s.mu.Lock()
		s.stopped = true
		s.mu.Unlock()
		d.mu.Lock()
		delete(d.subs, s)
		d.relist()
		d.mu.Unlock()
	}
}

// relist makes list hold the subscribers of subs; d.mu is held.
func (d *Direct) relist() {
	list := make([]*directSub, 0, len(d.subs))
	for s := range d.subs {
		list = append(list, s)
	}
	d.list.Store(&list)
}

// Call calls every subscriber's fn with n, one after another, on the
// caller's goroutine, and returns when they have returned. The caller must
// hold no lock that an fn may take.
func (d *Direct) Call(n Notice) {
	list := d.list.Load()
	if list == nil {
		return
	}
	for _, s := range *list {
		s.mu.Lock()
		if !s.stopped {
			s.fn(n)
		}
		s.mu.Unlock()
	}
}

// StopAll removes every subscriber, as each one's stop does.
func (d *Direct) StopAll() {
	d.mu.Lock()
	subs := d.subs
	d.subs = nil
	d.list.Store(nil)
	d.mu.Unlock()
	for s := range subs {
		s.mu.Lock()
		s.stopped = true
		s.mu.Unlock()
	}
}
