// Package topk tracks the cache keys with the most traffic in bounded memory.
package topk

import (
	"cmp"
	"math"
	"math/bits"
	"slices"
	"strings"
	"sync"
)

// Counts are per-key figures. Traffic ranks keys and decides which keep a
// slot; Misses, Loads and Stale are counted alongside it. Every figure
// saturates at math.MaxUint64 instead of wrapping.
type Counts struct {
	Traffic uint64 // requests for the key
	Misses  uint64 // requests the cache could not serve
	Loads   uint64 // backing-store calls made for the key
	Stale   uint64 // requests answered with a stale value
}

// Item is one tracked key as Top reports it.
//
// Traffic overestimates the key's true Traffic by at most Error:
// true ≤ Traffic ≤ true + Error. Misses, Loads and Stale are counted only
// since the key took its slot, so they are lower bounds of the true figures.
// While at most m distinct keys have been added, every figure is exact and
// Error is 0.
type Item struct {
	Key string
	Counts
	// Error is the Traffic the slot had when Key took it over; 0 when Key
	// got an empty slot.
	Error uint64
}

// Tracker finds the heavy hitters of a stream of (key, Counts) additions with
// the Space-Saving algorithm (Metwally, Agrawal, El Abbadi, 2005) on
// m = 10·k counters.
//
// With N the total Traffic added, every key whose true Traffic exceeds N/m is
// tracked, and every tracked key's reported Traffic lies in
// [true, true + Error] with Error ≤ N/m. An untracked key's true Traffic is
// at most the smallest tracked Traffic.
//
// A Tracker is safe for concurrent use. The zero Tracker, like a nil one,
// records nothing; use New.
type Tracker struct {
	k int // the number of keys Top reports; ≤ 0: the Tracker records nothing
	m int // the number of slots: 10·k, or math.MaxInt if that overflows

	mu sync.Mutex
	n  uint64 // total Traffic added (saturating)
	// slots holds the tracked keys, len(slots) ≤ m. A slot never moves;
	// a takeover only changes its key. Once len(slots) == m it stays so until
	// Reset. The slots' Traffic sums to n (unless n saturated), which is what
	// keeps the smallest Traffic, and so every Error, at or below n/m.
	slots []slot
	// index maps the key of every slot to its position in slots, and holds
	// nothing else.
	index map[string]int
	// heap holds every slot position once, as a binary min-heap on the slots'
	// Traffic: Traffic of slots[heap[i]] ≤ that of its children
	// slots[heap[2i+1]] and slots[heap[2i+2]]. slots[heap[i]].at == i.
	heap []int
}

// slot is one counter: a key, its figures, and its bookkeeping.
type slot struct {
	key string
	Counts
	err uint64 // the Traffic the slot had when key took it over
	at  int    // the slot's position in Tracker.heap
}

// New returns a Tracker whose Top reports the k keys with the most Traffic,
// using m = 10·k slots. Memory grows with the distinct keys added, up to m
// slots. If k ≤ 0 the Tracker records nothing: Add does nothing, Top returns
// nil and N returns 0.
func New(k int) *Tracker {
	if k <= 0 {
		return &Tracker{}
	}
	m := math.MaxInt
	if k <= math.MaxInt/10 {
		m = 10 * k
	}
	return &Tracker{k: k, m: m, index: make(map[string]int, min(m, 1024))}
}

// Add adds c to key's figures.
//
// A tracked key's figures grow by c. An absent key takes a free slot with
// figures c and Error 0. When all m slots are taken, an absent key takes over
// the slot with the least Traffic, min: its Traffic becomes min + c.Traffic,
// its Error min, and its Misses, Loads and Stale restart at c's. An absent key
// with c.Traffic == 0 cannot take a slot over; that addition is dropped.
//
// Add keeps key. It does not allocate for a tracked key, and it takes
// O(log m) time.
func (t *Tracker) Add(key string, c Counts) {
	if t == nil || t.m == 0 {
		return
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	t.n = addSat(t.n, c.Traffic)
	if s, ok := t.index[key]; ok {
		sl := &t.slots[s]
		sl.Traffic = addSat(sl.Traffic, c.Traffic)
		sl.Misses = addSat(sl.Misses, c.Misses)
		sl.Loads = addSat(sl.Loads, c.Loads)
		sl.Stale = addSat(sl.Stale, c.Stale)
		if c.Traffic != 0 {
			t.down(sl.at)
		}
		return
	}
	if len(t.slots) < t.m {
		s := len(t.slots)
		t.slots = append(t.slots, slot{key: key, Counts: c, at: len(t.heap)})
		t.heap = append(t.heap, s)
		t.index[key] = s
		t.up(len(t.heap) - 1)
		return
	}
	if c.Traffic == 0 {
		return
	}
	s := t.heap[0]
	sl := &t.slots[s]
	delete(t.index, sl.key)
	least := sl.Traffic
	*sl = slot{key: key, Counts: c, err: least, at: 0}
	sl.Traffic = addSat(least, c.Traffic)
	t.index[key] = s
	t.down(0)
}

// Top returns the k keys with the most Traffic, most first; keys with equal
// Traffic come in byte order of the key. It returns fewer than k items while
// fewer keys are tracked.
func (t *Tracker) Top() []Item {
	if t == nil || t.k <= 0 {
		return nil
	}
	t.mu.Lock()
	items := make([]Item, len(t.slots))
	for i, s := range t.slots {
		items[i] = Item{Key: s.key, Counts: s.Counts, Error: s.err}
	}
	t.mu.Unlock()
	slices.SortFunc(items, func(a, b Item) int {
		if c := cmp.Compare(b.Traffic, a.Traffic); c != 0 {
			return c
		}
		return strings.Compare(a.Key, b.Key)
	})
	if len(items) <= t.k {
		return items
	}
	return slices.Clone(items[:t.k])
}

// N returns the total Traffic added since New or the last Reset.
func (t *Tracker) N() uint64 {
	if t == nil || t.m == 0 {
		return 0
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.n
}

// Reset forgets every key and sets N to 0.
func (t *Tracker) Reset() {
	if t == nil || t.m == 0 {
		return
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	t.n = 0
	clear(t.index)
	clear(t.slots) // drop the keys
	t.slots = t.slots[:0]
	t.heap = t.heap[:0]
}

// addSat returns a + b, or math.MaxUint64 if that overflows.
func addSat(a, b uint64) uint64 {
	s, carry := bits.Add64(a, b, 0)
	if carry != 0 {
		return math.MaxUint64
	}
	return s
}

// less reports whether heap position i holds less Traffic than position j.
func (t *Tracker) less(i, j int) bool {
	return t.slots[t.heap[i]].Traffic < t.slots[t.heap[j]].Traffic
}

func (t *Tracker) swap(i, j int) {
	h := t.heap
	h[i], h[j] = h[j], h[i]
	t.slots[h[i]].at = i
	t.slots[h[j]].at = j
}

// up restores the heap after position i's Traffic fell below its parent's.
func (t *Tracker) up(i int) {
	for i > 0 {
		p := (i - 1) / 2
		if !t.less(i, p) {
			return
		}
		t.swap(i, p)
		i = p
	}
}

// down restores the heap after position i's Traffic grew.
func (t *Tracker) down(i int) {
	n := len(t.heap)
	for {
		c := 2*i + 1
		if c >= n {
			return
		}
		if r := c + 1; r < n && t.less(r, c) {
			c = r
		}
		if !t.less(c, i) {
			return
		}
		t.swap(i, c)
		i = c
	}
}
