package notify

import (
	"slices"
	"sync"
	"testing"
)

func closed(c <-chan struct{}) bool {
	select {
	case <-c:
		return true
	default:
		return false
	}
}

func TestWaiters(t *testing.T) {
	var ws Waiters
	a1, a2, b := ws.Add("a"), ws.Add("a"), ws.Add("b")
	if a1.C() != a2.C() || a1.C() == b.C() || ws.Len() != 2 || !ws.Has("a") || ws.Has("c") {
		t.Fatal("waiters of one key must share a generation, of two keys not")
	}
	ws.Wake("a")
	if !closed(a1.C()) || closed(b.C()) || ws.Len() != 1 {
		t.Fatal("Wake(a) must end a's generation only")
	}
	if next := ws.Add("a"); closed(next.C()) {
		t.Fatal("a waiter added after Wake waits for the next one")
	}
	ws.WakeAll()
	if !closed(b.C()) || ws.Len() != 0 {
		t.Fatal("WakeAll must end every generation")
	}
}

func TestWaitersLeave(t *testing.T) {
	var ws Waiters
	w1, w2 := ws.Add("k"), ws.Add("k")
	ws.Leave(w1)
	if ws.Len() != 1 {
		t.Fatal("the generation went with one of its two waiters")
	}
	ws.Leave(w2)
	if ws.Len() != 0 {
		t.Fatal("the last waiter to leave must remove the generation")
	}
	// A waiter leaving an ended generation must not remove the new one.
	old := ws.Add("k")
	ws.Wake("k")
	fresh := ws.Add("k")
	ws.Leave(old)
	if ws.Len() != 1 || closed(fresh.C()) {
		t.Fatal("leaving an ended generation touched the current one")
	}
}

// TestWatch: a watch is called once by the next announcement on its key,
// and one taken back before it leaves nothing behind; stop may be called
// twice, and after the call.
func TestWatch(t *testing.T) {
	var (
		mu    sync.Mutex
		ws    Waiters
		calls int
	)
	mu.Lock()
	stop := ws.Watch(&mu, "k", func() { calls++ })
	gone := ws.Watch(&mu, "gone", func() { t.Error("a watch taken back was called") })
	mu.Unlock()
	gone()
	gone()
	if ws.Has("gone") {
		t.Error("a watch taken back is still registered")
	}
	mu.Lock()
	ws.Wake("k")
	ws.Wake("k")
	ws.Wake("gone")
	mu.Unlock()
	if calls != 1 {
		t.Errorf("the watch was called %d times by two announcements, want once", calls)
	}
	stop()
	if ws.Len() != 0 {
		t.Errorf("%d keys still have waiters", ws.Len())
	}
}

// TestWatchMany: each key's registration is called once by the next
// announcement on its key, with its index; one taken back is not called
// and leaves nothing behind; stop may be called twice, and after the call.
func TestWatchMany(t *testing.T) {
	var (
		mu    sync.Mutex
		ws    Waiters
		calls = map[int]int{}
	)
	mu.Lock()
	other := ws.Watch(&mu, "b", func() {}) // b has a generation already
	stop := ws.WatchMany(&mu, []string{"a", "b", "gone"}, func(i int) { calls[i]++ })
	mu.Unlock()
	stop(2)
	stop(2)
	if ws.Has("gone") {
		t.Error("a watch taken back is still registered")
	}
	mu.Lock()
	ws.Wake("a")
	ws.Wake("a")
	ws.Wake("b")
	ws.Wake("gone")
	mu.Unlock()
	if calls[0] != 1 || calls[1] != 1 || len(calls) != 2 {
		t.Errorf("calls by index %v, want 0 and 1 called once each", calls)
	}
	for i := range 3 {
		stop(i)
	}
	other()
	if ws.Len() != 0 {
		t.Errorf("%d keys still have waiters", ws.Len())
	}
}

// TestWatchesOfOneKey: of many registrations on one key, by Watch and
// WatchMany, those taken back (the first, one in the middle, the last)
// are not called and the others are, once each and in the order they were
// made; the key keeps its generation while one remains.
func TestWatchesOfOneKey(t *testing.T) {
	var (
		mu     sync.Mutex
		ws     Waiters
		called []int
	)
	mu.Lock()
	var stops []func()
	for i := range 6 {
		if i%2 == 0 {
			stops = append(stops, ws.Watch(&mu, "k", func() { called = append(called, i) }))
			continue
		}
		stop := ws.WatchMany(&mu, []string{"k"}, func(int) { called = append(called, i) })
		stops = append(stops, func() { stop(0) })
	}
	mu.Unlock()
	for _, i := range []int{0, 3, 5} {
		stops[i]()
	}
	if !ws.Has("k") {
		t.Fatal("the key lost its generation with three registrations left")
	}
	mu.Lock()
	ws.Wake("k")
	mu.Unlock()
	if want := []int{1, 2, 4}; !slices.Equal(called, want) {
		t.Errorf("called %v, want %v", called, want)
	}
	for _, stop := range stops {
		stop()
	}
	if ws.Len() != 0 {
		t.Errorf("%d keys still have waiters", ws.Len())
	}

	// Taking every registration back removes the generation.
	mu.Lock()
	a := ws.Watch(&mu, "k", func() { t.Error("a watch taken back was called") })
	b := ws.WatchMany(&mu, []string{"k", "k"}, func(int) { t.Error("a watch taken back was called") })
	mu.Unlock()
	b(1)
	a()
	if !ws.Has("k") {
		t.Fatal("the key lost its generation with one registration left")
	}
	b(0)
	if ws.Len() != 0 {
		t.Errorf("%d keys still have waiters after every registration was taken back", ws.Len())
	}
}

// Count moves at each Wake of its key and at each WakeAll, and at nothing
// else of its key; it needs no registration and leaves none.
func TestWaitersCount(t *testing.T) {
	var ws Waiters
	a := ws.Count("a")
	if ws.Count("a") != a {
		t.Fatal("Count moved with no announcement")
	}
	ws.Wake("a")
	a2 := ws.Count("a")
	if a2 == a {
		t.Fatal("Wake(a) did not move Count(a)")
	}
	b := ws.Count("b")
	ws.WakeAll()
	if ws.Count("a") == a2 || ws.Count("b") == b {
		t.Fatal("WakeAll did not move every key's Count")
	}
	if ws.Len() != 0 {
		t.Fatalf("Count left %d keys registered; want 0", ws.Len())
	}
	// Another key's Wake moves a's Count only when the two share a
	// counter, which, of countSlots counters, few of 64 keys do.
	moved := 0
	for i := range 64 {
		before := ws.Count("a")
		ws.Wake(string(rune('b' + i)))
		if ws.Count("a") != before {
			moved++
		}
	}
	if moved > 8 {
		t.Errorf("%d of 64 other keys' Wakes moved a's Count; want few", moved)
	}
}
