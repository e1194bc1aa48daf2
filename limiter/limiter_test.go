package limiter

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"
)

func mustNew(t *testing.T, o Options) *Limiter {
	t.Helper()
	l, err := New(o)
	if err != nil {
		t.Fatalf("New(%+v): %v", o, err)
	}
	return l
}

// result runs Acquire on its own goroutine and returns a channel that
// receives its error.
func acquireAsync(l *Limiter, ctx context.Context) <-chan error {
	ch := make(chan error, 1)
	go func() { ch <- l.Acquire(ctx) }()
	return ch
}

func checkCounts(t *testing.T, l *Limiter, inUse, waiting int) {
	t.Helper()
	if got := l.InUse(); got != inUse {
		t.Errorf("InUse() = %d, want %d", got, inUse)
	}
	if got := l.Waiting(); got != waiting {
		t.Errorf("Waiting() = %d, want %d", got, waiting)
	}
}

// maxTracker records the largest number of callers inside a section at once.
type maxTracker struct {
	cur, max atomic.Int64
}

func (m *maxTracker) enter() {
	n := m.cur.Add(1)
	for {
		old := m.max.Load()
		if n <= old || m.max.CompareAndSwap(old, n) {
			return
		}
	}
}

func (m *maxTracker) leave() { m.cur.Add(-1) }

func TestCapNeverExceeded(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const limit, n = 8, 1000
		l := mustNew(t, Options{Limit: limit})
		var m maxTracker
		gate := make(chan struct{})
		var wg sync.WaitGroup
		for i := range n {
			ctx := WithPriority(context.Background(), Priority(i%3-1))
			wg.Go(func() {
				if err := l.Acquire(ctx); err != nil {
					t.Errorf("Acquire: %v", err)
					return
				}
				m.enter()
				<-gate
				m.leave()
				l.Release()
			})
		}
		synctest.Wait()
		if got := m.cur.Load(); got != limit {
			t.Errorf("%d callers hold a slot with all %d blocked, want %d", got, n, limit)
		}
		checkCounts(t, l, limit, n-limit)
		close(gate)
		wg.Wait()
		if got := m.max.Load(); got > limit {
			t.Errorf("max concurrent = %d, above the limit %d", got, limit)
		}
		checkCounts(t, l, 0, 0)
		s := l.Stats()
		if s.Acquired != n || s.MaxInUse != limit || s.QueueWaits != n-limit {
			t.Errorf("Stats = %+v, want Acquired %d, MaxInUse %d, QueueWaits %d", s, n, limit, n-limit)
		}
	})
}

// TestCapNeverExceededRealTime runs 1,000 acquirers on real goroutines, with
// the race detector's scheduling, and no fake clock.
func TestCapNeverExceededRealTime(t *testing.T) {
	const limit, n = 4, 1000
	l := mustNew(t, Options{Limit: limit})
	var m maxTracker
	var wg sync.WaitGroup
	for i := range n {
		ctx := WithPriority(context.Background(), Priority(i%3-1))
		wg.Go(func() {
			if err := l.Acquire(ctx); err != nil {
				t.Errorf("Acquire: %v", err)
				return
			}
			m.enter()
			runtime.Gosched()
			m.leave()
			l.Release()
		})
	}
	wg.Wait()
	if got := m.max.Load(); got > limit {
		t.Errorf("max concurrent = %d, above the limit %d", got, limit)
	}
	if s := l.Stats(); s.MaxInUse > limit || s.Acquired != n {
		t.Errorf("Stats = %+v, want MaxInUse <= %d and Acquired %d", s, limit, n)
	}
	checkCounts(t, l, 0, 0)
}

func TestPriorityOrder(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		l := mustNew(t, Options{Limit: 1})
		if err := l.Acquire(context.Background()); err != nil {
			t.Fatal(err)
		}
		var (
			mu    sync.Mutex
			order []string
			wg    sync.WaitGroup
		)
		arrivals := []struct {
			name string
			p    Priority
		}{
			{"normal-1", Normal}, {"low-1", Low}, {"normal-2", Normal},
			{"high-1", High}, {"low-2", Low}, {"high-2", High}, {"normal-3", Normal},
		}
		for _, a := range arrivals {
			ctx := WithPriority(context.Background(), a.p)
			wg.Go(func() {
				if err := l.Acquire(ctx); err != nil {
					t.Errorf("%s: Acquire: %v", a.name, err)
					return
				}
				mu.Lock()
				order = append(order, a.name)
				mu.Unlock()
				l.Release()
			})
			synctest.Wait() // queued before the next one arrives
		}
		checkCounts(t, l, 1, len(arrivals))
		l.Release()
		wg.Wait()
		want := "high-1 high-2 normal-1 normal-2 normal-3 low-1 low-2"
		if got := strings.Join(order, " "); got != want {
			t.Errorf("grant order = %s\nwant          %s", got, want)
		}
		checkCounts(t, l, 0, 0)
	})
}

func TestQueueTimeout(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		l := mustNew(t, Options{Limit: 1, QueueTimeout: time.Second})
		if err := l.Acquire(context.Background()); err != nil {
			t.Fatal(err)
		}
		start := time.Now()
		res := acquireAsync(l, WithPriority(context.Background(), High))
		time.Sleep(time.Second - time.Nanosecond)
		synctest.Wait()
		select {
		case err := <-res:
			t.Fatalf("Acquire returned %v before QueueTimeout", err)
		default:
		}
		checkCounts(t, l, 1, 1)
		time.Sleep(time.Nanosecond)
		synctest.Wait()
		err := <-res
		if elapsed := time.Since(start); elapsed != time.Second {
			t.Errorf("Acquire returned after %v, want 1s", elapsed)
		}
		if !errors.Is(err, ErrOverloaded) {
			t.Fatalf("Acquire = %v, want ErrOverloaded", err)
		}
		var oe *OverloadError
		if !errors.As(err, &oe) {
			t.Fatalf("Acquire = %T, want *OverloadError", err)
		}
		want := OverloadError{Reason: ReasonQueueTimeout, Priority: High, RetryAfter: time.Second}
		if *oe != want {
			t.Errorf("OverloadError = %+v, want %+v", *oe, want)
		}
		// The timed-out call holds nothing: only the first slot is in use.
		checkCounts(t, l, 1, 0)
		l.Release()
		checkCounts(t, l, 0, 0)
	})
}

func TestZeroQueueTimeoutWaitsForSlot(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		l := mustNew(t, Options{Limit: 1})
		if err := l.Acquire(context.Background()); err != nil {
			t.Fatal(err)
		}
		res := acquireAsync(l, context.Background())
		time.Sleep(24 * time.Hour)
		synctest.Wait()
		select {
		case err := <-res:
			t.Fatalf("Acquire returned %v with no QueueTimeout and no ctx deadline", err)
		default:
		}
		l.Release()
		if err := <-res; err != nil {
			t.Fatalf("Acquire = %v after Release, want nil", err)
		}
		checkCounts(t, l, 1, 0)
		l.Release()
	})
}

func TestMaxQueue(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		l := mustNew(t, Options{Limit: 1, MaxQueue: 2, QueueTimeout: 3 * time.Second})
		if err := l.Acquire(context.Background()); err != nil {
			t.Fatal(err)
		}
		low := WithPriority(context.Background(), Low)
		var results []<-chan error
		results = append(results, acquireAsync(l, context.Background()))
		synctest.Wait()
		// Below MaxQueue, a Low call waits like any other.
		results = append(results, acquireAsync(l, low))
		synctest.Wait()
		checkCounts(t, l, 1, 2)

		// At MaxQueue, a Low call is shed without waiting.
		start := time.Now()
		err := l.Acquire(low)
		var oe *OverloadError
		if !errors.As(err, &oe) || !errors.Is(err, ErrOverloaded) {
			t.Fatalf("Low Acquire with a full queue = %v, want *OverloadError", err)
		}
		want := OverloadError{Reason: ReasonQueueFull, Priority: Low, RetryAfter: 3 * time.Second}
		if *oe != want {
			t.Errorf("OverloadError = %+v, want %+v", *oe, want)
		}
		if time.Since(start) != 0 {
			t.Errorf("Low Acquire waited %v before being shed", time.Since(start))
		}

		// Normal and High calls still wait.
		results = append(results, acquireAsync(l, context.Background()))
		results = append(results, acquireAsync(l, WithPriority(context.Background(), High)))
		synctest.Wait()
		checkCounts(t, l, 1, 4)
		for _, r := range results {
			select {
			case err := <-r:
				t.Fatalf("a queued call returned %v early", err)
			default:
			}
		}

		for range results {
			l.Release()
			synctest.Wait()
		}
		for i, r := range results {
			if err := <-r; err != nil {
				t.Errorf("queued call %d: Acquire = %v, want nil", i, err)
			}
		}
		l.Release()
		checkCounts(t, l, 0, 0)
		s := l.Stats()
		if s.ShedQueueFull != 1 || s.ShedLow != 1 || s.Shed() != 1 {
			t.Errorf("Stats = %+v, want one queue-full Low shed", s)
		}
	})
}

func TestBackgroundNeverTakesReserve(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		l := mustNew(t, Options{Limit: 4, Reserve: 1})
		for i := range 3 {
			if !l.TryAcquireBackground() {
				t.Fatalf("TryAcquireBackground #%d = false with %d of 3 unreserved slots held", i+1, i)
			}
		}
		if l.TryAcquireBackground() {
			t.Fatal("TryAcquireBackground took a reserved slot")
		}
		if err := l.Acquire(context.Background()); err != nil {
			t.Fatalf("foreground Acquire of the reserved slot: %v", err)
		}
		// A foreground call now waits; background calls still return at once
		// (a background call that waited would deadlock this bubble).
		res := acquireAsync(l, context.Background())
		synctest.Wait()
		if l.TryAcquireBackground() {
			t.Fatal("TryAcquireBackground = true with every slot held")
		}
		checkCounts(t, l, 4, 1)

		l.Release() // to the waiting foreground call
		if err := <-res; err != nil {
			t.Fatal(err)
		}
		l.Release()
		checkCounts(t, l, 3, 0)
		if l.TryAcquireBackground() {
			t.Fatal("TryAcquireBackground = true with Limit-Reserve slots held")
		}
		l.Release()
		if !l.TryAcquireBackground() {
			t.Fatal("TryAcquireBackground = false with an unreserved slot free")
		}
		s := l.Stats()
		if s.ShedReserve != 3 || s.ShedBackground != 3 || s.Shed() != 3 || s.ShedNormal != 0 {
			t.Errorf("Stats = %+v, want 3 reserve sheds, all background", s)
		}
	})
}

func TestBackgroundWithoutReserveTakesEverySlot(t *testing.T) {
	l := mustNew(t, Options{Limit: 2})
	for i := range 2 {
		if !l.TryAcquireBackground() {
			t.Fatalf("TryAcquireBackground #%d = false with Reserve 0 and a free slot", i+1)
		}
	}
	if l.TryAcquireBackground() {
		t.Fatal("TryAcquireBackground = true beyond Limit")
	}
	checkCounts(t, l, 2, 0)
}

func TestCancelWhileWaiting(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		l := mustNew(t, Options{Limit: 1, QueueTimeout: time.Minute})
		if err := l.Acquire(context.Background()); err != nil {
			t.Fatal(err)
		}
		cause := errors.New("client went away")
		ctx, cancel := context.WithCancelCause(context.Background())
		start := time.Now()
		res := acquireAsync(l, ctx)
		synctest.Wait()
		cancel(cause)
		synctest.Wait()
		var err error
		select {
		case err = <-res:
		default:
			t.Fatal("Acquire still waiting after its ctx was canceled")
		}
		if time.Since(start) != 0 {
			t.Errorf("Acquire returned %v after cancel, want at once", time.Since(start))
		}
		if !errors.Is(err, context.Canceled) || !errors.Is(err, cause) {
			t.Errorf("Acquire = %v, want it to wrap context.Canceled and the cause", err)
		}
		if errors.Is(err, ErrOverloaded) {
			t.Errorf("Acquire = %v, a canceled call is not overloaded", err)
		}
		checkCounts(t, l, 1, 0)
		l.Release()
		checkCounts(t, l, 0, 0)
		// No slot leaked: the whole capacity is available.
		if err := l.Acquire(context.Background()); err != nil {
			t.Fatal(err)
		}
		l.Release()
		if s := l.Stats(); s.Canceled != 1 || s.Shed() != 0 {
			t.Errorf("Stats = %+v, want Canceled 1 and nothing shed", s)
		}
	})
}

func TestDeadlineBeforeQueueTimeout(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		l := mustNew(t, Options{Limit: 1, QueueTimeout: time.Second})
		if err := l.Acquire(context.Background()); err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
		defer cancel()
		start := time.Now()
		err := l.Acquire(ctx)
		if !errors.Is(err, context.DeadlineExceeded) || errors.Is(err, ErrOverloaded) {
			t.Errorf("Acquire = %v, want context.DeadlineExceeded", err)
		}
		if d := time.Since(start); d != 100*time.Millisecond {
			t.Errorf("Acquire returned after %v, want 100ms", d)
		}
		checkCounts(t, l, 1, 0)
		l.Release()
	})
}

func TestAcquireWithDoneContext(t *testing.T) {
	l := mustNew(t, Options{Limit: 1})
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := l.Acquire(ctx); !errors.Is(err, context.Canceled) {
		t.Errorf("Acquire(done ctx) = %v, want context.Canceled", err)
	}
	checkCounts(t, l, 0, 0)
}

// TestTimeoutReleaseRace makes a slot arrive after the queue timeout fired but
// before the waiter leaves the queue: the waiter must keep that slot.
func TestTimeoutReleaseRace(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		l := mustNew(t, Options{Limit: 1, QueueTimeout: time.Second})
		if err := l.Acquire(context.Background()); err != nil {
			t.Fatal(err)
		}
		l.testHookWaitEnded = l.Release
		if err := l.Acquire(context.Background()); err != nil {
			t.Fatalf("Acquire = %v, want the slot released during its timeout", err)
		}
		checkCounts(t, l, 1, 0)
		l.Release()
		checkCounts(t, l, 0, 0)
		if s := l.Stats(); s.Acquired != 2 || s.Shed() != 0 {
			t.Errorf("Stats = %+v, want Acquired 2 and nothing shed", s)
		}
	})
}

// TestCancelReleaseRace makes a slot arrive after the waiter's ctx ended but
// before it leaves the queue: the slot must pass to the next waiter.
func TestCancelReleaseRace(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		l := mustNew(t, Options{Limit: 1})
		if err := l.Acquire(context.Background()); err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		first := acquireAsync(l, ctx)
		synctest.Wait()
		second := acquireAsync(l, context.Background())
		synctest.Wait()
		l.testHookWaitEnded = l.Release
		cancel()
		if err := <-first; !errors.Is(err, context.Canceled) {
			t.Fatalf("canceled Acquire = %v, want context.Canceled", err)
		}
		synctest.Wait()
		select {
		case err := <-second:
			if err != nil {
				t.Fatalf("next waiter: Acquire = %v, want nil", err)
			}
		default:
			t.Fatal("the slot given to the canceled waiter did not pass to the next one")
		}
		checkCounts(t, l, 1, 0)
		l.Release()
		checkCounts(t, l, 0, 0)
	})
}

// TestTimeoutReleaseRaceRepeated releases a slot at about the moment a
// waiter's queue timeout fires, many times over, on real goroutines: the slot
// must end with exactly one party each time.
func TestTimeoutReleaseRaceRepeated(t *testing.T) {
	l := mustNew(t, Options{Limit: 1, QueueTimeout: 5 * time.Microsecond})
	var got, shed int
	for i := range 3000 {
		if err := l.Acquire(context.Background()); err != nil {
			t.Fatal(err)
		}
		res := acquireAsync(l, context.Background())
		for range i % 7 {
			runtime.Gosched()
		}
		l.Release()
		switch err := <-res; {
		case err == nil:
			got++
			l.Release()
		case errors.Is(err, ErrOverloaded):
			shed++
		default:
			t.Fatalf("Acquire = %v", err)
		}
		if l.InUse() != 0 || l.Waiting() != 0 {
			t.Fatalf("round %d: InUse %d, Waiting %d; want 0, 0", i, l.InUse(), l.Waiting())
		}
	}
	if s := l.Stats(); s.Acquired != uint64(3000+got) || s.ShedQueueTimeout != uint64(shed) {
		t.Errorf("Stats = %+v, want Acquired %d and ShedQueueTimeout %d", s, 3000+got, shed)
	}
	t.Logf("3000 rounds: the waiter got the slot %d times, timed out %d times", got, shed)
}

// TestRaceStress runs acquirers with tiny queue timeouts and random
// cancellation against each other on real goroutines, many times, and checks
// that every slot is accounted for.
func TestRaceStress(t *testing.T) {
	const (
		limit   = 2
		workers = 8
		rounds  = 2000
	)
	l := mustNew(t, Options{Limit: limit, QueueTimeout: 100 * time.Microsecond, MaxQueue: 4})
	var (
		m                         maxTracker
		ok, shed, canceled, total atomic.Uint64
		wg                        sync.WaitGroup
	)
	for w := range workers {
		wg.Go(func() {
			r := rand.New(rand.NewPCG(uint64(w), 1))
			for range rounds {
				total.Add(1)
				if r.IntN(4) == 0 {
					if l.TryAcquireBackground() {
						ok.Add(1)
						m.enter()
						m.leave()
						l.Release()
					}
					continue
				}
				ctx, cancel := context.WithCancel(WithPriority(context.Background(), Priority(r.IntN(3)-1)))
				if r.IntN(3) == 0 {
					go cancel()
				}
				err := l.Acquire(ctx)
				cancel()
				switch {
				case err == nil:
					ok.Add(1)
					m.enter()
					runtime.Gosched()
					m.leave()
					l.Release()
				case errors.Is(err, ErrOverloaded):
					shed.Add(1)
				case errors.Is(err, context.Canceled):
					canceled.Add(1)
				default:
					t.Errorf("Acquire = %v", err)
				}
			}
		})
	}
	wg.Wait()
	checkCounts(t, l, 0, 0)
	if got := m.max.Load(); got > limit {
		t.Errorf("max concurrent = %d, above the limit %d", got, limit)
	}
	s := l.Stats()
	if s.Acquired != ok.Load() {
		t.Errorf("Stats.Acquired = %d, but %d calls got a slot", s.Acquired, ok.Load())
	}
	if s.Shed() < shed.Load() || s.ShedQueueTimeout+s.ShedQueueFull != shed.Load() {
		t.Errorf("Stats = %+v, but %d foreground calls were shed", s, shed.Load())
	}
	if s.Canceled != canceled.Load() {
		t.Errorf("Stats.Canceled = %d, but %d calls were canceled", s.Canceled, canceled.Load())
	}
	if s.Acquired+s.Shed()+s.Canceled != total.Load() {
		t.Errorf("Stats = %+v account for %d calls, want %d", s, s.Acquired+s.Shed()+s.Canceled, total.Load())
	}
	t.Logf("%d calls: %d acquired, %d shed (%d queue-timeout), %d canceled",
		total.Load(), s.Acquired, s.Shed(), s.ShedQueueTimeout, s.Canceled)
}

func TestStats(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		l := mustNew(t, Options{Limit: 2, Reserve: 1, QueueTimeout: time.Second, MaxQueue: 1})
		bg := context.Background()
		if err := l.Acquire(bg); err != nil { // 1 in use
			t.Fatal(err)
		}
		if l.TryAcquireBackground() { // shed: reserve
			t.Fatal("background took the reserved slot")
		}
		if err := l.Acquire(bg); err != nil { // 2 in use
			t.Fatal(err)
		}
		// A Normal call that waits 250ms and gets a slot.
		granted := acquireAsync(l, bg)
		time.Sleep(250 * time.Millisecond)
		synctest.Wait()
		// Queue full: a Low call is shed at once.
		if err := l.Acquire(WithPriority(bg, Low)); !errors.Is(err, ErrOverloaded) {
			t.Fatalf("Low Acquire = %v, want ErrOverloaded", err)
		}
		l.Release()
		if err := <-granted; err != nil {
			t.Fatal(err)
		}
		// A High call that times out after 1s.
		if err := l.Acquire(WithPriority(bg, High)); !errors.Is(err, ErrOverloaded) {
			t.Fatalf("High Acquire = %v, want ErrOverloaded", err)
		}
		// A call canceled after 100ms.
		ctx, cancel := context.WithTimeout(bg, 100*time.Millisecond)
		defer cancel()
		if err := l.Acquire(ctx); !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("Acquire = %v, want DeadlineExceeded", err)
		}
		l.Release()
		l.Release()

		want := Stats{
			Acquired:         3,
			ShedQueueTimeout: 1,
			ShedQueueFull:    1,
			ShedReserve:      1,
			ShedLow:          1,
			ShedHigh:         1,
			ShedBackground:   1,
			Canceled:         1,
			QueueWait:        250*time.Millisecond + time.Second + 100*time.Millisecond,
			QueueWaits:       3,
			MaxInUse:         2,
		}
		if got := l.Stats(); got != want {
			t.Errorf("Stats() = %+v\nwant      %+v", got, want)
		}
		if got := l.Stats().Shed(); got != 3 {
			t.Errorf("Shed() = %d, want 3", got)
		}
	})
}

func TestOptionsValidation(t *testing.T) {
	tests := []struct {
		name string
		o    Options
		want string // substring of the error; empty for valid options
	}{
		{"zero limit", Options{}, "Limit is 0"},
		{"negative limit", Options{Limit: -3}, "Limit is -3"},
		{"negative reserve", Options{Limit: 2, Reserve: -1}, "Reserve is -1"},
		{"reserve equal to limit", Options{Limit: 2, Reserve: 2}, "must be below Limit"},
		{"reserve above limit", Options{Limit: 2, Reserve: 5}, "must be below Limit"},
		{"negative queue timeout", Options{Limit: 1, QueueTimeout: -time.Second}, "QueueTimeout is -1s"},
		{"negative max queue", Options{Limit: 1, MaxQueue: -1}, "MaxQueue is -1"},
		{"minimal", Options{Limit: 1}, ""},
		{"full", Options{Limit: 10, Reserve: 9, QueueTimeout: time.Millisecond, MaxQueue: 1}, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			l, err := New(tt.o)
			if tt.want == "" {
				if err != nil || l == nil {
					t.Fatalf("New(%+v) = %v, %v; want a limiter", tt.o, l, err)
				}
				if l.Limit() != tt.o.Limit {
					t.Errorf("Limit() = %d, want %d", l.Limit(), tt.o.Limit)
				}
				return
			}
			if err == nil || l != nil {
				t.Fatalf("New(%+v) = %v, %v; want an error", tt.o, l, err)
			}
			if !strings.HasPrefix(err.Error(), "limiter: ") || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("New(%+v) error = %q, want prefix %q containing %q", tt.o, err, "limiter: ", tt.want)
			}
		})
	}
}

func TestDefaultOptions(t *testing.T) {
	tests := []struct {
		limit, reserve, maxQueue int
	}{
		{1, 0, 4},
		{2, 1, 8},
		{3, 1, 12},
		{4, 1, 16},
		{8, 2, 32},
		{100, 25, 400},
	}
	for _, tt := range tests {
		o := DefaultOptions(tt.limit)
		want := Options{Limit: tt.limit, Reserve: tt.reserve, QueueTimeout: time.Second, MaxQueue: tt.maxQueue}
		if o != want {
			t.Errorf("DefaultOptions(%d) = %+v, want %+v", tt.limit, o, want)
		}
		if _, err := New(o); err != nil {
			t.Errorf("New(DefaultOptions(%d)): %v", tt.limit, err)
		}
	}
	if _, err := New(DefaultOptions(0)); err == nil {
		t.Error("New(DefaultOptions(0)) succeeded, want an error")
	}
}

func TestPriorityFromContext(t *testing.T) {
	bg := context.Background()
	if p := PriorityFrom(bg); p != Normal {
		t.Errorf("PriorityFrom(no priority) = %v, want normal", p)
	}
	for _, tt := range []struct{ in, want Priority }{
		{Low, Low}, {Normal, Normal}, {High, High}, {-100, Low}, {7, High},
	} {
		if got := PriorityFrom(WithPriority(bg, tt.in)); got != tt.want {
			t.Errorf("PriorityFrom(WithPriority(%v)) = %v, want %v", tt.in, got, tt.want)
		}
	}
	ctx := WithPriority(context.WithValue(bg, struct{ k int }{}, 1), High)
	ctx = context.WithValue(ctx, struct{ k string }{}, "x")
	var sink Priority
	if n := testing.AllocsPerRun(100, func() { sink = PriorityFrom(ctx) }); n != 0 {
		t.Errorf("PriorityFrom allocates %v times per call", n)
	}
	if sink != High {
		t.Errorf("PriorityFrom through other values = %v, want high", sink)
	}
}

func TestPriorityString(t *testing.T) {
	for p, want := range map[Priority]string{Low: "low", Normal: "normal", High: "high", 5: "priority(5)"} {
		if got := p.String(); got != want {
			t.Errorf("Priority(%d).String() = %q, want %q", int8(p), got, want)
		}
	}
}

func TestOverloadError(t *testing.T) {
	fg := &OverloadError{Reason: ReasonQueueTimeout, Priority: Low, RetryAfter: time.Second}
	wrapped := fmt.Errorf("loading user 7: %w", fg)
	if !errors.Is(wrapped, ErrOverloaded) {
		t.Error("errors.Is(wrapped *OverloadError, ErrOverloaded) = false")
	}
	if errors.Is(wrapped, context.Canceled) {
		t.Error("*OverloadError matches context.Canceled")
	}
	if got, want := fg.Error(), "limiter: overloaded: queue-timeout (priority low)"; got != want {
		t.Errorf("Error() = %q, want %q", got, want)
	}
	bg := &OverloadError{Reason: ReasonReserve, Background: true}
	if got, want := bg.Error(), "limiter: overloaded: reserve (background)"; got != want {
		t.Errorf("Error() = %q, want %q", got, want)
	}
}

func TestRetryAfterWithoutQueueTimeout(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		l := mustNew(t, Options{Limit: 1, MaxQueue: 1})
		if err := l.Acquire(context.Background()); err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		res := acquireAsync(l, ctx)
		synctest.Wait()
		err := l.Acquire(WithPriority(context.Background(), Low))
		var oe *OverloadError
		if !errors.As(err, &oe) || oe.RetryAfter != time.Second {
			t.Errorf("Acquire = %#v, want an *OverloadError with RetryAfter 1s", err)
		}
		cancel()
		<-res
		l.Release()
		checkCounts(t, l, 0, 0)
	})
}

func TestReleaseWithoutSlotPanics(t *testing.T) {
	l := mustNew(t, Options{Limit: 1})
	defer func() {
		r := recover()
		if s, _ := r.(string); !strings.HasPrefix(s, "limiter: ") {
			t.Errorf("Release without a slot: recovered %v, want a limiter panic", r)
		}
		checkCounts(t, l, 0, 0)
	}()
	l.Release()
}
