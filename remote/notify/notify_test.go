package notify

import (
	"fmt"
	"testing"
	"testing/synctest"

	"github.com/google/go-cmp/cmp"
)

// sink is a subscriber fn that records what it is handed and, for the keys
// in hold, blocks until release is closed.
type sink struct {
	got     chan Notice
	hold    map[string]bool
	release chan struct{}
}

func newSink(hold ...string) *sink {
	s := &sink{got: make(chan Notice, 1<<12), hold: map[string]bool{}, release: make(chan struct{})}
	for _, k := range hold {
		s.hold[k] = true
	}
	return s
}

func (s *sink) fn(n Notice) {
	s.got <- n
	if s.hold[n.Key] {
		<-s.release
	}
}

// drain returns what fn has been handed since the last drain.
func (s *sink) drain() []Notice {
	var out []Notice
	for {
		select {
		case n := <-s.got:
			out = append(out, n)
		default:
			return out
		}
	}
}

// fenced returns a notice for each key, fenced by its position plus one.
func fenced(keys ...string) []Notice {
	ns := make([]Notice, len(keys))
	for i, k := range keys {
		ns[i] = Notice{Key: k, Fence: uint64(i + 1)}
	}
	return ns
}

// pushAll pushes ns in order and returns them.
func pushAll(s *Subscription, ns []Notice) []Notice {
	for _, n := range ns {
		s.Push(n)
	}
	return ns
}

func keys(prefix string, n int) []string {
	ks := make([]string, n)
	for i := range ks {
		ks[i] = fmt.Sprint(prefix, i)
	}
	return ks
}

// TestOrder checks that fn gets every notice, the zero one included, once
// and in push order, whether pushed before fn runs or while it does.
func TestOrder(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		k := newSink()
		s := Start(k.fn, 8)
		defer s.Stop()

		want := pushAll(s, []Notice{{Key: "a", Fence: 1}, {}, {Key: "", Fence: 2}, {Key: "b", Fence: 3}})
		synctest.Wait()
		want = append(want, pushAll(s, fenced(keys("k", 8)...))...)
		synctest.Wait()
		if diff := cmp.Diff(want, k.drain()); diff != "" {
			t.Fatalf("notices (-want +got):\n%s", diff)
		}
	})
}

// TestOverflow checks that a queue filled to its bound keeps every notice,
// that one more push replaces them all with a single zero Notice which
// absorbs later pushes, and that the queue works normally once fn has taken
// it.
func TestOverflow(t *testing.T) {
	for _, tc := range []struct {
		name   string
		queue  int
		pushes int
		want   []Notice // after the held "first"
	}{
		{"full", 4, 4, fenced(keys("k", 4)...)},
		{"one over", 4, 5, []Notice{{}}},
		{"far over", 4, 100, []Notice{{}}},
		{"zero queue holds one", 0, 1, []Notice{{Key: "k0", Fence: 1}}},
		{"zero queue overflows at two", 0, 2, []Notice{{}}},
		{"negative queue holds one", -3, 1, []Notice{{Key: "k0", Fence: 1}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				k := newSink("first")
				s := Start(k.fn, tc.queue)
				defer s.Stop()

				s.Push(Notice{Key: "first", Fence: 7})
				synctest.Wait()
				// fn is blocked on "first"; a Push that waited for it would
				// deadlock the bubble here.
				pushAll(s, fenced(keys("k", tc.pushes)...))
				close(k.release)
				synctest.Wait()
				s.Push(Notice{Key: "after", Fence: 9})
				synctest.Wait()

				want := append([]Notice{{Key: "first", Fence: 7}}, tc.want...)
				want = append(want, Notice{Key: "after", Fence: 9})
				if diff := cmp.Diff(want, k.drain()); diff != "" {
					t.Fatalf("notices (-want +got):\n%s", diff)
				}
			})
		})
	}
}

// TestStop checks that Stop waits for a running fn, drops what is still
// queued, may be called again and concurrently, and that pushes after it
// reach no one.
func TestStop(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		k := newSink("a")
		s := Start(k.fn, 8)
		pushAll(s, fenced("a", "b")) // b is queued behind a, dropped by Stop
		synctest.Wait()

		stopped := make(chan struct{})
		for range 2 {
			go func() {
				s.Stop()
				stopped <- struct{}{}
			}()
		}
		synctest.Wait()
		select {
		case <-stopped:
			t.Fatal("Stop returned while fn was still running")
		default:
		}
		close(k.release)
		synctest.Wait()
		for i := range 2 {
			select {
			case <-stopped:
			default:
				t.Fatalf("Stop call %d did not return after fn did", i)
			}
		}

		s.Push(Notice{Key: "c", Fence: 3})
		s.Stop() // returns at once
		synctest.Wait()
		if diff := cmp.Diff([]Notice{{Key: "a", Fence: 1}}, k.drain()); diff != "" {
			t.Fatalf("notices (-want +got):\n%s", diff)
		}
	})
}

// TestStopIdle checks that Stop ends a subscription that was never pushed
// to: synctest fails the test if its goroutine outlives the bubble.
func TestStopIdle(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		k := newSink()
		s := Start(k.fn, 1)
		s.Stop()
		if got := k.drain(); len(got) != 0 {
			t.Fatalf("fn was called with %v", got)
		}
	})
}

// TestPushAll checks that the notices of one PushAll take one place in the
// queue, however many they are, and reach fn in order between the pushes
// before and after them; and that the queue overflows by messages.
func TestPushAll(t *testing.T) {
	for _, tc := range []struct {
		name     string
		queue    int
		messages int // PushAll calls of 1,000 notices each, while fn is held
		overflow bool
	}{
		{"one batch", 1, 1, false},
		{"full", 3, 3, false},
		{"one over", 3, 4, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				k := newSink("first")
				s := Start(k.fn, tc.queue)
				defer s.Stop()

				s.Push(Notice{Key: "first", Fence: 7})
				synctest.Wait()
				var want []Notice
				for m := range tc.messages {
					ns := fenced(keys(fmt.Sprint("m", m, "k"), 1000)...)
					s.PushAll(ns)
					want = append(want, ns...)
				}
				s.PushAll(nil) // nothing: not a message
				if tc.overflow {
					want = []Notice{{}}
				}
				close(k.release)
				synctest.Wait()
				s.Push(Notice{Key: "after", Fence: 9})
				synctest.Wait()

				want = append([]Notice{{Key: "first", Fence: 7}}, want...)
				want = append(want, Notice{Key: "after", Fence: 9})
				got := k.drain()
				if diff := cmp.Diff(want, got); diff != "" {
					t.Fatalf("notices (-want +got):\n%s", diff)
				}
			})
		})
	}
}
