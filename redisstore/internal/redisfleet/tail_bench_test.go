package redisfleet_test

import (
	"context"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/maypok86/otter/v2"
	"github.com/redis/go-redis/v9"

	"github.com/herdcache/herd"
	"github.com/herdcache/herd/observe"
	"github.com/herdcache/herd/redisstore/internal/redistest"
)

// BenchmarkTailLatency measures what readers of one hot key wait, in the
// same open-loop harness, for herd (20 replicas over one redis-server,
// NearTTL 1s) and for otter with RefreshWriting (20 caches of its own, no
// shared tier). Each offers 50 Gets a second per replica for tailRun, with
// SoftTTL (otter: the refresh interval) 2s, a 10s hard TTL and a 250ms
// load, and reports the percentiles of every Get's latency, herd's Gets
// that waited on a Store read, and the loads per TTL. It is one run per
// iteration: go test -run '^$' -bench TailLatency -benchtime 1x.
func BenchmarkTailLatency(b *testing.B) {
	const (
		replicas  = 20
		rate      = 50
		tailRun   = 6 * time.Second
		soft      = 2 * time.Second
		hard      = 10 * time.Second
		recompute = 250 * time.Millisecond
	)
	load := func(ctx context.Context) (string, error) {
		select {
		case <-time.After(recompute): // the database
		case <-ctx.Done():
			return "", ctx.Err()
		}
		return "v", nil
	}
	key := herd.Key("hot", "tail")

	b.Run("impl=herd", func(b *testing.B) {
		for b.Loop() {
			node := redistest.Server(b)
			cmds := &commandCount{}
			rs := fleet(b, replicas, func() redis.UniversalClient {
				c := node.Client()
				c.AddHook(cmds)
				return c
			}, func(o *herd.Options[string]) {
				o.SoftTTL, o.HardTTL = soft, hard
				o.NearTTL = time.Second
				o.Beta = 1
				o.OnLeaseHeld = herd.ServeStale
				o.RefreshBackoff = time.Second
			})
			gets := make([]func(context.Context) error, replicas)
			for i, r := range rs {
				gets[i] = func(ctx context.Context) error {
					_, err := r.cache.Get(ctx, key, func(ctx context.Context) (string, error) {
						loadsRun.add()
						return load(ctx)
					})
					return err
				}
			}
			loadsRun.reset()
			warm(b, gets)
			before := make([]observe.Stats, replicas)
			for i, r := range rs {
				before[i] = r.cache.Stats()
			}
			loadsRun.reset()
			cmds.n.Store(0)
			lat := openLoop(b, gets, rate, tailRun)
			sent := cmds.n.Load()
			var waited int64
			for i, r := range rs {
				waited += r.cache.Stats().RemoteWaits - before[i].RemoteWaits
			}
			report(b, lat, loadsRun.get(), tailRun, soft)
			b.ReportMetric(float64(waited), "redis-waits")
			b.ReportMetric(float64(sent)/float64(len(lat)), "redis-cmds/get")
		}
	})
	b.Run("impl=otter", func(b *testing.B) {
		for b.Loop() {
			loader := otter.LoaderFunc[string, string](func(ctx context.Context, _ string) (string, error) {
				loadsRun.add()
				return load(ctx)
			})
			gets := make([]func(context.Context) error, replicas)
			for i := range gets {
				c := otter.Must(&otter.Options[string, string]{
					MaximumSize:       1000,
					ExpiryCalculator:  otter.ExpiryWriting[string, string](hard),
					RefreshCalculator: otter.RefreshWriting[string, string](soft),
				})
				gets[i] = func(ctx context.Context) error {
					_, err := c.Get(ctx, key, loader)
					return err
				}
			}
			loadsRun.reset()
			warm(b, gets)
			loadsRun.reset()
			report(b, openLoop(b, gets, rate, tailRun), loadsRun.get(), tailRun, soft)
		}
	})
}

// loadsRun counts the loads of the implementation being measured.
var loadsRun counter

type counter struct {
	mu sync.Mutex
	n  int
}

func (c *counter) add()     { c.mu.Lock(); c.n++; c.mu.Unlock() }
func (c *counter) reset()   { c.mu.Lock(); c.n = 0; c.mu.Unlock() }
func (c *counter) get() int { c.mu.Lock(); defer c.mu.Unlock(); return c.n }

// warm makes each replica's first Get, so that the run starts with the value
// cached everywhere.
func warm(b *testing.B, gets []func(context.Context) error) {
	for i, get := range gets {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		err := get(ctx)
		cancel()
		if err != nil {
			b.Fatalf("warming replica %d: %v", i, err)
		}
	}
}

// openLoop offers rate Gets a second to each replica for d, each Get on a
// goroutine of its own, and returns every Get's latency.
func openLoop(b *testing.B, gets []func(context.Context) error, rate int, d time.Duration) []time.Duration {
	var (
		mu   sync.Mutex
		lat  = make([]time.Duration, 0, len(gets)*rate*int(d/time.Second+1))
		wg   sync.WaitGroup
		errs int
	)
	ticks := int(d / (time.Second / time.Duration(rate)))
	for _, get := range gets {
		wg.Add(1)
		go func() {
			defer wg.Done()
			tick := time.NewTicker(time.Second / time.Duration(rate))
			defer tick.Stop()
			var inner sync.WaitGroup
			for range ticks {
				<-tick.C
				inner.Add(1)
				go func() {
					defer inner.Done()
					ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
					defer cancel()
					start := time.Now()
					err := get(ctx)
					took := time.Since(start)
					mu.Lock()
					lat = append(lat, took)
					if err != nil {
						errs++
					}
					mu.Unlock()
				}()
			}
			inner.Wait()
		}()
	}
	wg.Wait()
	if errs > 0 {
		b.Errorf("%d of %d Gets failed", errs, len(lat))
	}
	return lat
}

// report sorts lat and reports its percentiles in microseconds, and the
// loads per TTL over the run.
func report(b *testing.B, lat []time.Duration, loads int, run, ttl time.Duration) {
	if len(lat) == 0 {
		b.Fatal("no Get measured")
	}
	slices.Sort(lat)
	at := func(q float64) float64 {
		return float64(lat[min(len(lat)-1, int(q*float64(len(lat))))]) / float64(time.Microsecond)
	}
	b.ReportMetric(at(0.50), "p50-µs")
	b.ReportMetric(at(0.99), "p99-µs")
	b.ReportMetric(at(0.999), "p999-µs")
	b.ReportMetric(float64(lat[len(lat)-1])/float64(time.Microsecond), "max-µs")
	b.ReportMetric(float64(loads)/(float64(run)/float64(ttl)), "loads/TTL")
	b.ReportMetric(float64(len(lat)), "gets")
}

// commandCount is a go-redis hook that counts the commands its clients
// send, each command of a pipeline counted: the Redis traffic a fleet makes.
type commandCount struct{ n atomic.Int64 }

func (*commandCount) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h *commandCount) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		h.n.Add(1)
		return next(ctx, cmd)
	}
}

func (h *commandCount) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		h.n.Add(int64(len(cmds)))
		return next(ctx, cmds)
	}
}
