// Package limiter caps concurrent calls to a backing store, queueing foreground calls by priority and shedding load when the queue is too long or too slow.
package limiter

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
)

// Priority orders foreground calls waiting for a slot: High before Normal
// before Low, first come first served within one priority. The zero value is
// Normal.
type Priority int8

// Priorities, lowest first.
const (
	Low    Priority = -1
	Normal Priority = 0
	High   Priority = 1
)

// String returns "low", "normal" or "high".
func (p Priority) String() string {
	switch p {
	case Low:
		return "low"
	case Normal:
		return "normal"
	case High:
		return "high"
	}
	return "priority(" + strconv.Itoa(int(p)) + ")"
}

type priorityKey struct{}

// WithPriority returns a copy of ctx that carries p for [Limiter.Acquire].
// A p above High counts as High and one below Low as Low.
func WithPriority(ctx context.Context, p Priority) context.Context {
	return context.WithValue(ctx, priorityKey{}, clamp(p))
}

// PriorityFrom returns the priority ctx carries, or Normal when it carries
// none.
func PriorityFrom(ctx context.Context) Priority {
	p, _ := ctx.Value(priorityKey{}).(Priority)
	return p
}

func clamp(p Priority) Priority {
	return min(max(p, Low), High)
}

// Reasons a call is shed, as found in [OverloadError.Reason].
const (
	// ReasonQueueTimeout: a foreground call waited QueueTimeout without a slot.
	ReasonQueueTimeout = "queue-timeout"
	// ReasonQueueFull: a Low-priority call found MaxQueue or more calls waiting.
	ReasonQueueFull = "queue-full"
	// ReasonReserve: a background call found no slot outside the reserve.
	ReasonReserve = "reserve"
	// ReasonLatency: a Low-priority or background call found the store's
	// measured latency, or that latency and the wait of the longest-waiting
	// call (or its own), above ShedLatency.
	ReasonLatency = "latency"
)

// ErrOverloaded is matched, through errors.Is, by every [*OverloadError].
var ErrOverloaded = errors.New("limiter: overloaded")

// OverloadError reports a call that the limiter shed instead of running.
type OverloadError struct {
	// Reason is ReasonQueueTimeout, ReasonQueueFull, ReasonReserve or
	// ReasonLatency.
	Reason string
	// Priority is the priority of the shed call; Normal for background calls.
	Priority Priority
	// Background reports whether the shed call was a background one.
	Background bool
	// RetryAfter is a hint for how long a client should wait before trying
	// again: the limiter's QueueTimeout, or one second when that is zero.
	RetryAfter time.Duration
}

func (e *OverloadError) Error() string {
	if e.Background {
		return "limiter: overloaded: " + e.Reason + " (background)"
	}
	return "limiter: overloaded: " + e.Reason + " (priority " + e.Priority.String() + ")"
}

// Is reports whether target is ErrOverloaded.
func (e *OverloadError) Is(target error) bool {
	return target == ErrOverloaded
}

// Options configures a [Limiter].
type Options struct {
	// Limit is the maximum number of slots held at once. It must be above zero.
	// With MinLimit set it is the ceiling of the adaptive limit.
	Limit int
	// MinLimit, when above zero, makes the limit adaptive: it starts at
	// MinLimit and follows the store's measured latency between MinLimit and
	// Limit (see [Limiter]). Zero keeps the limit fixed at Limit.
	// It must not be negative, must be at most Limit and above Reserve, so
	// that background calls keep a slot at the floor.
	MinLimit int
	// Reserve is the number of slots that background calls may not take: they
	// succeed only while fewer than Limit-Reserve slots are held. Zero reserves
	// none. It must be at least zero and below Limit.
	//
	// A herd cache takes a background slot for each refresh, before any
	// remote call, so a busy limiter sheds refreshes first and they cost the
	// remote tier nothing. A stale entry whose refresh was shed is not left
	// to reach its hard TTL: once half of its stale window has passed, its
	// refresh waits for a slot as a High-priority foreground call, which the
	// next released slot goes to (one such refresh per key at a time).
	Reserve int
	// QueueTimeout is how long a foreground call may wait for a slot before it
	// is shed. Zero means it waits until its context ends. It must not be
	// negative.
	QueueTimeout time.Duration
	// MaxQueue is the number of waiting calls at or beyond which a Low-priority
	// call that would have to wait is shed at once; Normal and High calls
	// still wait. Zero means no bound. It must not be negative.
	MaxQueue int
	// ShedLatency, when above zero, sheds Low-priority and background calls
	// with ReasonLatency while the store's latency is above it: the mean time
	// a slot was held over the last measurement window is, and the oldest
	// slot held has been held longer than it (so that once the store holds
	// no such call, calls go in again and measure it anew). A Low-priority
	// call that would have to wait is given what is left of ShedLatency
	// once the store's measured latency is paid: it is shed at once when
	// that is nothing or the longest-waiting call has waited longer, and
	// waits at most that long (or QueueTimeout, if shorter), so that a Low
	// call let in can still be answered within about ShedLatency. Normal
	// and High calls are not shed by latency. Zero sheds by nothing but
	// the queue. It must not be negative.
	ShedLatency time.Duration
}

// DefaultOptions returns the recommended options for limit slots: a quarter
// of them reserved for foreground calls (at least one when limit is above
// one), a one-second queue timeout, and Low-priority calls shed once
// 4*limit calls are waiting.
func DefaultOptions(limit int) Options {
	reserve := limit / 4
	if limit > 1 && reserve < 1 {
		reserve = 1
	}
	return Options{
		Limit:        limit,
		Reserve:      max(reserve, 0),
		QueueTimeout: time.Second,
		MaxQueue:     max(4*limit, 0),
	}
}

func (o Options) validate() error {
	switch {
	case o.Limit <= 0:
		return fmt.Errorf("limiter: Limit is %d, must be above zero", o.Limit)
	case o.Reserve < 0:
		return fmt.Errorf("limiter: Reserve is %d, must not be negative", o.Reserve)
	case o.Reserve >= o.Limit:
		return fmt.Errorf("limiter: Reserve is %d, must be below Limit (%d)", o.Reserve, o.Limit)
	case o.QueueTimeout < 0:
		return fmt.Errorf("limiter: QueueTimeout is %v, must not be negative", o.QueueTimeout)
	case o.MaxQueue < 0:
		return fmt.Errorf("limiter: MaxQueue is %d, must not be negative", o.MaxQueue)
	case o.MinLimit < 0:
		return fmt.Errorf("limiter: MinLimit is %d, must not be negative", o.MinLimit)
	case o.MinLimit > o.Limit:
		return fmt.Errorf("limiter: MinLimit is %d, must be at most Limit (%d)", o.MinLimit, o.Limit)
	case o.MinLimit > 0 && o.MinLimit <= o.Reserve:
		return fmt.Errorf("limiter: MinLimit is %d, must be above Reserve (%d)", o.MinLimit, o.Reserve)
	case o.ShedLatency < 0:
		return fmt.Errorf("limiter: ShedLatency is %v, must not be negative", o.ShedLatency)
	}
	return nil
}

// Stats is a snapshot of a [Limiter]'s counters since it was made. Every shed
// call is counted once by reason and once by priority.
type Stats struct {
	// Acquired counts slots granted, foreground and background.
	Acquired uint64
	// ShedQueueTimeout counts foreground calls that waited QueueTimeout
	// without getting a slot.
	ShedQueueTimeout uint64
	// ShedQueueFull counts Low-priority calls shed because MaxQueue or more
	// calls were waiting.
	ShedQueueFull uint64
	// ShedReserve counts background calls that found no slot outside the
	// reserve.
	ShedReserve uint64
	// ShedLatency counts Low-priority and background calls shed because the
	// store's latency, or the queue's wait with it, was above ShedLatency.
	ShedLatency uint64
	// ShedLow, ShedNormal and ShedHigh count shed foreground calls by
	// priority; ShedBackground counts shed background calls.
	ShedLow, ShedNormal, ShedHigh, ShedBackground uint64
	// Canceled counts foreground calls whose context ended before they got a
	// slot. They are not shed.
	Canceled uint64
	// QueueWait is the total time spent waiting by the QueueWaits calls that
	// had to wait, whatever the outcome of the wait.
	QueueWait  time.Duration
	QueueWaits uint64
	// MaxInUse is the largest number of slots held at once.
	MaxInUse int
	// Latency is the store's latency as last measured: the mean time a slot
	// was held over the last measurement window. NoLoadLatency is the
	// adaptive limit's estimate of the store's latency without queueing.
	// Both are zero while nothing is measured: the limit is fixed and
	// ShedLatency is zero, or no window has closed yet.
	Latency, NoLoadLatency time.Duration
}

// Shed returns the number of calls shed, for any reason.
func (s Stats) Shed() uint64 {
	return s.ShedQueueTimeout + s.ShedQueueFull + s.ShedReserve + s.ShedLatency
}

// A Limiter hands out a number of slots, fixed or adaptive. Foreground calls
// that find none free wait in priority order; background calls never wait.
// It is safe for concurrent use and may be shared by many caches.
//
// With Options.MinLimit set the number of slots adapts to the store, the
// way TCP Vegas and Netflix's concurrency-limits do: the time each slot is
// held is the store's latency, measured over windows of about one latency
// (at least max(5, limit) released slots). Its no-load latency is the mean
// latency of the first 16 released slots, and then the lowest seen of the
// median of the last three windows, so that one window made unusually
// fast or slow by the machine moves nothing. Each window estimates how
// many of the limiter's calls wait inside the store (the slots held times
// 1 - no-load/latency) and moves the limit halfway towards the number that
// leaves max(½, √limit/4) of them waiting, rising only while at least half
// the slots were in use; a latency above twice the no-load one cuts it to
// that number, by half at most. Limiters sharing one store so converge on
// near equal shares of it, and settle at its capacity rather than swing
// around it when its latency grows as the square of its calls past it (a
// database contending for its locks, which then serves fewer calls a
// second the more it is given). The limit starts at MinLimit, so that the
// first windows see the store unloaded, and until its first cut grows by
// its square root every latency (a slow start). When a cut made on a
// latency above twice the no-load latency does not bring the latency of
// the next calls down by a quarter, or a latency stays above twice the
// no-load one for four windows whatever the cuts, the store is taken to
// have become slower by itself: that latency becomes its no-load latency
// (and a limit cut so returns to what it was), so that a store that became
// uniformly slower keeps its concurrency; the old one returns, with the
// limit of before if higher, at the first window within twice it, or a
// quarter below the latency learned as the store slowed.
// MinLimit should be below the store's capacity. Priorities, Reserve, QueueTimeout, MaxQueue,
// the shedding reasons and RetryAfter work as with a fixed limit, against
// the limit of the moment.
type Limiter struct {
	reserve      int
	queueTimeout time.Duration
	maxQueue     int
	retryAfter   time.Duration
	shedLatency  time.Duration

	// limit is the number of slots, Options.Limit when it is fixed; written
	// under mu, read atomically.
	limit atomic.Int64
	// est measures the store's latency and adapts limit; nil when neither
	// MinLimit nor ShedLatency is set. Guarded by mu.
	est *estimator
	// latency is est's last measured latency, for ShedLatency; written under
	// mu, read atomically.
	latency atomic.Int64
	// noLoad is est's estimate of the no-load latency, read atomically.
	noLoad atomic.Int64

	mu sync.Mutex
	// inUse is the number of slots held. Guarded by mu. It exceeds limit only
	// after the adaptive limit went down, until enough slots are released.
	// Whenever a queue is non-empty, inUse >= limit: a slot released while
	// calls wait passes straight to the first of them.
	inUse int
	// queues holds the waiting calls by priority (index Priority+1), each
	// in arrival order. Guarded by mu.
	queues [3]queue
	// waiting is the total length of queues. Guarded by mu.
	waiting int

	acquired   atomic.Uint64
	shedReason [4]atomic.Uint64 // by reason: queue-timeout, queue-full, reserve, latency
	shedPrio   [4]atomic.Uint64 // by Priority+1; [3] is background
	canceled   atomic.Uint64
	queueWait  atomic.Int64
	queueWaits atomic.Uint64
	maxInUse   atomic.Int64 // written under mu

	// testHookWaitEnded, when set, runs after a wait ends by timeout or
	// context and before the waiter takes mu to leave its queue.
	testHookWaitEnded func()
}

// A waiter is one call waiting for a slot. Waiters are not pooled: a channel
// made inside a testing/synctest bubble must never be used outside it.
type waiter struct {
	// ready receives one value when the waiter is granted a slot, sent under
	// mu at the moment the waiter leaves its queue.
	ready      chan struct{}
	since      time.Time // when it started waiting
	prev, next *waiter   // guarded by mu
}

// queue is a FIFO list of waiters, linked through the waiters themselves so
// that a waiter whose wait ends can leave from the middle.
type queue struct {
	head, tail *waiter
}

func (q *queue) push(w *waiter) {
	w.prev = q.tail
	if q.tail != nil {
		q.tail.next = w
	} else {
		q.head = w
	}
	q.tail = w
}

func (q *queue) remove(w *waiter) {
	if w.prev != nil {
		w.prev.next = w.next
	} else {
		q.head = w.next
	}
	if w.next != nil {
		w.next.prev = w.prev
	} else {
		q.tail = w.prev
	}
	w.prev, w.next = nil, nil
}

const (
	reasonQueueTimeout = iota
	reasonQueueFull
	reasonReserve
	reasonLatency
)

var reasons = [...]string{ReasonQueueTimeout, ReasonQueueFull, ReasonReserve, ReasonLatency}

// New returns a Limiter configured by o, or an error if o is invalid.
func New(o Options) (*Limiter, error) {
	if err := o.validate(); err != nil {
		return nil, err
	}
	retry := o.QueueTimeout
	if retry == 0 {
		retry = time.Second
	}
	l := &Limiter{
		reserve:      o.Reserve,
		queueTimeout: o.QueueTimeout,
		maxQueue:     o.MaxQueue,
		retryAfter:   retry,
		shedLatency:  o.ShedLatency,
	}
	if o.MinLimit > 0 || o.ShedLatency > 0 {
		l.est = newEstimator(o.MinLimit, o.Limit)
	}
	l.limit.Store(int64(o.Limit))
	if o.MinLimit > 0 {
		l.limit.Store(int64(o.MinLimit))
	}
	return l, nil
}

// Acquire takes a slot for a foreground call, waiting for one if none is
// free, with the priority that ctx carries (see [WithPriority]). A nil error
// means the caller holds a slot and must [Limiter.Release] it. A call shed
// because it waited QueueTimeout, or because it is Low priority and the queue
// is full, gets an [*OverloadError]; a call whose ctx ends first gets an
// error wrapping ctx.Err() and its cause. Neither holds a slot.
func (l *Limiter) Acquire(ctx context.Context) error {
	select {
	case <-ctx.Done():
		l.canceled.Add(1)
		return ctxError(ctx)
	default:
	}

	p := PriorityFrom(ctx)
	l.mu.Lock()
	if p == Low && l.slowLocked() {
		l.mu.Unlock()
		return l.shed(reasonLatency, p, false)
	}
	if l.inUse < int(l.limit.Load()) {
		// No call is waiting (see inUse), so this one is not overtaking any.
		l.takeLocked()
		l.mu.Unlock()
		l.acquired.Add(1)
		return nil
	}
	if p == Low && l.maxQueue > 0 && l.waiting >= l.maxQueue {
		l.mu.Unlock()
		return l.shed(reasonQueueFull, p, false)
	}
	wait, reason := l.queueTimeout, reasonQueueTimeout
	if p == Low && l.shedLatency > 0 {
		// What is left of ShedLatency once the store's latency is paid.
		budget := l.shedLatency - time.Duration(l.latency.Load())
		if budget <= 0 || time.Since(l.oldestLocked()) > budget {
			l.mu.Unlock()
			return l.shed(reasonLatency, p, false)
		}
		if wait == 0 || budget < wait {
			wait, reason = budget, reasonLatency
		}
	}
	w := &waiter{ready: make(chan struct{}, 1), since: time.Now()}
	q := &l.queues[p+1]
	q.push(w)
	l.waiting++
	l.mu.Unlock()

	start := w.since
	var timeout <-chan time.Time
	if wait > 0 {
		t := time.NewTimer(wait)
		defer t.Stop()
		timeout = t.C
	}
	select {
	case <-w.ready:
		l.waited(start)
		l.acquired.Add(1)
		return nil

	case <-timeout:
		if l.testHookWaitEnded != nil {
			l.testHookWaitEnded()
		}
		l.mu.Lock()
		select {
		case <-w.ready:
			// Granted between the timeout and taking mu: the slot is ours.
			l.mu.Unlock()
			l.waited(start)
			l.acquired.Add(1)
			return nil
		default:
		}
		q.remove(w)
		l.waiting--
		l.mu.Unlock()
		l.waited(start)
		return l.shed(reason, p, false)

	case <-ctx.Done():
		if l.testHookWaitEnded != nil {
			l.testHookWaitEnded()
		}
		l.mu.Lock()
		select {
		case <-w.ready:
			// Granted between ctx ending and taking mu: the caller has gone,
			// so pass the slot on.
			if l.est != nil {
				l.est.forget()
			}
			l.releaseLocked()
		default:
			q.remove(w)
			l.waiting--
		}
		l.mu.Unlock()
		l.waited(start)
		l.canceled.Add(1)
		return ctxError(ctx)
	}
}

// TryAcquireBackground takes a slot for a background call if one is free
// outside the reserve, that is if fewer than Limit-Reserve slots are held,
// and reports whether it did. It never waits; a false result counts as shed,
// with the reason that [Limiter.AcquireBackground] would have given. On true
// the caller must [Limiter.Release] the slot.
func (l *Limiter) TryAcquireBackground() bool {
	return l.AcquireBackground() == nil
}

// AcquireBackground is [Limiter.TryAcquireBackground] with the reason a
// call is shed: it takes a slot for a background call without waiting and
// returns nil, or an [*OverloadError] with Background set and the reason
// ReasonLatency when the store's latency is above ShedLatency, or
// ReasonReserve when no slot is free outside the reserve. On nil the caller
// must [Limiter.Release] the slot.
func (l *Limiter) AcquireBackground() error {
	l.mu.Lock()
	if l.slowLocked() {
		l.mu.Unlock()
		return l.shed(reasonLatency, 0, true)
	}
	if l.inUse < int(l.limit.Load())-l.reserve {
		l.takeLocked()
		l.mu.Unlock()
		l.acquired.Add(1)
		return nil
	}
	l.mu.Unlock()
	return l.shed(reasonReserve, 0, true)
}

// Release gives back a slot taken by Acquire or TryAcquireBackground, handing
// it to the first waiting call of the highest priority if there is one.
// Calling it without holding a slot is a programming error, and it panics.
//
// When the limiter measures latency (MinLimit or ShedLatency set), the time
// a slot is held is taken for the store's latency: release a slot as soon as
// the store call it guards returns.
func (l *Limiter) Release() {
	l.mu.Lock()
	if l.inUse == 0 {
		l.mu.Unlock()
		panic("limiter: Release called without a slot held")
	}
	if l.est != nil {
		l.measureReleaseLocked()
	}
	l.releaseLocked()
	l.mu.Unlock()
}

// releaseLocked gives back one held slot, to the first waiting call unless
// the adaptive limit went below the slots held. l.mu must be held.
func (l *Limiter) releaseLocked() {
	if l.inUse <= int(l.limit.Load()) && l.grantLocked() {
		return
	}
	l.inUse--
}

// grantLocked passes a slot to the first waiting call of the highest
// priority, if there is one, and reports whether it did. l.mu must be held.
func (l *Limiter) grantLocked() bool {
	for i := len(l.queues) - 1; i >= 0; i-- {
		q := &l.queues[i]
		if w := q.head; w != nil {
			q.remove(w)
			l.waiting--
			w.ready <- struct{}{} // buffered, and sent to only once
			if l.est != nil {
				l.est.took(time.Now(), l.inUse)
			}
			return true
		}
	}
	return false
}

// oldestLocked returns when the longest-waiting call started waiting, or
// now when none waits. l.mu must be held.
func (l *Limiter) oldestLocked() time.Time {
	oldest := time.Now()
	for i := range l.queues {
		if w := l.queues[i].head; w != nil && w.since.Before(oldest) {
			oldest = w.since
		}
	}
	return oldest
}

// slowLocked reports whether the store's latency is above ShedLatency: the
// last measured latency is, and so is the time the oldest held slot has been
// held. A measure is never taken while every call is shed, so the second
// test lets calls in again once the store holds none that it keeps longer
// than ShedLatency. l.mu must be held.
func (l *Limiter) slowLocked() bool {
	if l.shedLatency <= 0 || time.Duration(l.latency.Load()) <= l.shedLatency {
		return false
	}
	e := l.est
	return e.n > 0 && time.Since(e.starts[e.head]) > l.shedLatency
}

// takeLocked takes a free slot. l.mu must be held.
func (l *Limiter) takeLocked() {
	l.inUse++
	if l.est != nil {
		l.est.took(time.Now(), l.inUse)
	}
	if int64(l.inUse) > l.maxInUse.Load() {
		l.maxInUse.Store(int64(l.inUse))
	}
}

func (l *Limiter) waited(start time.Time) {
	l.queueWait.Add(int64(time.Since(start)))
	l.queueWaits.Add(1)
}

func (l *Limiter) count(reason int, p Priority, background bool) {
	l.shedReason[reason].Add(1)
	if background {
		l.shedPrio[3].Add(1)
	} else {
		l.shedPrio[p+1].Add(1)
	}
}

func (l *Limiter) shed(reason int, p Priority, background bool) error {
	l.count(reason, p, background)
	return &OverloadError{
		Reason:     reasons[reason],
		Priority:   p,
		Background: background,
		RetryAfter: l.retryAfter,
	}
}

func ctxError(ctx context.Context) error {
	err := ctx.Err()
	if cause := context.Cause(ctx); cause != nil && cause != err {
		return fmt.Errorf("limiter: waiting for a slot: %w: %w", err, cause)
	}
	return fmt.Errorf("limiter: waiting for a slot: %w", err)
}

// RetryAfter returns the hint that every [*OverloadError] of l carries: its
// QueueTimeout, or one second when that is zero.
func (l *Limiter) RetryAfter() time.Duration { return l.retryAfter }

// InUse returns the number of slots held.
func (l *Limiter) InUse() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.inUse
}

// Waiting returns the number of foreground calls waiting for a slot.
func (l *Limiter) Waiting() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.waiting
}

// Limit returns the number of slots: the configured Limit, or the adaptive
// limit now when MinLimit is set.
func (l *Limiter) Limit() int {
	return int(l.limit.Load())
}

// Stats returns a snapshot of the limiter's counters. Each counter is read
// atomically, but not all of them at one instant.
func (l *Limiter) Stats() Stats {
	return Stats{
		Acquired:         l.acquired.Load(),
		ShedQueueTimeout: l.shedReason[reasonQueueTimeout].Load(),
		ShedQueueFull:    l.shedReason[reasonQueueFull].Load(),
		ShedReserve:      l.shedReason[reasonReserve].Load(),
		ShedLatency:      l.shedReason[reasonLatency].Load(),
		ShedLow:          l.shedPrio[Low+1].Load(),
		ShedNormal:       l.shedPrio[Normal+1].Load(),
		ShedHigh:         l.shedPrio[High+1].Load(),
		ShedBackground:   l.shedPrio[3].Load(),
		Canceled:         l.canceled.Load(),
		QueueWait:        time.Duration(l.queueWait.Load()),
		QueueWaits:       l.queueWaits.Load(),
		MaxInUse:         int(l.maxInUse.Load()),
		Latency:          time.Duration(l.latency.Load()),
		NoLoadLatency:    time.Duration(l.noLoad.Load()),
	}
}
