package herd

import (
	"container/list"
	"iter"
	"sync"
	"sync/atomic"

	"github.com/maypok86/otter/v2"
)

// localTier is the local tier: otter and, when the tier is bounded by
// weight, an LRU list beside it for the entries heavier than 1/256 of
// MaxWeight. otter admits a new entry through a window of about 1% of its
// bound: an entry heavier than that window meets otter's victim at once
// and, new and so seldom read, loses to it, so it would be dropped as soon
// as it was put. The list keeps such entries until newer heavy ones push
// them out. It holds at most half of MaxWeight, and otter's bound shrinks
// by what it holds, so that the two hold at most MaxWeight together and
// otter's window stays above the list's threshold.
type localTier[V any] struct {
	main *otter.Cache[string, *entry[V]]
	// weigh is nil when the tier is bounded by MaxEntries: no list then.
	weigh func(key string, e *entry[V]) uint32
	max   uint64 // MaxWeight
	heavy uint64 // an entry heavier than this goes to the list

	// n is the length of the list, read without mu by a lookup that otter
	// missed: no lock on a miss while the list is empty.
	n  atomic.Int64
	mu sync.Mutex
	// The list, its index and the weight it holds are guarded by mu; the
	// list runs from the most to the least recently used, and held never
	// exceeds max/2.
	lru  list.List // of *heavyEntry[V]
	at   map[string]*list.Element
	held uint64
}

// heavyEntry is an entry of the list, with the weight it was put with.
type heavyEntry[V any] struct {
	key string
	e   *entry[V]
	w   uint64
}

// GetIfPresent returns key's entry, from otter or the list.
func (t *localTier[V]) GetIfPresent(key string) (*entry[V], bool) {
	if e, ok := t.main.GetIfPresent(key); ok {
		return e, true
	}
	if t.n.Load() == 0 {
		return nil, false
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	el, ok := t.at[key]
	if !ok {
		return nil, false
	}
	t.lru.MoveToFront(el)
	return el.Value.(*heavyEntry[V]).e, true
}

// Put puts e under key if admit, called with key's entry (nil when there
// is none), allows it, and reports whether it did. Without a weight bound
// the lookup and the write are one otter Compute, under which admit runs:
// it must not call the tier.
func (t *localTier[V]) Put(key string, e *entry[V], admit func(cur *entry[V]) bool) bool {
	if t.weigh != nil {
		cur, _ := t.GetIfPresent(key)
		if !admit(cur) {
			return false
		}
		t.Set(key, e)
		return true
	}
	put := false
	t.main.Compute(key, func(cur *entry[V], _ bool) (*entry[V], otter.ComputeOp) {
		if !admit(cur) {
			return cur, otter.CancelOp
		}
		put = true
		return e, otter.WriteOp
	})
	return put
}

// Set puts e under key, in the list when it is heavy, and drops what the
// other part held under key. An entry heavier than half of MaxWeight is
// not kept at all.
func (t *localTier[V]) Set(key string, e *entry[V]) {
	if t.weigh == nil {
		t.main.Set(key, e)
		return
	}
	// Each part is written before the other's old entry goes, so no
	// interleaving of two Sets of key leaves an entry in both.
	switch w := uint64(t.weigh(key, e)); {
	case w <= t.heavy:
		t.main.Set(key, e)
		t.remove(key)
	case w <= t.max/2:
		t.add(key, e, w)
		t.main.Invalidate(key)
	default:
		t.main.Invalidate(key)
		t.remove(key)
	}
}

// add puts a heavy entry at the front of the list and evicts from its
// back until it holds at most max/2.
func (t *localTier[V]) add(key string, e *entry[V], w uint64) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.at == nil {
		t.at = make(map[string]*list.Element)
	}
	if el, ok := t.at[key]; ok {
		h := el.Value.(*heavyEntry[V])
		t.held -= h.w
		h.e, h.w = e, w
		t.lru.MoveToFront(el)
	} else {
		t.at[key] = t.lru.PushFront(&heavyEntry[V]{key: key, e: e, w: w})
	}
	t.held += w
	for t.held > t.max/2 {
		t.drop(t.lru.Back()) // never e: it weighs at most max/2
	}
	t.resized()
}

// remove drops key from the list.
func (t *localTier[V]) remove(key string) {
	if t.n.Load() == 0 {
		return
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if el, ok := t.at[key]; ok {
		t.drop(el)
		t.resized()
	}
}

// drop takes el off the list; t.mu is held.
func (t *localTier[V]) drop(el *list.Element) {
	h := t.lru.Remove(el).(*heavyEntry[V])
	delete(t.at, h.key)
	t.held -= h.w
}

// resized gives otter what the list leaves of MaxWeight; t.mu is held.
func (t *localTier[V]) resized() {
	t.n.Store(int64(t.lru.Len()))
	t.main.SetMaximum(t.max - t.held)
}

// Invalidate drops key's entry.
func (t *localTier[V]) Invalidate(key string) {
	t.main.Invalidate(key)
	t.remove(key)
}

// InvalidateAll drops every entry.
func (t *localTier[V]) InvalidateAll() {
	t.main.InvalidateAll()
	if t.weigh == nil {
		return
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	t.lru.Init()
	clear(t.at)
	t.held = 0
	t.resized()
}

// All yields the entries of otter, then those of the list as they were
// when otter's were done.
func (t *localTier[V]) All() iter.Seq2[string, *entry[V]] {
	return func(yield func(string, *entry[V]) bool) {
		for k, e := range t.main.All() {
			if !yield(k, e) {
				return
			}
		}
		if t.n.Load() == 0 {
			return
		}
		t.mu.Lock()
		heavy := make([]*heavyEntry[V], 0, t.lru.Len())
		for el := t.lru.Front(); el != nil; el = el.Next() {
			heavy = append(heavy, el.Value.(*heavyEntry[V]))
		}
		t.mu.Unlock()
		for _, h := range heavy {
			if !yield(h.key, h.e) {
				return
			}
		}
	}
}

// weight is the weight the tier holds, both parts; zero without MaxWeight.
func (t *localTier[V]) weight() uint64 {
	if t.weigh == nil {
		return 0
	}
	t.mu.Lock()
	held := t.held
	t.mu.Unlock()
	return t.main.WeightedSize() + held
}

// StopAllGoroutines stops otter's background work.
func (t *localTier[V]) StopAllGoroutines() { t.main.StopAllGoroutines() }
