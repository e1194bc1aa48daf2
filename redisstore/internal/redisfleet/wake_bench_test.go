package redisfleet_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/herdcache/herd"
	"github.com/herdcache/herd/redisstore/internal/redistest"
)

var wakeKeys atomic.Int64

// BenchmarkLoserWake measures how long a replica waiting for another
// replica's load takes to get the value once that load returned: woken by
// herd's completion notice (impl=push) against re-reading Redis every 50ms
// (impl=poll50ms), as a lock-and-poll cache does. It reports the median and
// p99 delay.
func BenchmarkLoserWake(b *testing.B) {
	node := redistest.Server(b)
	for _, impl := range []string{"push", "poll50ms"} {
		b.Run("impl="+impl, func(b *testing.B) {
			rs := fleet(b, 2, func() redis.UniversalClient { return node.Client() }, nil)
			a, l := rs[0], rs[1]
			ctx := context.Background()
			var delays []time.Duration
			for b.Loop() {
				key := herd.Key("wake", impl, fmt.Sprint(wakeKeys.Add(1))) // new in every run of the benchmark
				entered, release := make(chan struct{}), make(chan struct{})
				var returned atomic.Int64
				done := make(chan error, 1)
				go func() {
					_, err := a.cache.Get(ctx, key, func(ctx context.Context) (string, error) {
						close(entered)
						<-release
						returned.Store(time.Now().UnixNano())
						return "v", nil
					})
					done <- err
				}()
				<-entered // a holds the lease
				got := make(chan time.Time, 1)
				go func() {
					switch impl {
					case "push":
						if _, err := l.cache.Get(ctx, key, nil, herd.WithLoserPolicy(herd.Wait)); err != nil {
							b.Error(err)
						}
					default:
						for {
							env, err := l.remote.Load(ctx, key)
							if err != nil {
								b.Error(err)
								break
							}
							if env != nil {
								break
							}
							time.Sleep(50 * time.Millisecond) // the polling being measured
						}
					}
					got <- time.Now()
				}()
				// Let the loser start waiting, then finish the load at a random
				// point of the polling period (part of the scenario, not of the
				// measure).
				time.Sleep(5*time.Millisecond + time.Duration(rand.Int64N(int64(50*time.Millisecond))))
				close(release)
				t1 := <-got
				if err := <-done; err != nil {
					b.Fatal(err)
				}
				delays = append(delays, time.Duration(t1.UnixNano()-returned.Load()))
			}
			slices.Sort(delays)
			b.ReportMetric(float64(delays[len(delays)/2].Microseconds()), "median-µs")
			b.ReportMetric(float64(delays[len(delays)*99/100].Microseconds()), "p99-µs")
		})
	}
}
