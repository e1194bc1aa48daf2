package herd

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/herdcache/herd/observe"
)

// recorderFor returns the Recorder a cache named name uses for r: r itself,
// what r's ForCache gives, or NopRecorder when r is nil.
func recorderFor(r observe.Recorder, name string) (observe.Recorder, error) {
	if r == nil {
		return observe.NopRecorder{}, nil
	}
	if b, ok := r.(observe.CacheRecorder); ok {
		if r = b.ForCache(name); r == nil {
			return nil, fmt.Errorf("herd: Recorder's ForCache(%q) returned nil", name)
		}
	}
	return r, nil
}

// nopTracer is the Tracer of a cache whose Recorder does not trace.
type nopTracer struct{}

func (nopTracer) StartSpan(ctx context.Context, _, _ string) (context.Context, func(error)) {
	return ctx, endNothing
}

func endNothing(error) {}

// nopEvents is the EventRecorder of a cache whose Recorder takes no events.
type nopEvents struct{}

func (nopEvents) RecordEvent(observe.Event) {}

// histogramBounds serve every histogram of a cache: from a local round trip
// to a stuck origin call.
var histogramBounds = []time.Duration{
	100 * time.Microsecond, 250 * time.Microsecond, 500 * time.Microsecond,
	time.Millisecond, 2500 * time.Microsecond, 5 * time.Millisecond,
	10 * time.Millisecond, 25 * time.Millisecond, 50 * time.Millisecond,
	100 * time.Millisecond, 250 * time.Millisecond, 500 * time.Millisecond,
	time.Second, 2500 * time.Millisecond, 5 * time.Second,
	10 * time.Second, 30 * time.Second, time.Minute,
}

// histogram counts durations into histogramBounds without locks.
type histogram struct {
	counts [19]atomic.Uint64 // len(histogramBounds)+1
	sum    atomic.Int64
}

func (h *histogram) observe(d time.Duration) {
	i := 0
	for i < len(histogramBounds) && d > histogramBounds[i] {
		i++
	}
	h.counts[i].Add(1)
	h.sum.Add(int64(d))
}

func (h *histogram) snapshot() observe.Histogram {
	s := observe.Histogram{Bounds: slices.Clone(histogramBounds), Counts: make([]uint64, len(h.counts))}
	for i := range h.counts {
		s.Counts[i] = h.counts[i].Load()
		s.Count += s.Counts[i]
	}
	s.Sum = time.Duration(h.sum.Load())
	return s
}

// keyLoads tracks how many loads of each key run at once in this process:
// with coalescing it never exceeds one.
type keyLoads struct {
	mu      sync.Mutex
	running map[string]int // guarded by mu; keys with loads running
	total   int            // guarded by mu
	max     int            // guarded by mu; highest per-key count seen
}

func (k *keyLoads) start(key string) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.running == nil {
		k.running = map[string]int{}
	}
	n := k.running[key] + 1
	k.running[key] = n
	k.total++
	k.max = max(k.max, n)
}

func (k *keyLoads) done(key string) {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.total--
	if n := k.running[key] - 1; n > 0 {
		k.running[key] = n
	} else {
		delete(k.running, key)
	}
}

// snapshot returns the loads running, the highest per-key count now and the
// highest ever.
func (k *keyLoads) snapshot() (total, now, highest int) {
	k.mu.Lock()
	defer k.mu.Unlock()
	for _, n := range k.running {
		now = max(now, n)
	}
	return k.total, now, k.max
}

// eventContext hands an Event, with the context of the load it happened
// in, to the EventRecorder: to RecordEventContext when it has one.
func (c *Cache[V]) eventContext(ctx context.Context, kind observe.EventKind, key string, err error) {
	e := observe.Event{Kind: kind, Key: key, Err: err}
	if er, ok := c.events.(observe.ContextEventRecorder); ok {
		er.RecordEventContext(ctx, e)
		return
	}
	c.events.RecordEvent(e)
}

// encodeFailed reports that the codec could not encode the value loaded
// for key (EncodeErrors is counted where the encoding failed).
func (c *Cache[V]) encodeFailed(ctx context.Context, key string, err error) {
	c.eventContext(ctx, observe.EventEncodeFailed, key, err)
}

// writeBackFailed counts and reports the failure of the remote write of
// the value loaded for key, when err says it failed.
func (c *Cache[V]) writeBackFailed(key string, err error) {
	if err == nil {
		return
	}
	c.st.writeBackErrors.add(1)
	c.event(observe.EventWriteBackFailed, key, err)
}

// leaseWriteFailed reports the end of a lease whose value was to be
// written, was not, and whose call failed; a release that failed alone is
// not reported (see EventWriteBackFailed).
func (c *Cache[V]) leaseWriteFailed(end leaseEnd, wrote bool, err error) {
	if end.env != nil && !wrote {
		c.writeBackFailed(end.h.key, err)
	}
}
