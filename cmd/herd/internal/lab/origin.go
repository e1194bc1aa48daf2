package lab

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"time"
)

// ErrOriginFailure is what a backing-store call returns when the failure
// rate draws a failure.
var ErrOriginFailure = errors.New("lab: backing store failed (simulated)")

// OriginOptions configures an [Origin].
type OriginOptions struct {
	// Latency is the distribution each call's duration is drawn from.
	Latency Latency
	// Capacity is how many calls run at full speed at once: a call that
	// starts with n > Capacity calls in flight (itself included) lasts its
	// drawn latency × n/Capacity, i.e. latency × (1 + (n−Capacity)/Capacity).
	// Zero means no limit. It is ignored when Query is set: a real backing
	// store has a capacity of its own.
	Capacity int
	// FailureRate is the probability that a call fails with
	// [ErrOriginFailure] once its latency has passed. Zero means never.
	FailureRate float64
	// Seed seeds the draws of latency and failure.
	Seed uint64
	// Query, when non-nil, is the real call: it is given the drawn latency
	// (e.g. for pg_sleep) instead of the Origin sleeping for it.
	Query func(ctx context.Context, d time.Duration) error
}

// Call is one backing-store call as the Origin recorded it. Times are
// offsets from the Origin's creation.
type Call struct {
	ID      uint64 // 1 for the first call, then one more per call
	Key     int
	Replica int
	Start   time.Duration
	// End is when the call returned; meaningful once Done is set.
	End time.Duration
	// Latency is the duration drawn for the call, capacity slowdown included.
	Latency time.Duration
	// Inflight is the number of calls in flight when it started, itself
	// included.
	Inflight int
	Done     bool
	// Failed is set for a call that returned an error (a drawn failure, a
	// failed query or an ended context).
	Failed bool
}

// Origin is the backing store of a run: it counts every call, its
// concurrency and its latency, and either sleeps for the drawn latency or
// runs a real query. It is safe for concurrent use.
type Origin struct {
	opts  OriginOptions
	epoch time.Time

	mu sync.Mutex
	// rng draws latencies and failures; guarded by mu.
	rng *rand.Rand
	// calls holds every call, calls[i].ID == i+1; guarded by mu. An entry
	// is written at the call's start and completed at its end.
	calls []Call
	// inflight counts the calls running now, fleet-wide and per replica;
	// peak and replicaPeak hold their maxima. Guarded by mu.
	inflight, peak         int
	replicaIn, replicaPeak []int
	// idle is closed when inflight drops to zero; a new one is made when a
	// call starts from zero. Guarded by mu.
	idle chan struct{}
}

// NewOrigin returns an Origin whose clock starts now.
func NewOrigin(o OriginOptions) *Origin {
	return &Origin{
		opts:  o,
		epoch: time.Now(),
		rng:   rand.New(rand.NewPCG(o.Seed, 0x6f726967696e)),
	}
}

// Since returns the time since the Origin was made.
func (o *Origin) Since() time.Duration { return time.Since(o.epoch) }

// Call makes one backing-store call for key on behalf of replica and returns
// its ID, or an error when it failed.
func (o *Origin) Call(ctx context.Context, key, replica int) (uint64, error) {
	o.mu.Lock()
	id := uint64(len(o.calls) + 1)
	if o.inflight == 0 {
		o.idle = make(chan struct{})
	}
	o.inflight++
	o.peak = max(o.peak, o.inflight)
	for len(o.replicaIn) <= replica {
		o.replicaIn = append(o.replicaIn, 0)
		o.replicaPeak = append(o.replicaPeak, 0)
	}
	o.replicaIn[replica]++
	o.replicaPeak[replica] = max(o.replicaPeak[replica], o.replicaIn[replica])
	d := o.opts.Latency.Draw(o.rng)
	if c := o.opts.Capacity; c > 0 && o.inflight > c && o.opts.Query == nil {
		d = time.Duration(float64(d) * float64(o.inflight) / float64(c))
	}
	fail := o.opts.FailureRate > 0 && o.rng.Float64() < o.opts.FailureRate
	o.calls = append(o.calls, Call{
		ID: id, Key: key, Replica: replica,
		Start: time.Since(o.epoch), Latency: d, Inflight: o.inflight,
	})
	o.mu.Unlock()

	var err error
	if o.opts.Query != nil {
		err = o.opts.Query(ctx, d)
	} else if !sleepFor(ctx, d) {
		err = fmt.Errorf("lab: backing store call: %w", ctx.Err())
	}
	if err == nil && fail {
		err = ErrOriginFailure
	}

	o.mu.Lock()
	c := &o.calls[id-1]
	c.End, c.Done, c.Failed = time.Since(o.epoch), true, err != nil
	o.inflight--
	if o.inflight == 0 {
		close(o.idle)
	}
	o.replicaIn[replica]--
	o.mu.Unlock()
	return id, err
}

// Calls returns a copy of every call recorded so far, in ID order.
func (o *Origin) Calls() []Call {
	o.mu.Lock()
	defer o.mu.Unlock()
	return append([]Call(nil), o.calls...)
}

// Peak returns the most calls that were ever in flight at once, fleet-wide
// and per replica (indexed by replica; replicas that made no call may be
// missing at the end).
func (o *Origin) Peak() (fleet int, perReplica []int) {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.peak, append([]int(nil), o.replicaPeak...)
}

// WaitIdle waits until no call is in flight, or ctx ends.
func (o *Origin) WaitIdle(ctx context.Context) error {
	for {
		o.mu.Lock()
		if o.inflight == 0 {
			o.mu.Unlock()
			return nil
		}
		idle := o.idle
		o.mu.Unlock()
		select {
		case <-idle:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// Inflight returns the number of calls running now.
func (o *Origin) Inflight() int {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.inflight
}
