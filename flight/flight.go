// Package flight runs one call of a function per key at a time and hands its result to every caller that asks for that key meanwhile.
package flight

import (
	"context"
	"errors"
	"fmt"
	"math"
	"runtime/debug"
	"sync"
	"sync/atomic"
	"time"
)

// DefaultTimeout bounds the context of a flight's function when
// [Group.Timeout] is zero.
const DefaultTimeout = time.Minute

// ErrGoexit is the error every waiter gets when the function of its flight
// called [runtime.Goexit] (as t.FailNow does) instead of returning.
var ErrGoexit = errors.New("flight: function called runtime.Goexit")

var (
	errNilContext      = errors.New("flight: nil Context")
	errNilFunc         = errors.New("flight: nil function")
	errNegativeTimeout = errors.New("flight: negative Group.Timeout")
)

// PanicError is the error every waiter gets when the function of its flight
// panicked. The panic is recovered: the process goes on and the key is free
// for a new flight at once.
type PanicError struct {
	// Value is the value the function panicked with.
	Value any
	// Stack is the panicking goroutine's stack, taken where the panic was
	// recovered.
	Stack []byte
}

// Error reports the panic value; the stack is in the Stack field.
func (e *PanicError) Error() string {
	return fmt.Sprintf("flight: function panicked: %v", e.Value)
}

// Unwrap returns the panic value when it is an error, so that [errors.Is]
// and [errors.As] see through the panic.
func (e *PanicError) Unwrap() error {
	err, _ := e.Value.(error)
	return err
}

// Group coalesces calls by key: while a function runs for a key, callers
// asking for that key wait for its result instead of running their own.
//
// The zero value is ready to use. Set the fields before the first call to
// [Group.Do] and leave them alone afterwards. A Group must not be copied
// after first use.
type Group[K comparable, V any] struct {
	// Timeout bounds the context a flight's function runs with, from the
	// moment the flight starts: when it has passed, that context is done
	// with [context.DeadlineExceeded]. Zero means [DefaultTimeout]; a
	// negative value makes Do fail. A function that ignores its context
	// keeps its key busy until it returns; [Group.Forget] frees the key.
	Timeout time.Duration

	// CancelWhenAbandoned, when true, cancels a flight's context as soon as
	// every caller waiting for it has left because its own context ended,
	// and frees the key so that the next caller starts a new flight. When
	// false (the default) the function runs to completion, so that its
	// value reaches the callers that join later and can be cached.
	CancelWhenAbandoned bool

	// OnStart, when not nil, is called with the key each time a caller
	// starts a new flight, before the function runs. It runs on that
	// caller's goroutine and should return quickly.
	OnStart func(key K)

	// OnJoin, when not nil, is called with the key each time a caller joins
	// a flight that another caller started. It runs on the joining
	// caller's goroutine and should return quickly.
	OnJoin func(key K)

	mu       sync.Mutex
	m        map[K]*call[V] // flights that new callers join; nil until first use
	inFlight int            // functions running now, forgotten flights included
	base     time.Time      // set with m; flights time themselves from it
}

// call is one flight. It is also the context its function runs with, when
// it has one of its own (fc): a flight of Do, and the batch of a DoMany,
// whose led flights have none (their function runs with the batch's) and
// are never used as contexts.
type call[V any] struct {
	// Guarded by the group's mu. No caller can join once the call has left
	// the map, so joins, wgUsed and done do not change after that.
	waiters int32 // callers waiting for the result now
	joins   int32 // callers that joined, ever
	inMap   bool  // the group's map holds this call under its key
	// unshared is set, before the function runs, on a call of DoUnshared:
	// never in the map, not counted by InFlight.
	unshared bool
	wgUsed   bool // wg's count is 1: a caller waits on it

	// cstate is the function's context state: whether and why it ended
	// (it changes once, from ctxLive). Not guarded by mu; it sits here to
	// fill the word of the fields above.
	cstate atomic.Uint32

	// done is closed once val and err are set; the first caller that must
	// select on it makes it.
	done chan struct{}

	// wg is done once val and err are set; the first caller that waits
	// without a context that can end adds to it. A flight that nobody joins
	// costs neither a channel nor a WaitGroup operation.
	wg sync.WaitGroup

	// Written once before wg is done and done is closed, read-only after.
	val V
	err error

	// fc is the state of the call's context; nil for a flight that a
	// DoMany leads. Set before the function runs.
	fc *fnCtx

	// batch is set, before the call enters the map, on a flight that
	// DoMany leads in a group with CancelWhenAbandoned: the context of
	// that DoMany's function, told when this call's own context ends. Nil
	// otherwise; read-only afterwards.
	batch *batch[V]
}

// States of a flight's context.
const (
	ctxLive uint32 = iota
	ctxCanceled
	ctxExpired
)

// fnCtx is the state of a call's context but for cstate, apart from the
// call so that the flights a DoMany leads, which need none, are smaller.
type fnCtx struct {
	// Written by the caller that started the flight before the function
	// runs; read-only afterwards.
	parent   context.Context // where Value looks; never cancelled
	base     *time.Time      // the group's base time
	deadline time.Duration   // since *base

	// cx is the context's Done channel, set by the first Done.
	cx atomic.Pointer[ctxDone]
}

// doCall is a flight of Do: a call with its context, allocated together.
type doCall[V any] struct {
	call[V]
	ctx fnCtx
}

// ctxDone is the Done channel of a flight's context and the timer that
// closes it at the deadline.
type ctxDone struct {
	ch     chan struct{}
	mu     sync.Mutex
	closed bool        // guarded by mu; ch is closed
	timer  *time.Timer // guarded by mu; nil once stopped
}

// Do returns the result of fn for key, running fn only if no flight for key
// is running; otherwise it waits for the running flight and returns its
// result. Every caller of one flight gets the same value and the same error.
//
// ctx bounds only this caller's wait: when it ends first, Do returns an
// error wrapping ctx.Err() (and context.Cause(ctx) if different), and the
// flight goes on for its other callers. A ctx that is already done makes Do
// return at once without starting or joining a flight. fn runs with a
// context that carries the values of the first caller's ctx but not its
// cancellation, ends after [Group.Timeout], and ends once fn has returned.
//
// If the first caller's ctx can never end (its Done method returns nil, as
// for [context.Background]) that caller runs fn on its own goroutine, as a
// plain function call would; otherwise fn runs on a new goroutine so that
// the first caller can leave when its ctx ends.
//
// fn must not call Do for its own key: it would wait for itself.
//
// A panic in fn is recovered and returned to every caller as a
// [*PanicError]; a fn that calls runtime.Goexit gives its callers
// [ErrGoexit] (a first caller that runs fn itself exits with it).
//
// shared reports whether the result went to more than one caller: it is
// true for every caller that joined a flight another caller started, and
// true for the caller that started the flight when anyone joined it.
func (g *Group[K, V]) Do(ctx context.Context, key K, fn func(context.Context) (V, error)) (v V, err error, shared bool) {
	v, shared, _, err = g.do(ctx, key, fn, join)
	return v, err, shared
}

// TryDo is Do for a caller that would rather not wait for somebody else's
// flight: when a flight for key is running it returns at once, with started
// false and without joining it. Otherwise it starts a flight, which later
// callers of Do join, and waits for it as Do does.
func (g *Group[K, V]) TryDo(ctx context.Context, key K, fn func(context.Context) (V, error)) (v V, err error, started bool) {
	v, _, started, err = g.do(ctx, key, fn, try)
	return v, err, started
}

// DoUnshared runs fn as Do would for a flight that nobody can join: the
// same context, timeout, panic and Goexit handling, and the same wait, but
// no caller of key waits for it and it waits for no one. [Group.InFlight]
// does not count it.
func (g *Group[K, V]) DoUnshared(ctx context.Context, key K, fn func(context.Context) (V, error)) (V, error) {
	v, _, _, err := g.do(ctx, key, fn, alone)
	return v, err
}

// How a call of do meets a running flight of its key.
type joinMode uint8

const (
	join  joinMode = iota // join it (Do)
	try                   // leave without it (TryDo)
	alone                 // ignore it and run a flight of its own, unshared (DoUnshared)
)

func (g *Group[K, V]) do(ctx context.Context, key K, fn func(context.Context) (V, error), mode joinMode) (v V, shared, started bool, err error) {
	if ctx == nil {
		return v, false, false, errNilContext
	}
	if fn == nil {
		return v, false, false, errNilFunc
	}
	timeout := g.Timeout
	if timeout <= 0 {
		if timeout < 0 {
			return v, false, false, errNegativeTimeout
		}
		timeout = DefaultTimeout
	}
	done := ctx.Done()
	if done != nil {
		select {
		case <-done:
			return v, false, false, waitError(ctx)
		default:
		}
	}
	g.mu.Lock()
	if c, ok := g.m[key]; ok && mode != alone {
		if mode == try {
			g.mu.Unlock()
			return v, false, false, nil
		}
		v, err, shared = g.join(ctx, done, c, key)
		return v, shared, false, err
	}
	if g.m == nil {
		g.m = make(map[K]*call[V])
		g.base = time.Now()
	}
	dc := new(doCall[V])
	c := &dc.call
	c.fc = &dc.ctx
	c.waiters = 1
	if done != nil {
		c.done = make(chan struct{})
	}
	if mode != alone {
		c.inMap = true
		g.m[key] = c
		g.inFlight++
	} else {
		c.unshared = true
	}
	g.mu.Unlock()
	// Measuring from the group's base reads only the monotonic clock.
	c.fc.base = &g.base
	c.fc.deadline = time.Since(g.base)
	c.fc.deadline += min(timeout, math.MaxInt64-c.fc.deadline) // saturates
	if g.OnStart != nil && mode != alone {
		g.OnStart(key)
	}
	if done == nil {
		// ctx can never end, so it needs no stripping and this caller can
		// never leave: it runs fn itself.
		c.fc.parent = ctx
		g.run(c, key, fn)
		return c.val, c.joins > 0, true, c.err
	}
	c.fc.parent = context.WithoutCancel(ctx)
	go g.run(c, key, fn)
	v, err, shared = g.wait(ctx, done, c, key, false)
	return v, shared, true, err
}

// join adds a caller to the running flight c and waits for its result. g.mu
// is held on entry and released here.
func (g *Group[K, V]) join(ctx context.Context, done <-chan struct{}, c *call[V], key K) (v V, err error, shared bool) {
	c.enlist(done == nil)
	g.mu.Unlock()
	if g.OnJoin != nil {
		g.OnJoin(key)
	}
	if done == nil {
		c.wg.Wait()
		return c.val, c.err, true
	}
	return g.wait(ctx, done, c, key, true)
}

// enlist counts one more caller joining c and readies what it will wait
// on: the WaitGroup if block (its ctx can never end), the done channel
// otherwise. g.mu is held.
func (c *call[V]) enlist(block bool) {
	c.waiters++
	c.joins++
	if block {
		if !c.wgUsed {
			c.wgUsed = true
			c.wg.Add(1)
		}
	} else if c.done == nil {
		c.done = make(chan struct{})
	}
}

// wait waits for c's result or for ctx to end, whichever comes first.
func (g *Group[K, V]) wait(ctx context.Context, done <-chan struct{}, c *call[V], key K, joined bool) (v V, err error, shared bool) {
	select {
	case <-c.done:
		return c.val, c.err, joined || c.joins > 0
	case <-done:
	}
	g.mu.Lock()
	abandoned := g.leave(c, key)
	g.mu.Unlock()
	if abandoned {
		c.end(ctxCanceled)
	}
	return v, waitError(ctx), false
}

// leave stops counting a caller that gave up as a waiter of c. It reports
// whether c is abandoned now, in which case it has left the map and the
// caller must end its context once g.mu is released. g.mu is held.
func (g *Group[K, V]) leave(c *call[V], key K) (abandoned bool) {
	c.waiters--
	abandoned = c.waiters == 0 && g.CancelWhenAbandoned
	if abandoned && c.inMap {
		delete(g.m, key)
		c.inMap = false
	}
	return abandoned
}

// waitError is the error of a caller whose ctx ended before its result came.
func waitError(ctx context.Context) error {
	err := ctx.Err()
	if cause := context.Cause(ctx); cause != nil && cause != err {
		return fmt.Errorf("flight: stopped waiting: %w: %w", err, cause)
	}
	return fmt.Errorf("flight: stopped waiting: %w", err)
}

// run calls fn for c and publishes its outcome, whatever way fn ends.
func (g *Group[K, V]) run(c *call[V], key K, fn func(context.Context) (V, error)) {
	normal := false
	defer func() {
		if !normal {
			var zero V
			c.val = zero
			if r := recover(); r != nil {
				c.err = &PanicError{Value: r, Stack: debug.Stack()}
			} else {
				c.err = ErrGoexit
			}
		}
		g.finish(c, key)
	}()
	c.val, c.err = fn(c)
	normal = true
}

// finish ends c's context, removes c from the map if it is still there and
// only then lets the waiters see the result, so that no caller arriving
// after a waiter has seen it can join the finished flight.
func (g *Group[K, V]) finish(c *call[V], key K) {
	c.end(ctxCanceled)
	g.mu.Lock()
	if c.inMap {
		delete(g.m, key)
		c.inMap = false
	}
	if !c.unshared {
		g.inFlight--
	}
	wgUsed, done := c.wgUsed, c.done
	g.mu.Unlock()
	if wgUsed {
		c.wg.Done()
	}
	if done != nil {
		close(done)
	}
}

// Forget makes the next caller for key start a new flight. Callers already
// waiting for the running flight keep waiting for it, and its end leaves the
// new flight alone.
func (g *Group[K, V]) Forget(key K) {
	g.mu.Lock()
	if c, ok := g.m[key]; ok {
		delete(g.m, key)
		c.inMap = false
	}
	g.mu.Unlock()
}

// ForgetAll is Forget for every key: the next caller of any key starts a
// new flight.
func (g *Group[K, V]) ForgetAll() {
	g.mu.Lock()
	for key, c := range g.m {
		delete(g.m, key)
		c.inMap = false
	}
	g.mu.Unlock()
}

// InFlight returns how many flights' functions are running now, including
// those of forgotten and abandoned flights that have not returned yet.
func (g *Group[K, V]) InFlight() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.inFlight
}

// Waiters returns how many callers are waiting for the flight that a new
// caller for key would join, the caller that started it included; zero when
// there is none.
func (g *Group[K, V]) Waiters(key K) int {
	g.mu.Lock()
	defer g.mu.Unlock()
	if c, ok := g.m[key]; ok {
		return int(c.waiters)
	}
	return 0
}

// end ends the function's context for reason unless it has already ended.
func (c *call[V]) end(reason uint32) {
	if !c.cstate.CompareAndSwap(ctxLive, reason) {
		return
	}
	// A Done that stored cx before the swap above is seen here; one that
	// stores it later sees the new state itself.
	if c.fc != nil {
		if x := c.fc.cx.Load(); x != nil {
			x.close()
		}
	}
	if b := c.batch; b != nil {
		b.keyEnded()
	}
}

func (x *ctxDone) close() {
	x.mu.Lock()
	if !x.closed {
		close(x.ch)
		x.closed = true
	}
	t := x.timer
	x.timer = nil
	x.mu.Unlock()
	if t != nil {
		t.Stop()
	}
}

func (c *call[V]) expire() { c.end(ctxExpired) }

// Deadline reports when the flight's timeout ends its context.
func (c *call[V]) Deadline() (time.Time, bool) { return c.fc.base.Add(c.fc.deadline), true }

// left returns how long the function's context has until its deadline.
func (c *call[V]) left() time.Duration { return c.fc.deadline - time.Since(*c.fc.base) }

// Done returns a channel closed when the flight's context ends. The channel
// and the timer behind it are made on the first call, so a function that
// never asks for Done costs neither.
func (c *call[V]) Done() <-chan struct{} {
	if x := c.fc.cx.Load(); x != nil {
		return x.ch
	}
	x := &ctxDone{ch: make(chan struct{})}
	if !c.fc.cx.CompareAndSwap(nil, x) {
		return c.fc.cx.Load().ch
	}
	if c.cstate.Load() != ctxLive {
		x.close()
		return x.ch
	}
	d := c.left()
	if d <= 0 {
		c.end(ctxExpired)
		return x.ch
	}
	x.mu.Lock()
	if !x.closed {
		x.timer = time.AfterFunc(d, c.expire)
	}
	x.mu.Unlock()
	return x.ch
}

// Err returns nil until the flight's context ends, then why it ended. While
// no Done channel (and so no timer) exists it reads the clock itself, so it
// reports the deadline all the same.
func (c *call[V]) Err() error {
	s := c.cstate.Load()
	if s == ctxLive && c.fc.cx.Load() == nil && c.left() <= 0 {
		c.end(ctxExpired)
		s = c.cstate.Load()
	}
	switch s {
	case ctxCanceled:
		return context.Canceled
	case ctxExpired:
		return context.DeadlineExceeded
	}
	return nil
}

// Value returns the first caller's value for key.
func (c *call[V]) Value(key any) any { return c.fc.parent.Value(key) }

func (c *call[V]) String() string { return "flight.Context" }
