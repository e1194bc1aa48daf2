package notify

import (
	"sync"
	"sync/atomic"
	"testing"
	"time"
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

// TestDirectConcurrentCalls checks that Calls from two goroutines run one
// subscriber's fn at the same time: the first call is held inside fn until
// the second has entered it too, which never happens when the calls of one
// subscriber are serialised (the test then fails after 10s). It also
// checks that no fn runs once stop, called while both are held, returns.
func TestDirectConcurrentCalls(t *testing.T) {
	var d Direct
	var running atomic.Int32
	entered := make(chan string, 2)
	release := make(chan struct{})
	stop := d.Add(func(n Notice) {
		running.Add(1)
		defer running.Add(-1)
		entered <- n.Key
		<-release
	})
	var wg sync.WaitGroup
	wg.Go(func() { d.Call(Notice{Key: "1"}) })
	wg.Go(func() { d.Call(Notice{Key: "2"}) })
	got := map[string]bool{}
	for range 2 {
		select {
		case k := <-entered:
			got[k] = true
		case <-time.After(10 * time.Second):
			close(release)
			t.Fatalf("fn entered with %v only: the calls were serialised", got)
		}
	}
	stopped := make(chan int32)
	go func() {
		stop()
		stopped <- running.Load()
	}()
	close(release)
	if n := <-stopped; n != 0 {
		t.Errorf("stop returned with %d calls of fn running, want 0", n)
	}
	wg.Wait()
}
