package flight

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/google/go-cmp/cmp"
)

type manyFunc = func(ctx context.Context, led []string, settle func(key, v string, err error))

// goDoMany calls g.DoMany on a new goroutine; its results arrive on the
// channel.
func goDoMany(g *Group[string, string], ctx context.Context, keys []string, fn manyFunc) <-chan []Result[string] {
	ch := make(chan []Result[string], 1)
	go func() { ch <- g.DoMany(ctx, keys, fn) }()
	return ch
}

// returnedMany reports the results of a goDoMany if that DoMany has
// returned.
func returnedMany(ch <-chan []Result[string]) ([]Result[string], bool) {
	select {
	case r := <-ch:
		return r, true
	default:
		return nil, false
	}
}

// failing is a Do function for a caller that must join a flight, not run
// its own.
func failing(t *testing.T) func(context.Context) (string, error) {
	return func(context.Context) (string, error) {
		t.Error("a caller that should have joined a flight ran its own")
		return "", errors.New("ran")
	}
}

// settleAll settles each led key with "v" and the key.
func settleAll(led []string, settle func(key, v string, err error)) {
	for _, k := range led {
		settle(k, "v"+k, nil)
	}
}

// A DoMany joins the running flight of a key and leads the others; fn gets
// only the led ones, and the result of each position comes from its flight.
func TestDoManyLedAndJoined(t *testing.T) {
	for _, kind := range contextKinds {
		t.Run("ctx="+kind, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				var g Group[string, string]
				var calls atomic.Int32
				gateA, openA := newGate(t)
				a := goDo(&g, context.Background(), "a", gated(&calls, gateA, "va", nil))
				synctest.Wait()
				gate, open := newGate(t)
				var led []string
				ch := goDoMany(&g, ctxOf(t, kind), []string{"a", "b"}, func(ctx context.Context, l []string, settle func(string, string, error)) {
					led = slices.Clone(l)
					<-gate
					settle("b", "vb", nil)
				})
				synctest.Wait()
				if !slices.Equal(led, []string{"b"}) {
					t.Errorf("fn led %q, want [b]", led)
				}
				if got := [3]int{g.Waiters("a"), g.Waiters("b"), g.InFlight()}; got != [3]int{2, 1, 2} {
					t.Errorf("Waiters(a), Waiters(b), InFlight = %v, want [2 1 2]", got)
				}
				open()
				synctest.Wait()
				if _, ok := returnedMany(ch); ok {
					t.Fatal("DoMany returned before the flight it joined ended")
				}
				if got := [2]int{g.Waiters("b"), g.InFlight()}; got != [2]int{0, 1} {
					t.Errorf("after b was settled: Waiters(b), InFlight = %v, want [0 1]", got)
				}
				openA()
				want := []Result[string]{{"va", nil, true, false, false}, {"vb", nil, false, false, true}}
				if got := <-ch; !slices.Equal(got, want) {
					t.Errorf("DoMany = %+v, want %+v", got, want)
				}
				if r := <-a; r != (result{"va", nil, true}) {
					t.Errorf("Do of the joined key = %+v, want va, shared", r)
				}
				if n := calls.Load(); n != 1 || g.InFlight() != 0 {
					t.Errorf("Do's fn ran %d times, InFlight %d at the end; want 1, 0", n, g.InFlight())
				}
			})
		})
	}
}

// A DoMany whose keys are all running joins them and never calls fn.
func TestDoManyAllJoined(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var g Group[string, string]
		var calls atomic.Int32
		gate, open := newGate(t)
		a := goDo(&g, context.Background(), "a", gated(&calls, gate, "va", nil))
		synctest.Wait()
		ch := goDoMany(&g, t.Context(), []string{"a", "a"}, func(context.Context, []string, func(string, string, error)) {
			t.Error("fn ran although no key was led")
		})
		synctest.Wait()
		if n := g.Waiters("a"); n != 2 {
			t.Errorf("Waiters(a) = %d, want 2", n)
		}
		open()
		want := []Result[string]{{"va", nil, true, false, false}, {"va", nil, true, true, false}}
		if got := <-ch; !slices.Equal(got, want) {
			t.Errorf("DoMany = %+v, want %+v", got, want)
		}
		<-a
	})
}

// A Do arriving while fn runs joins the led key and gets the settled value
// as soon as settle is called, before fn returns; the key is free then.
func TestDoManyJoinerGetsSettledValueEarly(t *testing.T) {
	for _, kind := range contextKinds {
		t.Run("ctx="+kind, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				var g Group[string, string]
				gate1, open1 := newGate(t)
				gate2, open2 := newGate(t)
				fnReturned := make(chan struct{})
				ch := goDoMany(&g, ctxOf(t, kind), []string{"a", "b"}, func(ctx context.Context, led []string, settle func(string, string, error)) {
					defer close(fnReturned)
					<-gate1
					settle("a", "va", nil)
					<-gate2
					settle("b", "vb", nil)
				})
				synctest.Wait()
				j1 := goDo(&g, context.Background(), "a", failing(t))
				j2 := goDo(&g, ctxOf(t, "cancel"), "a", failing(t))
				synctest.Wait()
				if n := g.Waiters("a"); n != 3 {
					t.Errorf("Waiters(a) = %d, want 3", n)
				}
				open1()
				synctest.Wait()
				for i, j := range []<-chan result{j1, j2} {
					r, ok := returned(j)
					if !ok || r != (result{"va", nil, true}) {
						t.Errorf("joiner %d: returned %v with %+v once a was settled; want va, shared", i, ok, r)
					}
				}
				select {
				case <-fnReturned:
					t.Fatal("fn returned early")
				default:
				}
				if got := [3]int{g.Waiters("a"), g.Waiters("b"), g.InFlight()}; got != [3]int{0, 1, 1} {
					t.Errorf("Waiters(a), Waiters(b), InFlight = %v, want [0 1 1]", got)
				}
				// a is free: the next caller starts a flight of its own.
				v, err, shared := g.Do(context.Background(), "a", func(context.Context) (string, error) { return "fresh", nil })
				if v != "fresh" || err != nil || shared {
					t.Errorf("Do(a) after settle = %q, %v, %v; want a new flight", v, err, shared)
				}
				if _, ok := returnedMany(ch); ok {
					t.Fatal("DoMany returned before b was settled")
				}
				open2()
				want := []Result[string]{{"va", nil, true, false, true}, {"vb", nil, false, false, true}}
				if got := <-ch; !slices.Equal(got, want) {
					t.Errorf("DoMany = %+v, want %+v", got, want)
				}
			})
		})
	}
}

// A repeated key is led or joined once and every position gets its result,
// the later ones marked Repeat; with many keys the map lookup does the
// same, and fn may change led. A call that fails at once marks them too.
func TestDoManyDuplicates(t *testing.T) {
	t.Run("few", func(t *testing.T) {
		var starts atomic.Int32
		g := Group[string, string]{OnStart: func(string) { starts.Add(1) }}
		var led []string
		got := g.DoMany(context.Background(), []string{"a", "b", "a", "c", "b", "a"}, func(ctx context.Context, l []string, settle func(string, string, error)) {
			led = slices.Clone(l)
			for _, k := range l {
				if g.Waiters(k) != 1 {
					t.Errorf("Waiters(%s) = %d, want 1", k, g.Waiters(k))
				}
			}
			settleAll(l, settle)
		})
		if !slices.Equal(led, []string{"a", "b", "c"}) || starts.Load() != 3 {
			t.Errorf("fn led %q after %d starts, want [a b c] after 3", led, starts.Load())
		}
		want := []Result[string]{{"va", nil, false, false, true}, {"vb", nil, false, false, true}, {"va", nil, false, true, true}, {"vc", nil, false, false, true}, {"vb", nil, false, true, true}, {"va", nil, false, true, true}}
		if !slices.Equal(got, want) {
			t.Errorf("DoMany = %+v, want %+v", got, want)
		}
	})
	t.Run("many", func(t *testing.T) {
		var g Group[string, string]
		var keys []string
		for i := range 20 {
			keys = append(keys, "k"+strconv.Itoa(i))
		}
		for i := range 20 {
			keys = append(keys, keys[19-i])
		}
		var led []string
		got := g.DoMany(t.Context(), keys, func(ctx context.Context, l []string, settle func(string, string, error)) {
			led = slices.Clone(l)
			slices.Reverse(l) // fn's own copy
			var wg sync.WaitGroup
			for _, k := range l {
				wg.Go(func() { settle(k, "v"+k, nil) })
			}
			wg.Wait()
			settle("missing", "x", nil)
		})
		if !slices.Equal(led, keys[:20]) {
			t.Errorf("fn led %q, want %q", led, keys[:20])
		}
		for i, r := range got {
			if r != (Result[string]{"v" + keys[i], nil, false, i >= 20, true}) {
				t.Errorf("position %d (%s): %+v, want v%s, repeated %t", i, keys[i], r, keys[i], i >= 20)
			}
		}
	})
	t.Run("failed", func(t *testing.T) {
		var g Group[string, string]
		ctx, cancel := context.WithCancel(t.Context())
		cancel()
		got := g.DoMany(ctx, []string{"a", "b", "a"}, func(context.Context, []string, func(string, string, error)) {
			t.Error("fn ran for a done context")
		})
		for i, r := range got {
			if !errors.Is(r.Err, context.Canceled) || r.Repeat != (i == 2) || r.Led {
				t.Errorf("position %d: %+v, want context.Canceled, repeated %t, not led", i, r, i == 2)
			}
		}
	})
	t.Run("joined", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			var joins atomic.Int32
			g := Group[string, string]{OnJoin: func(string) { joins.Add(1) }}
			var calls atomic.Int32
			gate, open := newGate(t)
			j := goDo(&g, context.Background(), "j", gated(&calls, gate, "vj", nil))
			synctest.Wait()
			ch := goDoMany(&g, t.Context(), []string{"j", "x", "j"}, func(ctx context.Context, l []string, settle func(string, string, error)) {
				settleAll(l, settle)
			})
			synctest.Wait()
			if n := g.Waiters("j"); n != 2 || joins.Load() != 1 {
				t.Errorf("Waiters(j) = %d after %d joins, want 2 after 1", n, joins.Load())
			}
			open()
			want := []Result[string]{{"vj", nil, true, false, false}, {"vx", nil, false, false, true}, {"vj", nil, true, true, false}}
			if got := <-ch; !slices.Equal(got, want) {
				t.Errorf("DoMany = %+v, want %+v", got, want)
			}
			<-j
		})
	})
}

// No keys: a nil result and no call of fn, whatever else is wrong.
func TestDoManyEmptyKeys(t *testing.T) {
	var g Group[string, string]
	fn := func(context.Context, []string, func(string, string, error)) { t.Error("fn ran for no keys") }
	for _, keys := range [][]string{nil, {}} {
		if got := g.DoMany(context.Background(), keys, fn); got != nil {
			t.Errorf("DoMany(%#v) = %#v, want nil", keys, got)
		}
	}
	//lint:ignore SA1012 a nil Context is part of the input under test
	if got := g.DoMany(nil, nil, nil); got != nil {
		t.Errorf("DoMany(nil, nil, nil) = %#v, want nil", got)
	}
}

// A led key fn returns without settling gets ErrUnsettled, for every caller
// of its flight; a settle saved and called after fn returned does nothing.
func TestDoManyUnsettled(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var g Group[string, string]
		gate, open := newGate(t)
		var saved func(string, string, error)
		ch := goDoMany(&g, context.Background(), []string{"a", "b", "c"}, func(ctx context.Context, led []string, settle func(string, string, error)) {
			saved = settle
			settle("a", "va", nil)
			<-gate
		})
		synctest.Wait()
		j := goDo(&g, t.Context(), "b", failing(t))
		synctest.Wait()
		open()
		want := []Result[string]{{"va", nil, false, false, true}, {"", ErrUnsettled, true, false, true}, {"", ErrUnsettled, false, false, true}}
		if got := <-ch; !slices.Equal(got, want) {
			t.Errorf("DoMany = %+v, want %+v", got, want)
		}
		if r := <-j; r.err != ErrUnsettled {
			t.Errorf("joiner of b got %+v, want ErrUnsettled", r)
		}
		if g.InFlight() != 0 || g.Waiters("b") != 0 {
			t.Errorf("InFlight %d, Waiters(b) %d at the end; want 0, 0", g.InFlight(), g.Waiters("b"))
		}

		gate2, open2 := newGate(t)
		var calls atomic.Int32
		later := goDo(&g, context.Background(), "b", gated(&calls, gate2, "own", nil))
		synctest.Wait()
		saved("b", "late", nil)
		open2()
		if r := <-later; r != (result{"own", nil, false}) {
			t.Errorf("a later flight of b got %+v after the old settle was called; want its own value", r)
		}
	})
}

// A panic in fn gives each unsettled led key one *PanicError; keys settled
// before keep their values.
func TestDoManyPanic(t *testing.T) {
	for _, kind := range contextKinds {
		t.Run("ctx="+kind, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				var g Group[string, string]
				gate, open := newGate(t)
				ch := goDoMany(&g, ctxOf(t, kind), []string{"a", "b", "c"}, func(ctx context.Context, led []string, settle func(string, string, error)) {
					settle("a", "va", nil)
					<-gate
					panic(errPanicValue)
				})
				synctest.Wait()
				j := goDo(&g, context.Background(), "b", failing(t))
				synctest.Wait()
				open()
				got := <-ch
				if got[0] != (Result[string]{"va", nil, false, false, true}) {
					t.Errorf("settled key a got %+v, want va", got[0])
				}
				var pb, pc *PanicError
				if !errors.As(got[1].Err, &pb) || !errors.As(got[2].Err, &pc) {
					t.Fatalf("b and c got %v and %v, want *PanicError", got[1].Err, got[2].Err)
				}
				if pb != pc || pb.Value != errPanicValue || !errors.Is(got[1].Err, errPanicValue) {
					t.Errorf("b and c got %p and %p with value %v; want one PanicError of %v", pb, pc, pb.Value, errPanicValue)
				}
				if !strings.Contains(string(pb.Stack), "TestDoManyPanic") {
					t.Errorf("stack without the panicking function:\n%s", pb.Stack)
				}
				if r := <-j; r.err != error(pb) || !r.shared {
					t.Errorf("joiner of b got %+v, want the same *PanicError", r)
				}
				if g.InFlight() != 0 {
					t.Errorf("InFlight = %d after the panic, want 0", g.InFlight())
				}
			})
		})
	}
}

// A Goexit in fn gives each unsettled led key ErrGoexit. A caller running
// fn itself exits with it and stops waiting for the flight it joined.
func TestDoManyGoexit(t *testing.T) {
	for _, kind := range contextKinds {
		t.Run("ctx="+kind, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				var g Group[string, string]
				var calls atomic.Int32
				gateJ, openJ := newGate(t)
				jLeader := goDo(&g, context.Background(), "j", gated(&calls, gateJ, "vj", nil))
				synctest.Wait()
				gate, open := newGate(t)
				results := make(chan []Result[string], 1)
				exited := make(chan struct{})
				go func() {
					defer close(exited)
					results <- g.DoMany(ctxOf(t, kind), []string{"j", "a", "b"}, func(ctx context.Context, led []string, settle func(string, string, error)) {
						settle("a", "va", nil)
						<-gate
						runtime.Goexit()
					})
				}()
				synctest.Wait()
				jb := goDo(&g, context.Background(), "b", failing(t))
				synctest.Wait()
				open()
				if r := <-jb; r.err != ErrGoexit {
					t.Errorf("joiner of b got %+v, want ErrGoexit", r)
				}
				synctest.Wait()
				if kind == "background" {
					<-exited
					if got, ok := returnedMany(results); ok {
						t.Errorf("caller running fn itself returned %+v; want its goroutine to exit", got)
					}
					if n := g.Waiters("j"); n != 1 {
						t.Errorf("Waiters(j) = %d after the caller exited, want 1", n)
					}
					openJ()
				} else {
					if n := g.Waiters("j"); n != 2 {
						t.Errorf("Waiters(j) = %d, want 2", n)
					}
					openJ()
					want := []Result[string]{{"vj", nil, true, false, false}, {"va", nil, false, false, true}, {"", ErrGoexit, true, false, true}}
					if got := <-results; !slices.Equal(got, want) {
						t.Errorf("DoMany = %+v, want %+v", got, want)
					}
				}
				<-jLeader
				if g.InFlight() != 0 {
					t.Errorf("InFlight = %d at the end, want 0", g.InFlight())
				}
			})
		})
	}
}

// The caller's ctx bounds its own wait: keys without a result get the wait
// error, fn goes on, and the other callers get their results.
func TestDoManyContextBoundsOnlyOwnWait(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var g Group[string, string]
		var calls atomic.Int32
		gateJ, openJ := newGate(t)
		jLeader := goDo(&g, context.Background(), "j", gated(&calls, gateJ, "vj", nil))
		synctest.Wait()
		gate, open := newGate(t)
		var fnCtx context.Context
		ctx, cancel := cancellable(t)
		ch := goDoMany(&g, ctx, []string{"a", "b", "j"}, func(ctx context.Context, led []string, settle func(string, string, error)) {
			fnCtx = ctx
			settle("a", "va", nil)
			<-gate
			settle("b", "vb", nil)
		})
		synctest.Wait()
		jb := goDo(&g, context.Background(), "b", failing(t))
		synctest.Wait()
		if got := [2]int{g.Waiters("b"), g.Waiters("j")}; got != [2]int{2, 2} {
			t.Errorf("Waiters(b), Waiters(j) = %v, want [2 2]", got)
		}
		errCause := errors.New("client went away")
		cancel(errCause)
		synctest.Wait()
		got, ok := returnedMany(ch)
		if !ok {
			t.Fatal("DoMany did not return when its ctx ended")
		}
		if got[0] != (Result[string]{"va", nil, false, false, true}) {
			t.Errorf("settled key a got %+v, want va", got[0])
		}
		for _, r := range got[1:] {
			if r.Val != "" || r.Shared || !errors.Is(r.Err, context.Canceled) || !errors.Is(r.Err, errCause) || !strings.HasPrefix(r.Err.Error(), "flight: ") {
				t.Errorf("unsettled key got %+v, want a flight: error wrapping context.Canceled and the cause", r)
			}
		}
		if got := [3]int{g.Waiters("b"), g.Waiters("j"), g.InFlight()}; got != [3]int{1, 1, 2} {
			t.Errorf("after the caller left: Waiters(b), Waiters(j), InFlight = %v, want [1 1 2]", got)
		}
		if err := fnCtx.Err(); err != nil {
			t.Errorf("fn's ctx ended with %v when its caller left", err)
		}
		open()
		if r := <-jb; r != (result{"vb", nil, true}) {
			t.Errorf("joiner of b got %+v, want vb, shared", r)
		}
		openJ()
		if r := <-jLeader; r != (result{"vj", nil, true}) {
			t.Errorf("Do of j got %+v, want vj, shared", r)
		}
		if g.InFlight() != 0 {
			t.Errorf("InFlight = %d at the end, want 0", g.InFlight())
		}
	})
}

// With CancelWhenAbandoned a led key whose callers have all left is freed,
// and fn's context is cancelled once no unsettled led key has a caller; by
// default it ends only with the timeout or fn's return.
func TestDoManyCancelWhenAbandoned(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		g := Group[string, string]{CancelWhenAbandoned: true}
		gate, open := newGate(t)
		var fnCtx context.Context
		ctxA, cancelA := cancellable(t)
		ch := goDoMany(&g, ctxA, []string{"a", "b"}, func(ctx context.Context, led []string, settle func(string, string, error)) {
			fnCtx = ctx
			<-ctx.Done()
			<-gate
		})
		synctest.Wait()
		ctxB, cancelB := cancellable(t)
		jb := goDo(&g, ctxB, "b", failing(t))
		synctest.Wait()
		cancelA(nil)
		synctest.Wait()
		for i, r := range <-ch {
			if !errors.Is(r.Err, context.Canceled) {
				t.Errorf("position %d got %+v, want context.Canceled", i, r)
			}
		}
		if got := [3]int{g.Waiters("a"), g.Waiters("b"), g.InFlight()}; got != [3]int{0, 1, 2} {
			t.Errorf("Waiters(a), Waiters(b), InFlight = %v, want [0 1 2]", got)
		}
		if err := fnCtx.Err(); err != nil {
			t.Fatalf("fn's ctx ended with %v while b still had a caller", err)
		}
		v, err, shared := g.Do(context.Background(), "a", func(context.Context) (string, error) { return "fresh", nil })
		if v != "fresh" || err != nil || shared {
			t.Errorf("Do(a) after a was abandoned = %q, %v, %v; want a new flight", v, err, shared)
		}
		cancelB(nil)
		synctest.Wait()
		if r := <-jb; !errors.Is(r.err, context.Canceled) {
			t.Errorf("joiner of b got %+v, want context.Canceled", r)
		}
		if err := fnCtx.Err(); err != context.Canceled {
			t.Errorf("fn's ctx = %v once every led key was abandoned, want context.Canceled", err)
		}
		if n := g.InFlight(); n != 2 {
			t.Errorf("InFlight = %d while fn runs on, want 2", n)
		}
		open()
		synctest.Wait()
		if n := g.InFlight(); n != 0 {
			t.Errorf("InFlight = %d after fn returned, want 0", n)
		}
	})

	for _, policy := range []bool{false, true} {
		t.Run(fmt.Sprintf("all settled/CancelWhenAbandoned=%v", policy), func(t *testing.T) {
			g := Group[string, string]{CancelWhenAbandoned: policy}
			var afterOne, afterAll error
			fnDone := make(chan struct{})
			// DoMany may return before fn does: once every key is settled.
			g.DoMany(t.Context(), []string{"a", "b"}, func(ctx context.Context, led []string, settle func(string, string, error)) {
				defer close(fnDone)
				settle("a", "va", nil)
				afterOne = ctx.Err()
				settle("b", "vb", nil)
				afterAll = ctx.Err()
			})
			<-fnDone
			var want error
			if policy {
				want = context.Canceled
			}
			if afterOne != nil || afterAll != want {
				t.Errorf("fn's ctx after one settle %v, after all %v; want nil, %v", afterOne, afterAll, want)
			}
		})
	}
}

// A ctx that is already done: every key gets the wait error and nothing
// starts or joins.
func TestDoManyDoneContext(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var hooks atomic.Int32
		g := Group[string, string]{
			OnStart: func(string) { hooks.Add(1) },
			OnJoin:  func(string) { hooks.Add(1) },
		}
		var calls atomic.Int32
		gate, open := newGate(t)
		j := goDo(&g, context.Background(), "j", gated(&calls, gate, "vj", nil))
		synctest.Wait()
		ctx, cancel := context.WithCancel(t.Context())
		cancel()
		got := g.DoMany(ctx, []string{"j", "k"}, func(context.Context, []string, func(string, string, error)) {
			t.Error("fn ran with a done ctx")
		})
		for i, r := range got {
			if !errors.Is(r.Err, context.Canceled) || r.Shared {
				t.Errorf("position %d got %+v, want context.Canceled", i, r)
			}
		}
		if got := [4]int{len(got), int(hooks.Load()), g.Waiters("j"), g.InFlight()}; got != [4]int{2, 1, 1, 1} {
			t.Errorf("len, hook calls, Waiters(j), InFlight = %v, want [2 1 1 1]", got)
		}
		open()
		<-j
	})
}

// The first settle of a key wins, however many race for it, and every
// caller of the flight gets that one.
func TestDoManyConcurrentSettles(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var g Group[string, string]
		start, open := newGate(t)
		ch := goDoMany(&g, t.Context(), []string{"a", "b"}, func(ctx context.Context, led []string, settle func(string, string, error)) {
			settle("b", "first", nil)
			settle("b", "second", nil)
			var wg sync.WaitGroup
			for i := range 8 {
				wg.Go(func() {
					<-start
					settle("a", "v"+strconv.Itoa(i), nil)
				})
			}
			wg.Wait()
		})
		synctest.Wait()
		j := goDo(&g, context.Background(), "a", failing(t))
		synctest.Wait()
		open()
		got := <-ch
		r := <-j
		if n, err := strconv.Atoi(strings.TrimPrefix(got[0].Val, "v")); err != nil || n < 0 || n > 7 || got[0].Err != nil || r.v != got[0].Val {
			t.Errorf("DoMany got %+v for a and its joiner %+v; want one of v0…v7 for both", got[0], r)
		}
		if got[1] != (Result[string]{"first", nil, false, false, true}) {
			t.Errorf("DoMany got %+v for b, want the first settle", got[1])
		}
	})
}

// settle ignores a key the DoMany did not lead: one it joined, and one it
// never had.
func TestDoManySettleIgnoresForeignKeys(t *testing.T) {
	for _, n := range []int{2, 40} { // scan and map
		t.Run(fmt.Sprintf("keys=%d", n), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				var g Group[string, string]
				var calls atomic.Int32
				gate, open := newGate(t)
				jLeader := goDo(&g, context.Background(), "j", gated(&calls, gate, "vj", nil))
				synctest.Wait()
				keys := []string{"j"}
				for i := range n - 1 {
					keys = append(keys, "k"+strconv.Itoa(i))
				}
				ch := goDoMany(&g, t.Context(), keys, func(ctx context.Context, led []string, settle func(string, string, error)) {
					settle("j", "stolen", nil)
					settle("zzz", "x", nil)
					settleAll(led, settle)
				})
				synctest.Wait()
				open()
				got := <-ch
				if got[0] != (Result[string]{"vj", nil, true, false, false}) {
					t.Errorf("joined key j got %+v, want vj from its own flight", got[0])
				}
				if r := <-jLeader; r != (result{"vj", nil, true}) {
					t.Errorf("Do of j got %+v, want vj", r)
				}
				for i, r := range got[1:] {
					if r != (Result[string]{"v" + keys[i+1], nil, false, false, true}) {
						t.Errorf("led key %s got %+v", keys[i+1], r)
					}
				}
			})
		})
	}
}

// OnStart and OnJoin are called once per led and joined key; Waiters counts
// the DoMany caller once per key and InFlight each led key until it is
// settled.
func TestDoManyCountersAndHooks(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var mu sync.Mutex
		var events []string
		g := Group[string, string]{
			OnStart: func(key string) { mu.Lock(); events = append(events, "start "+key); mu.Unlock() },
			OnJoin:  func(key string) { mu.Lock(); events = append(events, "join "+key); mu.Unlock() },
		}
		var calls atomic.Int32
		gate, open := newGate(t)
		a := goDo(&g, context.Background(), "a", gated(&calls, gate, "va", nil))
		synctest.Wait()
		settleC, openC := newGate(t)
		settleB, openB := newGate(t)
		ch := goDoMany(&g, t.Context(), []string{"a", "b", "c", "b"}, func(ctx context.Context, led []string, settle func(string, string, error)) {
			<-settleC
			settle("c", "vc", nil)
			<-settleB
			settle("b", "vb", nil)
		})
		synctest.Wait()
		jb := goDo(&g, t.Context(), "b", failing(t))
		synctest.Wait()
		counts := func() [4]int { return [4]int{g.Waiters("a"), g.Waiters("b"), g.Waiters("c"), g.InFlight()} }
		if got := counts(); got != [4]int{2, 2, 1, 3} {
			t.Errorf("Waiters(a, b, c), InFlight = %v, want [2 2 1 3]", got)
		}
		openC()
		synctest.Wait()
		if got := counts(); got != [4]int{2, 2, 0, 2} {
			t.Errorf("after c was settled: Waiters(a, b, c), InFlight = %v, want [2 2 0 2]", got)
		}
		openB()
		synctest.Wait()
		if got := counts(); got != [4]int{2, 0, 0, 1} {
			t.Errorf("after b was settled: Waiters(a, b, c), InFlight = %v, want [2 0 0 1]", got)
		}
		open()
		<-ch
		<-a
		<-jb
		if got := counts(); got != [4]int{0, 0, 0, 0} {
			t.Errorf("at the end: Waiters(a, b, c), InFlight = %v, want [0 0 0 0]", got)
		}
		want := []string{"start a", "join a", "start b", "start c", "join b"}
		if diff := cmp.Diff(want, events); diff != "" {
			t.Errorf("hook calls (-want +got):\n%s", diff)
		}
	})
}

// fn's ctx carries the caller's values but not its cancellation, ends at
// the timeout, and ends once fn has returned.
func TestDoManyFlightContext(t *testing.T) {
	for _, tc := range []struct {
		timeout, want time.Duration
	}{{0, DefaultTimeout}, {5 * time.Second, 5 * time.Second}} {
		for _, kind := range contextKinds {
			t.Run(fmt.Sprintf("timeout=%v/ctx=%s", tc.timeout, kind), func(t *testing.T) {
				synctest.Test(t, func(t *testing.T) {
					g := Group[string, string]{Timeout: tc.timeout}
					ctx := context.WithValue(context.Background(), ctxKey{}, "trace-1")
					var cancel context.CancelFunc
					if kind == "cancel" {
						ctx, cancel = context.WithCancel(ctx)
						defer cancel()
					}
					start := time.Now()
					var (
						value          any
						deadline       time.Time
						errAfterCancel error
						ended          time.Duration
						endErr         error
					)
					fnDone := make(chan struct{})
					got := g.DoMany(ctx, []string{"a"}, func(fctx context.Context, led []string, settle func(string, string, error)) {
						defer close(fnDone)
						value = fctx.Value(ctxKey{})
						deadline, _ = fctx.Deadline()
						if cancel != nil {
							cancel()
							errAfterCancel = fctx.Err()
						}
						<-fctx.Done()
						ended, endErr = time.Since(start), fctx.Err()
						settle("a", "late", fctx.Err())
					})
					<-fnDone
					if value != "trace-1" || !deadline.Equal(start.Add(tc.want)) || errAfterCancel != nil {
						t.Errorf("fn's ctx: value %v, deadline %v, Err after the caller's cancel %v; want trace-1, %v, nil", value, deadline, errAfterCancel, start.Add(tc.want))
					}
					if ended != tc.want || endErr != context.DeadlineExceeded {
						t.Errorf("fn's ctx ended after %v with %v, want %v, DeadlineExceeded", ended, endErr, tc.want)
					}
					if kind == "cancel" {
						if !errors.Is(got[0].Err, context.Canceled) {
							t.Errorf("caller got %+v, want its own cancellation", got[0])
						}
					} else if got[0] != (Result[string]{"late", context.DeadlineExceeded, false, false, true}) {
						t.Errorf("caller got %+v, want fn's late result", got[0])
					}
				})
			})
		}
	}
	for _, kind := range contextKinds {
		var g Group[string, string]
		var fctx context.Context
		var during error
		g.DoMany(ctxOf(t, kind), []string{"a"}, func(ctx context.Context, led []string, settle func(string, string, error)) {
			fctx, during = ctx, ctx.Err()
		})
		if during != nil || fctx.Err() != context.Canceled {
			t.Errorf("ctx=%s: fn's ctx Err during fn %v, after %v; want nil, Canceled", kind, during, fctx.Err())
		}
	}
}

// Bad input fails every key with a flight: error and starts nothing.
func TestDoManyBadInput(t *testing.T) {
	fn := func(context.Context, []string, func(string, string, error)) { t.Error("fn ran on bad input") }
	started := 0
	g := Group[string, string]{OnStart: func(string) { started++ }}
	neg := Group[string, string]{Timeout: -time.Second, OnStart: g.OnStart}
	keys := []string{"a", "b"}
	for _, tc := range []struct {
		name string
		got  []Result[string]
	}{
		//lint:ignore SA1012 a nil Context is the bad input under test
		{"nil ctx", g.DoMany(nil, keys, fn)},
		{"nil fn", g.DoMany(context.Background(), keys, nil)},
		{"negative Timeout", neg.DoMany(context.Background(), keys, fn)},
	} {
		if len(tc.got) != len(keys) {
			t.Fatalf("%s: %d results for %d keys", tc.name, len(tc.got), len(keys))
		}
		for _, r := range tc.got {
			if r.Err == nil || !strings.HasPrefix(r.Err.Error(), "flight: ") || r.Err != tc.got[0].Err {
				t.Errorf("%s: %+v, want one flight: error for every key", tc.name, r)
			}
		}
	}
	if started != 0 || g.InFlight() != 0 || neg.InFlight() != 0 {
		t.Errorf("bad input started %d flights", started)
	}
}

// BenchmarkDoMany: one goroutine loads 100 distinct keys, with one DoMany
// or with a loop of Do; ns/op and allocs/op are per 100 keys.
func BenchmarkDoMany(b *testing.B) {
	keys := benchKeys(100)
	for _, kind := range ctxKinds {
		b.Run("impl=DoMany/ctx="+kind, func(b *testing.B) {
			ctx := benchCtx(b, kind)
			var g Group[string, *benchValue]
			fn := func(ctx context.Context, led []string, settle func(string, *benchValue, error)) {
				for _, k := range led {
					settle(k, benchResult, nil)
				}
			}
			b.ReportAllocs()
			for b.Loop() {
				if r := g.DoMany(ctx, keys, fn); r[99].Val != benchResult {
					b.Fatal("wrong value")
				}
			}
		})
		b.Run("impl=Do/ctx="+kind, func(b *testing.B) {
			ctx := benchCtx(b, kind)
			var g Group[string, *benchValue]
			fn := func(context.Context) (*benchValue, error) { return benchResult, nil }
			b.ReportAllocs()
			for b.Loop() {
				for _, k := range keys {
					if v, _, _ := g.Do(ctx, k, fn); v != benchResult {
						b.Fatal("wrong value")
					}
				}
			}
		})
	}
}
