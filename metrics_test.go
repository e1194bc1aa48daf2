package herd_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/herdcache/herd"
	"github.com/herdcache/herd/limiter"
	"github.com/herdcache/herd/memory"
	"github.com/herdcache/herd/observe"
)

// stampedeStats has callers Get one missing key at once while the load waits
// until every caller has arrived (or, with coalescing, joined), and returns
// the stats after.
func stampedeStats(t *testing.T, callers int, disableCoalescing bool) observe.Stats {
	var stats observe.Stats
	synctest.Test(t, func(t *testing.T) {
		c := herd.Must(herd.New(&herd.Options[string]{
			MaxEntries: 10, SoftTTL: time.Minute, DisableCoalescing: disableCoalescing, HotKeys: 5,
		}))
		defer c.Close(context.Background())
		release := make(chan struct{})
		load := func(ctx context.Context) (string, error) {
			<-release
			return "v", nil
		}
		var wg sync.WaitGroup
		for range callers {
			wg.Go(func() {
				if v, err := c.Get(context.Background(), herd.Key("hot"), load); err != nil || v != "v" {
					t.Errorf("Get = %q, %v", v, err)
				}
			})
		}
		synctest.Wait() // every caller is in its load or waiting on the one flight
		close(release)
		wg.Wait()
		stats = c.Stats()
	})
	return stats
}

func TestStatsAfterStampede(t *testing.T) {
	s := stampedeStats(t, 1000, false)
	if s.Loads != 1 || s.Coalesced != 999 || s.KeyConcurrencyMax != 1 || s.Misses != 1000 {
		t.Errorf("coalesced stampede: loads=%d coalesced=%d key concurrency max=%d misses=%d; want 1, 999, 1, 1000",
			s.Loads, s.Coalesced, s.KeyConcurrencyMax, s.Misses)
	}
	if s.LoadDuration.Count != 1 {
		t.Errorf("load duration histogram holds %d loads, want 1", s.LoadDuration.Count)
	}
	if len(s.HotKeys) != 1 || s.HotKeys[0].Misses != 1000 || s.HotKeys[0].Loads != 1 {
		t.Errorf("hot keys = %+v, want the one key with 1000 misses and 1 load", s.HotKeys)
	}

	u := stampedeStats(t, 50, true)
	if u.Loads != 50 || u.KeyConcurrencyMax != 50 || u.Coalesced != 0 {
		t.Errorf("without coalescing: loads=%d key concurrency max=%d coalesced=%d; want 50, 50, 0",
			u.Loads, u.KeyConcurrencyMax, u.Coalesced)
	}
}

func TestHotKeys(t *testing.T) {
	ctx := context.Background()
	c := herd.Must(herd.New(&herd.Options[int]{MaxEntries: 10_000, SoftTTL: time.Hour, HotKeys: 3}))
	defer c.Close(ctx)
	load := func(ctx context.Context) (int, error) { return 1, nil }
	// One key that keeps missing (a NoCache load) drives the origin while
	// 1,000 others are hit a few times each: the global miss rate is low.
	for i := range 1000 {
		for range 5 {
			c.Get(ctx, herd.Key("user", "t1", fmt.Sprint(i)), load)
		}
	}
	hot := herd.Key("report", "tenant-secret", "q4")
	for range 800 {
		c.Get(ctx, hot, func(ctx context.Context) (int, error) {
			herd.NoCache(ctx)
			return 2, nil
		})
	}
	s := c.Stats()
	if len(s.HotKeys) != 3 {
		t.Fatalf("%d hot keys reported, want 3", len(s.HotKeys))
	}
	top := s.HotKeys[0]
	if top.Key != herd.RedactKey(hot) || top.Misses != 800 || top.Loads != 800 {
		t.Errorf("top hot key = %+v, want %s with 800 misses and 800 loads", top, herd.RedactKey(hot))
	}
	for _, h := range s.HotKeys {
		if strings.Contains(h.Key, "tenant-secret") || strings.Contains(h.Key, "t1") {
			t.Errorf("hot key %q shows the key's parts without HotKeyNames", h.Key)
		}
	}

	named := herd.Must(herd.New(&herd.Options[int]{MaxEntries: 10, SoftTTL: time.Hour, HotKeys: 1, HotKeyNames: true}))
	defer named.Close(ctx)
	named.Get(ctx, hot, load)
	if got := named.Stats().HotKeys; len(got) != 1 || got[0].Key != hot {
		t.Errorf("with HotKeyNames, hot keys = %+v, want the full key %q", got, hot)
	}
}

// recorder counts what a Recorder is told.
type recorder struct {
	gets     [4]atomic.Int64
	loads    atomic.Int64
	notFound atomic.Int64 // loads that returned ErrNotFound
	events   sync.Map
	mu       sync.Mutex
	shed     []string // reasons, "background" appended for refreshes; guarded by mu
}

func (r *recorder) RecordGet(res observe.GetResult) { r.gets[res].Add(1) }
func (r *recorder) RecordLoad(_ time.Duration, err error, _ bool) {
	r.loads.Add(1)
	if errors.Is(err, herd.ErrNotFound) {
		r.notFound.Add(1)
	}
}
func (r *recorder) RecordLease(observe.LeaseEvent, time.Duration) {}
func (r *recorder) RecordShed(reason string, background bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if background {
		reason += " background"
	}
	r.shed = append(r.shed, reason)
}
func (r *recorder) RecordEvent(e observe.Event) { r.events.Store(e.Kind, e) }

// A fresh negative entry is answered as ResultNegative, counted in
// NegativeHits and not in Hits, from the local tier and from the Store; a
// load that finds no value is a not-found, not an error.
func TestRecorderNegativeAndNotFound(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := memory.New()
		mk := func(rec observe.Recorder) *herd.Cache[int] {
			return fleetReplica(t, r, func(o *herd.Options[int]) {
				o.NegativeTTL = time.Minute
				o.Recorder = rec
			})
		}
		recA, recB := &recorder{}, &recorder{}
		a, b := mk(recA), mk(recB)
		var loads atomic.Int64
		for range 3 {
			if _, err := a.Get(bounded(t), "gone", notFound(&loads)); !errors.Is(err, herd.ErrNotFound) {
				t.Fatalf("Get = %v, want ErrNotFound", err)
			}
		}
		synctest.Wait() // the negative entry's write-back to the Store is done
		if _, err := b.Get(bounded(t), "gone", notFound(&loads)); !errors.Is(err, herd.ErrNotFound) {
			t.Fatalf("Get from the Store = %v, want ErrNotFound", err)
		}
		if n := loads.Load(); n != 1 {
			t.Fatalf("%d loads, want 1", n)
		}
		if got := [4]int64{recA.gets[observe.ResultHit].Load(), recA.gets[observe.ResultStale].Load(), recA.gets[observe.ResultNegative].Load(), recA.gets[observe.ResultMiss].Load()}; got != [4]int64{0, 0, 2, 1} {
			t.Errorf("replica a's gets (hit, stale, negative, miss) = %v, want [0 0 2 1]", got)
		}
		if n := recB.gets[observe.ResultNegative].Load(); n != 1 {
			t.Errorf("replica b recorded %d negative gets from the Store, want 1", n)
		}
		if recA.loads.Load() != 1 || recA.notFound.Load() != 1 {
			t.Errorf("recorded %d loads, %d not found; want 1 and 1", recA.loads.Load(), recA.notFound.Load())
		}
		st := a.Stats()
		if st.Hits != 0 || st.NegativeHits != 2 || st.Loads != 1 || st.LoadsNotFound != 1 || st.LoadErrors != 0 {
			t.Errorf("Stats: Hits %d, NegativeHits %d, Loads %d, LoadsNotFound %d, LoadErrors %d; want 0, 2, 1, 1, 0",
				st.Hits, st.NegativeHits, st.Loads, st.LoadsNotFound, st.LoadErrors)
		}
		if st := b.Stats(); st.NegativeHits != 1 || st.RemoteHits != 0 {
			t.Errorf("replica b: NegativeHits %d, RemoteHits %d; want 1 and 0", st.NegativeHits, st.RemoteHits)
		}
		if _, err := a.Get(bounded(t), "broken", func(context.Context) (int, error) { return 0, errors.New("origin down") }); err == nil {
			t.Fatal("a failing load gave no error")
		}
		if st := a.Stats(); st.LoadErrors != 1 || st.LoadsNotFound != 1 {
			t.Errorf("after a failed load: LoadErrors %d, LoadsNotFound %d; want 1 and 1", st.LoadErrors, st.LoadsNotFound)
		}
	})
}

// The limiter's refusals reach the Recorder with their reason.
func TestRecorderShed(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		rec := &recorder{}
		l, err := limiter.New(limiter.Options{Limit: 1, QueueTimeout: time.Second})
		if err != nil {
			t.Fatal(err)
		}
		o := testOptions()
		o.Limiter, o.Recorder = l, rec
		c := newCache(t, o)
		gate := make(chan struct{})
		go c.Get(context.Background(), "held", func(context.Context) (int, error) { <-gate; return 1, nil })
		synctest.Wait()
		if _, err := c.Get(bounded(t), "other", fleetValue(2)); !errors.Is(err, herd.ErrOverloaded) {
			t.Fatalf("Get = %v, want ErrOverloaded", err)
		}
		close(gate)
		synctest.Wait()
		rec.mu.Lock()
		defer rec.mu.Unlock()
		if want := []string{limiter.ReasonQueueTimeout}; !slices.Equal(rec.shed, want) {
			t.Errorf("RecordShed calls %q, want %q", rec.shed, want)
		}
	})
}

// named is a CacheRecorder that notes the names it is given.
type named struct {
	observe.NopRecorder
	name  string
	names *[]string
}

func (n named) ForCache(name string) observe.Recorder {
	*n.names = append(*n.names, name)
	return named{name: name, names: n.names}
}

// New hands a CacheRecorder the cache's name, also through Recorders, and
// refuses one that gives nil.
func TestCacheRecorder(t *testing.T) {
	var names []string
	for _, name := range []string{"users", ""} {
		o := testOptions()
		o.Name, o.Recorder = name, observe.Recorders(named{names: &names})
		newCache(t, o)
	}
	if want := []string{"users", "default"}; !slices.Equal(names, want) {
		t.Errorf("ForCache was given %q, want %q", names, want)
	}
	o := testOptions()
	o.Recorder = nilRecorder{}
	if _, err := herd.New(o); err == nil || !strings.Contains(err.Error(), "ForCache") {
		t.Errorf("New with a ForCache that returns nil = %v, want an error naming ForCache", err)
	}
}

type nilRecorder struct{ observe.NopRecorder }

func (nilRecorder) ForCache(string) observe.Recorder { return nil }

func TestRecorder(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		rec := &recorder{}
		c := herd.Must(herd.New(&herd.Options[string]{
			MaxEntries: 10, SoftTTL: time.Second, HardTTL: time.Minute, Recorder: rec,
		}))
		defer c.Close(context.Background())
		ctx := context.Background()
		fail := false
		load := func(ctx context.Context) (string, error) {
			if fail {
				return "", fmt.Errorf("origin down")
			}
			return "v", nil
		}
		c.Get(ctx, "k", load) // miss
		c.Get(ctx, "k", load) // hit
		time.Sleep(2 * time.Second)
		fail = true
		c.Get(ctx, "k", load) // stale; its refresh fails
		synctest.Wait()
		if rec.gets[observe.ResultMiss].Load() != 1 || rec.gets[observe.ResultHit].Load() != 1 || rec.gets[observe.ResultStale].Load() != 1 {
			t.Errorf("gets: miss %d hit %d stale %d; want 1 each",
				rec.gets[observe.ResultMiss].Load(), rec.gets[observe.ResultHit].Load(), rec.gets[observe.ResultStale].Load())
		}
		if rec.loads.Load() != 2 {
			t.Errorf("loads recorded %d, want 2", rec.loads.Load())
		}
		if _, ok := rec.events.Load(observe.EventRefreshFailed); !ok {
			t.Error("a failed refresh raised no event")
		}
	})
}

type tracer struct {
	recorder
	spans []string
}

func (t *tracer) StartSpan(ctx context.Context, op, key string) (context.Context, func(error)) {
	t.spans = append(t.spans, "start "+op)
	return ctx, func(error) { t.spans = append(t.spans, "end "+op) }
}

func TestRecorders(t *testing.T) {
	plain, traced := &recorder{}, &tracer{}
	c := herd.Must(herd.New(&herd.Options[string]{
		MaxEntries: 10, SoftTTL: time.Minute, Recorder: observe.Recorders(plain, nil, traced),
	}))
	defer c.Close(context.Background())
	c.Get(context.Background(), "k", func(ctx context.Context) (string, error) { return "v", nil })
	c.Get(context.Background(), "k", nil)
	for _, r := range []*recorder{plain, &traced.recorder} {
		if r.gets[observe.ResultMiss].Load() != 1 || r.gets[observe.ResultHit].Load() != 1 || r.loads.Load() != 1 {
			t.Errorf("a member saw miss %d hit %d loads %d, want 1 each",
				r.gets[observe.ResultMiss].Load(), r.gets[observe.ResultHit].Load(), r.loads.Load())
		}
	}
	if want := []string{"start herd.load", "end herd.load"}; fmt.Sprint(traced.spans) != fmt.Sprint(want) {
		t.Errorf("spans %v, want %v", traced.spans, want)
	}
}

func TestName(t *testing.T) {
	named := herd.Must(herd.New(&herd.Options[int]{Name: "profiles", MaxEntries: 1, SoftTTL: time.Second}))
	unnamed := herd.Must(herd.New(&herd.Options[int]{MaxEntries: 1, SoftTTL: time.Second}))
	if named.Name() != "profiles" || unnamed.Name() != "default" {
		t.Errorf("names %q and %q, want profiles and default", named.Name(), unnamed.Name())
	}
}

// A snapshot's histogram bounds are its own: changing them changes no
// other snapshot.
func TestHistogramBoundsAreCopied(t *testing.T) {
	c := newCache(t, testOptions())
	mustGet(t, c, "k", fleetValue(1), 1)
	a, b := c.Stats().LoadDuration, c.Stats().LoadDuration
	if len(a.Bounds) == 0 {
		t.Fatal("no histogram bounds")
	}
	want := b.Bounds[0]
	a.Bounds[0] = -1
	if got := c.Stats().LoadDuration.Bounds[0]; got != want || b.Bounds[0] != want {
		t.Errorf("after changing one snapshot's bounds, another's first bound is %v and a new one's %v, want %v", b.Bounds[0], got, want)
	}
}

// A background refresh the limiter sheds because the store is slow reaches
// the Recorder with the reason latency, not reserve: the cache passes on
// the limiter's own reason.
func TestRecorderShedRefreshByLatency(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		rec := &recorder{}
		l, err := limiter.New(limiter.Options{Limit: 8, ShedLatency: 50 * time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		o := testOptions()
		o.Limiter, o.Recorder = l, rec
		c := newCache(t, o)
		mustGet(t, c, "s", fleetValue(1), 1)

		// A window's worth of loads (8) of 100ms: the store's latency is
		// measured above ShedLatency.
		slow := func(ctx context.Context) (int, error) {
			time.Sleep(100 * time.Millisecond)
			return 2, nil
		}
		var wg sync.WaitGroup
		for i := range 8 {
			wg.Go(func() { mustGet(t, c, fmt.Sprint("w", i), slow, 2) })
		}
		wg.Wait()
		if got := l.Stats().Latency; got <= 50*time.Millisecond {
			t.Fatalf("limiter Latency = %v, want it above ShedLatency (50ms)", got)
		}
		// One more slow load in the store, held past ShedLatency.
		gate := make(chan struct{})
		held := make(chan struct{})
		go func() {
			defer close(held)
			c.Get(context.Background(), "held", func(context.Context) (int, error) { <-gate; return 3, nil })
		}()
		time.Sleep(testSoft + time.Second) // s is stale; held has been loading since
		mustGet(t, c, "s", fleetValue(4), 1)
		synctest.Wait()
		close(gate)
		<-held
		rec.mu.Lock()
		defer rec.mu.Unlock()
		if want := []string{limiter.ReasonLatency + " background"}; !slices.Equal(rec.shed, want) {
			t.Errorf("RecordShed calls %q, want %q", rec.shed, want)
		}
	})
}
