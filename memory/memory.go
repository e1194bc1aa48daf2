// Package memory is an in-process remote tier: caches that share one Remote act as replicas of one fleet.
package memory

import (
	"bytes"
	"context"
	"fmt"
	"math"
	"sync"
	"time"

	"github.com/herdcache/herd/remote"
	"github.com/herdcache/herd/remote/envelope"
	"github.com/herdcache/herd/remote/notify"
)

// subscribeQueue is how many notices a subscription queues for a slow fn
// before it replaces them with one zero Notice: drop everything.
const subscribeQueue = 1024

// Fences expire as redisstore's fence keys do: max(the value's ttl, the
// lease's ttl, minFenceTTL) + fenceMargin after each change to the key.
const (
	minFenceTTL = time.Minute
	fenceMargin = 10 * time.Second
)

// minSweep is the fewest keys at which a Remote sweeps out the expired ones.
const minSweep = 1024

// Remote holds encoded envelopes, fences and leases in memory. It implements
// [remote.Store], [remote.Lease], [remote.Notifier] and [remote.HoldNotifier]
// and is safe for concurrent use. The zero value is not usable; call [New].
//
// Values, leases and fences expire, as in redisstore: a key's fence lasts
// max(the value's ttl, the lease's ttl, 1 min) + 10 s after the last write,
// Set, Invalidate, Acquire or Extend of the key, and then reads as 0. A new
// fence is max(the previous + 1, the clock in Unix microseconds), so fences
// only grow while the clock does not go back. A key with nothing left is
// forgotten when next used, or by a sweep whenever the number of keys held
// has doubled, so memory stays in proportion to the live keys.
//
// Expiry follows time.Now, so testing/synctest's fake clock drives it.
type Remote struct {
	mu sync.Mutex
	// down, when non-nil, is wrapped by the error of every Store and Lease call.
	down error
	// keys holds every key with a value, a lease or a fence above zero, and
	// keys whose last one has expired since they were last used or swept.
	keys map[string]*entry
	// sweepAt is how many keys make the next new key sweep out the expired
	// ones: twice as many as the last sweep left, and at least minSweep.
	sweepAt int
	// waits holds the Wait calls blocked until a key's next announcement,
	// and the watches of the next one. wmu guards it: taken inside mu by
	// the calls that announce, and alone by those that register, so that
	// registering and taking back a watch never waits for a Store call.
	wmu   sync.Mutex
	waits notify.Waiters
	// subs holds the subscriptions that have not been stopped.
	subs map[*notify.Subscription]struct{}
	// holds holds the SubscribeHolds subscriptions that have not been
	// stopped.
	holds map[*notify.Subscription]struct{}
	// noticeValues is the longest envelope a change notice carries
	// (SetNoticeValues); none when below 1.
	noticeValues int
	// batched, when not nil, collects the notices of a batch call, pushed
	// to every subscription as one message when it ends.
	batched []notify.Notice
	stats   Stats
	// tags holds the tags' versions (see InvalidateTag); nil until the
	// first call.
	tags map[string]tagVersion
	// tagsSwept is how many versions the last sweep of tags left.
	tagsSwept int
	// hot holds the hot set's counts by period (see AddHot); nil until the
	// first call.
	hot map[hotPeriod]map[string]float64
}

// entry is one key's state.
type entry struct {
	// value is the stored envelope with its fence field set; nil when none.
	// It is never handed out: readers get copies.
	value []byte
	// hard is when value stops being visible; meaningful only when value != nil.
	hard time.Time
	// fence is the key's fence: zero until first advanced, and again once
	// it expires at fenceEnd; while it lives it only grows.
	fence uint64
	// fenceEnd is when fence reads as zero again; meaningful only when
	// fence != 0.
	fenceEnd time.Time
	// token is the lease holder's token; empty when nobody holds the lease.
	token string
	// leaseEnd is when the lease expires; meaningful only when token != "".
	leaseEnd time.Time
}

// Stats counts what a Remote has done since [New]. A call that returns an
// error counts only as a Failure; a Wait whose context ends counts nowhere.
type Stats struct {
	Loads         uint64 // Load calls
	Writes        uint64 // Write calls that stored (fence current)
	RefusedWrites uint64 // Write calls refused for a stale fence
	Sets          uint64 // Set calls that stored
	Invalidates   uint64 // Invalidate calls
	// InvalidateAlls counts InvalidateAll calls.
	InvalidateAlls uint64
	// TagInvalidates counts InvalidateTag calls, and TagReads the tags
	// whose version TagVersions read.
	TagInvalidates, TagReads uint64
	AcquireValue             uint64 // Acquire calls answered with a fresh value
	AcquireLease             uint64 // Acquire calls that took the lease
	AcquireHeld              uint64 // Acquire calls that found the lease held by another
	Extends                  uint64 // Extend calls that extended a lease
	Releases                 uint64 // Release calls that gave up a held lease
	Announces                uint64 // completions announced to Wait-ers (one per Release)
	Failures                 uint64 // calls that returned an error
	// Batches counts LoadMany, AcquireMany, ExtendMany and WriteReleaseMany
	// calls, whatever their entries' outcomes; each entry also counts as
	// its single call.
	Batches uint64
}

var (
	_ remote.Store             = (*Remote)(nil)
	_ remote.Lease             = (*Remote)(nil)
	_ remote.WriteReleaser     = (*Remote)(nil)
	_ remote.Notifier          = (*Remote)(nil)
	_ remote.HoldNotifier      = (*Remote)(nil)
	_ remote.BatchWatcher      = (*Remote)(nil)
	_ remote.CompletionCounter = (*Remote)(nil)
)

// New returns an empty, healthy Remote.
func New() *Remote {
	return &Remote{
		keys:    make(map[string]*entry),
		sweepAt: minSweep,
		subs:    make(map[*notify.Subscription]struct{}),
		holds:   make(map[*notify.Subscription]struct{}),
	}
}

// SetDown makes every later Store and Lease call fail with an error wrapping
// err, and wakes every Wait with that error; a nil err brings the remote back
// with its values, fences and leases as they were.
func (r *Remote) SetDown(err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.down = err
	if err == nil {
		return
	}
	r.wakeAll()
}

// wakeAll wakes every Wait and calls every watch. r.mu is held.
func (r *Remote) wakeAll() {
	r.wmu.Lock()
	defer r.wmu.Unlock()
	r.waits.WakeAll()
}

// Flush drops every value and lease and the hot set, as a cache flush
// would, but keeps the fences until they expire, so a write begun before
// the flush is still refused after a newer acquisition. Subscribers and Wait-ers are not told,
// as with a Redis FLUSHALL.
func (r *Remote) Flush() {
	r.mu.Lock()
	defer r.mu.Unlock()
	now := time.Now()
	for key, e := range r.keys {
		e.expire(now)
		e.value, e.token = nil, ""
		r.tidy(key, e)
	}
	r.hot = nil
}

// Stats returns a snapshot of the counters.
func (r *Remote) Stats() Stats {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.stats
}

// Load returns a copy of the envelope stored under key, or nil when there is
// none or it is past its hard expiry.
func (r *Remote) Load(ctx context.Context, key string) ([]byte, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.load(ctx, key, time.Now())
}

// load is Load at now with r.mu held.
func (r *Remote) load(ctx context.Context, key string, now time.Time) ([]byte, error) {
	if err := r.check(ctx, "load", key); err != nil {
		return nil, err
	}
	r.stats.Loads++
	e := r.entry(key, now, false)
	if e == nil || e.value == nil {
		return nil, nil
	}
	return bytes.Clone(e.value), nil
}

// Write stores a copy of env, its fence field set to fence, under key for ttl
// if fence is key's current fence (zero for a key never fenced or whose
// fence has expired), keeps the fence at least as long, and notifies
// subscribers. An env that does not decode is an error and changes nothing.
func (r *Remote) Write(ctx context.Context, key string, env []byte, fence uint64, ttl time.Duration) (bool, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.write(ctx, key, env, fence, ttl)
}

// write is Write with r.mu held.
func (r *Remote) write(ctx context.Context, key string, env []byte, fence uint64, ttl time.Duration) (bool, error) {
	if err := r.check(ctx, "write", key); err != nil {
		return false, err
	}
	v, err := r.prepare(env, ttl, "write", key)
	if err != nil {
		return false, err
	}
	now := time.Now()
	e := r.entry(key, now, true)
	if e.fence != fence {
		r.stats.RefusedWrites++
		r.tidy(key, e)
		return false, nil
	}
	if err := r.store(e, v, fence, now.Add(ttl), key); err != nil {
		r.tidy(key, e)
		return false, err
	}
	keepFence(e, now, ttl)
	r.stats.Writes++
	r.notifyStored(key, fence, e.value)
	return true, nil
}

// WriteRelease does what Write and then Release do, atomically, and reports
// whether it wrote. The release and its announcement happen whether or not
// it wrote, and even when the write is an error.
func (r *Remote) WriteRelease(ctx context.Context, key string, env []byte, fence uint64, ttl time.Duration, token string) (bool, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.writeRelease(ctx, key, env, fence, ttl, token)
}

// writeRelease is WriteRelease with r.mu held.
func (r *Remote) writeRelease(ctx context.Context, key string, env []byte, fence uint64, ttl time.Duration, token string) (bool, error) {
	wrote, err := r.write(ctx, key, env, fence, ttl)
	var stored []byte // what the completion announces: the value it wrote
	if wrote {
		if e := r.keys[key]; e != nil {
			stored = e.value
		}
	}
	if rerr := r.releaseWith(ctx, key, token, stored); rerr != nil {
		return wrote, rerr
	}
	return wrote, err
}

// Set advances key's fence, stores a copy of env under the new fence for ttl,
// notifies subscribers and returns the new fence. An env that does not decode
// is an error and changes nothing, the fence included.
func (r *Remote) Set(ctx context.Context, key string, env []byte, ttl time.Duration) (uint64, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if err := r.check(ctx, "set", key); err != nil {
		return 0, err
	}
	v, err := r.prepare(env, ttl, "set", key)
	if err != nil {
		return 0, err
	}
	now := time.Now()
	e := r.entry(key, now, true)
	if err := r.canAdvance(e, "set", key); err != nil {
		return 0, err
	}
	fence := nextFence(e, now)
	if err := r.store(e, v, fence, now.Add(ttl), key); err != nil {
		r.tidy(key, e)
		return 0, err
	}
	advance(e, fence, now, ttl)
	r.stats.Sets++
	r.notifyStored(key, e.fence, e.value)
	return e.fence, nil
}

// Invalidate advances key's fence, deletes its value and notifies subscribers.
func (r *Remote) Invalidate(ctx context.Context, key string) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if err := r.check(ctx, "invalidate", key); err != nil {
		return err
	}
	now := time.Now()
	e := r.entry(key, now, true)
	if err := r.canAdvance(e, "invalidate", key); err != nil {
		return err
	}
	advance(e, nextFence(e, now), now, 0)
	e.value = nil
	r.stats.Invalidates++
	r.notify(key, e.fence, true)
	return nil
}

// Acquire returns a copy of key's value if its soft expiry is later than both
// now and after; otherwise how long the current lease has left if another
// holder has it; otherwise it takes the lease for ttl with a new random token
// and advances the fence. Soft expiries are compared at the millisecond
// resolution of the envelope. A value that does not decode counts as no
// fresh value.
func (r *Remote) Acquire(ctx context.Context, key string, ttl time.Duration, after time.Time) (remote.Grant, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	now := time.Now()
	a := r.acquire(ctx, key, ttl, after, now)
	r.announce([]remote.LeaseRequest{{Key: key}}, []remote.Acquired{a}, now.Add(ttl))
	return a.Grant, a.Err
}

// Extend pushes key's lease expiry to ttl from now if token holds a live
// lease, keeping the fence at least as long, and reports whether it did.
func (r *Remote) Extend(ctx context.Context, key, token string, ttl time.Duration) (bool, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if err := r.check(ctx, "extend", key); err != nil {
		return false, err
	}
	if err := r.checkTTL(ttl, "extend", key); err != nil {
		return false, err
	}
	now := time.Now()
	e := r.entry(key, now, false)
	if e == nil || token == "" || e.token != token {
		return false, nil
	}
	e.leaseEnd = now.Add(ttl)
	keepFence(e, now, ttl)
	r.stats.Extends++
	return true, nil
}

// Release drops key's lease if token holds it, and in any case announces to
// Wait-ers that key's load has completed.
func (r *Remote) Release(ctx context.Context, key, token string) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.releaseWith(ctx, key, token, nil)
}

// releaseWith is Release with r.mu held, its completion announced with
// stored, the value the load stored (nil: none), to WatchValues
// registrations.
func (r *Remote) releaseWith(ctx context.Context, key, token string, stored []byte) error {
	if err := r.check(ctx, "release", key); err != nil {
		return err
	}
	if e := r.entry(key, time.Now(), false); e != nil && token != "" && e.token == token {
		e.token = ""
		r.stats.Releases++
		r.tidy(key, e)
	}
	r.stats.Announces++
	r.wmu.Lock()
	r.waits.WakeWith(key, stored)
	r.wmu.Unlock()
	return nil
}

// Wait blocks until a completion for key is announced after it was called,
// or ctx ends, or the remote goes down; the last two return an error.
func (r *Remote) Wait(ctx context.Context, key string) error {
	r.mu.Lock()
	if err := r.check(ctx, "wait", key); err != nil {
		r.mu.Unlock()
		return err
	}
	r.wmu.Lock()
	w := r.waits.Add(key)
	r.wmu.Unlock()
	r.mu.Unlock()

	select {
	case <-w.C():
		r.mu.Lock()
		defer r.mu.Unlock()
		if r.down != nil {
			r.stats.Failures++
			return fmt.Errorf("memory: wait %q: %w", key, r.down)
		}
		return nil
	case <-ctx.Done():
		r.wmu.Lock()
		defer r.wmu.Unlock()
		r.waits.Leave(w)
		return fmt.Errorf("memory: wait %q: %w", key, ctx.Err())
	}
}

// Watch registers notify for the next completion of key announced after
// it was called, as Wait waits for it, without blocking ([remote.Watcher]);
// notify is also called when the remote goes down.
func (r *Remote) Watch(key string, notify func()) (stop func()) {
	r.wmu.Lock()
	defer r.wmu.Unlock()
	return r.waits.Watch(&r.wmu, key, notify)
}

// Completions returns a count that each later completion of key moves,
// and whatever else calls a Watch's notify ([remote.CompletionCounter]);
// keys share counts.
func (r *Remote) Completions(key string) uint64 { return r.waits.Count(key) }

// WatchMany is Watch for each of keys at once ([remote.BatchWatcher]).
func (r *Remote) WatchMany(keys []string, notify func(i int)) (stop func(i int)) {
	r.wmu.Lock()
	defer r.wmu.Unlock()
	return r.waits.WatchMany(&r.wmu, keys, notify)
}

// WatchValues is WatchMany with each completion's value
// ([remote.ValueWatcher]): the envelope a WriteRelease stored, nil for a
// Release, a write refused, and a completion announced otherwise.
func (r *Remote) WatchValues(keys []string, notify func(i int, env []byte)) (stop func(i int)) {
	r.wmu.Lock()
	defer r.wmu.Unlock()
	return r.waits.WatchManyValues(&r.wmu, keys, notify)
}

// check returns the error that refuses a call: an ended ctx or a down
// remote. r.mu is held.
func (r *Remote) check(ctx context.Context, op, key string) error {
	var err error
	switch {
	case ctx.Err() != nil:
		err = fmt.Errorf("memory: %s %q: %w", op, key, ctx.Err())
	case r.down != nil:
		err = fmt.Errorf("memory: %s %q: %w", op, key, r.down)
	}
	if err != nil {
		r.stats.Failures++
	}
	return err
}

// canAdvance refuses to advance a fence that has reached envelope.MaxFence,
// so that fences stay below 2^53. r.mu is held.
func (r *Remote) canAdvance(e *entry, op, key string) error {
	if e.fence < envelope.MaxFence {
		return nil
	}
	r.stats.Failures++
	return fmt.Errorf("memory: %s %q: fence %d cannot advance: %w", op, key, e.fence, remote.ErrRejected)
}

// checkTTL refuses a ttl that is not positive. r.mu is held.
func (r *Remote) checkTTL(ttl time.Duration, op, key string) error {
	if ttl > 0 {
		return nil
	}
	r.stats.Failures++
	return fmt.Errorf("memory: %s %q: ttl %v is not positive: %w", op, key, ttl, remote.ErrRejected)
}

// prepare checks env and ttl and returns a private copy of env. r.mu is held.
func (r *Remote) prepare(env []byte, ttl time.Duration, op, key string) ([]byte, error) {
	if err := r.checkTTL(ttl, op, key); err != nil {
		return nil, err
	}
	if _, err := envelope.Decode(env); err != nil {
		r.stats.Failures++
		return nil, fmt.Errorf("memory: %s %q: %w: %w", op, key, remote.ErrRejected, err)
	}
	return bytes.Clone(env), nil
}

// store puts v, its fence field set to fence, as e's value until hard.
// r.mu is held.
func (r *Remote) store(e *entry, v []byte, fence uint64, hard time.Time, key string) error {
	if err := envelope.SetFence(v, fence); err != nil {
		r.stats.Failures++
		return fmt.Errorf("memory: store %q: %w: %w", key, remote.ErrRejected, err)
	}
	e.value, e.hard = v, hard
	return nil
}

// entry returns key's entry with anything expired at now dropped; when there
// is none it returns nil, or a new zero entry if create is set. r.mu is held.
func (r *Remote) entry(key string, now time.Time, create bool) *entry {
	e := r.keys[key]
	if e == nil {
		if !create {
			return nil
		}
		if len(r.keys) >= r.sweepAt {
			r.sweep(now)
		}
		e = &entry{}
		r.keys[key] = e
		return e
	}
	e.expire(now)
	if !create {
		r.tidy(key, e)
	}
	return e
}

// sweep forgets every key with nothing left at now. r.mu is held.
func (r *Remote) sweep(now time.Time) {
	for key, e := range r.keys {
		e.expire(now)
		r.tidy(key, e)
	}
	r.sweepAt = max(2*len(r.keys), minSweep)
}

// expire drops what has expired of e at now.
func (e *entry) expire(now time.Time) {
	if e.value != nil && !now.Before(e.hard) {
		e.value = nil
	}
	if e.token != "" && !now.Before(e.leaseEnd) {
		e.token = ""
	}
	if e.fence != 0 && !now.Before(e.fenceEnd) {
		e.fence, e.fenceEnd = 0, time.Time{}
	}
}

// tidy forgets key's entry if it holds nothing. r.mu is held.
func (r *Remote) tidy(key string, e *entry) {
	if e.value == nil && e.token == "" && e.fence == 0 {
		delete(r.keys, key)
	}
}

// nextFence returns the fence that follows e's at now: max(e.fence + 1, now
// in Unix microseconds), at most envelope.MaxFence, which e.fence must be
// below.
func nextFence(e *entry, now time.Time) uint64 {
	us := uint64(max(now.UnixMicro(), 0))
	return max(e.fence+1, min(us, envelope.MaxFence))
}

// advance sets e's fence to fence, kept for at least fenceTTL(ttl) from now.
func advance(e *entry, fence uint64, now time.Time, ttl time.Duration) {
	e.fence = fence
	keepFence(e, now, ttl)
}

// keepFence keeps e's fence, if it has one, for at least fenceTTL(ttl) from
// now; it never shortens it.
func keepFence(e *entry, now time.Time, ttl time.Duration) {
	if end := now.Add(fenceTTL(ttl)); e.fence != 0 && end.After(e.fenceEnd) {
		e.fenceEnd = end
	}
}

// fenceTTL is how long a fence lasts after a change that keeps a value or a
// lease for ttl (0 for neither): max(ttl, minFenceTTL) + fenceMargin.
func fenceTTL(ttl time.Duration) time.Duration {
	ttl = max(ttl, minFenceTTL)
	if ttl > math.MaxInt64-fenceMargin {
		return math.MaxInt64
	}
	return ttl + fenceMargin
}

// notify queues a change of key under fence for every subscription.
// r.mu is held.
func (r *Remote) notify(key string, fence uint64, dropped bool) {
	r.push(notify.Notice{Key: key, Fence: fence, Dropped: dropped})
}

// notifyStored queues the change that stored env, with its fence field set,
// under key's fence; the notice carries env when it is no longer than
// SetNoticeValues allows. r.mu is held.
func (r *Remote) notifyStored(key string, fence uint64, env []byte) {
	n := notify.Notice{Key: key, Fence: fence}
	if r.noticeValues > 0 && len(env) <= r.noticeValues {
		n.Value = string(env)
	}
	r.push(n)
}

// push queues n for every subscription, or for the batch being collected.
// r.mu is held.
func (r *Remote) push(n notify.Notice) {
	if r.batched != nil {
		r.batched = append(r.batched, n)
		return
	}
	for s := range r.subs {
		s.Push(n)
	}
}

// SetNoticeValues makes the change notices of later writes and Sets carry
// the envelope they stored ([remote.Notice] Value) when it is at most max
// bytes long, as redisstore's do for small values, so that replicas holding
// the key replace their copies without a Load. Zero, the default, and any
// max below it carry no value: every change notice is a plain one, as from
// a Store that does not carry values.
func (r *Remote) SetNoticeValues(max int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.noticeValues = max
}

// Subscribe calls fn, on one goroutine per subscription and in order, with
// each change of a key: a write, a Set or an Invalidate (Dropped), under the
// fence of that change (refused writes are not announced), until stop is
// called. Writers never wait for fn: each subscription queues up to 1024
// notices, and when a slow fn lets the queue fill, the queued notices are
// replaced by a single zero Notice (drop everything).
//
// stop drops the notices still queued, waits until fn has returned and the
// goroutine has exited, and may be called more than once; it must not be
// called from fn.
func (r *Remote) Subscribe(fn func(remote.Notice)) (stop func()) {
	return r.subscribe(r.subs, fn)
}

// subscribe starts a subscription that calls fn, kept in set (r.subs or
// r.holds) until stopped.
func (r *Remote) subscribe(set map[*notify.Subscription]struct{}, fn func(remote.Notice)) (stop func()) {
	s := notify.Start(func(n notify.Notice) { fn(remote.Notice(n)) }, subscribeQueue)
	r.mu.Lock()
	set[s] = struct{}{}
	r.mu.Unlock()
	return func() {
		r.mu.Lock()
		delete(set, s)
		r.mu.Unlock()
		s.Stop()
	}
}

// SubscribeHolds calls fn with a Notice whose Key, Fence, Held and Seq are
// set for each lease Acquire or AcquireMany takes ([remote.HoldNotifier]),
// until stop is called: Fence is the lease's, Held when it ends unless
// extended or released, and Seq the key's completion count (Completions)
// when it was taken, plus one. fn is called on a goroutine of the
// subscription's own, in order, and the holder never waits for it: a
// subscription queues up to 1024 batches of holds, and when a slow fn lets
// the queue fill, the queued holds are replaced by a single zero Notice
// (holds may have been lost). A Remote does not know which of the caches
// that share it asked: every subscriber hears every lease, the asker's own
// included. Holds reach no Subscribe subscriber. stop drops the holds
// still queued, waits until fn has returned and the goroutine has exited,
// and may be called more than once; it must not be called from fn.
func (r *Remote) SubscribeHolds(fn func(remote.Notice)) (stop func()) {
	return r.subscribe(r.holds, fn)
}

// announce queues, for every hold subscription, one batch of the holds of
// the leases that the answers got to reqs took, held until held. r.mu is
// held.
func (r *Remote) announce(reqs []remote.LeaseRequest, got []remote.Acquired, held time.Time) {
	if len(r.holds) == 0 {
		return
	}
	n := 0
	for _, a := range got {
		if a.Token != "" {
			n++
		}
	}
	ns := make([]notify.Notice, 0, n)
	for i, a := range got {
		if a.Token != "" {
			key := reqs[i].Key
			ns = append(ns, notify.Notice{Key: key, Fence: a.Fence, Held: held, Seq: r.waits.Count(key) + 1})
		}
	}
	for s := range r.holds {
		s.PushAll(ns)
	}
}
