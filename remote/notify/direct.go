package notify

import "sync"

// Direct is a set of subscribers that an announcer calls itself, on its own
// goroutine, before it goes on: what they do in fn happens before anything
// the announcer does next. A Store author uses it for hold announcements
// (remote.HoldNotifier), whose subscribers register for the holder's
// completion before it can be announced. The zero Direct is empty and
// ready; its methods are safe for concurrent use.
type Direct struct {
	mu   sync.Mutex
	subs map[*directSub]struct{}
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
	d.mu.Unlock()
	return func() {
		s.mu.Lock()
		s.stopped = true
		s.mu.Unlock()
		d.mu.Lock()
		delete(d.subs, s)
		d.mu.Unlock()
	}
}

// Call calls every subscriber's fn with n, one after another, on the
// caller's goroutine, and returns when they have returned. The caller must
// hold no lock that an fn may take.
func (d *Direct) Call(n Notice) {
	d.mu.Lock()
	if len(d.subs) == 0 {
		d.mu.Unlock()
		return
	}
	subs := make([]*directSub, 0, len(d.subs))
	for s := range d.subs {
		subs = append(subs, s)
	}
	d.mu.Unlock()
	for _, s := range subs {
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
	d.mu.Unlock()
	for s := range subs {
		s.mu.Lock()
		s.stopped = true
		s.mu.Unlock()
	}
}
