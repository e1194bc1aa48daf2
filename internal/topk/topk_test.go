package topk

import (
	"cmp"
	"fmt"
	"math"
	"math/rand/v2"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/google/go-cmp/cmp/cmpopts"

	gocmp "github.com/google/go-cmp/cmp"
)

// slotsOf returns every tracked key, in slot order.
func slotsOf(tr *Tracker) []Item {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	items := make([]Item, len(tr.slots))
	for i, s := range tr.slots {
		items[i] = Item{Key: s.key, Counts: s.Counts, Error: s.err}
	}
	return items
}

// checkInvariants checks the invariants written next to Tracker's fields.
func checkInvariants(tb testing.TB, tr *Tracker) {
	tb.Helper()
	tr.mu.Lock()
	defer tr.mu.Unlock()
	if len(tr.slots) > tr.m || len(tr.heap) != len(tr.slots) || len(tr.index) != len(tr.slots) {
		tb.Fatalf("m %d: %d slots, %d in heap, %d in index", tr.m, len(tr.slots), len(tr.heap), len(tr.index))
	}
	var sum uint64
	for s, sl := range tr.slots {
		sum += sl.Traffic
		if got, ok := tr.index[sl.key]; !ok || got != s {
			tb.Fatalf("index[%q] = %d, %v; want slot %d", sl.key, got, ok, s)
		}
		if tr.heap[sl.at] != s {
			tb.Fatalf("slot %d says heap position %d, which holds slot %d", s, sl.at, tr.heap[sl.at])
		}
	}
	for i := 1; i < len(tr.heap); i++ {
		if p := (i - 1) / 2; tr.less(i, p) {
			tb.Fatalf("heap position %d (Traffic %d) under %d (Traffic %d)",
				i, tr.slots[tr.heap[i]].Traffic, p, tr.slots[tr.heap[p]].Traffic)
		}
	}
	if sum != tr.n {
		tb.Fatalf("slots' Traffic sums to %d, N = %d", sum, tr.n)
	}
}

// TestZipf is the acceptance test: 10^6 Zipf(s=1.1) draws over 10^5 keys into
// a Tracker with k = 10 (m = 100).
func TestZipf(t *testing.T) {
	const (
		keys  = 100_000
		draws = 1_000_000
		k     = 10
		m     = 10 * k
	)
	names := make([]string, keys)
	for i := range names {
		names[i] = fmt.Sprintf("key-%05d", i)
	}
	z := rand.NewZipf(rand.New(rand.NewPCG(20050101, 1)), 1.1, 1, keys-1)
	stream := make([]uint32, draws)
	truth := make([]uint64, keys)
	for i := range stream {
		v := z.Uint64()
		stream[i] = uint32(v)
		truth[v]++
	}
	want := make([]int, keys)
	for i := range want {
		want[i] = i
	}
	slices.SortFunc(want, func(a, b int) int { return cmp.Or(cmp.Compare(truth[b], truth[a]), cmp.Compare(a, b)) })
	if truth[want[k-1]] == truth[want[k]] {
		t.Fatalf("the true top %d is not unique (ranks %d and %d both have %d); pick another seed", k, k, k+1, truth[want[k]])
	}

	tr := New(k)
	for _, v := range stream {
		tr.Add(names[v], Counts{Traffic: 1, Misses: 1})
	}
	checkInvariants(t, tr)
	if got := tr.N(); got != draws {
		t.Fatalf("N() = %d, want %d", got, draws)
	}
	top := tr.Top()
	if len(top) != k {
		t.Fatalf("Top() has %d items, want %d", len(top), k)
	}
	rank := make(map[string]int, k)
	for i, it := range top {
		rank[it.Key] = i
	}
	var maxErr uint64
	for i, v := range want[:k] {
		r, ok := rank[names[v]]
		if !ok {
			t.Errorf("true rank %d, %s (Traffic %d), missing from Top()", i+1, names[v], truth[v])
			continue
		}
		it := top[r]
		tv := truth[v]
		if it.Traffic < tv || it.Traffic-tv > it.Error || it.Error*m > draws {
			t.Errorf("%s: Traffic %d, Error %d, true %d; want true ≤ Traffic ≤ true+Error ≤ true+N/m (N/m = %d)",
				it.Key, it.Traffic, it.Error, tv, draws/m)
		}
		// Every draw adds one to both figures, so Misses counts exactly the
		// Traffic added since the key took its slot.
		if it.Misses != it.Traffic-it.Error {
			t.Errorf("%s: Misses %d, want Traffic−Error = %d", it.Key, it.Misses, it.Traffic-it.Error)
		}
		maxErr = max(maxErr, it.Error)
	}
	// Reported order must follow true order wherever the truth differs by
	// more than the error bound: true_a > true_b + Error_b forces a first.
	idx := make(map[string]int, keys)
	for i, n := range names {
		idx[n] = i
	}
	inOrder := true
	for i := range top {
		for j := i + 1; j < len(top); j++ {
			a, b := truth[idx[top[i].Key]], truth[idx[top[j].Key]]
			if b > a+top[i].Error {
				t.Errorf("Top()[%d] = %s (true %d, Error %d) before Top()[%d] = %s (true %d)",
					i, top[i].Key, a, top[i].Error, j, top[j].Key, b)
			}
			if b > a {
				inOrder = false
			}
		}
	}
	t.Logf("true 10th/11th: %d/%d; N/m = %d; largest Error in Top(): %d; order identical to true order: %v",
		truth[want[k-1]], truth[want[k]], draws/m, maxErr, inOrder)
}

func TestExactBelowCapacity(t *testing.T) {
	tr := New(2) // m = 20
	want := map[string]Counts{}
	r := rand.New(rand.NewPCG(7, 7))
	for range 3000 {
		key := fmt.Sprintf("k%02d", r.IntN(20))
		c := Counts{Traffic: r.Uint64N(4), Misses: r.Uint64N(3), Loads: r.Uint64N(2), Stale: r.Uint64N(2)}
		tr.Add(key, c)
		w := want[key]
		w.Traffic += c.Traffic
		w.Misses += c.Misses
		w.Loads += c.Loads
		w.Stale += c.Stale
		want[key] = w
	}
	checkInvariants(t, tr)
	var all []Item
	for key, c := range want {
		all = append(all, Item{Key: key, Counts: c})
	}
	if diff := gocmp.Diff(all, slotsOf(tr), cmpopts.SortSlices(func(a, b Item) bool { return a.Key < b.Key })); diff != "" {
		t.Errorf("tracked keys differ from exact counts (-want +got):\n%s", diff)
	}
	slices.SortFunc(all, func(a, b Item) int { return cmp.Or(cmp.Compare(b.Traffic, a.Traffic), strings.Compare(a.Key, b.Key)) })
	if diff := gocmp.Diff(all[:2], tr.Top()); diff != "" {
		t.Errorf("Top() (-want +got):\n%s", diff)
	}
}

func TestTakeover(t *testing.T) {
	tr := New(1) // m = 10
	for i := range 10 {
		tr.Add(string(rune('a'+i)), Counts{Traffic: uint64(i + 1), Misses: 7, Loads: 7, Stale: 7})
	}
	// "a" has the least Traffic (1); "z" takes its slot over.
	tr.Add("z", Counts{Traffic: 5, Misses: 2, Loads: 1, Stale: 3})
	checkInvariants(t, tr)
	get := func(key string) (Item, bool) {
		for _, it := range slotsOf(tr) {
			if it.Key == key {
				return it, true
			}
		}
		return Item{}, false
	}
	if it, ok := get("a"); ok {
		t.Errorf("evicted key still tracked: %+v", it)
	}
	want := Item{Key: "z", Counts: Counts{Traffic: 1 + 5, Misses: 2, Loads: 1, Stale: 3}, Error: 1}
	if got, _ := get("z"); got != want {
		t.Errorf("after takeover: %+v, want %+v", got, want)
	}
	// Now "b" (2) is least; "a" comes back and takes it over.
	tr.Add("a", Counts{Traffic: 1})
	want = Item{Key: "a", Counts: Counts{Traffic: 2 + 1}, Error: 2}
	if got, _ := get("a"); got != want {
		t.Errorf("after second takeover: %+v, want %+v", got, want)
	}
	// A tracked key grows, without touching its Error.
	tr.Add("z", Counts{Traffic: 10, Misses: 1})
	want = Item{Key: "z", Counts: Counts{Traffic: 16, Misses: 3, Loads: 1, Stale: 3}, Error: 1}
	if got, _ := get("z"); got != want {
		t.Errorf("after adding to a tracked key: %+v, want %+v", got, want)
	}
	// An absent key with no Traffic cannot take a slot over; a tracked key
	// with no Traffic still gets its other figures.
	before := slotsOf(tr)
	tr.Add("y", Counts{Misses: 4})
	if diff := gocmp.Diff(before, slotsOf(tr)); diff != "" {
		t.Errorf("zero-Traffic Add of an absent key changed the slots (-before +after):\n%s", diff)
	}
	tr.Add("a", Counts{Stale: 2})
	want = Item{Key: "a", Counts: Counts{Traffic: 3, Stale: 2}, Error: 2}
	if got, _ := get("a"); got != want {
		t.Errorf("after zero-Traffic Add of a tracked key: %+v, want %+v", got, want)
	}
	if got, want := tr.N(), uint64(55+5+1+10); got != want {
		t.Errorf("N() = %d, want %d", got, want)
	}
	checkInvariants(t, tr)
}

func TestTopOrder(t *testing.T) {
	tr := New(3)
	for _, key := range []string{"d", "c", "b", "a"} {
		tr.Add(key, Counts{Traffic: 5})
	}
	tr.Add("e", Counts{Traffic: 9})
	tr.Add("f", Counts{Traffic: 1})
	want := []Item{
		{Key: "e", Counts: Counts{Traffic: 9}},
		{Key: "a", Counts: Counts{Traffic: 5}},
		{Key: "b", Counts: Counts{Traffic: 5}},
	}
	if diff := gocmp.Diff(want, tr.Top()); diff != "" {
		t.Errorf("Top() (-want +got):\n%s", diff)
	}
}

func TestTopFewerThanK(t *testing.T) {
	tr := New(5)
	if got := tr.Top(); len(got) != 0 {
		t.Errorf("empty Tracker: Top() = %+v, want none", got)
	}
	tr.Add("x", Counts{Traffic: 1})
	tr.Add("y", Counts{Traffic: 2})
	want := []Item{{Key: "y", Counts: Counts{Traffic: 2}}, {Key: "x", Counts: Counts{Traffic: 1}}}
	if diff := gocmp.Diff(want, tr.Top()); diff != "" {
		t.Errorf("Top() (-want +got):\n%s", diff)
	}
}

func TestDisabled(t *testing.T) {
	for name, tr := range map[string]*Tracker{"New(0)": New(0), "New(-3)": New(-3), "zero": {}, "nil": nil} {
		t.Run(name, func(t *testing.T) {
			tr.Add("x", Counts{Traffic: 3, Misses: 1})
			if got := tr.Top(); got != nil {
				t.Errorf("Top() = %+v, want nil", got)
			}
			if got := tr.N(); got != 0 {
				t.Errorf("N() = %d, want 0", got)
			}
			tr.Reset()
		})
	}
}

func TestHugeK(t *testing.T) {
	tr := New(math.MaxInt)
	tr.Add("x", Counts{Traffic: 2})
	tr.Add("y", Counts{Traffic: 1})
	want := []Item{{Key: "x", Counts: Counts{Traffic: 2}}, {Key: "y", Counts: Counts{Traffic: 1}}}
	if diff := gocmp.Diff(want, tr.Top()); diff != "" {
		t.Errorf("Top() (-want +got):\n%s", diff)
	}
}

func TestReset(t *testing.T) {
	tr := New(1)
	for i := range 50 {
		tr.Add(fmt.Sprint(i), Counts{Traffic: uint64(i)})
	}
	tr.Reset()
	checkInvariants(t, tr)
	if got := tr.N(); got != 0 {
		t.Errorf("N() after Reset = %d, want 0", got)
	}
	if got := tr.Top(); len(got) != 0 {
		t.Errorf("Top() after Reset = %+v, want none", got)
	}
	// After Reset the slots are free again: new keys are exact, Error 0.
	for i := range 10 {
		tr.Add(fmt.Sprint("n", i), Counts{Traffic: uint64(i + 1)})
	}
	checkInvariants(t, tr)
	for _, it := range slotsOf(tr) {
		if it.Error != 0 || !strings.HasPrefix(it.Key, "n") {
			t.Errorf("after Reset: %+v, want a new key with Error 0", it)
		}
	}
	if diff := gocmp.Diff([]Item{{Key: "n9", Counts: Counts{Traffic: 10}}}, tr.Top()); diff != "" {
		t.Errorf("Top() (-want +got):\n%s", diff)
	}
}

func TestSaturation(t *testing.T) {
	tr := New(1)
	tr.Add("x", Counts{Traffic: math.MaxUint64 - 1, Misses: math.MaxUint64})
	tr.Add("x", Counts{Traffic: 5, Misses: 1})
	if got := tr.N(); got != math.MaxUint64 {
		t.Errorf("N() = %d, want MaxUint64", got)
	}
	want := []Item{{Key: "x", Counts: Counts{Traffic: math.MaxUint64, Misses: math.MaxUint64}}}
	if diff := gocmp.Diff(want, tr.Top()); diff != "" {
		t.Errorf("Top() (-want +got):\n%s", diff)
	}
}

func TestConcurrentAdd(t *testing.T) {
	for _, keys := range []int{5, 1000} { // below m = 10, and far above
		t.Run(fmt.Sprint(keys, "keys"), func(t *testing.T) {
			const workers, adds = 8, 3000
			tr := New(1)
			var wg sync.WaitGroup
			for w := range workers {
				wg.Go(func() {
					for i := range adds {
						tr.Add(fmt.Sprint((w*adds+i)%keys), Counts{Traffic: uint64(i%3 + 1), Misses: 1})
						if i%500 == 0 {
							tr.Top()
						}
					}
				})
			}
			wg.Wait()
			checkInvariants(t, tr)
			// Each worker adds Traffic 1,2,3,1,2,3,… over 3000 Adds: 6000.
			if got, want := tr.N(), uint64(workers*adds*2); got != want {
				t.Errorf("N() = %d, want %d", got, want)
			}
			if keys < tr.m {
				var misses uint64
				for _, it := range slotsOf(tr) {
					misses += it.Misses
				}
				if misses != workers*adds {
					t.Errorf("Misses sum to %d, want %d", misses, workers*adds)
				}
			}
		})
	}
}

func TestAddAllocs(t *testing.T) {
	tr := New(10)
	keys := make([]string, 4096)
	for i := range keys {
		// Longer than 16 bytes, so a copy would not hide in the tiny allocator.
		keys[i] = fmt.Sprintf("tenant-42:user:%08d", i)
		tr.Add(keys[i], Counts{Traffic: 1})
	}
	hot := tr.Top()[0].Key
	if a := testing.AllocsPerRun(1000, func() { tr.Add(hot, Counts{Traffic: 1, Misses: 1}) }); a != 0 {
		t.Errorf("Add of a tracked key: %v allocs, want 0", a)
	}
	// Cycling through 4096 keys with 100 slots, nearly every Add is a
	// takeover. testing.AllocsPerRun rounds down, so count mallocs here.
	const runs = 10_000
	takeovers := 0
	var ms runtime.MemStats
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1))
	runtime.ReadMemStats(&ms)
	before := ms.Mallocs
	for i := range runs {
		key := keys[i%len(keys)]
		if _, ok := tr.index[key]; !ok {
			takeovers++
		}
		tr.Add(key, Counts{Traffic: 1})
	}
	runtime.ReadMemStats(&ms)
	if takeovers < runs*99/100 {
		t.Fatalf("only %d of %d Adds were takeovers", takeovers, runs)
	}
	if a := float64(ms.Mallocs-before) / runs; a > 0.01 {
		t.Errorf("Add of an untracked key with full slots: %.3f allocs on average, want ~0", a)
	}
}

// stream is one random test case: a Tracker size and a list of additions.
type stream struct {
	k   int
	ops []op
}

type op struct {
	key string
	c   Counts
}

// checkStream feeds s to a Tracker and to an exact map, and checks the
// Space-Saving guarantees along the way.
func checkStream(t *testing.T, s stream) {
	t.Helper()
	tr := New(s.k)
	truth := map[string]Counts{}
	var n uint64
	for i, o := range s.ops {
		tr.Add(o.key, o.c)
		w := truth[o.key]
		w.Traffic += o.c.Traffic
		w.Misses += o.c.Misses
		w.Loads += o.c.Loads
		w.Stale += o.c.Stale
		truth[o.key] = w
		n += o.c.Traffic
		if i%7 == 0 || i == len(s.ops)-1 {
			checkBounds(t, tr, truth, n)
		}
	}
}

func checkBounds(t *testing.T, tr *Tracker, truth map[string]Counts, n uint64) {
	t.Helper()
	checkInvariants(t, tr)
	if got := tr.N(); got != n {
		t.Fatalf("N() = %d, want %d", got, n)
	}
	m := uint64(tr.m)
	slots := slotsOf(tr)
	full := len(slots) == tr.m
	tracked := map[string]bool{}
	least := uint64(math.MaxUint64)
	for _, it := range slots {
		tracked[it.Key] = true
		least = min(least, it.Traffic)
		w := truth[it.Key]
		if it.Traffic < w.Traffic || it.Traffic-w.Traffic > it.Error || it.Error*m > n {
			t.Fatalf("%q: Traffic %d, Error %d, true %d, N %d, m %d; want true ≤ Traffic ≤ true+Error ≤ true+N/m",
				it.Key, it.Traffic, it.Error, w.Traffic, n, m)
		}
		if it.Misses > w.Misses || it.Loads > w.Loads || it.Stale > w.Stale {
			t.Fatalf("%q: %+v exceeds the true %+v", it.Key, it.Counts, w)
		}
		if !full && (it.Counts != w || it.Error != 0) {
			t.Fatalf("%q with free slots left: %+v, Error %d; want exactly %+v, Error 0", it.Key, it.Counts, it.Error, w)
		}
	}
	for key, w := range truth {
		if w.Traffic*m > n && !tracked[key] {
			t.Fatalf("%q: true Traffic %d > N/m = %d/%d, but not tracked", key, w.Traffic, n, m)
		}
		if !tracked[key] && w.Traffic > least {
			t.Fatalf("%q: untracked with true Traffic %d > least tracked Traffic %d", key, w.Traffic, least)
		}
		if !full && !tracked[key] {
			t.Fatalf("%q: not tracked though slots are free", key)
		}
	}
	slices.SortFunc(slots, func(a, b Item) int { return cmp.Or(cmp.Compare(b.Traffic, a.Traffic), strings.Compare(a.Key, b.Key)) })
	if want, got := slots[:min(tr.k, len(slots))], tr.Top(); !slices.Equal(want, got) {
		t.Fatalf("Top() = %+v, want the first k of all slots by Traffic, then key: %+v", got, want)
	}
}

func randomStream(r *rand.Rand) stream {
	s := stream{k: 1 + r.IntN(3)}
	keys := 1 + r.IntN(80)
	skew := r.IntN(2) == 0
	s.ops = make([]op, r.IntN(400))
	for i := range s.ops {
		key := r.IntN(keys)
		if skew { // square a uniform draw to favour low keys
			key = key * key / keys
		}
		s.ops[i] = op{key: fmt.Sprint(key), c: Counts{
			Traffic: r.Uint64N(5), // 0 included
			Misses:  r.Uint64N(3),
			Loads:   r.Uint64N(2),
			Stale:   r.Uint64N(2),
		}}
	}
	return s
}

func TestBoundsRandom(t *testing.T) {
	r := rand.New(rand.NewPCG(2005, 11))
	for i := range 400 {
		s := randomStream(r)
		t.Run(fmt.Sprint(i), func(t *testing.T) { checkStream(t, s) })
	}
}

// decodeStream turns fuzz bytes into a stream: the first byte picks k, then
// every two bytes are one addition (key, then packed figures).
func decodeStream(data []byte) stream {
	if len(data) == 0 {
		return stream{k: 1}
	}
	s := stream{k: 1 + int(data[0])%3}
	for b := data[1:]; len(b) >= 2; b = b[2:] {
		f := b[1]
		s.ops = append(s.ops, op{key: fmt.Sprint(b[0] % 64), c: Counts{
			Traffic: uint64(f & 7),
			Misses:  uint64(f >> 3 & 3),
			Loads:   uint64(f >> 5 & 1),
			Stale:   uint64(f >> 6),
		}})
	}
	return s
}

func FuzzBounds(f *testing.F) {
	f.Add([]byte{})
	f.Add([]byte{0, 1, 1, 2, 1, 3, 1})
	r := rand.New(rand.NewPCG(1, 2))
	for range 8 {
		b := make([]byte, 1+2*r.IntN(300))
		for i := range b {
			b[i] = byte(r.Uint32())
		}
		f.Add(b)
	}
	// A stream that fills the 10 slots with Traffic 0 (Misses 1), then sends
	// 20 new keys with Traffic 1 to 7 that take them over.
	b := []byte{0}
	for i := range 10 {
		b = append(b, byte(i), 1<<3)
	}
	for i := range 20 {
		b = append(b, byte(10+i), byte(1+i%7))
	}
	f.Add(b)
	f.Fuzz(func(t *testing.T, data []byte) { checkStream(t, decodeStream(data)) })
}
