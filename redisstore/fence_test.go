package redisstore

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/herdcache/herd/redisstore/internal/redistest"
	"github.com/herdcache/herd/remote/envelope"
)

// shortFences lowers r's fence key TTLs to max(ttl, floor) + margin, so that
// a test can see fence keys expire. It must be called before r is used.
func shortFences(r *Remote, floor, margin time.Duration) {
	r.fenceFloor, r.fenceMargin = floor, margin
}

// gone polls until name no longer exists, within deadline.
func gone(t *testing.T, c redis.UniversalClient, name string) {
	t.Helper()
	ctx := t.Context()
	end := time.Now().Add(deadline)
	for {
		n, err := c.Exists(ctx, name).Result()
		if err != nil {
			t.Fatalf("EXISTS %q: %v", name, err)
		}
		if n == 0 {
			return
		}
		if time.Now().After(end) {
			t.Fatalf("%q still exists after %v", name, deadline)
		}
		time.Sleep(10 * time.Millisecond) // polling a real TTL: nothing to wait on
	}
}

// valueUnder checks that key holds the envelope of value written under fence.
func valueUnder(t *testing.T, r *Remote, key, value string, fence uint64) {
	t.Helper()
	b, err := r.Load(t.Context(), key)
	if err != nil {
		t.Fatalf("Load(%q): %v", key, err)
	}
	if value == "" {
		if b != nil {
			t.Fatalf("Load(%q) = %q, want nothing", key, b)
		}
		return
	}
	e, err := envelope.Decode(b)
	if err != nil || string(e.Value) != value || e.Fence != fence {
		t.Fatalf("Load(%q) = %+v, %v; want %q under fence %d", key, e, err, value, fence)
	}
}

// TestPausedHolderFenceExpired pauses a lease holder past its lease and its
// fence key's TTL: its late write is refused, whether the key was left alone
// (the fence key is gone and reads as 0) or another writer took the lease
// and wrote meanwhile (the fence key was made again, above the old fence).
func TestPausedHolderFenceExpired(t *testing.T) {
	t.Parallel()
	c := redistest.Server(t).Client()
	r := newRemote(t, c, Options{})
	shortFences(r, 200*time.Millisecond, 100*time.Millisecond)
	ctx := t.Context()

	for _, recreate := range []bool{false, true} {
		k := fmt.Sprintf("paused/recreated=%v", recreate)
		n := r.space.Names(k)
		paused, err := r.Acquire(ctx, k, 200*time.Millisecond, time.Time{})
		if err != nil || paused.Token == "" {
			t.Fatalf("Acquire = %+v, %v; want a lease", paused, err)
		}
		gone(t, c, n.Fence) // the lease, shorter, has gone too
		want, under := "", uint64(0)
		if recreate {
			g, err := r.Acquire(ctx, k, time.Minute, time.Time{})
			if err != nil || g.Token == "" {
				t.Fatalf("Acquire after the fence key expired = %+v, %v; want a lease", g, err)
			}
			if g.Fence <= paused.Fence {
				t.Fatalf("fence after the fence key expired = %d, not above the paused holder's %d", g.Fence, paused.Fence)
			}
			if ok, err := r.WriteRelease(ctx, k, fresh("new"), g.Fence, time.Minute, g.Token); !ok || err != nil {
				t.Fatalf("WriteRelease of the new holder = %v, %v; want true", ok, err)
			}
			want, under = "new", g.Fence
		}
		if ok, err := r.Write(ctx, k, fresh("late"), paused.Fence, time.Minute); ok || err != nil {
			t.Fatalf("recreated=%v: the paused holder's Write = %v, %v; want refused", recreate, ok, err)
		}
		if ok, err := r.WriteRelease(ctx, k, fresh("late"), paused.Fence, time.Minute, paused.Token); ok || err != nil {
			t.Fatalf("recreated=%v: the paused holder's WriteRelease = %v, %v; want refused", recreate, ok, err)
		}
		valueUnder(t, r, k, want, under)
	}
}

// TestPausedHolderFenceEvicted deletes the fence key under a lease holder,
// as an eviction would: its write is refused, whether the key was left
// alone, another writer Set it, or the lease was evicted too and another
// holder took it and wrote.
func TestPausedHolderFenceEvicted(t *testing.T) {
	t.Parallel()
	c := redistest.Server(t).Client()
	r := newRemote(t, c, Options{})
	ctx := t.Context()

	for _, then := range []string{"nothing", "Set", "Acquire"} {
		k := "evicted/" + then
		n := r.space.Names(k)
		paused, err := r.Acquire(ctx, k, time.Minute, time.Time{})
		if err != nil || paused.Token == "" {
			t.Fatalf("Acquire = %+v, %v; want a lease", paused, err)
		}
		evict := []string{n.Fence}
		if then == "Acquire" {
			evict = append(evict, n.Lease)
		}
		if err := c.Del(ctx, evict...).Err(); err != nil {
			t.Fatalf("DEL: %v", err)
		}
		want, under := "", uint64(0)
		switch then {
		case "Set":
			f, err := r.Set(ctx, k, fresh("set"), time.Minute)
			if err != nil || f <= paused.Fence {
				t.Fatalf("Set after the fence key was evicted = %d, %v; want a fence above %d", f, err, paused.Fence)
			}
			want, under = "set", f
		case "Acquire":
			g, err := r.Acquire(ctx, k, time.Minute, time.Time{})
			if err != nil || g.Token == "" || g.Fence <= paused.Fence {
				t.Fatalf("Acquire after fence and lease were evicted = %+v, %v; want a lease with a fence above %d", g, err, paused.Fence)
			}
			if ok, err := r.Write(ctx, k, fresh("new"), g.Fence, time.Minute); !ok || err != nil {
				t.Fatalf("Write of the new holder = %v, %v; want true", ok, err)
			}
			want, under = "new", g.Fence
		}
		if ok, err := r.Write(ctx, k, fresh("late"), paused.Fence, time.Minute); ok || err != nil {
			t.Fatalf("then %s: the paused holder's Write = %v, %v; want refused", then, ok, err)
		}
		valueUnder(t, r, k, want, under)
	}
}

// TestLongLoadExtended keeps a lease by Extend, as the cache's watchdog
// does, well past the fence key's TTL: the holder's write still succeeds.
func TestLongLoadExtended(t *testing.T) {
	t.Parallel()
	c := redistest.Server(t).Client()
	r := newRemote(t, c, Options{})
	const (
		lease    = 2 * time.Second // a stall this long would end the lease
		fenceTTL = lease + 100*time.Millisecond
	)
	shortFences(r, lease, fenceTTL-lease)
	ctx := t.Context()
	const k = "long"

	g, err := r.Acquire(ctx, k, lease, time.Time{})
	if err != nil || g.Token == "" {
		t.Fatalf("Acquire = %+v, %v; want a lease", g, err)
	}
	start := time.Now()
	tick := time.NewTicker(50 * time.Millisecond) // the watchdog's pace
	defer tick.Stop()
	extends := 0
	for time.Since(start) < fenceTTL+500*time.Millisecond {
		<-tick.C
		if ok, err := r.Extend(ctx, k, g.Token, lease); !ok || err != nil {
			t.Fatalf("Extend %d after %v = %v, %v; want true", extends, time.Since(start), ok, err)
		}
		extends++
	}
	if ok, err := r.Write(ctx, k, fresh("slow"), g.Fence, time.Minute); !ok || err != nil {
		t.Fatalf("Write after %v and %d extensions = %v, %v; want true", time.Since(start), extends, ok, err)
	}
	valueUnder(t, r, k, "slow", g.Fence)
	if err := r.Release(ctx, k, g.Token); err != nil {
		t.Fatalf("Release: %v", err)
	}
}

// TestKeysExpire writes 10,000 keys with short TTLs, half by Set and half
// by Acquire and Write (whose leases are left to expire): every key herd
// made in Redis has a TTL no longer than the fence key's, and they all
// expire.
func TestKeysExpire(t *testing.T) {
	if testing.Short() {
		t.Skip("writes 10,000 keys and waits for them to expire")
	}
	t.Parallel()
	c := redistest.Server(t).Client()
	const prefix = "bounded:"
	r := newRemote(t, c, Options{Prefix: prefix})
	const (
		ttl     = time.Second // of values and leases
		floor   = 2 * time.Second
		margin  = time.Second
		keys    = 10_000
		workers = 16
	)
	fenceTTL := max(ttl, floor) + margin
	shortFences(r, floor, margin)
	ctx := t.Context()

	start := time.Now()
	var wg sync.WaitGroup
	errs := make(chan error, workers)
	for w := range workers {
		wg.Go(func() {
			for i := w; i < keys; i += workers {
				if err := writeOne(ctx, r, fmt.Sprintf("user:%d", i), i%2 == 0, ttl); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	written := time.Now()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}

	// A key that expired before the SCAN had a TTL too: nothing else
	// deletes herd's keys.
	before, noTTL, longest := scanTTLs(t, c, prefix+"*")
	t.Logf("%d keys written in %v: %d Redis keys, longest PTTL %v (fence key TTL %v)",
		keys, written.Sub(start), before, longest, fenceTTL)
	if noTTL != 0 {
		t.Errorf("%d of %d keys have no TTL", noTTL, before)
	}
	if longest > fenceTTL {
		t.Errorf("a key expires in %v, later than the fence key TTL %v", longest, fenceTTL)
	}

	// Every key expires within fenceTTL of the last write, by the server's
	// clock; the poll allows a busy machine more.
	end := written.Add(fenceTTL + deadline)
	for {
		left, _, _ := scanTTLs(t, c, prefix+"*")
		if left == 0 {
			break
		}
		if time.Now().After(end) {
			t.Fatalf("%d keys left %v after the last write", left, time.Since(written))
		}
		time.Sleep(100 * time.Millisecond) // polling real TTLs: nothing to wait on
	}
	size, err := c.DBSize(ctx).Result()
	t.Logf("no keys left %v after the last write (fence key TTL %v); DBSIZE %d, %v", time.Since(written), fenceTTL, size, err)
}

// TestMemoryUsage reports what Redis holds for a key with a small value,
// written under a lease that is still held.
func TestMemoryUsage(t *testing.T) {
	t.Parallel()
	c := redistest.Server(t).Client()
	r := newRemote(t, c, Options{})
	ctx := t.Context()
	const k = "user:42"
	if err := writeOne(ctx, r, k, false, time.Minute); err != nil {
		t.Fatal(err)
	}
	n := r.space.Names(k)
	var total int64
	for _, name := range []string{n.Value, n.Lease, n.Fence} {
		b, err := c.MemoryUsage(ctx, name, 0).Result()
		if err != nil {
			t.Fatalf("MEMORY USAGE %q: %v", name, err)
		}
		t.Logf("MEMORY USAGE %s = %d bytes", name, b)
		total += b
	}
	v, _ := c.Get(ctx, n.Value).Result()
	t.Logf("key %q, a %d-byte envelope of a 1-byte value: %d bytes in all", k, len(v), total)
	if total > 1024 {
		t.Errorf("a small key takes %d bytes, over 1 KiB", total)
	}
}

// writeOne writes key with a value for ttl: by Set, or by Acquire (a lease
// for ttl, left to expire) and Write.
func writeOne(ctx context.Context, r *Remote, key string, set bool, ttl time.Duration) error {
	env := fresh("v")
	if set {
		_, err := r.Set(ctx, key, env, ttl)
		return err
	}
	g, err := r.Acquire(ctx, key, ttl, time.Time{})
	if err != nil {
		return err
	}
	if g.Token == "" {
		return fmt.Errorf("Acquire(%q) = %+v, want a lease", key, g)
	}
	if ok, err := r.Write(ctx, key, env, g.Fence, ttl); !ok || err != nil {
		return fmt.Errorf("Write(%q) = %v, %v; want true", key, ok, err)
	}
	return nil
}

// scanTTLs counts the keys matching pattern with SCAN, how many of them have
// no TTL, and the longest TTL among them.
func scanTTLs(t *testing.T, c redis.UniversalClient, pattern string) (count, noTTL int, longest time.Duration) {
	t.Helper()
	ctx := t.Context()
	iter := c.Scan(ctx, 0, pattern, 1000).Iterator()
	var names []string
	for iter.Next(ctx) {
		names = append(names, iter.Val())
	}
	if err := iter.Err(); err != nil {
		t.Fatalf("SCAN: %v", err)
	}
	cmds, err := c.Pipelined(ctx, func(p redis.Pipeliner) error {
		for _, name := range names {
			p.PTTL(ctx, name)
		}
		return nil
	})
	if err != nil {
		t.Fatalf("PTTL: %v", err)
	}
	for _, cmd := range cmds {
		switch d := cmd.(*redis.DurationCmd).Val(); {
		case d == -2: // expired since the SCAN
		case d == -1:
			noTTL++
			count++
		default:
			count++
			longest = max(longest, d)
		}
	}
	return count, noTTL, longest
}
