package herd

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/herdcache/herd/memory"
	"github.com/herdcache/herd/remote"
)

func TestBreaker(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var changes []bool
		var causes []error
		b := &breaker{threshold: 3, cooldown: time.Second, onChange: func(open bool, cause error) {
			changes = append(changes, open)
			causes = append(causes, cause)
		}}
		ctx := context.Background()
		down := errors.New("down")

		for i := range 2 {
			if !b.allow() {
				t.Fatalf("closed breaker refused call %d", i)
			}
			b.record(ctx, b.at(), down)
		}
		if b.open() {
			t.Fatal("opened before the threshold")
		}
		b.record(ctx, b.at(), nil) // a success resets the count
		for range 2 {
			b.record(ctx, b.at(), down)
		}
		if b.open() {
			t.Fatal("failures before a success counted towards the threshold")
		}
		last := errors.New("down, the third time")
		b.record(ctx, b.at(), last)
		if !b.open() || b.allow() {
			t.Fatal("breaker did not open after 3 consecutive failures")
		}
		if len(causes) != 1 || causes[0] != last {
			t.Fatalf("opening reported causes %v, want the failure that opened it, %v", causes, last)
		}

		time.Sleep(time.Second - time.Millisecond)
		if b.allow() {
			t.Fatal("probe allowed before the cool-down")
		}
		time.Sleep(time.Millisecond)
		if !b.allow() {
			t.Fatal("no probe after the cool-down")
		}
		if b.allow() {
			t.Fatal("a second probe while the first runs")
		}
		b.record(ctx, b.at(), down) // failed probe: open for another cool-down
		if b.allow() {
			t.Fatal("probe allowed right after a failed probe")
		}
		time.Sleep(time.Second)
		if !b.allow() {
			t.Fatal("no probe after the second cool-down")
		}
		b.record(ctx, b.at(), nil)
		if b.open() || len(changes) != 2 || !changes[0] || changes[1] {
			t.Fatalf("open=%v changes=%v after a successful probe, want closed and [true false]", b.open(), changes)
		}
		d, opens := b.degraded()
		if d != 2*time.Second || opens != 1 {
			t.Fatalf("degraded %v over %d opens, want 2s over 1", d, opens)
		}
	})
}

func TestBreakerIgnoresCallerCancellation(t *testing.T) {
	b := &breaker{threshold: 1, cooldown: time.Second}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	b.record(ctx, b.at(), ctx.Err())
	if b.open() {
		t.Fatal("a caller's own cancellation opened the breaker")
	}
	b.record(context.Background(), b.at(), errors.New("down"))
	if !b.open() {
		t.Fatal("threshold 1 did not open on a failure")
	}
}

func TestBreakerOff(t *testing.T) {
	b := &breaker{}
	for range 100 {
		b.record(context.Background(), b.at(), errors.New("down"))
	}
	if b.open() || !b.allow() {
		t.Fatal("a zero threshold opened the breaker")
	}
}

// A call's outcome counts only in the epoch it began in: calls under way
// when a probe closed the breaker do not open it again, a late failure of a
// call that began before the probe does not cost the probe its turn, and a
// late success of a call that began before the breaker opened does not
// close it.
func TestBreakerIgnoresCallsFromEarlierStates(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var changes []bool
		b := &breaker{threshold: 2, cooldown: time.Second, onChange: func(open bool, _ error) { changes = append(changes, open) }}
		ctx := context.Background()
		down := errors.New("down")

		beforeOpen := b.at() // calls under way while closed
		b.record(ctx, b.at(), down)
		b.record(ctx, b.at(), down)
		if !b.open() {
			t.Fatal("did not open after 2 failures")
		}
		b.record(ctx, beforeOpen, nil)
		if !b.open() {
			t.Fatal("a success of a call that began before the breaker opened closed it")
		}

		whileOpen := b.at() // calls under way while open, not probes
		time.Sleep(time.Second)
		if !b.allow() {
			t.Fatal("no probe after the cool-down")
		}
		probe := b.at()
		b.record(ctx, whileOpen, down)
		b.record(ctx, beforeOpen, down)
		if b.probeDue() || b.allow() {
			t.Fatal("a late failure of an earlier call ended the probe")
		}
		b.record(ctx, probe, nil)
		if b.open() {
			t.Fatal("a successful probe did not close the breaker")
		}

		// Calls that began before the probe closed it fail afterwards.
		for range 10 {
			b.record(ctx, whileOpen, down)
			b.record(ctx, beforeOpen, down)
			b.record(ctx, probe, down)
		}
		if b.open() {
			t.Fatal("failures of calls that began before the probe closed the breaker opened it again")
		}
		if _, opens := b.degraded(); opens != 1 || len(changes) != 2 {
			t.Fatalf("%d opens, changes %v; want 1 and [true false]", opens, changes)
		}

		// Calls made since fail, one after another: it opens again.
		b.record(ctx, b.at(), down)
		b.record(ctx, b.at(), down)
		if !b.open() {
			t.Fatal("failures of calls made after the close did not open the breaker")
		}
		if _, opens := b.degraded(); opens != 2 {
			t.Fatalf("%d opens, want 2", opens)
		}
	})
}

// A probe whose caller gave up lets the next caller probe at once; a
// failure of a call that was under way meanwhile does not.
func TestBreakerProbeCancelled(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := &breaker{threshold: 1, cooldown: time.Second}
		b.record(context.Background(), b.at(), errors.New("down"))
		time.Sleep(time.Second)
		if !b.allow() {
			t.Fatal("no probe after the cool-down")
		}
		probe := b.at()
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		b.record(ctx, probe, ctx.Err())
		if !b.allow() {
			t.Fatal("no second probe at once after the first one's caller gave up")
		}
		second := b.at()
		b.record(context.Background(), probe, errors.New("down")) // the first probe's call, late
		if b.allow() || !b.open() {
			t.Fatal("state changed by a call of an earlier probe")
		}
		b.record(context.Background(), second, nil)
		if b.open() {
			t.Fatal("the second probe's success did not close the breaker")
		}
	})
}

// Calls that were all under way when one of them failed count as that one
// failure, whatever their number and order (run with -race); failures each
// of a call made after the one before failed open the breaker, once.
func TestBreakerCountsBurstOnce(t *testing.T) {
	var opens atomic.Int64
	b := &breaker{threshold: 3, cooldown: time.Hour, onChange: func(open bool, _ error) {
		if open {
			opens.Add(1)
		}
	}}
	down := errors.New("down")
	burst := func() {
		at := b.at()
		var wg sync.WaitGroup
		for range 50 {
			wg.Go(func() { b.record(context.Background(), at, down) })
		}
		wg.Wait()
	}
	burst()
	burst()
	if b.open() {
		t.Fatal("two bursts of concurrent failures opened a breaker of threshold 3")
	}
	ok := b.at()
	b.record(context.Background(), ok, nil) // began after the last failure
	burst()
	burst()
	if b.open() {
		t.Fatal("failures before a success counted towards the threshold")
	}
	burst()
	if !b.open() || opens.Load() != 1 {
		t.Fatalf("open %v after %d openings, want open after 1", b.open(), opens.Load())
	}
}

// reachedStore is a Store that tells whether it has reached its server.
type reachedStore struct {
	remote.Store
	reached bool
}

func (s reachedStore) Reached() bool { return s.reached }

// A breaker starts open, with a probe due at once, over a Store that has
// not reached its server; closed over one that has, over one that cannot
// tell, and when it never opens.
func TestBreakerStartsFromStore(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var opened []bool
		b := &breaker{threshold: 5, cooldown: time.Second, onChange: func(open bool, _ error) { opened = append(opened, open) }}
		b.startFrom(reachedStore{reached: false})
		if !b.open() || !b.probeDue() || len(opened) != 1 || !opened[0] {
			t.Fatalf("over an unreached Store: open %v, probe due %v, changes %v; want open with a probe due, reported", b.open(), b.probeDue(), opened)
		}
		if _, opens := b.degraded(); opens != 1 {
			t.Errorf("opens = %d, want 1", opens)
		}
		if !b.allow() || b.allow() {
			t.Fatal("want exactly one probe")
		}
		b.record(context.Background(), b.at(), errors.New("down"))
		if !b.open() || b.probeDue() {
			t.Fatal("a failed first probe did not keep the breaker open for its cool-down")
		}
		time.Sleep(time.Second)
		if !b.allow() {
			t.Fatal("no probe after the cool-down")
		}
		b.record(context.Background(), b.at(), nil)
		if b.open() {
			t.Fatal("a probe that succeeded did not close the breaker")
		}

		for _, s := range []remote.Store{reachedStore{reached: true}, nil} {
			b := &breaker{threshold: 5, cooldown: time.Second}
			b.startFrom(s)
			if b.open() {
				t.Errorf("over %T: the breaker starts open", s)
			}
		}
		never := &breaker{}
		never.startFrom(reachedStore{reached: false})
		if never.open() {
			t.Error("a breaker of threshold zero starts open")
		}
	})
}

// A batch that the breaker lets through as its probe and that makes no
// remote call, its keys settled by the Store reads its callers had just
// made, ends the probe: the next call probes, where the breaker would
// otherwise stay open, letting no call through, for good.
func TestBreakerProbeOfBatchWithoutCall(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := Must(New(&Options[int]{MaxEntries: 10, SoftTTL: time.Minute, Store: memory.New(), NearTTL: time.Second, BreakerThreshold: 1, BreakerCooldown: time.Second}))
		defer c.Close(context.Background())
		c.brk.record(context.Background(), c.brk.at(), errors.New("down"))
		time.Sleep(time.Second)
		if !c.brk.probeDue() {
			t.Fatal("no probe due a cool-down after the breaker opened")
		}
		f := c.newFill("k", foreground, callOpts{})
		f.pre = remoteRead[int]{done: true, gone: true, gen: f.gen, puts: f.puts} // read just now: nothing there
		b := &batchFill[int]{c: c, settle: func(string, *entry[int], error) {}, leases: newLeaseSet(), wakes: newWakes(), scratch: c.newScratch()}
		b.remote(context.Background(), []*fillState[int]{f})
		if !c.brk.probeDue() {
			t.Error("after a batch that made no remote call, no probe is due: the breaker lets no call through")
		}
	})
}
