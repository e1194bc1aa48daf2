package bench

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/herdcache/herd"
	"github.com/herdcache/herd/memory"
	"github.com/maypok86/otter/v2"
	"github.com/viccon/sturdyc"
	"golang.org/x/sync/singleflight"
)

// Every library is given the same room and the same TTL, long enough that
// nothing expires during a run: a cold key is a key never read before.
const (
	capacity = 1 << 20
	ttl      = time.Hour
)

// db is the backing store behind every loader: each call counts the keys
// it was given, waits for gate (when set) and then takes cost, the time of
// one query whatever its number of keys.
type db struct {
	cost time.Duration
	// gate, when not nil, holds every call until it is closed, so that a
	// test can have every caller join a load before any load ends.
	gate <-chan struct{}

	calls atomic.Int64 // loader calls
	keys  atomic.Int64 // keys given to loaders, summed over calls

	mu sync.Mutex
	// loaded counts the calls that were given each key; nil unless track
	// made it.
	loaded map[string]int
}

// track makes d count the loads of each key, for loadsOf.
func (d *db) track() *db {
	d.loaded = map[string]int{}
	return d
}

// loadsOf returns how many calls were given key; d must track.
func (d *db) loadsOf(key string) int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.loaded[key]
}

// query is the cost of one call with keys.
func (d *db) query(ctx context.Context, keys []string) error {
	d.calls.Add(1)
	d.keys.Add(int64(len(keys)))
	if d.loaded != nil {
		d.mu.Lock()
		for _, k := range keys {
			d.loaded[k]++
		}
		d.mu.Unlock()
	}
	if d.gate != nil {
		select {
		case <-d.gate:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	if d.cost > 0 {
		time.Sleep(d.cost) // the query; nothing is synchronised by it
	}
	return nil
}

// loadMany is the batch loader: one query for keys.
func (d *db) loadMany(ctx context.Context, keys []string) (map[string]int, error) {
	if err := d.query(ctx, keys); err != nil {
		return nil, err
	}
	m := make(map[string]int, len(keys))
	for _, k := range keys {
		m[k] = valueOf(k)
	}
	return m, nil
}

// loadOne is the loader of one key: one query for it.
func (d *db) loadOne(ctx context.Context, key string) (int, error) {
	if err := d.query(ctx, []string{key}); err != nil {
		return 0, err
	}
	return valueOf(key), nil
}

// valueOf is the value the backing store holds for key: its FNV-1a hash,
// never negative.
func valueOf(key string) int {
	h := uint64(14695981039346656037)
	for i := range len(key) {
		h ^= uint64(key[i])
		h *= 1099511628211
	}
	return int(h >> 1)
}

// replica is one process's cache of one library.
type replica interface {
	// read puts the value of keys[i] in dst[i], which is as long as keys.
	read(ctx context.Context, keys []string, dst []int) error
	close()
}

// impl is one library under comparison.
type impl struct {
	name string
	// local returns a cache alone in its process, loading from d.
	local func(d *db) replica
	// fleet returns one replica per db, replica i loading from dbs[i],
	// sharing what the library lets replicas share.
	fleet func(dbs []*db) []replica
	// fleetWide is set when a fleet loads each key once, not once per
	// replica.
	fleetWide bool
}

var impls = []impl{
	{name: "herd", local: herdLocal(false), fleet: herdFleet(false), fleetWide: true},
	{name: "sturdyc", local: newSturdyc, fleet: apart(newSturdyc)},
	{name: "otter", local: newOtter, fleet: apart(newOtter)},
	{name: "singleflight", local: newSingleflight, fleet: apart(newSingleflight)},
	{name: "herd-get-loop", local: herdLocal(true), fleet: herdFleet(true), fleetWide: true},
}

// apart makes a fleet of caches that share nothing: the peers coalesce
// loads within a process only.
func apart(local func(*db) replica) func([]*db) []replica {
	return func(dbs []*db) []replica {
		rs := make([]replica, len(dbs))
		for i, d := range dbs {
			rs[i] = local(d)
		}
		return rs
	}
}

// herdCache reads through GetMany, or with loop through Get once per key.
type herdCache struct {
	c    *herd.Cache[int]
	loop bool
}

func herdOptions(d *db, loop bool) *herd.Options[int] {
	o := &herd.Options[int]{MaxEntries: capacity, SoftTTL: ttl}
	if loop {
		o.Load = d.loadOne
	} else {
		o.LoadMany = d.loadMany
	}
	return o
}

func herdLocal(loop bool) func(*db) replica {
	return func(d *db) replica {
		return &herdCache{c: herd.Must(herd.New(herdOptions(d, loop))), loop: loop}
	}
}

// herdFleet makes replicas over one memory.Remote with a lease, whose
// losers wait for the holder's value.
func herdFleet(loop bool) func([]*db) []replica {
	return func(dbs []*db) []replica {
		r := memory.New()
		rs := make([]replica, len(dbs))
		for i, d := range dbs {
			o := herdOptions(d, loop)
			o.Store, o.Lease = r, r
			o.NearTTL, o.NoBreaker = time.Second, true
			o.LeaseTTL = 5 * time.Second
			o.OnLeaseHeld = herd.Wait
			o.LeaseWait = time.Minute
			rs[i] = &herdCache{c: herd.Must(herd.New(o)), loop: loop}
		}
		return rs
	}
}

func (h *herdCache) read(ctx context.Context, keys []string, dst []int) error {
	if h.loop {
		for i, k := range keys {
			v, err := h.c.Get(ctx, k, nil)
			if err != nil {
				return err
			}
			dst[i] = v
		}
		return nil
	}
	for i, it := range h.c.GetMany(ctx, keys, nil) {
		if it.Err != nil {
			return fmt.Errorf("%q: %w", keys[i], it.Err)
		}
		dst[i] = it.Value
	}
	return nil
}

func (h *herdCache) close() { _ = h.c.Close(context.Background()) }

// pollWakes is how many of this replica's lease waits were ended by the
// loser's re-read of the Store, not by the holder's completion notice.
func (h *herdCache) pollWakes() int64 { return h.c.Stats().WokenByPoll }

// sturdycCache reads through GetOrFetchBatch, keyed by the ids as they are.
type sturdycCache struct {
	c     *sturdyc.Client[int]
	fetch sturdyc.BatchFetchFn[int]
}

func newSturdyc(d *db) replica {
	// No continuous evictions: that goroutine never ends, and nothing
	// expires within a run.
	c := sturdyc.New[int](capacity, 64, ttl, 10, sturdyc.WithNoContinuousEvictions())
	return &sturdycCache{c: c, fetch: d.loadMany}
}

func sameKey(id string) string { return id }

func (s *sturdycCache) read(ctx context.Context, keys []string, dst []int) error {
	m, err := s.c.GetOrFetchBatch(ctx, keys, sameKey, s.fetch)
	if err != nil {
		return err
	}
	return fill(m, keys, dst)
}

func (s *sturdycCache) close() {}

// otterCache reads through BulkGet with a BulkLoader.
type otterCache struct {
	c    *otter.Cache[string, int]
	load otter.BulkLoader[string, int]
}

func newOtter(d *db) replica {
	c := otter.Must(&otter.Options[string, int]{
		MaximumSize:      capacity,
		ExpiryCalculator: otter.ExpiryWriting[string, int](ttl),
	})
	return &otterCache{c: c, load: otter.BulkLoaderFunc[string, int](d.loadMany)}
}

func (o *otterCache) read(ctx context.Context, keys []string, dst []int) error {
	m, err := o.c.BulkGet(ctx, keys, o.load)
	if err != nil {
		return err
	}
	return fill(m, keys, dst)
}

func (o *otterCache) close() { o.c.StopAllGoroutines() }

// fill puts the value of keys[i] in m into dst[i].
func fill(m map[string]int, keys []string, dst []int) error {
	for i, k := range keys {
		v, ok := m[k]
		if !ok {
			return fmt.Errorf("%q missing from the result", k)
		}
		dst[i] = v
	}
	return nil
}

// sfCache is the hand-rolled baseline: a map under a RWMutex, read once
// for the batch, and one singleflight.Do per key missing, each loading
// that key alone.
type sfCache struct {
	d  *db
	g  singleflight.Group
	mu sync.RWMutex
	m  map[string]sfEntry // guarded by mu
}

type sfEntry struct {
	v   int
	exp int64 // Unix nanoseconds
}

func newSingleflight(d *db) replica { return &sfCache{d: d, m: map[string]sfEntry{}} }

func (s *sfCache) read(ctx context.Context, keys []string, dst []int) error {
	now := time.Now().UnixNano()
	missed := false
	s.mu.RLock()
	for i, k := range keys {
		e, ok := s.m[k]
		if !ok || now >= e.exp {
			dst[i], missed = -1, true // no value is negative
			continue
		}
		dst[i] = e.v
	}
	s.mu.RUnlock()
	if !missed {
		return nil
	}
	for i, k := range keys {
		if dst[i] != -1 {
			continue
		}
		v, err, _ := s.g.Do(k, func() (any, error) { return s.load(ctx, k) })
		if err != nil {
			return err
		}
		dst[i] = v.(int)
	}
	return nil
}

// load loads key into the map, unless a Do that ended since the caller
// read the map stored it.
func (s *sfCache) load(ctx context.Context, key string) (any, error) {
	s.mu.RLock()
	e, ok := s.m[key]
	s.mu.RUnlock()
	if ok && time.Now().UnixNano() < e.exp {
		return e.v, nil
	}
	v, err := s.d.loadOne(ctx, key)
	if err != nil {
		return nil, err
	}
	s.mu.Lock()
	s.m[key] = sfEntry{v: v, exp: time.Now().Add(ttl).UnixNano()}
	s.mu.Unlock()
	return v, nil
}

func (s *sfCache) close() {}
