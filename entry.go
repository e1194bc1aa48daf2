package herd

import (
	"hash/maphash"
	"sync"
	"sync/atomic"
	"time"

	"github.com/herdcache/herd/observe"
	"github.com/herdcache/herd/remote"
	"github.com/herdcache/herd/remote/envelope"
	"github.com/herdcache/herd/xfetch"
)

// entry is one value in the local tier. Its fields are written before the
// entry is published to the local tier or a flight's waiters and never after,
// except the atomics.
type entry[V any] struct {
	value V
	// soft and hard are the wall-clock expiries in Unix nanoseconds: fresh
	// before soft, stale between, gone at hard.
	soft, hard int64
	// near is when a replica with a Store must ask it again (Unix
	// nanoseconds); zero without a Store.
	near int64
	// born is when the entry was put in the local tier (Unix nanoseconds).
	born int64
	// delta is the load duration that early refresh and refresh-ahead plan
	// by (ns): the measured duration of the load that made the value, or
	// nine tenths of the value it replaced if that is longer, so that one
	// fast load does not cut the lead that the next, slower one needs.
	delta int64
	// lead is how long before soft a hit starts an early refresh (ns),
	// decided once for the value by setLead; zero: never. A stale copy's is
	// its soft expiry (staleCopy): the hit path's coarse check never passes.
	lead     int64
	negative bool
	// uncached marks a value its load asked not to cache: it is handed to the
	// flight's callers and never stored.
	uncached bool
	// tags are the entry's tags, sorted (Tags), and since is when its load
	// began on the clock of tag versions (Unix microseconds): a version of
	// a tag at or after since retires the entry. Untagged: nil.
	tags  []string
	since uint64

	// refreshing is set by the one reader that starts a background refresh of
	// this entry; a new entry replaces it when the refresh succeeds.
	refreshing atomic.Bool
	// retryAt is the earliest time (Unix nanoseconds) another background
	// refresh may start after one failed, was shed, or found the lease held
	// elsewhere.
	retryAt atomic.Int64
	// shed is set once the limiter shed a refresh of this entry: from half
	// of its stale window on, its refresh waits for a slot at High priority.
	shed atomic.Bool
	// superseded is set when a notice announced a newer write of the key:
	// the entry is served while one read of the Store replaces it.
	superseded atomic.Bool
	// read is set by the first hit on the entry when hot keys are refreshed
	// ahead: a hot key whose value was not read is not refreshed.
	read atomic.Bool
	// revalidating is set by the reader that starts the one background read
	// that replaces this entry (see revalidate).
	revalidating atomic.Bool
	// fence is the remote fence the value was written under; zero until its
	// write-back, made in the background, reports it, and when it never
	// reached a Store.
	fence atomic.Uint64
}

func (e *entry[V]) result() (V, error) {
	if e.negative {
		var zero V
		return zero, ErrNotFound
	}
	return e.value, nil
}

// newerThan reports whether e holds a later value than o: a higher fence
// when both fences are known, else a later soft expiry.
func (e *entry[V]) newerThan(o *entry[V]) bool {
	if ef, of := e.fence.Load(), o.fence.Load(); ef != 0 && of != 0 {
		return ef > of
	}
	return e.soft > o.soft
}

// staleCopy returns a copy of e that went stale at now, under fence if
// that is newer than e's. Its lead is its whole soft expiry, so that no
// read judges it by the hit path's coarse clock, which may lag the precise
// one while starved of CPU: every read of it takes the precise time, and
// finds it stale.
func (e *entry[V]) staleCopy(now int64, fence uint64) *entry[V] {
	s := &entry[V]{value: e.value, soft: now, lead: now, hard: e.hard, near: e.near, born: e.born, delta: e.delta, negative: e.negative, tags: e.tags, since: e.since}
	s.fence.Store(max(fence, e.fence.Load()))
	return s
}

func (e *entry[V]) stale(now int64) bool { return !e.uncached && now >= e.soft }

// gone reports whether e is past its hard expiry at now: never to be served.
func (e *entry[V]) gone(now int64) bool { return !e.uncached && now >= e.hard }

// midStale is the middle of e's stale window (Unix nanoseconds).
func (e *entry[V]) midStale() int64 { return e.soft + (e.hard-e.soft)/2 }

// decode makes the entry of env, key's envelope as read from the Store at
// at (Unix nanoseconds): with a NearTTL, it is trusted until NearTTL after
// then.
func (c *Cache[V]) decode(key string, env []byte, at int64) (*entry[V], bool) {
	ev, err := envelope.Decode(env)
	if err != nil {
		c.st.decodeErrors.add(1)
		return nil, false
	}
	e := &entry[V]{
		soft:     ev.Soft * int64(time.Millisecond),
		hard:     ev.Hard * int64(time.Millisecond),
		delta:    int64(ev.Delta),
		negative: ev.Flags&envelope.FlagNegative != 0,
		tags:     ev.Tags,
		since:    ev.Since,
	}
	e.fence.Store(ev.Fence)
	if !e.negative {
		v, err := c.cfg.Codec.Unmarshal(ev.Value)
		if err != nil {
			c.st.decodeErrors.add(1)
			return nil, false
		}
		e.value = v
	}
	if c.cfg.NearTTL > 0 {
		e.near = addTime(at, c.cfg.NearTTL)
	}
	c.setLead(key, e)
	return e, true
}

func (c *Cache[V]) encode(e *entry[V]) ([]byte, error) {
	ev := envelope.Envelope{
		Soft:  e.soft / int64(time.Millisecond),
		Hard:  e.hard / int64(time.Millisecond),
		Delta: time.Duration(e.delta),
	}
	if len(e.tags) > 0 {
		ev.Flags |= envelope.FlagTagged
		ev.Tags, ev.Since = e.tags, e.since
	}
	if e.negative {
		ev.Flags |= envelope.FlagNegative
	} else {
		b, err := c.cfg.Codec.Marshal(e.value)
		if err != nil {
			return nil, err
		}
		ev.Value = b
	}
	return envelope.Append(nil, &ev), nil
}

// setLocal puts e in the local tier unless key was set or invalidated since
// gen was read.
func (c *Cache[V]) setLocal(key string, e *entry[V], gen uint64) { c.publish(key, e, gen, false) }

// publish puts e in the local tier unless key may have been set or
// invalidated since gen was read, and reports whether it did. With write, it also refuses
// while a Set or Invalidate of key is running, and otherwise counts an
// unfenced remote write of key as in flight, to be ended with endWrite.
func (c *Cache[V]) publish(key string, e *entry[V], gen uint64, write bool) bool {
	s := c.gens.stripe(key)
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.changedSince(key, gen) || write && (s.changes[key] > 0 || c.gens.all.Load() > 0) {
		return false
	}
	already := false
	put := c.local.Put(key, e, func(cur *entry[V]) bool {
		switch {
		case cur == e && !write:
			already = true // put already, by a caller that shared its read
			return false
		case cur != nil && !write && cur.newerThan(e):
			return false // a read of the Store that began before a refresh here landed
		case cur != nil && cur.soft == e.soft:
			// The same value read again: it was read if cur was, and a refresh
			// of cur that failed or was shed holds for it too.
			e.read.Store(e.read.Load() || cur.read.Load())
			e.retryAt.Store(max(e.retryAt.Load(), cur.retryAt.Load()))
			e.shed.Store(e.shed.Load() || cur.shed.Load())
		}
		if e.born == 0 { // a value read from the Store keeps when its read was sent (sentAt)
			e.born = c.clk.now()
		}
		return true
	})
	if !put {
		return already
	}
	s.puts++
	if write {
		if s.writes == nil {
			s.writes = make(map[string]int)
		}
		s.writes[key]++
	}
	return true
}

// unpublish drops e from the local tier if it is still key's entry there.
func (c *Cache[V]) unpublish(key string, e *entry[V]) {
	s := c.gens.stripe(key)
	s.mu.Lock()
	defer s.mu.Unlock()
	if cur, ok := c.local.GetIfPresent(key); ok && cur == e {
		c.local.Invalidate(key)
	}
}

// generations order the tiers' writes against Set and Invalidate. Set and
// Invalidate bump the generation of their key's stripe when they begin and
// when they end, and a load that read an older generation writes neither
// tier if one of the bumps since was of its key. Keys share stripes, and a
// stripe remembers the last change of up to lastKeys keys: a change of
// another key in the stripe does not keep a load's value out, and past
// that many keys the oldest is forgotten, after which a load that read the
// stripe before its change counts as changed. An unrelated change can then
// keep a value out of the tiers, never let an old one in.
//
// A load without a lease writes the Store unfenced, so the order of those
// writes is kept here too: while a Set or Invalidate of key runs, no such
// write of key starts, and it begins only once every one in flight has
// landed.
type generations struct {
	seed    maphash.Seed
	stripes [256]genStripe
	// completions is the Lease's count of completions, when it keeps one.
	completions remote.CompletionCounter
	// all counts the InvalidateAlls running: no unfenced remote write
	// starts meanwhile.
	all atomic.Int32
}

type genStripe struct {
	mu sync.Mutex
	n  uint64 // guarded by mu
	// last maps each key changed since floor to the generation of its last
	// change, for at most lastKeys keys; guarded by mu, nil until first
	// used.
	last map[string]uint64
	// floor is the generation of the last change of every key, or of the
	// last change forgotten to keep last within lastKeys, whichever is
	// later: a load that read the stripe before it counts as changed;
	// guarded by mu.
	floor uint64
	// puts counts the entries put in the local tier by loads and reads;
	// guarded by mu. A Store read made before a put may be out of date.
	puts uint64
	// writes counts, by key, the unfenced remote writes in flight, and
	// changes the Sets and Invalidates running; guarded by mu, nil until
	// first used, and a key is deleted when its count drops to zero.
	writes, changes map[string]int
	// idle is signalled when a key's writes drop to zero; its L is &mu.
	idle sync.Cond
	// heldUntil maps a key whose lease another load was found to hold to
	// when that holder's lease ends and to the watch of its completion;
	// guarded by mu, nil until first used. Expired and completed keys are
	// swept as new ones are added.
	heldUntil map[string]heldBy
	// refreshing holds the keys a background refresh runs for; guarded by
	// mu, nil until first used. Two copies of one key (one re-read from the
	// Store while the other is refreshed) start one refresh between them.
	refreshing map[string]struct{}
}

// lastKeys is how many keys' last change a stripe remembers.
const lastKeys = 64

// bump advances the generation for a change of key, or of every key (all);
// s.mu is held. With more than lastKeys keys remembered, it forgets the
// one changed longest ago.
func (s *genStripe) bump(key string, all bool) {
	s.n++
	if all {
		s.floor = s.n
		clear(s.last)
		return
	}
	if s.last == nil {
		s.last = make(map[string]uint64)
	}
	s.last[key] = s.n
	if len(s.last) <= lastKeys {
		return
	}
	oldest, at := "", s.n
	for k, g := range s.last {
		if g < at {
			oldest, at = k, g
		}
	}
	delete(s.last, oldest)
	s.floor = max(s.floor, at)
}

// changedSince reports whether key may have been changed since the stripe
// was at gen: its last change, a change of every key, or a change
// forgotten since, came after gen; s.mu is held.
func (s *genStripe) changedSince(key string, gen uint64) bool {
	return s.n != gen && (gen < s.floor || s.last[key] > gen)
}

// startRefresh claims key's one background refresh and reports whether it
// did; a claim is ended by endRefresh.
func (g *generations) startRefresh(key string) bool {
	s := g.stripe(key)
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.refreshing[key]; ok {
		return false
	}
	if s.refreshing == nil {
		s.refreshing = make(map[string]struct{})
	}
	s.refreshing[key] = struct{}{}
	return true
}

// endRefresh ends the claim startRefresh made.
func (g *generations) endRefresh(key string) {
	s := g.stripe(key)
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.refreshing, key)
}

func (g *generations) stripe(key string) *genStripe {
	return &g.stripes[maphash.String(g.seed, key)%uint64(len(g.stripes))]
}

// get returns the generation and the count of puts of key's stripe.
func (g *generations) get(key string) (gen, puts uint64) {
	s := g.stripe(key)
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.n, s.puts
}

// changedSince reports whether key may have been set or invalidated since
// gen was read.
func (g *generations) changedSince(key string, gen uint64) bool {
	s := g.stripe(key)
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.changedSince(key, gen)
}

// beginChange starts a Set or Invalidate of key: it bumps the generation,
// runs fn (if not nil) under the stripe's lock, and returns once no unfenced
// remote write of key is in flight. Each call is ended by endChange.
func (g *generations) beginChange(key string, fn func()) {
	s := g.stripe(key)
	s.mu.Lock()
	defer s.mu.Unlock()
	s.bump(key, false)
	if s.changes == nil {
		s.changes = make(map[string]int)
	}
	s.changes[key]++
	if fn != nil {
		fn()
	}
	for s.writes[key] > 0 {
		if s.idle.L == nil {
			s.idle.L = &s.mu
		}
		s.idle.Wait()
	}
}

// endChange ends a change begun by beginChange: it bumps the generation
// again and runs fn under the stripe's lock.
func (g *generations) endChange(key string, fn func()) {
	s := g.stripe(key)
	s.mu.Lock()
	defer s.mu.Unlock()
	s.bump(key, false)
	if s.changes[key]--; s.changes[key] == 0 {
		delete(s.changes, key)
	}
	fn()
}

// beginAll starts an InvalidateAll: like beginChange for every key at once,
// it bumps every generation, and returns once no unfenced remote write is
// in flight; until endAll, publish refuses new ones.
func (g *generations) beginAll() {
	g.all.Add(1)
	for i := range g.stripes {
		s := &g.stripes[i]
		s.mu.Lock()
		s.bump("", true)
		for len(s.writes) > 0 {
			if s.idle.L == nil {
				s.idle.L = &s.mu
			}
			s.idle.Wait()
		}
		s.mu.Unlock()
	}
}

// endAll ends an InvalidateAll begun by beginAll.
func (g *generations) endAll() {
	g.bumpAll()
	g.all.Add(-1)
}

// bumpAll bumps every generation: no load that read one before puts its
// value in the local tier.
func (g *generations) bumpAll() {
	for i := range g.stripes {
		s := &g.stripes[i]
		s.mu.Lock()
		s.bump("", true)
		s.mu.Unlock()
	}
}

// endWrite ends an unfenced remote write of key counted by publish.
func (g *generations) endWrite(key string) {
	s := g.stripe(key)
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.writes[key]--; s.writes[key] == 0 {
		delete(s.writes, key)
		if s.idle.L != nil {
			s.idle.Broadcast()
		}
	}
}

// heldBy is what a replica knows of a lease another load holds.
type heldBy struct {
	until int64       // when the holder's lease ends (Unix ns)
	done  *completion // its completion, watched since before it was known; nil: not watched
	// counted: the holder's completion is known by the Lease's count of
	// the key's completions moving from seq ([remote.CompletionCounter]),
	// read before the holder could complete; done is nil then.
	counted bool
	seq     uint64
	// heard: the hold was announced to this replica (announced.go), not
	// found by a lease attempt of its own; spared: the lease attempt it
	// kept this replica from has been counted (LeaseAttemptsSkipped).
	heard, spared bool
	// own: this replica holds the lease. Its completion brings nothing
	// newer than what its load put in the local tier.
	own bool
}

// completed reports whether the completion of h, key's holder, was
// announced.
func (g *generations) completed(key string, h heldBy) bool {
	return h.done.came() || h.counted && g.completions.Completions(key) != h.seq
}

// over reports whether h, key's holder, is over at now: its time has
// passed or its completion was announced.
func (g *generations) over(key string, h heldBy, now int64) bool {
	return h.until <= now || g.completed(key, h)
}

// markHeld records h, what this replica knows of another load that holds
// key's lease, and owns h.done: this replica does not try that lease again
// before h.until, unless the holder's completion or notice comes first.
func (g *generations) markHeld(key string, h heldBy, now int64) {
	g.mark(key, h, now, false)
}

// markHeldFirst is markHeld unless this replica knows of a holder of
// key's lease already, whose record it keeps; it reports whether it
// recorded h, and stops h.done when it did not.
func (g *generations) markHeldFirst(key string, h heldBy, now int64) bool {
	return g.mark(key, h, now, true)
}

// mark is markHeld, or markHeldFirst when first is set.
func (g *generations) mark(key string, h heldBy, now int64, first bool) bool {
	s := g.stripe(key)
	s.mu.Lock()
	var stale []*completion
	if s.heldUntil == nil {
		s.heldUntil = make(map[string]heldBy)
	}
	if len(s.heldUntil) >= sweepAt {
		for k, old := range s.heldUntil {
			if g.over(k, old, now) {
				delete(s.heldUntil, k)
				stale = append(stale, old.done)
			}
		}
	}
	marked := true
	switch old, ok := s.heldUntil[key]; {
	case ok && first && !g.over(key, old, now):
		marked = false
		stale = append(stale, h.done)
	case ok:
		stale = append(stale, old.done)
		fallthrough
	default:
		s.heldUntil[key] = h
	}
	s.mu.Unlock()
	for _, w := range stale {
		w.stop()
	}
	return marked
}

// sweepAt is the size of a stripe's heldUntil at which adding a key first
// drops the expired ones, so that a stripe holds about the keys whose
// leases are held now.
const sweepAt = 16

// held reports until when another replica holds key's lease, as this
// replica was last told, if that time is still ahead of now.
func (g *generations) held(key string, now int64) (until int64, ok bool) {
	h, ok, _ := g.heldOrCompleted(key, now)
	return h.until, ok
}

// heldOrCompleted is held, with what this replica knows of the holder, and
// also reports whether another replica this replica was told holds the
// lease has announced its completion since (the lease is not held, and the
// Store may hold its value). This replica's own completion is not
// reported: its load's value is in the local tier already, and the
// completion may come before the change notice that forgets the hold.
func (g *generations) heldOrCompleted(key string, now int64) (h heldBy, ok, completed bool) {
	h, ok, completed, _ = g.lookHeld(key, now, false)
	return h, ok, completed
}

// lookHeld is heldOrCompleted, and with spare marks the spared attempt of
// a hold that is still held counted, as spare does, reporting whether it
// was not counted before; all under one hold of the stripe's lock.
func (g *generations) lookHeld(key string, now int64, spare bool) (h heldBy, ok, completed, spared bool) {
	s := g.stripe(key)
	s.mu.Lock()
	h, ok = s.heldUntil[key]
	if ok && g.over(key, h, now) {
		delete(s.heldUntil, key)
		s.mu.Unlock()
		completed = !h.own && g.completed(key, h)
		h.done.stop()
		return heldBy{}, false, completed, false
	}
	if ok && spare {
		spared = s.spare(key, h)
	}
	s.mu.Unlock()
	return h, ok, false, spared
}

// spare marks the spared attempt of h, key's hold, counted when h was
// heard announced and its attempt was not counted yet, and reports
// whether it did; s.mu is held.
func (s *genStripe) spare(key string, h heldBy) bool {
	if !h.heard || h.spared {
		return false
	}
	h.spared = true
	s.heldUntil[key] = h
	return true
}

// spare reports whether key's lease is held by a hold this replica heard
// announced whose spared attempt is not counted yet, and marks it
// counted: a hold heard spares the replica one lease attempt, the first
// one a miss or a refresh of the key would have made.
func (g *generations) spare(key string) bool {
	s := g.stripe(key)
	s.mu.Lock()
	defer s.mu.Unlock()
	h, ok := s.heldUntil[key]
	return ok && s.spare(key, h)
}

// heldSparing is held, and spare when key's lease is held: until when
// another replica holds the lease, whether it does, and whether the hold
// spared an attempt that had not been counted.
func (g *generations) heldSparing(key string, now int64) (until int64, ok, spared bool) {
	h, ok, _, spared := g.lookHeld(key, now, true)
	return h.until, ok, spared
}

// forgetHeld drops what markHeld recorded of key: its holder's notice came.
func (g *generations) forgetHeld(key string) {
	s := g.stripe(key)
	s.mu.Lock()
	h, ok := s.heldUntil[key]
	delete(s.heldUntil, key)
	s.mu.Unlock()
	if ok {
		h.done.stop()
	}
}

// forgetAllHeld drops what markHeld recorded of every key: notices may have
// been lost.
func (g *generations) forgetAllHeld() {
	for i := range g.stripes {
		s := &g.stripes[i]
		s.mu.Lock()
		held := s.heldUntil
		s.heldUntil = nil
		s.mu.Unlock()
		for _, h := range held {
			h.done.stop()
		}
	}
}

// setLead decides, once for the value, when e's early refresh starts:
// xfetch.Lead before its soft expiry, from a draw that every replica
// derives alike from the key and the soft expiry the Store holds (to the
// millisecond), so that they agree on the instant and keys written
// together spread their refreshes.
func (c *Cache[V]) setLead(key string, e *entry[V]) {
	if c.cfg.Beta <= 0 || e.uncached {
		return
	}
	var u float64
	if c.draw != nil {
		u = c.draw()
	} else {
		u = xfetch.UOf(valueHash(key, e.soft/int64(time.Millisecond)))
	}
	e.lead = int64(xfetch.Lead(time.Duration(e.delta), c.cfg.Beta, xfetch.DefaultMargin, u))
}

// valueHash hashes key and a value's soft expiry in milliseconds: FNV-1a,
// then a 64-bit finaliser so that every bit of the result depends on both.
func valueHash(key string, softMs int64) uint64 {
	h := uint64(14695981039346656037)
	for i := 0; i < len(key); i++ {
		h = (h ^ uint64(key[i])) * 1099511628211
	}
	h ^= uint64(softMs)
	h = (h ^ h>>30) * 0xbf58476d1ce4e5b9
	h = (h ^ h>>27) * 0x94d049bb133111eb
	return h ^ h>>31
}

// freshResult is how a Get served e, fresh, was answered.
func (e *entry[V]) freshResult() observe.GetResult {
	if e.negative {
		return observe.ResultNegative
	}
	return observe.ResultHit
}
