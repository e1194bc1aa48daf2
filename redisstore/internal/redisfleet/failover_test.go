package redisfleet_test

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/herdcache/herd"
	"github.com/herdcache/herd/redisstore"
	"github.com/herdcache/herd/redisstore/internal/redistest"
)

// The shape of a failover run: writerCaches herd caches, each with its own
// failover client and Remote, and writersPerCache goroutines on each, every
// goroutine changing its own keysPerWriter keys in turn.
const (
	writerCaches    = 2
	writersPerCache = 3
	keysPerWriter   = 8
	// progress is how many changes each writer must see succeed before the
	// failover, so that the failover happens under load.
	progress = 20
	// failoverAck is the AckTimeout of the runs that wait for a replica.
	failoverAck = 500 * time.Millisecond
)

// keyLog is what one writer knows of one key: the changes it made, in
// order, each numbered by version (a Set stores its version as the value).
type keyLog struct {
	// acked is the version of the last change that returned nil (0: none);
	// ackedSet tells a Set from an Invalidate.
	acked    int
	ackedSet bool
	// droppedSince is set when a change that returned an error, made after
	// acked, was an Invalidate: that one may have happened.
	droppedSince bool
	version      int
}

// outcome counts what a failover run did.
type outcome struct {
	acked, failed int // changes that returned nil, an error
	keys          int // keys with an acknowledged change
	lost          int // of those, keys that read older than it
}

// TestFailoverKeepsAcknowledgedChanges fails a Sentinel group over while
// herd caches Set and Invalidate through it with AckReplicas 1, by
// SENTINEL FAILOVER and by SIGKILL of the master (restarted, empty, once
// the replica is promoted, so that changes can be acknowledged again by
// the time the Sentinels make it a replica): afterwards every key
// reads as at least as new as its last change that returned nil, and no
// invalidated key reads a version from before its invalidation.
func TestFailoverKeepsAcknowledgedChanges(t *testing.T) {
	t.Parallel()
	for name, fail := range map[string]func(*redistest.SentinelGroup){
		"SentinelFailover": func(g *redistest.SentinelGroup) { g.Failover() },
		"KillMaster": func(g *redistest.SentinelGroup) {
			old := g.Master()
			old.Kill()
			g.AwaitPromotion(old)
		},
	} {
		t.Run(name, func(t *testing.T) {
			o := failoverRun(t, redistest.Sentinel(t), 1, fail)
			t.Logf("AckReplicas 1: %d changes acknowledged, %d failed; %d keys checked, %d lost their last acknowledged change", o.acked, o.failed, o.keys, o.lost)
			if o.lost != 0 {
				t.Errorf("%d of %d keys read older than their last acknowledged change", o.lost, o.keys)
			}
			if o.keys < writerCaches*writersPerCache*keysPerWriter {
				t.Errorf("%d keys had an acknowledged change, want all %d", o.keys, writerCaches*writersPerCache*keysPerWriter)
			}
		})
	}
}

// BenchmarkFailoverLoss counts the keys whose last change that returned
// nil a SENTINEL FAILOVER under load loses, without AckReplicas and with
// it (one fresh Sentinel group per iteration, about 15 s each).
func BenchmarkFailoverLoss(b *testing.B) {
	for _, ack := range []int{0, 1} {
		b.Run(fmt.Sprintf("AckReplicas=%d", ack), func(b *testing.B) {
			var sum outcome
			for range b.N {
				o := failoverRun(b, redistest.Sentinel(b), ack, func(g *redistest.SentinelGroup) { g.Failover() })
				b.Logf("AckReplicas %d: %d changes acknowledged, %d failed; %d keys checked, %d lost their last acknowledged change", ack, o.acked, o.failed, o.keys, o.lost)
				sum.acked += o.acked
				sum.failed += o.failed
				sum.keys += o.keys
				sum.lost += o.lost
			}
			n := float64(b.N)
			b.ReportMetric(float64(sum.lost)/n, "lost-keys/failover")
			b.ReportMetric(float64(sum.failed)/n, "failed-changes/failover")
			b.ReportMetric(float64(sum.acked)/n, "acked-changes/failover")
		})
	}
}

// failoverRun starts the writers over g with AckReplicas ack, lets each
// make progress changes, calls fail, which returns once the Sentinels agree
// on the new master, stops the writers and reads every key through a new
// cache: the first read of each since the failover, before any later
// change could hide a lost one.
func failoverRun(t testing.TB, g *redistest.SentinelGroup, ack int, fail func(*redistest.SentinelGroup)) outcome {
	t.Helper()
	prefix := fmt.Sprintf("failover:%d:", ack)
	ctx, stop := context.WithCancel(context.Background())
	defer stop()
	var (
		wg       sync.WaitGroup
		logs     [][]keyLog
		counts   []*atomic.Int64
		outcomes = make([]outcome, writerCaches*writersPerCache)
	)
	for c := range writerCaches {
		cache := failoverCache(t, g, prefix, ack)
		for w := range writersPerCache {
			i := c*writersPerCache + w
			keys := make([]keyLog, keysPerWriter)
			logs = append(logs, keys)
			n := new(atomic.Int64)
			counts = append(counts, n)
			wg.Go(func() { write(ctx, cache, i, keys, n, &outcomes[i]) })
		}
	}
	deadline := time.Now().Add(time.Minute)
	for i, n := range counts {
		for n.Load() < progress {
			if time.Now().After(deadline) {
				stop()
				wg.Wait()
				t.Fatalf("writer %d had %d changes succeed, want %d within a minute", i, n.Load(), progress)
			}
			time.Sleep(10 * time.Millisecond) // polls the writers
		}
	}
	fail(g)
	stop()
	wg.Wait()

	var sum outcome
	for _, o := range outcomes {
		sum.acked += o.acked
		sum.failed += o.failed
	}
	reader := failoverCache(t, g, prefix, 0)
	for i, keys := range logs {
		for k, l := range keys {
			if l.acked == 0 {
				continue
			}
			sum.keys++
			got, err := reader.Get(context.Background(), writerKey(i, k), func(context.Context) (string, error) { return "", nil })
			if err != nil {
				t.Fatalf("reading %s after the failover: %v", writerKey(i, k), err)
			}
			if lostChange(l, got) {
				sum.lost++
				if ack == 0 {
					continue // expected: the caller reports the count
				}
				t.Logf("%s reads %q after the failover; its last acknowledged change was version %d (a Set: %v), and an Invalidate that failed since: %v",
					writerKey(i, k), got, l.acked, l.ackedSet, l.droppedSince)
			}
		}
	}
	return sum
}

// lostChange reports whether a key read as got (empty: absent) is older
// than the last acknowledged change that l records.
func lostChange(l keyLog, got string) bool {
	if got == "" {
		return l.ackedSet && !l.droppedSince // only an Invalidate since could have dropped it
	}
	v, err := strconv.Atoi(got)
	return err != nil || v < l.acked // an Invalidate's own version is never stored
}

// write changes keys, one after the other, until ctx ends: two Sets then
// an Invalidate, each under the key's next version, recording each
// outcome in keys and o and counting successes in n.
func write(ctx context.Context, cache *herd.Cache[string], writer int, keys []keyLog, n *atomic.Int64, o *outcome) {
	for i := 0; ctx.Err() == nil; i++ {
		k := i % len(keys)
		l := &keys[k]
		l.version++
		isSet := l.version%3 != 0
		var err error
		if isSet {
			err = cache.Set(ctx, writerKey(writer, k), strconv.Itoa(l.version))
		} else {
			err = cache.Invalidate(ctx, writerKey(writer, k))
		}
		switch {
		case ctx.Err() != nil:
			if !isSet {
				l.droppedSince = true // it may have reached Redis
			}
		case err != nil:
			o.failed++
			if !isSet {
				l.droppedSince = true
			}
		default:
			o.acked++
			n.Add(1)
			l.acked, l.ackedSet, l.droppedSince = l.version, isSet, false
		}
		time.Sleep(time.Millisecond) // paces the writer: the Sentinels need the CPU too
	}
}

func writerKey(writer, k int) string { return fmt.Sprintf("w%d:k%d", writer, k) }

// failoverCache returns a herd cache over its own failover client of g and
// a Remote that waits for ack replicas; both close when the test ends.
func failoverCache(t testing.TB, g *redistest.SentinelGroup, prefix string, ack int) *herd.Cache[string] {
	t.Helper()
	o := redisstore.Options{Client: g.Client(), Prefix: prefix, Timeout: 2 * time.Second, AckReplicas: ack}
	if ack > 0 {
		o.AckTimeout = failoverAck
	}
	r, err := redisstore.New(o)
	if err != nil {
		t.Fatal(err)
	}
	c, err := herd.New(&herd.Options[string]{
		NoNearCache:      true,
		MaxEntries:       1000,
		SoftTTL:          time.Hour,
		Store:            r,
		Lease:            r,
		LeaseTTL:         2 * time.Second,
		BreakerThreshold: 5,
		BreakerCooldown:  100 * time.Millisecond,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = c.Close(ctx)
		_ = r.Close()
	})
	return c
}

// Through a herd cache, a change that the frozen replica cannot
// acknowledge returns an error wrapping both herd.ErrDegraded and
// redisstore.ErrNotAcknowledged, within its deadline (Timeout plus
// AckTimeout) even for a script the master has not run before: the
// change waits for its replicas once. The wait for the acknowledgement is
// long enough for a running replica on a loaded machine to give it.
func TestAckFrozenReplicaThroughCache(t *testing.T) {
	t.Parallel()
	master := redistest.Server(t)
	replica := redistest.Replica(t, master)
	r, err := redisstore.New(redisstore.Options{Client: master.Client(), Prefix: "frozen:", Timeout: time.Second, AckReplicas: 1, AckTimeout: 1500 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = r.Close() })
	c, err := herd.New(&herd.Options[string]{NoNearCache: true, NoBreaker: true, MaxEntries: 10, SoftTTL: time.Hour, Store: r, Lease: r, LeaseTTL: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close(context.Background()) })
	ctx := t.Context()
	if err := c.Set(ctx, "k", "1"); err != nil {
		t.Fatalf("Set with the replica running: %v", err)
	}
	replica.Pause()
	t.Cleanup(replica.Resume)
	for name, err := range map[string]error{
		"Set":        c.Set(ctx, "k", "2"),
		"Invalidate": c.Invalidate(ctx, "k"),
	} {
		if !errors.Is(err, redisstore.ErrNotAcknowledged) || !errors.Is(err, herd.ErrDegraded) {
			t.Errorf("%s with the replica frozen: %v; want ErrDegraded and ErrNotAcknowledged", name, err)
		}
	}
}
