package herdhttp

import (
	"context"
	"io"
	"net/http"
	"sync"
	"sync/atomic"
)

// flights holds the fetches of this process in progress, one stream per
// key: the requests that miss a key while it is being fetched read the
// fetch's stream instead of waiting for the whole response.
type flights struct {
	mu sync.Mutex
	m  map[string]*stream
	// n is len(m), written under mu: get reads it without the lock, so
	// that a request finds no fetch without taking mu while none runs.
	n atomic.Int64
}

// join returns key's stream with a reader of its body, and whether the
// caller made it and leads it: the leader must call leaderDone when it
// stops waiting, and every caller must close the reader.
// old is the stored response the fetch revalidates, if any: a reader
// that joined without looking at the tiers may serve it on error.
func (f *flights) join(key string, bufLimit int64, old *entry) (s *stream, b *streamBody, leader bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if s := f.m[key]; s != nil {
		if b := s.attach(); b != nil {
			return s, b, false
		}
	}
	if f.m == nil {
		f.m = map[string]*stream{}
	}
	s = newStream(bufLimit)
	s.old = old
	if f.m[key] == nil {
		f.n.Add(1)
	}
	f.m[key] = s
	return s, s.attach(), true
}

// get returns key's stream, with a reader of its body, when one runs that
// a reader may join.
func (f *flights) get(key string) (*stream, *streamBody) {
	if f.n.Load() == 0 {
		return nil, nil // none runs, as if it were asked with mu held now
	}
	f.mu.Lock()
	s := f.m[key]
	f.mu.Unlock()
	if s == nil {
		return nil, nil
	}
	if b := s.attach(); b != nil {
		return s, b
	}
	return nil, nil
}

// running reports whether a fetch of key is in progress, without taking
// the lock while none is.
func (f *flights) running(key string) bool {
	if f.n.Load() == 0 {
		return false
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.m[key] != nil
}

// remove forgets s as key's stream: later requests start a new one.
func (f *flights) remove(key string, s *stream) {
	f.mu.Lock()
	if f.m[key] == s {
		delete(f.m, key)
		f.n.Add(-1)
	}
	f.mu.Unlock()
}

// streamState says what a stream's readers are given.
type streamState uint8

const (
	// waiting: nothing is known yet.
	waiting streamState = iota
	// streaming: a storable response whose body arrives in buf.
	streaming
	// handedOff: a response that must not be shared, for the leader alone;
	// the other readers go to the origin themselves.
	handedOff
	// finished: the fetch ended in e or err without streaming: a value
	// from the shared tier, another replica's fetch, a pass mark, an error.
	finished
)

// stream is one fetch of a key as its readers see it. The fetch writes it
// (start, write, end; or handOff; or finish), any number of readers read
// it. Everything below mu is guarded by it.
type stream struct {
	mu sync.Mutex
	// changed is closed, and replaced, at every change readers wait for.
	changed chan struct{}
	state   streamState
	// leaderGone is set once the request that leads the stream stopped
	// waiting: a response for it alone is then closed, not handed off.
	leaderGone bool

	// streaming: e holds the status and the fields stored, own the same
	// with every end-to-end field the origin sent, for the leader, whose
	// answer it is (Set-Cookie, fields no-cache or private names); the
	// body of neither is read. buf holds the body from byte base on.
	// Until overflow every byte is kept, so a reader
	// may join at any point; after it, no reader joins and bytes every
	// reader has read are dropped. limit bounds buf after overflow: the
	// writer waits for slow readers rather than hold more.
	e        *entry
	own      *entry
	buf      []byte
	base     int64
	ended    bool
	endErr   error
	overflow bool
	limit    int64
	offsets  map[*streamBody]int64

	// handedOff: live is the leader's response until it takes it.
	live *http.Response

	// finished
	err error

	// old is the stored response the fetch revalidates; set before the
	// stream is shared, never changed.
	old *entry
}

func newStream(limit int64) *stream {
	return &stream{changed: make(chan struct{}), limit: max(limit, 64<<10)}
}

// attach registers a reader of the body from its first byte, unless no
// reader may join any more: once bytes may have been dropped (overflow),
// or once the body failed. Bytes a registered reader has yet to read are
// kept for it until it closes.
func (s *stream) attach() *streamBody {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.overflow || s.ended && s.endErr != nil {
		return nil
	}
	b := &streamBody{s: s, ctx: context.Background()}
	if s.offsets == nil {
		s.offsets = map[*streamBody]int64{}
	}
	s.offsets[b] = 0
	return b
}

// leaderDone records that the leader stopped waiting, and closes a
// response handed off to it that it did not take.
func (s *stream) leaderDone() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.leaderGone = true
	if s.live != nil {
		s.live.Body.Close()
		s.live = nil
	}
}

// notify wakes the readers; s.mu is held.
func (s *stream) notify() {
	close(s.changed)
	s.changed = make(chan struct{})
}

// wait blocks until the stream is no longer waiting, or ctx ends.
func (s *stream) wait(ctx context.Context) (streamState, error) {
	s.mu.Lock()
	for s.state == waiting {
		ch := s.changed
		s.mu.Unlock()
		select {
		case <-ch:
		case <-ctx.Done():
			return waiting, ctx.Err()
		}
		s.mu.Lock()
	}
	st := s.state
	s.mu.Unlock()
	return st, nil
}

// start makes the stream stream e's body as it arrives, own being e with
// the fields of the leader's answer; it reports false when the stream had
// already been settled otherwise.
func (s *stream) start(e, own *entry) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.state != waiting {
		return false
	}
	s.state, s.e, s.own = streaming, e, own
	s.notify()
	return true
}

// write appends body bytes. After overflow it waits while buf holds more
// than limit and some reader has yet to read it, so that a slow reader
// slows the fetch instead of growing memory; it returns false when no
// reader is left.
func (s *stream) write(p []byte) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	for s.overflow && int64(len(s.buf)) >= s.limit && len(s.offsets) > 0 {
		ch := s.changed
		s.mu.Unlock()
		<-ch
		s.mu.Lock()
	}
	if s.overflow && len(s.offsets) == 0 {
		return false
	}
	s.buf = append(s.buf, p...)
	s.notify()
	return true
}

// setOverflow stops readers from joining and lets the stream drop what
// every reader has read.
func (s *stream) setOverflow() {
	s.mu.Lock()
	s.overflow = true
	s.compact()
	s.mu.Unlock()
}

// compact drops the bytes every reader has read; s.mu is held.
func (s *stream) compact() {
	if !s.overflow {
		return
	}
	low := s.base + int64(len(s.buf))
	for _, off := range s.offsets {
		low = min(low, off)
	}
	if drop := low - s.base; drop > 0 {
		s.buf = append([]byte(nil), s.buf[drop:]...)
		s.base = low
	}
}

// end ends the body: err nil means complete, otherwise the readers' body
// fails with err (the client sees a truncated transfer).
func (s *stream) end(err error) {
	s.mu.Lock()
	if s.ended {
		s.mu.Unlock()
		return
	}
	s.ended, s.endErr = true, err
	s.notify()
	s.mu.Unlock()
}

// handOff gives resp, a response that must not be shared, to the
// leader, the request it was fetched for; the other readers go to the
// origin themselves. It reports false when the stream had already been
// settled or the leader is gone: the caller keeps resp.
func (s *stream) handOff(resp *http.Response) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.state != waiting || s.leaderGone {
		return false
	}
	s.state, s.live = handedOff, resp
	s.notify()
	return true
}

// take returns the handed-off response to the leader, once.
func (s *stream) take() *http.Response {
	s.mu.Lock()
	defer s.mu.Unlock()
	r := s.live
	s.live = nil
	return r
}

// finish settles a stream that is still waiting with the fetch's entry
// or error.
func (s *stream) finish(e *entry, err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.state != waiting {
		return
	}
	s.state, s.e, s.err = finished, e, err
	s.notify()
}

// leaderHead returns the head of a streaming stream as the leader
// answers with it: with every field the origin sent.
func (s *stream) leaderHead() *entry {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.own
}

// result returns the entry and error of a finished stream, or the
// head of a streaming one.
func (s *stream) result() (*entry, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.e, s.err
}

// streamBody reads a stream's body as it arrives. ctx, set before the
// first Read, ends its waits.
type streamBody struct {
	s      *stream
	ctx    context.Context
	off    int64
	closed bool
}

func (b *streamBody) Read(p []byte) (int, error) {
	s := b.s
	s.mu.Lock()
	defer s.mu.Unlock()
	for {
		if b.closed {
			return 0, io.ErrClosedPipe
		}
		if avail := s.base + int64(len(s.buf)) - b.off; avail > 0 {
			n := copy(p, s.buf[b.off-s.base:])
			b.off += int64(n)
			s.offsets[b] = b.off
			if s.overflow {
				s.compact()
				s.notify() // a writer may wait for room
			}
			return n, nil
		}
		if s.ended {
			if s.endErr != nil {
				return 0, s.endErr
			}
			return 0, io.EOF
		}
		ch := s.changed
		s.mu.Unlock()
		select {
		case <-ch:
		case <-b.ctx.Done():
			s.mu.Lock()
			return 0, b.ctx.Err()
		}
		s.mu.Lock()
	}
}

func (b *streamBody) Close() error {
	s := b.s
	s.mu.Lock()
	defer s.mu.Unlock()
	if !b.closed {
		b.closed = true
		delete(s.offsets, b)
		s.compact()
		s.notify()
	}
	return nil
}

// bytes returns the whole body of a stream that ended without overflow;
// nothing is appended to it after end, so it may be stored as it is.
func (s *stream) bytes() []byte {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.buf[:len(s.buf):len(s.buf)]
}
