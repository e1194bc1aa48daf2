package flight

import (
	"context"
	"runtime"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"

	"golang.org/x/sync/singleflight"
)

// The benchmarks compare Group with golang.org/x/sync/singleflight, the
// standard alternative. With a context that can never end they compare
// Group.Do with singleflight's Do; with a cancellable context they compare
// Group.Do with singleflight's DoChan plus a select on ctx.Done(), which is
// how a singleflight user honours a context. Sub-benchmark names put the
// implementation in impl= so that `benchstat -col /impl` sets them side by
// side.

type benchValue struct{ n int }

var benchResult = &benchValue{n: 42}

func benchKeys(n int) []string {
	keys := make([]string, n)
	for i := range keys {
		keys[i] = "key-" + strconv.Itoa(i)
	}
	return keys
}

// benchCtx returns the context a sub-benchmark uses, built once outside the
// timed loop.
func benchCtx(b *testing.B, kind string) context.Context {
	if kind == "background" {
		return context.Background()
	}
	ctx, cancel := context.WithCancel(context.Background())
	b.Cleanup(cancel)
	return ctx
}

// xsyncDo is what a singleflight user writes: Do when ctx cannot end,
// DoChan and a select when it can.
func xsyncDo(ctx context.Context, g *singleflight.Group, key string, fn func() (any, error)) (any, error) {
	done := ctx.Done()
	if done == nil {
		v, err, _ := g.Do(key, fn)
		return v, err
	}
	select {
	case r := <-g.DoChan(key, fn):
		return r.Val, r.Err
	case <-done:
		return nil, ctx.Err()
	}
}

var ctxKinds = []string{"background", "cancel"}

// BenchmarkDistinct: one goroutine, a new key every call, so every call
// starts and finishes a flight.
func BenchmarkDistinct(b *testing.B) {
	keys := benchKeys(1024)
	for _, kind := range ctxKinds {
		b.Run("impl=herd/ctx="+kind, func(b *testing.B) {
			ctx := benchCtx(b, kind)
			var g Group[string, *benchValue]
			fn := func(context.Context) (*benchValue, error) { return benchResult, nil }
			b.ReportAllocs()
			i := 0
			for b.Loop() {
				if v, _, _ := g.Do(ctx, keys[i&1023], fn); v != benchResult {
					b.Fatal("wrong value")
				}
				i++
			}
		})
		b.Run("impl=xsync/ctx="+kind, func(b *testing.B) {
			ctx := benchCtx(b, kind)
			var g singleflight.Group
			fn := func() (any, error) { return benchResult, nil }
			b.ReportAllocs()
			i := 0
			for b.Loop() {
				if v, _ := xsyncDo(ctx, &g, keys[i&1023], fn); v != benchResult {
					b.Fatal("wrong value")
				}
				i++
			}
		})
	}
}

const herdSize = 1000

// runHerd makes herdSize goroutines call do for one key at once, round
// after round, until b.N calls have been made, so ns/op and allocs/op are
// per call. The goroutines are started before the timer. The function of
// a flight waits until every goroutine of its round has arrived at do and
// then yields a while, so that they really join it; the flights/round
// metric shows how well that worked (1 is perfect).
func runHerd(b *testing.B, do func(gate func()) bool) {
	var (
		arrived atomic.Int64
		flights atomic.Int64
		target  atomic.Int64
	)
	gate := func() {
		flights.Add(1)
		for arrived.Load() < target.Load() {
			runtime.Gosched()
		}
		for range 100 {
			runtime.Gosched()
		}
	}
	rounds := (b.N + herdSize - 1) / herdSize
	starts := make([]chan struct{}, rounds)
	for i := range starts {
		starts[i] = make(chan struct{})
	}
	var wg sync.WaitGroup
	for w := range herdSize {
		go func() {
			for r, start := range starts {
				<-start
				if r*herdSize+w < b.N {
					arrived.Add(1)
					if !do(gate) {
						b.Error("wrong value")
					}
				}
				wg.Done()
			}
		}()
	}
	b.ReportAllocs()
	b.ResetTimer()
	for r, start := range starts {
		target.Store(int64(min(herdSize, b.N-r*herdSize)))
		arrived.Store(0)
		wg.Add(herdSize)
		close(start)
		wg.Wait()
	}
	b.StopTimer()
	b.ReportMetric(float64(flights.Load())/float64(rounds), "flights/round")
}

// BenchmarkHerd: 1,000 goroutines call for one key at once; per call.
func BenchmarkHerd(b *testing.B) {
	for _, kind := range ctxKinds {
		b.Run("impl=herd/ctx="+kind, func(b *testing.B) {
			ctx := benchCtx(b, kind)
			var g Group[string, *benchValue]
			runHerd(b, func(gate func()) bool {
				v, _, _ := g.Do(ctx, "hot", func(context.Context) (*benchValue, error) {
					gate()
					return benchResult, nil
				})
				return v == benchResult
			})
		})
		b.Run("impl=xsync/ctx="+kind, func(b *testing.B) {
			ctx := benchCtx(b, kind)
			var g singleflight.Group
			runHerd(b, func(gate func()) bool {
				v, _ := xsyncDo(ctx, &g, "hot", func() (any, error) {
					gate()
					return benchResult, nil
				})
				return v == benchResult
			})
		})
	}
}

// BenchmarkParallel: b.RunParallel over many keys, so calls both start
// flights and join them.
func BenchmarkParallel(b *testing.B) {
	keys := benchKeys(4096)
	for _, kind := range ctxKinds {
		b.Run("impl=herd/ctx="+kind, func(b *testing.B) {
			ctx := benchCtx(b, kind)
			var g Group[string, *benchValue]
			fn := func(context.Context) (*benchValue, error) { return benchResult, nil }
			var seed atomic.Int64
			b.ReportAllocs()
			b.RunParallel(func(pb *testing.PB) {
				i := int(seed.Add(977))
				for pb.Next() {
					if v, _, _ := g.Do(ctx, keys[i&4095], fn); v != benchResult {
						b.Error("wrong value")
					}
					i++
				}
			})
		})
		b.Run("impl=xsync/ctx="+kind, func(b *testing.B) {
			ctx := benchCtx(b, kind)
			var g singleflight.Group
			fn := func() (any, error) { return benchResult, nil }
			var seed atomic.Int64
			b.ReportAllocs()
			b.RunParallel(func(pb *testing.PB) {
				i := int(seed.Add(977))
				for pb.Next() {
					if v, _ := xsyncDo(ctx, &g, keys[i&4095], fn); v != benchResult {
						b.Error("wrong value")
					}
					i++
				}
			})
		})
	}
}
