package flight

import (
	"context"
	"errors"
	"fmt"
	"math"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/google/go-cmp/cmp"
)

type result struct {
	v      string
	err    error
	shared bool
}

// goDo calls g.Do on a new goroutine; its result arrives on the channel.
func goDo(g *Group[string, string], ctx context.Context, key string, fn func(context.Context) (string, error)) <-chan result {
	ch := make(chan result, 1)
	go func() {
		v, err, shared := g.Do(ctx, key, fn)
		ch <- result{v, err, shared}
	}()
	return ch
}

// returned reports the result of a goDo if that Do has returned.
func returned(ch <-chan result) (result, bool) {
	select {
	case r := <-ch:
		return r, true
	default:
		return result{}, false
	}
}

// gated returns a function that counts its calls, blocks until gate is
// closed and then returns v and err.
func gated(calls *atomic.Int32, gate <-chan struct{}, v string, err error) func(context.Context) (string, error) {
	return func(context.Context) (string, error) {
		calls.Add(1)
		<-gate
		return v, err
	}
}

// newGate returns a channel for fn to wait on and the function that opens
// it. A test that stops early opens it on the way out, so that no goroutine
// is left blocked.
func newGate(t *testing.T) (<-chan struct{}, func()) {
	ch := make(chan struct{})
	var once sync.Once
	open := func() { once.Do(func() { close(ch) }) }
	t.Cleanup(open)
	return ch, open
}

// cancellable returns a context that can end and its cancel function.
func cancellable(t *testing.T) (context.Context, context.CancelCauseFunc) {
	ctx, cancel := context.WithCancelCause(t.Context())
	t.Cleanup(func() { cancel(nil) })
	return ctx, cancel
}

var contextKinds = []string{"background", "cancel"}

func ctxOf(t *testing.T, kind string) context.Context {
	if kind == "background" {
		return context.Background()
	}
	ctx, _ := cancellable(t)
	return ctx
}

// One execution per key at a time, and every caller of a
// flight gets its value or its error, whichever ctx the first caller has.
func TestDoOneExecutionSharedResult(t *testing.T) {
	errBoom := errors.New("boom")
	for _, leader := range contextKinds {
		for _, tc := range []struct {
			name string
			v    string
			err  error
		}{{"value", "v1", nil}, {"error", "", errBoom}} {
			t.Run("leader="+leader+"/"+tc.name, func(t *testing.T) {
				synctest.Test(t, func(t *testing.T) {
					var g Group[string, string]
					var calls atomic.Int32
					gate, open := newGate(t)
					fn := gated(&calls, gate, tc.v, tc.err)
					chans := []<-chan result{goDo(&g, ctxOf(t, leader), "k", fn)}
					synctest.Wait()
					for i := range 8 {
						chans = append(chans, goDo(&g, ctxOf(t, contextKinds[i%2]), "k", fn))
					}
					synctest.Wait()
					if got := g.Waiters("k"); got != len(chans) {
						t.Fatalf("Waiters = %d, want %d", got, len(chans))
					}
					open()
					for i, ch := range chans {
						r := <-ch
						if r.v != tc.v || r.err != tc.err || !r.shared {
							t.Errorf("caller %d got %+v, want v=%q err=%v shared", i, r, tc.v, tc.err)
						}
					}
					if n := calls.Load(); n != 1 {
						t.Errorf("fn ran %d times, want 1", n)
					}
				})
			})
		}
	}
}

func TestDoAloneIsNotShared(t *testing.T) {
	for _, kind := range contextKinds {
		var g Group[string, string]
		v, err, shared := g.Do(ctxOf(t, kind), "k", func(context.Context) (string, error) { return "v", nil })
		if v != "v" || err != nil || shared {
			t.Errorf("ctx=%s: Do = %q, %v, %v; want v, nil, false", kind, v, err, shared)
		}
	}
}

// A caller's ctx bounds its own wait only.
func TestDoContextBoundsOnlyOwnWait(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var g Group[string, string]
		var calls atomic.Int32
		gate, open := newGate(t)
		var fnCtx context.Context
		fn := func(ctx context.Context) (string, error) {
			fnCtx = ctx
			return gated(&calls, gate, "v", nil)(ctx)
		}
		ctxA, cancelA := cancellable(t)
		ctxB, cancelB := cancellable(t)
		ctxC, cancelC := context.WithTimeout(t.Context(), time.Second)
		defer cancelC()
		a := goDo(&g, ctxA, "k", fn) // starts the flight
		synctest.Wait()
		b := goDo(&g, ctxB, "k", fn)
		c := goDo(&g, ctxC, "k", fn)
		d := goDo(&g, context.Background(), "k", fn)
		synctest.Wait()

		errCause := errors.New("client went away")
		cancelB(errCause)
		synctest.Wait()
		r, ok := returned(b)
		if !ok {
			t.Fatal("joiner whose ctx was cancelled did not return")
		}
		if !errors.Is(r.err, context.Canceled) || !errors.Is(r.err, errCause) || !strings.HasPrefix(r.err.Error(), "flight: ") {
			t.Errorf("joiner got err %v, want flight: error wrapping context.Canceled and the cause", r.err)
		}

		cancelA(nil) // the caller that started the flight leaves too
		synctest.Wait()
		if r, ok := returned(a); !ok || !errors.Is(r.err, context.Canceled) {
			t.Fatalf("first caller: returned=%v, %+v; want context.Canceled", ok, r)
		}
		if err := fnCtx.Err(); err != nil {
			t.Errorf("fn's ctx ended with %v when callers left", err)
		}

		<-ctxC.Done() // the fake clock reaches ctxC's deadline
		synctest.Wait()
		if r, ok := returned(c); !ok || !errors.Is(r.err, context.DeadlineExceeded) {
			t.Fatalf("timed-out joiner: returned=%v, %+v; want context.DeadlineExceeded", ok, r)
		}
		if _, ok := returned(d); ok {
			t.Fatal("a caller whose ctx did not end returned before fn did")
		}
		if got := g.Waiters("k"); got != 1 {
			t.Errorf("Waiters = %d, want 1", got)
		}
		open()
		if r := <-d; r.v != "v" || r.err != nil || !r.shared {
			t.Errorf("remaining caller got %+v, want v, nil, shared", r)
		}
		if n := calls.Load(); n != 1 {
			t.Errorf("fn ran %d times, want 1", n)
		}
	})
}

func TestDoDoneContextReturnsAtOnce(t *testing.T) {
	var g Group[string, string]
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	called := false
	_, err, _ := g.Do(ctx, "k", func(context.Context) (string, error) { called = true; return "", nil })
	if !errors.Is(err, context.Canceled) || called || g.InFlight() != 0 {
		t.Errorf("Do with a done ctx: err=%v called=%v InFlight=%d; want context.Canceled, false, 0", err, called, g.InFlight())
	}
}

type ctxKey struct{}

// fn's ctx keeps the first caller's values, not its
// cancellation, and ends at the flight's timeout.
func TestFlightContext(t *testing.T) {
	for _, tc := range []struct {
		name    string
		timeout time.Duration
		want    time.Duration
		cancel  bool // the first caller's ctx can end (and does)
		useDone bool // fn waits on Done rather than polling Err
	}{
		{"default/background/done", 0, time.Minute, false, true},
		{"default/cancel/done", 0, time.Minute, true, true},
		{"5s/background/done", 5 * time.Second, 5 * time.Second, false, true},
		{"5s/cancel/done", 5 * time.Second, 5 * time.Second, true, true},
		{"5s/background/err", 5 * time.Second, 5 * time.Second, false, false},
		{"5s/cancel/err", 5 * time.Second, 5 * time.Second, true, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				g := Group[string, string]{Timeout: tc.timeout}
				ctx := context.WithValue(context.Background(), ctxKey{}, "trace-1")
				var cancel context.CancelCauseFunc
				if tc.cancel {
					ctx, cancel = context.WithCancelCause(ctx)
				}
				start := time.Now()
				entered := make(chan struct{})
				var (
					fnCtx            context.Context
					value            any
					deadline         time.Time
					hasDeadline      bool
					errAfterCancel   error
					causeAfterCancel error
					ended            time.Duration
					endErr           error
					endCause         error
					childErr         error
				)
				fnDone := make(chan struct{})
				fn := func(ctx context.Context) (string, error) {
					defer close(fnDone)
					fnCtx = ctx
					value = ctx.Value(ctxKey{})
					deadline, hasDeadline = ctx.Deadline()
					close(entered)
					if cancel != nil {
						cancel(errors.New("caller gone"))
						errAfterCancel = ctx.Err()
						causeAfterCancel = context.Cause(ctx)
					}
					var child context.Context
					if tc.useDone {
						// A child asks for Done, which arms the timer.
						var stop context.CancelFunc
						child, stop = context.WithCancel(ctx)
						defer stop()
						<-ctx.Done()
					} else {
						// Err alone must see the deadline: no Done, no timer.
						<-time.After(tc.want - time.Nanosecond)
						if err := ctx.Err(); err != nil {
							return "", fmt.Errorf("ctx ended early: %w", err)
						}
						<-time.After(time.Nanosecond)
					}
					ended = time.Since(start)
					endErr = ctx.Err()
					endCause = context.Cause(ctx)
					if child == nil {
						var stop context.CancelFunc
						child, stop = context.WithCancel(ctx)
						defer stop()
					}
					<-child.Done()
					childErr = child.Err()
					return "late", ctx.Err()
				}
				ch := goDo(&g, ctx, "k", fn)
				<-entered
				r := <-ch
				<-fnDone
				if tc.cancel {
					if !errors.Is(r.err, context.Canceled) {
						t.Errorf("first caller got %+v, want its own cancellation", r)
					}
				} else if r.err != context.DeadlineExceeded {
					t.Errorf("first caller got %+v, want fn's DeadlineExceeded", r)
				}
				synctest.Wait()
				if value != "trace-1" {
					t.Errorf("fn's ctx value = %v, want trace-1", value)
				}
				if !hasDeadline || !deadline.Equal(start.Add(tc.want)) {
					t.Errorf("fn's ctx deadline = %v, %v; want %v", deadline, hasDeadline, start.Add(tc.want))
				}
				if errAfterCancel != nil || causeAfterCancel != nil {
					t.Errorf("fn's ctx after the caller's cancel: Err=%v Cause=%v; want nil, nil", errAfterCancel, causeAfterCancel)
				}
				if ended != tc.want || endErr != context.DeadlineExceeded || endCause != context.DeadlineExceeded {
					t.Errorf("fn's ctx ended after %v with %v (cause %v); want %v, DeadlineExceeded", ended, endErr, endCause, tc.want)
				}
				if childErr != context.DeadlineExceeded {
					t.Errorf("child of fn's ctx ended with %v, want DeadlineExceeded", childErr)
				}
				if g.InFlight() != 0 || g.Waiters("k") != 0 {
					t.Errorf("after the flight: InFlight=%d Waiters=%d; want 0, 0", g.InFlight(), g.Waiters("k"))
				}
				select {
				case <-fnCtx.Done():
				default:
					t.Error("fn's ctx Done is open after the flight")
				}
			})
		})
	}
}

func TestFlightContextEndsWhenFnReturns(t *testing.T) {
	for _, kind := range contextKinds {
		var g Group[string, string]
		var fnCtx context.Context
		var during error
		g.Do(ctxOf(t, kind), "k", func(ctx context.Context) (string, error) {
			fnCtx = ctx
			during = ctx.Err()
			return "", nil
		})
		if during != nil || fnCtx.Err() != context.Canceled {
			t.Errorf("ctx=%s: fn's ctx Err during fn = %v, after = %v; want nil, Canceled", kind, during, fnCtx.Err())
		}
		select {
		case <-fnCtx.Done():
		default:
			t.Errorf("ctx=%s: Done still open after fn returned", kind)
		}
	}
}

// CancelWhenAbandoned cancels fn's ctx once every caller has
// left; by default fn runs on and later callers join it.
func TestCancelWhenAbandoned(t *testing.T) {
	for _, policy := range []bool{false, true} {
		t.Run(fmt.Sprintf("CancelWhenAbandoned=%v", policy), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				g := Group[string, string]{CancelWhenAbandoned: policy}
				var calls atomic.Int32
				gate, open := newGate(t)
				var fnErr atomic.Value
				fn := func(ctx context.Context) (string, error) {
					n := calls.Add(1)
					select {
					case <-ctx.Done():
						fnErr.Store(ctx.Err())
						<-gate // wind down slowly, as a real load may
						return "", ctx.Err()
					case <-gate:
						return fmt.Sprintf("v%d", n), nil
					}
				}
				ctxA, cancelA := cancellable(t)
				ctxB, cancelB := cancellable(t)
				a := goDo(&g, ctxA, "k", fn)
				synctest.Wait()
				b := goDo(&g, ctxB, "k", fn)
				synctest.Wait()
				cancelA(nil)
				synctest.Wait()
				if fnErr.Load() != nil {
					t.Fatal("fn's ctx ended while a caller still waited")
				}
				cancelB(nil)
				synctest.Wait()
				<-a
				<-b
				if policy {
					if err := fnErr.Load(); err != context.Canceled {
						t.Fatalf("fn's ctx ended with %v, want context.Canceled", err)
					}
					if g.Waiters("k") != 0 || g.InFlight() != 1 {
						t.Errorf("abandoned flight: Waiters=%d InFlight=%d; want 0, 1", g.Waiters("k"), g.InFlight())
					}
				} else if err := fnErr.Load(); err != nil {
					t.Fatalf("fn's ctx ended with %v although the default lets fn finish", err)
				}
				// A caller arriving now starts a new flight if the old one was
				// cancelled, and joins the old one if it runs on.
				c := goDo(&g, context.Background(), "k", fn)
				synctest.Wait()
				open()
				r := <-c
				wantCalls, want := int32(1), result{"v1", nil, true}
				if policy {
					wantCalls, want = 2, result{"v2", nil, false}
				}
				if r != want || calls.Load() != wantCalls {
					t.Errorf("later caller got %+v after %d calls, want %+v after %d", r, calls.Load(), want, wantCalls)
				}
			})
		})
	}
}

var errPanicValue = errors.New("panic value")

// A panic reaches every caller as a *PanicError, the process
// goes on and the key is free at once; runtime.Goexit does not hang callers.
func TestPanic(t *testing.T) {
	for _, leader := range contextKinds {
		t.Run("leader="+leader, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				var g Group[string, string]
				gate, open := newGate(t)
				fn := func(context.Context) (string, error) {
					<-gate
					panic(errPanicValue)
				}
				chans := []<-chan result{goDo(&g, ctxOf(t, leader), "k", fn)}
				synctest.Wait()
				chans = append(chans, goDo(&g, ctxOf(t, "background"), "k", fn), goDo(&g, ctxOf(t, "cancel"), "k", fn))
				synctest.Wait()
				open()
				for i, ch := range chans {
					r := <-ch
					var pe *PanicError
					if !errors.As(r.err, &pe) {
						t.Fatalf("caller %d got %+v, want a *PanicError", i, r)
					}
					if pe.Value != errPanicValue || !errors.Is(r.err, errPanicValue) {
						t.Errorf("caller %d: PanicError.Value = %v, want %v (and errors.Is)", i, pe.Value, errPanicValue)
					}
					if !strings.Contains(string(pe.Stack), "TestPanic") || !strings.HasPrefix(pe.Error(), "flight: ") {
						t.Errorf("caller %d: Error() = %q, stack without the panicking function:\n%s", i, pe.Error(), pe.Stack)
					}
				}
				v, err, shared := g.Do(context.Background(), "k", func(context.Context) (string, error) { return "again", nil })
				if v != "again" || err != nil || shared || g.InFlight() != 0 {
					t.Errorf("after the panic Do = %q, %v, %v; InFlight=%d; want a fresh flight", v, err, shared, g.InFlight())
				}
			})
		})
	}
}

func TestGoexit(t *testing.T) {
	for _, leader := range contextKinds {
		t.Run("leader="+leader, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				var g Group[string, string]
				gate, open := newGate(t)
				fn := func(context.Context) (string, error) {
					<-gate
					runtime.Goexit()
					return "unreachable", nil
				}
				leaderDone := make(chan result, 1)
				leaderExited := make(chan struct{})
				go func() {
					defer close(leaderExited)
					v, err, shared := g.Do(ctxOf(t, leader), "k", fn)
					leaderDone <- result{v, err, shared}
				}()
				synctest.Wait()
				j1 := goDo(&g, context.Background(), "k", fn)
				j2 := goDo(&g, ctxOf(t, "cancel"), "k", fn)
				synctest.Wait()
				open()
				for i, ch := range []<-chan result{j1, j2} {
					if r := <-ch; r.err != ErrGoexit || r.v != "" {
						t.Errorf("joiner %d got %+v, want ErrGoexit", i, r)
					}
				}
				<-leaderExited
				r, ok := returned(leaderDone)
				if leader == "background" && ok {
					t.Errorf("first caller running fn itself returned %+v; want its goroutine to exit as fn asked", r)
				}
				if leader == "cancel" && (!ok || r.err != ErrGoexit) {
					t.Errorf("first caller got %+v (returned %v), want ErrGoexit", r, ok)
				}
				if g.InFlight() != 0 || g.Waiters("k") != 0 {
					t.Errorf("InFlight=%d Waiters=%d after Goexit, want 0, 0", g.InFlight(), g.Waiters("k"))
				}
			})
		})
	}
}

// The key is free before any caller sees the result, so a
// caller that saw an error and asks again starts a fresh flight.
func TestResultVisibleOnlyAfterKeyFree(t *testing.T) {
	errOld := errors.New("old error")
	for round := range 300 {
		var g Group[string, string]
		gate, open := newGate(t)
		var calls atomic.Int32
		old := gated(&calls, gate, "", errOld)
		fresh := func(context.Context) (string, error) { return "fresh", nil }
		joined := make(chan struct{}, 8)
		g.OnJoin = func(string) { joined <- struct{}{} }
		leader := goDo(&g, context.Background(), "k", old)
		for calls.Load() == 0 {
			runtime.Gosched()
		}
		var wg sync.WaitGroup
		var bad atomic.Int32
		for i := range 4 {
			ctx := ctxOf(t, contextKinds[i%2])
			wg.Go(func() {
				_, err, _ := g.Do(ctx, "k", old)
				if err != errOld {
					t.Errorf("round %d: joiner got %v, want the old error", round, err)
				}
				// The timeout only turns a wait on a finished flight into a
				// failure instead of a hang.
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				defer cancel()
				if v, err, _ := g.Do(ctx, "k", fresh); v != "fresh" || err != nil {
					bad.Add(1)
				}
			})
		}
		for range 4 {
			<-joined
		}
		open()
		wg.Wait()
		<-leader
		if n := bad.Load(); n != 0 {
			t.Fatalf("round %d: %d callers that had seen the result and asked again got the old flight's result", round, n)
		}
	}
}

// The same, probed from inside: while the group's lock is held the
// finished flight cannot leave the map, so no caller may see its result.
func TestNoResultWhileKeyHeld(t *testing.T) {
	for _, leader := range contextKinds {
		t.Run("leader="+leader, func(t *testing.T) {
			joined := make(chan struct{}, 2)
			g := Group[string, string]{OnJoin: func(string) { joined <- struct{}{} }}
			gate, open := newGate(t)
			fnReturned := make(chan struct{})
			fn := func(context.Context) (string, error) {
				defer close(fnReturned)
				<-gate
				return "v", nil
			}
			chans := []<-chan result{goDo(&g, ctxOf(t, leader), "k", fn)}
			for g.InFlight() == 0 {
				runtime.Gosched()
			}
			chans = append(chans, goDo(&g, context.Background(), "k", fn), goDo(&g, ctxOf(t, "cancel"), "k", fn))
			<-joined
			<-joined

			g.mu.Lock()
			open()
			<-fnReturned
			for range 1000 {
				for i, ch := range chans {
					if r, ok := returned(ch); ok {
						g.mu.Unlock()
						t.Fatalf("caller %d got %+v while the finished flight could not leave the map", i, r)
					}
				}
				runtime.Gosched()
			}
			g.mu.Unlock()
			for _, ch := range chans {
				if r := <-ch; r.v != "v" {
					t.Errorf("got %+v, want v", r)
				}
			}
		})
	}
}

// Forget makes later callers start a new flight; callers of the
// old one keep it, and its end leaves the new flight in place.
func TestForget(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var g Group[string, string]
		var calls atomic.Int32
		gate1, open1 := newGate(t)
		gate2, open2 := newGate(t)
		fn1 := gated(&calls, gate1, "v1", nil)
		fn2 := gated(&calls, gate2, "v2", nil)
		l1 := goDo(&g, context.Background(), "k", fn1)
		synctest.Wait()
		j1 := goDo(&g, ctxOf(t, "cancel"), "k", fn1)
		synctest.Wait()
		g.Forget("k")
		g.Forget("missing")
		if g.Waiters("k") != 0 {
			t.Fatalf("Waiters after Forget = %d, want 0", g.Waiters("k"))
		}
		l2 := goDo(&g, context.Background(), "k", fn2)
		synctest.Wait()
		if calls.Load() != 2 || g.InFlight() != 2 || g.Waiters("k") != 1 {
			t.Fatalf("after Forget: calls=%d InFlight=%d Waiters=%d; want 2, 2, 1", calls.Load(), g.InFlight(), g.Waiters("k"))
		}
		open1()
		for _, ch := range []<-chan result{l1, j1} {
			if r := <-ch; r.v != "v1" || r.err != nil || !r.shared {
				t.Errorf("caller of the forgotten flight got %+v, want v1", r)
			}
		}
		synctest.Wait()
		j2 := goDo(&g, context.Background(), "k", fn2)
		synctest.Wait()
		if calls.Load() != 2 || g.Waiters("k") != 2 {
			t.Fatalf("the forgotten flight's end removed the new one: calls=%d Waiters=%d; want 2, 2", calls.Load(), g.Waiters("k"))
		}
		open2()
		for _, ch := range []<-chan result{l2, j2} {
			if r := <-ch; r.v != "v2" || r.err != nil || !r.shared {
				t.Errorf("caller of the new flight got %+v, want v2 shared", r)
			}
		}
	})
}

// ForgetAll makes the next caller of every key start a new flight; the
// forgotten flights still reach their callers.
func TestForgetAll(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var g Group[string, string]
		var calls atomic.Int32
		gate, open := newGate(t)
		a := goDo(&g, context.Background(), "a", gated(&calls, gate, "old a", nil))
		b := goDo(&g, context.Background(), "b", gated(&calls, gate, "old b", nil))
		synctest.Wait()
		g.ForgetAll()
		if g.Waiters("a") != 0 || g.Waiters("b") != 0 || g.InFlight() != 2 {
			t.Fatalf("after ForgetAll: Waiters %d, %d, InFlight %d; want 0, 0, 2", g.Waiters("a"), g.Waiters("b"), g.InFlight())
		}
		newA := goDo(&g, context.Background(), "a", gated(&calls, gate, "new a", nil))
		synctest.Wait()
		if calls.Load() != 3 {
			t.Fatalf("%d calls, want 3: a caller after ForgetAll starts a new flight", calls.Load())
		}
		open()
		for ch, want := range map[<-chan result]string{a: "old a", b: "old b", newA: "new a"} {
			if r := <-ch; r.v != want || r.err != nil {
				t.Errorf("got %+v, want %q", r, want)
			}
		}
	})
}

// InFlight, Waiters, OnStart and OnJoin report flights and their callers.
func TestCountersAndHooks(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var mu sync.Mutex
		var events []string
		g := Group[string, string]{
			OnStart: func(key string) { mu.Lock(); events = append(events, "start "+key); mu.Unlock() },
			OnJoin:  func(key string) { mu.Lock(); events = append(events, "join "+key); mu.Unlock() },
		}
		var calls atomic.Int32
		gate, open := newGate(t)
		fn := gated(&calls, gate, "v", nil)
		if g.InFlight() != 0 || g.Waiters("a") != 0 {
			t.Fatal("zero Group reports flights")
		}
		var chans []<-chan result
		chans = append(chans, goDo(&g, context.Background(), "a", fn))
		synctest.Wait()
		chans = append(chans, goDo(&g, context.Background(), "a", fn))
		synctest.Wait()
		ctxLeave, leave := cancellable(t)
		leaver := goDo(&g, ctxLeave, "a", fn)
		synctest.Wait()
		chans = append(chans, goDo(&g, ctxOf(t, "cancel"), "b", fn))
		synctest.Wait()
		if got := [4]int{g.InFlight(), g.Waiters("a"), g.Waiters("b"), g.Waiters("c")}; got != [4]int{2, 3, 1, 0} {
			t.Errorf("InFlight, Waiters(a), Waiters(b), Waiters(c) = %v, want [2 3 1 0]", got)
		}
		leave(nil)
		<-leaver
		if got := g.Waiters("a"); got != 2 {
			t.Errorf("Waiters(a) after one caller left = %d, want 2", got)
		}
		g.Forget("a")
		if g.InFlight() != 2 || g.Waiters("a") != 0 {
			t.Errorf("after Forget: InFlight=%d Waiters(a)=%d; want 2, 0", g.InFlight(), g.Waiters("a"))
		}
		open()
		for _, ch := range chans {
			<-ch
		}
		if g.InFlight() != 0 || g.Waiters("b") != 0 {
			t.Errorf("after all flights: InFlight=%d Waiters(b)=%d; want 0, 0", g.InFlight(), g.Waiters("b"))
		}
		want := []string{"start a", "join a", "join a", "start b"}
		if diff := cmp.Diff(want, events); diff != "" {
			t.Errorf("hook calls (-want +got):\n%s", diff)
		}
	})
}

func TestBadInput(t *testing.T) {
	fn := func(context.Context) (string, error) {
		t.Error("fn ran on bad input")
		return "", nil
	}
	started := 0
	g := Group[string, string]{OnStart: func(string) { started++ }}
	neg := Group[string, string]{Timeout: -time.Second, OnStart: g.OnStart}
	for _, tc := range []struct {
		name string
		do   func() error
	}{
		//lint:ignore SA1012 a nil Context is the bad input under test
		{"nil ctx", func() error { _, err, _ := g.Do(nil, "k", fn); return err }},
		{"nil fn", func() error { _, err, _ := g.Do(context.Background(), "k", nil); return err }},
		{"negative Timeout", func() error { _, err, _ := neg.Do(context.Background(), "k", fn); return err }},
	} {
		err := tc.do()
		var pe *PanicError
		if err == nil || !strings.HasPrefix(err.Error(), "flight: ") || errors.As(err, &pe) {
			t.Errorf("%s: err = %v, want a flight: error that is no panic", tc.name, err)
		}
	}
	if started != 0 {
		t.Errorf("bad input started %d flights", started)
	}
}

// The longest Timeout saturates: the function's deadline lies far in the
// future, never wrapped into the past, and its context has not ended.
func TestLongestTimeout(t *testing.T) {
	g := Group[string, int]{Timeout: math.MaxInt64}
	for _, ctx := range []context.Context{context.Background(), t.Context()} {
		_, err, _ := g.Do(ctx, "k", func(fctx context.Context) (int, error) {
			d, ok := fctx.Deadline()
			if !ok || !d.After(time.Now().Add(290*365*24*time.Hour)) {
				return 0, fmt.Errorf("deadline %v, want about 292 years from now", d)
			}
			if err := fctx.Err(); err != nil {
				return 0, fmt.Errorf("context ended at once: %w", err)
			}
			select {
			case <-fctx.Done():
				return 0, errors.New("Done closed at once")
			default:
			}
			return 1, nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
}

// TryDo starts a flight only when none of its key runs: otherwise it leaves
// at once without joining, and the running flight is not disturbed. A flight
// it started is joined by Do.
func TestTryDo(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var g Group[string, string]
		gate, open := newGate(t)
		var calls atomic.Int32
		slow := func(context.Context) (string, error) {
			calls.Add(1)
			<-gate
			return "first", nil
		}
		first := goDo(&g, t.Context(), "k", slow)
		synctest.Wait()
		v, err, started := g.TryDo(t.Context(), "k", func(context.Context) (string, error) {
			t.Error("TryDo ran its function while a flight of its key was running")
			return "", nil
		})
		if started || err != nil || v != "" {
			t.Errorf("TryDo during a flight = %q, %v, started %v; want \"\", nil, false", v, err, started)
		}
		if n := g.Waiters("k"); n != 1 {
			t.Errorf("Waiters = %d after TryDo left, want 1", n)
		}
		open()
		if r := <-first; r.v != "first" || r.err != nil {
			t.Fatalf("Do = %+v, want first", r)
		}

		gate2, open2 := newGate(t)
		tried := make(chan result, 1)
		go func() {
			v, err, started := g.TryDo(t.Context(), "k", func(context.Context) (string, error) {
				<-gate2
				return "tried", nil
			})
			tried <- result{v, err, started}
		}()
		synctest.Wait()
		joined := goDo(&g, t.Context(), "k", slow)
		synctest.Wait()
		open2()
		if r := <-tried; r.v != "tried" || r.err != nil || !r.shared {
			t.Errorf("TryDo with its key free = %+v, want tried, nil, started", r)
		}
		if r := <-joined; r.v != "tried" || r.err != nil || !r.shared {
			t.Errorf("Do during TryDo's flight = %+v, want its shared result", r)
		}
		if n := calls.Load(); n != 1 {
			t.Errorf("slow ran %d times, want 1", n)
		}
	})
}

// DoUnshared runs its function even while a flight of its key runs, is
// joined by nobody, is not counted by InFlight, and hands a panic or a
// Goexit back as an error, as Do does.
func TestDoUnshared(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var g Group[string, string]
		gate, open := newGate(t)
		first := goDo(&g, t.Context(), "k", func(context.Context) (string, error) {
			<-gate
			return "shared", nil
		})
		synctest.Wait()
		gate2, open2 := newGate(t)
		alone := make(chan result, 1)
		go func() {
			v, err := g.DoUnshared(t.Context(), "k", func(context.Context) (string, error) {
				<-gate2
				return "alone", nil
			})
			alone <- result{v: v, err: err}
		}()
		synctest.Wait()
		if n, w := g.InFlight(), g.Waiters("k"); n != 1 || w != 1 {
			t.Errorf("InFlight %d, Waiters %d beside an unshared call; want 1, 1", n, w)
		}
		joined := goDo(&g, t.Context(), "k", func(context.Context) (string, error) { return "", errors.New("ran") })
		synctest.Wait()
		open()
		for _, ch := range []<-chan result{first, joined} {
			if r := <-ch; r.v != "shared" {
				t.Errorf("Do = %+v, want the shared flight's result", r)
			}
		}
		open2()
		if r := <-alone; r.v != "alone" || r.err != nil {
			t.Errorf("DoUnshared = %+v, want alone, nil", r)
		}

		_, err := g.DoUnshared(t.Context(), "k", func(context.Context) (string, error) { panic(errPanicValue) })
		if !errors.Is(err, errPanicValue) {
			t.Errorf("DoUnshared of a panicking function: %v, want the panic as an error", err)
		}
		_, err = g.DoUnshared(t.Context(), "k", func(context.Context) (string, error) {
			runtime.Goexit()
			return "", nil
		})
		if err != ErrGoexit {
			t.Errorf("DoUnshared of a function calling Goexit: %v, want ErrGoexit", err)
		}
		if g.InFlight() != 0 {
			t.Errorf("InFlight = %d at the end, want 0", g.InFlight())
		}
	})
}
