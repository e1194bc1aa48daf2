package herd_test

import (
	"context"
	"errors"
	"math"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/herdcache/herd"
	"github.com/herdcache/herd/memory"
	"github.com/herdcache/herd/observe"
)

// failureEvents is a Recorder that keeps every event it is given, with the
// request value of the context of each that came with one, and counts the
// fenced writes.
type failureEvents struct {
	observe.NopRecorder
	mu     sync.Mutex
	events []observe.Event
	reqs   []any // ctx.Value(reqKey{}) of each event; nil when it came without a context
	fenced int
}

// ctxEvents is a failureEvents that also takes the context of an event.
type ctxEvents struct{ *failureEvents }

type reqKey struct{}

func (r *failureEvents) RecordEvent(e observe.Event) { r.add(e, nil) }

func (r ctxEvents) RecordEventContext(ctx context.Context, e observe.Event) {
	r.add(e, ctx.Value(reqKey{}))
}

func (r *failureEvents) add(e observe.Event, req any) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.events = append(r.events, e)
	r.reqs = append(r.reqs, req)
}

func (r *failureEvents) RecordLease(e observe.LeaseEvent, _ time.Duration) {
	if e == observe.LeaseFenced {
		r.mu.Lock()
		defer r.mu.Unlock()
		r.fenced++
	}
}

// of returns the events of kind, with the request values that came with
// them.
func (r *failureEvents) of(kind observe.EventKind) (es []observe.Event, reqs []any) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for i, e := range r.events {
		if e.Kind == kind {
			es = append(es, e)
			reqs = append(reqs, r.reqs[i])
		}
	}
	return es, reqs
}

// A value the JSON codec cannot encode is served on every load and never
// cached, and each load reports EventEncodeFailed with its key: to
// RecordEventContext with the caller's context when the Recorder has it,
// else to RecordEvent.
func TestEventsEncodeFailed(t *testing.T) {
	for _, c := range []struct {
		name    string
		withCtx bool
	}{{"RecordEvent", false}, {"RecordEventContext", true}} {
		t.Run(c.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				r := memory.New()
				rec := &failureEvents{}
				var hr observe.Recorder = rec
				if c.withCtx {
					hr = observe.Recorders(ctxEvents{rec})
				}
				cache, err := herd.New(&herd.Options[float64]{
					NoNearCache: true,
					NoBreaker:   true,
					MaxEntries:  10, SoftTTL: time.Minute, Codec: herd.JSON[float64](),
					Store: r, Lease: r, LeaseTTL: 5 * time.Second, Recorder: hr,
				})
				if err != nil {
					t.Fatal(err)
				}
				defer cache.Close(context.Background())
				key := herd.Key("gauge", "tenant-7", "pressure")
				loads := 0
				load := func(context.Context) (float64, error) {
					loads++
					return math.Inf(1), nil
				}
				ctx := context.WithValue(t.Context(), reqKey{}, "request-1")
				for i := range 2 {
					v, err := cache.Get(ctx, key, load)
					if err != nil || !math.IsInf(v, 1) {
						t.Fatalf("Get %d = %v, %v; want +Inf served", i, v, err)
					}
				}
				synctest.Wait()
				if loads != 2 {
					t.Errorf("%d loads, want 2: the value must not be cached", loads)
				}
				es, reqs := rec.of(observe.EventEncodeFailed)
				if len(es) != 2 {
					t.Fatalf("%d encode events (all events: %v), want one per load, 2", len(es), rec.events)
				}
				for i, e := range es {
					if e.Key != key || e.Err == nil || !strings.Contains(e.Err.Error(), "unsupported value") {
						t.Errorf("event %d = %+v, want key %q and the codec's error", i, e, key)
					}
					if want := map[bool]any{true: "request-1"}[c.withCtx]; reqs[i] != want {
						t.Errorf("event %d came with request %v, want %v", i, reqs[i], want)
					}
				}
				if es, _ := rec.of(observe.EventWriteBackFailed); len(es) != 0 {
					t.Errorf("write-back events %v for a value never written", es)
				}
				if st := cache.Stats(); st.EncodeErrors != 2 || st.WriteBackErrors != 0 {
					t.Errorf("EncodeErrors %d, WriteBackErrors %d; want 2 and 0", st.EncodeErrors, st.WriteBackErrors)
				}
				if w := r.Stats().Writes + r.Stats().Sets; w != 0 {
					t.Errorf("%d writes reached the Store, want none", w)
				}
			})
		})
	}
}

var errRemoteRefused = errors.New("OOM command not allowed when used memory > 'maxmemory'")

// A write-back that fails, with the lease's release or alone without a
// lease, reports EventWriteBackFailed with the key and the Store's error;
// the value is served and stays in the local tier.
func TestEventsWriteBackFailed(t *testing.T) {
	for _, c := range []struct {
		name  string
		lease bool
	}{{"lease", true}, {"no lease", false}} {
		t.Run(c.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				r := memory.New()
				rec := &failureEvents{}
				o := &herd.Options[int]{NoNearCache: true, NoBreaker: true, MaxEntries: 10, SoftTTL: time.Minute, Store: r, Recorder: rec}
				if c.lease {
					o.Lease, o.LeaseTTL = r, 5*time.Second
				}
				cache := newCache(t, o)
				key := herd.Key("user", "tenant-7", "42")
				started, gate := make(chan struct{}), make(chan struct{})
				loads := 0
				load := func(context.Context) (int, error) {
					loads++
					close(started)
					<-gate
					return 7, nil
				}
				got := make(chan error, 1)
				go func() {
					v, err := cache.Get(t.Context(), key, load)
					if err == nil && v != 7 {
						err = errors.New("wrong value")
					}
					got <- err
				}()
				<-started // the lease is held, when there is one
				r.SetDown(errRemoteRefused)
				close(gate)
				if err := <-got; err != nil {
					t.Fatalf("Get: %v; want 7 served", err)
				}
				synctest.Wait() // the write-back has ended
				es, _ := rec.of(observe.EventWriteBackFailed)
				if len(es) != 1 || es[0].Key != key || !errors.Is(es[0].Err, errRemoteRefused) {
					t.Fatalf("write-back events %+v (all events: %v), want one for %q with the Store's error", es, rec.events, key)
				}
				if st := cache.Stats(); st.WriteBackErrors != 1 || st.FencedWrites != 0 {
					t.Errorf("WriteBackErrors %d, FencedWrites %d; want 1 and 0", st.WriteBackErrors, st.FencedWrites)
				}
				if v, err := cache.Get(t.Context(), key, load); v != 7 || err != nil || loads != 1 {
					t.Errorf("second Get = %v, %v after %d loads; want 7 from the local tier, 1 load", v, err, loads)
				}
			})
		})
	}
}

// A write the fence refuses, because another replica set the key while
// the load held the lease, is a fenced write, not a failed one.
func TestEventsFencedWriteIsNoFailure(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := memory.New()
		rec := &failureEvents{}
		a := fleetReplica(t, r, func(o *herd.Options[int]) { o.Recorder = rec })
		b := fleetReplica(t, r, nil)
		key := herd.Key("user", "tenant-7", "42")
		started, gate := make(chan struct{}), make(chan struct{})
		got := make(chan error, 1)
		go func() {
			_, err := a.Get(t.Context(), key, func(context.Context) (int, error) {
				close(started)
				<-gate
				return 7, nil
			})
			got <- err
		}()
		<-started
		if err := b.Set(t.Context(), key, 9); err != nil {
			t.Fatal(err)
		}
		close(gate)
		if err := <-got; err != nil {
			t.Fatal(err)
		}
		synctest.Wait()
		rec.mu.Lock()
		fenced := rec.fenced
		rec.mu.Unlock()
		if fenced != 1 {
			t.Fatalf("%d fenced writes, want 1", fenced)
		}
		if es, _ := rec.of(observe.EventWriteBackFailed); len(es) != 0 {
			t.Errorf("write-back events %v for a fenced write, want none", es)
		}
		if st := a.Stats(); st.WriteBackErrors != 0 || st.FencedWrites != 1 {
			t.Errorf("WriteBackErrors %d, FencedWrites %d; want 0 and 1", st.WriteBackErrors, st.FencedWrites)
		}
	})
}

func TestEventKindNames(t *testing.T) {
	for k, want := range map[observe.EventKind]string{
		observe.EventWriteBackFailed: "write-back-failed",
		observe.EventEncodeFailed:    "encode-failed",
	} {
		if got := k.String(); got != want {
			t.Errorf("EventKind(%d).String() = %q, want %q", k, got, want)
		}
	}
}

// The write-backs of a batch load that fail are reported once per key.
func TestEventsWriteBackFailedBatch(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := memory.New()
		rec := &failureEvents{}
		cache := newCache(t, &herd.Options[int]{
			NoNearCache: true,
			NoBreaker:   true,
			MaxEntries:  10, SoftTTL: time.Minute, Store: r, Lease: r, LeaseTTL: 5 * time.Second, Recorder: rec,
		})
		keys := []string{herd.Key("user", "1"), herd.Key("user", "2")}
		started, gate := make(chan struct{}), make(chan struct{})
		load := func(_ context.Context, ks []string) (map[string]int, error) {
			close(started)
			<-gate
			m := map[string]int{}
			for i, k := range ks {
				m[k] = i
			}
			return m, nil
		}
		got := make(chan []herd.Item[int], 1)
		go func() { got <- cache.GetMany(t.Context(), keys, load) }()
		<-started
		r.SetDown(errRemoteRefused)
		close(gate)
		for i, it := range <-got {
			if it.Err != nil {
				t.Errorf("item %d: %v, want its value served", i, it.Err)
			}
		}
		synctest.Wait()
		es, _ := rec.of(observe.EventWriteBackFailed)
		seen := map[string]int{}
		for _, e := range es {
			if !errors.Is(e.Err, errRemoteRefused) {
				t.Errorf("event %+v: want the Store's error", e)
			}
			seen[e.Key]++
		}
		if len(es) != 2 || seen[keys[0]] != 1 || seen[keys[1]] != 1 {
			t.Errorf("write-back events %+v, want one for each of %q", es, keys)
		}
		if st := cache.Stats(); st.WriteBackErrors != 2 {
			t.Errorf("WriteBackErrors %d, want 2", st.WriteBackErrors)
		}
	})
}
