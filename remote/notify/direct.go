package notify

import (
	"slices"
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
	mu sync.Mutex // serialises the changes of subs
	// subs holds the subscribers, a slice made anew at each change, so
	// that Call reads it without the lock or an allocation.
	subs atomic.Pointer[[]*directSub]
}

// directSub is one subscriber of a Direct; mu is read-held while fn runs,
// so that announcers call fn at the same time, and once stop has returned
// fn is not running and is never called again.
type directSub struct {
	mu      sync.RWMutex
	fn      func(Notice)
	stopped bool
}

// current returns the subscribers.
func (d *Direct) current() []*directSub {
	if p := d.subs.Load(); p != nil {
		return *p
	}
	return nil
}

// Add subscribes fn. stop removes it, waiting for a call of fn in progress;
// it may be called more than once, and must not be called from fn.
func (d *Direct) Add(fn func(Notice)) (stop func()) {
	s := &directSub{fn: fn}
	d.mu.Lock()
	subs := append(slices.Clone(d.current()), s)
	d.subs.Store(&subs)
	d.mu.Unlock()
	return func() {
		s.mu.Lock()
		s.stopped = true
		s.mu.Unlock()
		d.mu.Lock()
		subs := slices.DeleteFunc(slices.Clone(d.current()), func(o *directSub) bool { return o == s })
		d.subs.Store(&subs)
		d.mu.Unlock()
	}
}

// Call calls every subscriber's fn with n, one after another, on the
// caller's goroutine, and returns when they have returned. Calls from
// several goroutines run at the same time, each subscriber's fn among
// them. The caller must hold no lock that an fn may take.
func (d *Direct) Call(n Notice) {
	for _, s := range d.current() {
		s.mu.RLock()
		if !s.stopped {
			s.fn(n)
		}
		s.mu.RUnlock()
	}
}

// StopAll removes every subscriber, as each one's stop does.
func (d *Direct) StopAll() {
	d.mu.Lock()
	subs := d.current()
	d.subs.Store(nil)
	d.mu.Unlock()
	for _, s := range subs {
		s.mu.Lock()
		s.stopped = true
		s.mu.Unlock()
	}
}
