package notify

import (
	"sync"
	"testing"
)

// TestDirect checks that Call runs each subscriber before it returns, and
// that a stopped subscriber is not called, even when stop races Call.
func TestDirect(t *testing.T) {
	var d Direct
	var a, b []string
	stopA := d.Add(func(n Notice) { a = append(a, n.Key) })
	stopB := d.Add(func(n Notice) { b = append(b, n.Key) })
	d.Call(Notice{Key: "1"})
	if len(a) != 1 || len(b) != 1 {
		t.Fatalf("after Call: a %v, b %v; want one notice each, at once", a, b)
	}
	stopA()
	stopA()
	d.Call(Notice{Key: "2"})
	if len(a) != 1 || len(b) != 2 {
		t.Fatalf("after stopping a: a %v, b %v; want a unchanged", a, b)
	}
	d.StopAll()
	d.Call(Notice{Key: "3"})
	if len(b) != 2 {
		t.Fatalf("after StopAll: b %v; want unchanged", b)
	}
	stopB()

	var mu sync.Mutex
	stopped := false
	var wg sync.WaitGroup
	stop := d.Add(func(Notice) {
		mu.Lock()
		defer mu.Unlock()
		if stopped {
			t.Error("fn called after stop returned")
		}
	})
	wg.Go(func() {
		for range 1000 {
			d.Call(Notice{Key: "k"})
		}
	})
	stop()
	mu.Lock()
	stopped = true
	mu.Unlock()
	wg.Wait()
}
