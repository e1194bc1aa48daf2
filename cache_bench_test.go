package herd_test

import (
	"context"

	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/maypok86/otter/v2"
	"slices"

	"github.com/herdcache/herd"
)

type benchStruct struct {
	ID    int
	Name  string
	Score float64
}

var (
	loadString = func(ctx context.Context) (string, error) { return "value", nil }
	loadStruct = func(ctx context.Context) (benchStruct, error) { return benchStruct{1, "x", 2}, nil }
)

const benchKeys = 1024

func benchKeyList(n int) []string {
	keys := make([]string, n)
	for i := range keys {
		keys[i] = herd.Key("bench", strconv.Itoa(i))
	}
	return keys
}

// benchHit compares a fresh hit in herd (Get, and GetIfPresent) with
// otter's GetIfPresent under the same expiry policy, for one value type and n present keys: otter with its
// default (precise) clock, and with a CoarseClock of 1ms, the resolution
// herd's hit clock takes for these TTLs.
func benchHit[V any](b *testing.B, load herd.LoadFunc[V], v V, n int) {
	keys := benchKeyList(n)
	ctx := context.Background()
	opts := &herd.Options[V]{MaxEntries: 2 * benchKeys, SoftTTL: time.Hour, HardTTL: 2 * time.Hour, Beta: 1}
	c := herd.Must(herd.New(opts))
	defer c.Close(ctx)
	for _, k := range keys {
		if _, err := c.Get(ctx, k, load); err != nil {
			b.Fatal(err)
		}
	}
	coarse := otter.NewCoarseClock(time.Millisecond)
	defer coarse.Stop()
	impls := []struct {
		name string
		get  func(key string) bool
	}{
		{"herd", func(key string) bool { _, err := c.Get(ctx, key, load); return err == nil }},
		{"herd-GetIfPresent", func(key string) bool { _, ok := c.GetIfPresent(key); return ok }},
	}
	for _, o := range []struct {
		name  string
		clock otter.Clock
	}{{"otter", nil}, {"otter-coarse", coarse}} {
		oc := otter.Must(&otter.Options[string, V]{
			MaximumSize:      2 * benchKeys,
			ExpiryCalculator: otter.ExpiryWriting[string, V](2 * time.Hour),
			Clock:            o.clock,
		})
		for _, k := range keys {
			oc.Set(k, v)
		}
		impls = append(impls, struct {
			name string
			get  func(key string) bool
		}{o.name, func(key string) bool { _, ok := oc.GetIfPresent(key); return ok }})
	}
	var seed atomic.Int64
	for _, impl := range impls {
		b.Run("impl="+impl.name+"/goroutines=1", func(b *testing.B) {
			b.ReportAllocs()
			i := 0
			for b.Loop() {
				if !impl.get(keys[i%n]) {
					b.Fatal("miss")
				}
				i++
			}
		})
		b.Run("impl="+impl.name+"/goroutines=parallel", func(b *testing.B) {
			b.ReportAllocs()
			b.RunParallel(func(pb *testing.PB) {
				i := int(seed.Add(7919))
				for pb.Next() {
					if !impl.get(keys[i%n]) {
						b.Error("miss")
						return
					}
					i++
				}
			})
		})
	}
}

func BenchmarkHit(b *testing.B) {
	for _, n := range []int{1, benchKeys} {
		keys := "/keys=" + strconv.Itoa(n)
		b.Run("value=string"+keys, func(b *testing.B) { benchHit(b, loadString, "value", n) })
		b.Run("value=struct"+keys, func(b *testing.B) { benchHit(b, loadStruct, benchStruct{1, "x", 2}, n) })
	}
}

// BenchmarkHotKeyExpiry has 1,000 goroutines miss one key at once while its
// load takes 1ms, and reports the loads per expiry (must be 1) and the p99
// wait of the callers.
func BenchmarkHotKeyExpiry(b *testing.B) {
	const callers = 1000
	ctx := context.Background()
	c := herd.Must(herd.New(&herd.Options[string]{MaxEntries: 16, SoftTTL: time.Hour}))
	defer c.Close(ctx)
	var loads atomic.Int64
	load := func(ctx context.Context) (string, error) {
		loads.Add(1)
		time.Sleep(time.Millisecond)
		return "v", nil
	}
	waits := make([]time.Duration, 0, callers*b.N)
	var mu sync.Mutex
	key := herd.Key("hot")
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if err := c.Invalidate(ctx, key); err != nil {
			b.Fatal(err)
		}
		var wg sync.WaitGroup
		start := make(chan struct{})
		for range callers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-start
				t0 := time.Now()
				if _, err := c.Get(ctx, key, load); err != nil {
					b.Error(err)
				}
				d := time.Since(t0)
				mu.Lock()
				waits = append(waits, d)
				mu.Unlock()
			}()
		}
		close(start)
		wg.Wait()
	}
	b.StopTimer()
	b.ReportMetric(float64(loads.Load())/float64(b.N), "loads/expiry")
	b.ReportMetric(float64(percentile(waits, 0.99).Microseconds()), "p99-wait-µs")
}

func percentile(d []time.Duration, p float64) time.Duration {
	if len(d) == 0 {
		return 0
	}
	s := append([]time.Duration(nil), d...)
	slices.Sort(s)
	return s[min(len(s)-1, int(p*float64(len(s))))]
}

// BenchmarkHitStats measures what counting costs on the hit path: nothing
// counted (DisableStats), the exact counters of Stats, and the counters plus
// hot-key tracking.
func BenchmarkHitStats(b *testing.B) {
	keys := benchKeyList(benchKeys)
	ctx := context.Background()
	for _, level := range []string{"off", "counters", "hotkeys"} {
		opts := &herd.Options[string]{MaxEntries: 2 * benchKeys, SoftTTL: time.Hour, Beta: 1}
		switch level {
		case "off":
			opts.DisableStats = true
		case "hotkeys":
			opts.HotKeys = 20
		}
		c := herd.Must(herd.New(opts))
		for _, k := range keys {
			if _, err := c.Get(ctx, k, loadString); err != nil {
				b.Fatal(err)
			}
		}
		b.Run("stats="+level+"/goroutines=1", func(b *testing.B) {
			b.ReportAllocs()
			i := 0
			for b.Loop() {
				c.Get(ctx, keys[i%benchKeys], loadString)
				i++
			}
		})
		b.Run("stats="+level+"/goroutines=parallel", func(b *testing.B) {
			b.ReportAllocs()
			var seed atomic.Int64
			b.RunParallel(func(pb *testing.PB) {
				i := int(seed.Add(7919))
				for pb.Next() {
					c.Get(ctx, keys[i%benchKeys], loadString)
					i++
				}
			})
		})
		c.Close(ctx)
	}
}
