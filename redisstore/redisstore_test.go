package redisstore

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/herdcache/herd"
	"github.com/herdcache/herd/redisstore/internal/redistest"
	"github.com/herdcache/herd/remote"
	"github.com/herdcache/herd/remote/envelope"
	"github.com/herdcache/herd/remote/keyspace"
	"github.com/herdcache/herd/remote/notify"
	"github.com/herdcache/herd/storetest"
)

// deadline bounds how long an expected event may take on a real server.
const deadline = 10 * time.Second

// testTimeout is the Timeout of the tests' Remotes unless they set one: a
// machine busy with other work may take longer than DefaultTimeout.
const testTimeout = 5 * time.Second

// newRemote returns a Remote over c, closed when the test ends.
func newRemote(t testing.TB, c redis.UniversalClient, o Options) *Remote {
	t.Helper()
	o.Client = c
	if o.Timeout == 0 {
		o.Timeout = testTimeout
	}
	r, err := New(o)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	t.Cleanup(func() {
		if err := r.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	return r
}

// fresh encodes an envelope holding value, fresh for an hour.
func fresh(value string) []byte {
	now := time.Now()
	return envelope.Append(nil, &envelope.Envelope{
		Soft:  now.Add(time.Hour).UnixMilli(),
		Hard:  now.Add(2 * time.Hour).UnixMilli(),
		Value: []byte(value),
	})
}

func TestConformance(t *testing.T) {
	t.Parallel()
	t.Run("Single", func(t *testing.T) {
		t.Parallel()
		c := redistest.Server(t).Client()
		storetest.Run(t, func(t *testing.T) (remote.Store, remote.Lease) {
			r := newRemote(t, c, Options{})
			return r, r
		})
	})
	t.Run("SingleLive", func(t *testing.T) {
		t.Parallel()
		c := redistest.Server(t).Client()
		storetest.Run(t, func(t *testing.T) (remote.Store, remote.Lease) {
			r := newRemote(t, c, Options{LivePeriod: 100 * time.Millisecond})
			return r, r
		})
	})
	t.Run("Cluster", func(t *testing.T) {
		t.Parallel()
		c := redistest.Cluster(t).Client()
		storetest.Run(t, func(t *testing.T) (remote.Store, remote.Lease) {
			r := newRemote(t, c, Options{})
			return r, r
		})
	})
}

// clusterKeys are cache keys whose bytes would upset a naive naming scheme.
var clusterKeys = []string{"a", "user:42", "{tag}", "}{", "{", "a{b}c", "\x00\xff\n", strings.Repeat("k", 1000)}

// TestClusterSameSlot checks that the value, lease and fence keys of one
// cache key hash to one Cluster slot, as the server computes it, and that
// the scripts touching them run there.
func TestClusterSameSlot(t *testing.T) {
	t.Parallel()
	c := redistest.Cluster(t).Client()
	r := newRemote(t, c, Options{})
	ctx := t.Context()
	slots := make(map[int64]bool)
	for _, k := range clusterKeys {
		n := r.space.Names(k)
		var got []int64
		for _, name := range []string{n.Value, n.Lease, n.Fence} {
			slot, err := c.ClusterKeySlot(ctx, name).Result()
			if err != nil {
				t.Fatalf("CLUSTER KEYSLOT %q: %v", name, err)
			}
			if slot != int64(keyspace.Slot(name)) {
				t.Errorf("CLUSTER KEYSLOT %q = %d, keyspace.Slot says %d", name, slot, keyspace.Slot(name))
			}
			got = append(got, slot)
		}
		if got[0] != got[1] || got[0] != got[2] {
			t.Errorf("key %q: value, lease and fence on slots %v, want one slot", k, got)
		}
		slots[got[0]] = true

		g, err := r.Acquire(ctx, k, time.Minute, time.Time{})
		if err != nil || g.Token == "" {
			t.Fatalf("Acquire(%q) on the cluster = %+v, %v; want a lease", k, g, err)
		}
		if ok, err := r.Write(ctx, k, fresh("v"), g.Fence, time.Minute); !ok || err != nil {
			t.Fatalf("Write(%q) on the cluster = %v, %v; want true", k, ok, err)
		}
		if err := r.Release(ctx, k, g.Token); err != nil {
			t.Fatalf("Release(%q) on the cluster: %v", k, err)
		}
	}
	if len(slots) < 2 {
		t.Errorf("all keys on slots %v: the test does not spread over the cluster", slots)
	}
}

// TestScriptFlush checks that every script still runs after the server's
// script cache is flushed (EVALSHA answers NOSCRIPT; EVAL follows).
func TestScriptFlush(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name  string
		start func(t *testing.T) (redis.UniversalClient, func(context.Context) error)
	}{
		{"Single", func(t *testing.T) (redis.UniversalClient, func(context.Context) error) {
			c := redistest.Server(t).Client()
			return c, func(ctx context.Context) error { return c.ScriptFlush(ctx).Err() }
		}},
		{"Cluster", func(t *testing.T) (redis.UniversalClient, func(context.Context) error) {
			c := redistest.Cluster(t).Client()
			return c, func(ctx context.Context) error {
				return c.ForEachMaster(ctx, func(ctx context.Context, n *redis.Client) error {
					return n.ScriptFlush(ctx).Err()
				})
			}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			c, flush := tc.start(t)
			r := newRemote(t, c, Options{})
			ctx := t.Context()
			mustFlush := func() {
				t.Helper()
				if err := flush(ctx); err != nil {
					t.Fatalf("SCRIPT FLUSH: %v", err)
				}
			}
			const k = "flushed"
			mustFlush()
			g, err := r.Acquire(ctx, k, time.Minute, time.Time{})
			if err != nil || g.Token == "" {
				t.Fatalf("Acquire after SCRIPT FLUSH = %+v, %v; want a lease", g, err)
			}
			mustFlush()
			if ok, err := r.Extend(ctx, k, g.Token, time.Minute); !ok || err != nil {
				t.Fatalf("Extend after SCRIPT FLUSH = %v, %v; want true", ok, err)
			}
			mustFlush()
			if ok, err := r.Write(ctx, k, fresh("w"), g.Fence, time.Minute); !ok || err != nil {
				t.Fatalf("Write after SCRIPT FLUSH = %v, %v; want true", ok, err)
			}
			mustFlush()
			if err := r.Release(ctx, k, g.Token); err != nil {
				t.Fatalf("Release after SCRIPT FLUSH: %v", err)
			}
			mustFlush()
			f, err := r.Set(ctx, k, fresh("s"), time.Minute)
			if err != nil || f <= g.Fence {
				t.Fatalf("Set after SCRIPT FLUSH = %d, %v; want a fence above %d", f, err, g.Fence)
			}
			mustFlush()
			if err := r.Invalidate(ctx, k); err != nil {
				t.Fatalf("Invalidate after SCRIPT FLUSH: %v", err)
			}
			if b, err := r.Load(ctx, k); b != nil || err != nil {
				t.Fatalf("Load after Invalidate = %q, %v; want nil", b, err)
			}
		})
	}
}

// TestCorruptValueNotFresh writes values straight into Redis: Acquire takes
// the lease over any that envelope.Decode refuses (a short or unknown
// header, unknown flags, expiries negative, out of order or past MaxExpiry,
// a negative delta, a fence at or above 2^53), and returns a good one.
func TestCorruptValueNotFresh(t *testing.T) {
	t.Parallel()
	c := redistest.Server(t).Client()
	r := newRemote(t, c, Options{})
	ctx := t.Context()
	good := fresh("good")
	future := bytes.Clone(good)
	future[envelope.VersionOffset] = envelope.Version + 1
	hour := time.Now().Add(time.Hour).UnixMilli()
	year3000 := time.Date(3000, 1, 1, 0, 0, 0, 0, time.UTC).UnixMilli()
	header := func(soft, hard, delta int64, fence uint64, flags byte) []byte {
		b := envelope.Append(nil, &envelope.Envelope{Value: []byte("v")})
		for off, x := range map[int]uint64{envelope.SoftOffset: uint64(soft), envelope.HardOffset: uint64(hard),
			envelope.DeltaOffset: uint64(delta), envelope.FenceOffset: fence} {
			binary.BigEndian.PutUint64(b[off:], x)
		}
		b[envelope.FlagsOffset] = flags
		return b
	}
	for name, v := range map[string][]byte{
		"empty":           {},
		"garbage":         []byte("not an envelope at all, but long enough for a header"),
		"short":           good[:envelope.HeaderSize-1],
		"version":         future,
		"negative":        header(-1, hour, 0, 0, 0),
		"hard year 3000":  header(hour, year3000, 0, 0, 0),
		"both year 3000":  header(year3000, year3000, 0, 0, 0),
		"hard MaxInt64":   header(hour, math.MaxInt64, 0, 0, 0),
		"hard negative":   header(hour, -1, 0, 0, 0),
		"hard < soft":     header(hour, hour-1, 0, 0, 0),
		"negative delta":  header(hour, hour, -1, 0, 0),
		"fence 2^53":      header(hour, hour, 0, 1<<53, 0),
		"fence max":       header(hour, hour, 0, math.MaxUint64, 0),
		"unknown flag":    header(hour, hour, 0, 0, 4),
		"tagged, no tags": header(hour, hour, 0, 0, byte(envelope.FlagTagged)),
		"tags cut short": envelope.Append(nil, &envelope.Envelope{Flags: envelope.FlagTagged, Soft: hour, Hard: hour,
			Tags: []string{"abc"}})[:envelope.HeaderSize+4],
	} {
		if _, err := envelope.Decode(v); err == nil {
			t.Fatalf("%s: Decode accepts the case", name)
		}
		k := "corrupt/" + name
		if err := c.Set(ctx, r.space.Names(k).Value, v, time.Minute).Err(); err != nil {
			t.Fatalf("SET: %v", err)
		}
		g, err := r.Acquire(ctx, k, time.Minute, time.Time{})
		if err != nil || g.Token == "" {
			t.Errorf("Acquire over a %s value = %+v, %v; want a lease", name, g, err)
		}
	}
	k := "corrupt/control"
	good = envelope.Append(nil, &envelope.Envelope{Flags: envelope.KnownFlags, Soft: hour, Hard: envelope.MaxExpiry,
		Delta: math.MaxInt64, Fence: envelope.MaxFence, Tags: []string{"t", "", "{x}"}, Since: 1 << 52})
	if err := c.Set(ctx, r.space.Names(k).Value, good, time.Minute).Err(); err != nil {
		t.Fatalf("SET: %v", err)
	}
	if g, err := r.Acquire(ctx, k, time.Minute, time.Time{}); err != nil || !bytes.Equal(g.Value, good) {
		t.Fatalf("Acquire over a good value = %+v, %v; want the value", g, err)
	}
}

// TestAcquireAgreesWithDecode checks that the scripts and Go judge stored
// bytes alike: Acquire hands back a value exactly when Decode accepts it
// (and it is fresh), over valid envelopes, their extremes and random
// corruptions of them.
func TestAcquireAgreesWithDecode(t *testing.T) {
	t.Parallel()
	c := redistest.Server(t).Client()
	r := newRemote(t, c, Options{})
	ctx := t.Context()
	rng := rand.New(rand.NewPCG(1, 2))
	hour := time.Now().Add(time.Hour).UnixMilli()
	edges := []uint64{0, 1, uint64(hour), envelope.MaxExpiry, envelope.MaxExpiry + 1, envelope.MaxFence, 1 << 53,
		math.MaxInt64, 1 << 63, math.MaxUint64}
	accepted := 0
	const cases = 400
	for i := range cases {
		b := envelope.Append(nil, &envelope.Envelope{Soft: hour, Hard: hour + 1000, Value: []byte("v")})
		for range 1 + rng.IntN(3) {
			off := envelope.SoftOffset + 8*rng.IntN(4) // soft, hard, delta or fence
			x := edges[rng.IntN(len(edges))]
			if rng.IntN(3) == 0 {
				x = rng.Uint64()
			}
			binary.BigEndian.PutUint64(b[off:], x)
		}
		if rng.IntN(8) == 0 {
			b[envelope.FlagsOffset] = byte(rng.IntN(256))
		}
		if rng.IntN(3) == 0 {
			// A tagged envelope, its tags section corrupted or cut.
			b = envelope.Append(nil, &envelope.Envelope{Flags: envelope.FlagTagged, Soft: hour, Hard: hour + 1000,
				Tags: []string{"tag", strings.Repeat("t", rng.IntN(200))}, Since: rng.Uint64(), Value: []byte("v")})
			switch tail := b[envelope.HeaderSize:]; rng.IntN(3) {
			case 0:
				tail[rng.IntN(len(tail))] = byte(rng.IntN(256))
			case 1:
				b = b[:envelope.HeaderSize+rng.IntN(len(tail))]
			}
		}
		e, err := envelope.Decode(b)
		want := err == nil && e.Soft > time.Now().Add(time.Minute).UnixMilli()
		if err == nil && !want && e.Soft > time.Now().Add(-time.Minute).UnixMilli() {
			continue // fresh or not depends on the clock at the very moment: skip
		}
		k := fmt.Sprint("agree/", i)
		if err := c.Set(ctx, r.space.Names(k).Value, b, time.Minute).Err(); err != nil {
			t.Fatalf("SET: %v", err)
		}
		g, err := r.Acquire(ctx, k, time.Minute, time.Time{})
		if err != nil {
			t.Fatalf("Acquire: %v", err)
		}
		if got := g.Value != nil; got != want {
			t.Fatalf("envelope %x: Acquire returned the value: %v; Decode says fresh and valid: %v", b, got, want)
		}
		if want {
			accepted++
		}
	}
	if accepted == 0 || accepted == cases {
		t.Fatalf("%d of %d cases were valid and fresh: the test judged only one side", accepted, cases)
	}
	t.Logf("%d of %d cases valid and fresh", accepted, cases)
}

// TestRejectedErrors checks which errors wrap remote.ErrRejected: a reply
// about one key's state does, a server that cannot be reached does not.
func TestRejectedErrors(t *testing.T) {
	t.Parallel()
	c := redistest.Server(t).Client()
	r := newRemote(t, c, Options{})
	ctx := t.Context()
	n := r.space.Names("wrongtype")
	if err := c.HSet(ctx, n.Value, "f", "v").Err(); err != nil {
		t.Fatal(err)
	}
	if _, err := r.Load(ctx, "wrongtype"); !errors.Is(err, remote.ErrRejected) {
		t.Errorf("Load of a hash = %v, want an error wrapping remote.ErrRejected", err)
	}
	if err := c.Set(ctx, r.space.Names("badfence").Fence, "x", 0).Err(); err != nil {
		t.Fatal(err)
	}
	if _, err := r.Acquire(ctx, "badfence", time.Minute, time.Time{}); !errors.Is(err, remote.ErrRejected) {
		t.Errorf("Acquire over a corrupt fence = %v, want an error wrapping remote.ErrRejected", err)
	}
	if _, err := r.Set(ctx, "k", fresh("v"), 0); !errors.Is(err, remote.ErrRejected) {
		t.Errorf("Set with ttl 0 = %v, want an error wrapping remote.ErrRejected", err)
	}
	down := NewClient(&redis.UniversalOptions{Addrs: []string{"127.0.0.1:1"}, MaxRetries: -1})
	defer down.Close()
	rd := newRemote(t, down, Options{Timeout: 200 * time.Millisecond})
	if _, err := rd.Load(ctx, "k"); err == nil || errors.Is(err, remote.ErrRejected) {
		t.Errorf("Load from a server that is not there = %v, want an error that does not wrap remote.ErrRejected", err)
	}
}

// TestFence checks the fence key: it holds the fence in decimal, at or
// above the server's clock in microseconds; its TTL is max(the value's ttl,
// the lease's ttl, 1 min) + 10 s, set or lengthened by every change and
// every Extend, never shortened; and a fence that cannot advance, or that is
// not a number, is an error that changes nothing.
func TestFence(t *testing.T) {
	t.Parallel()
	c := redistest.Server(t).Client()
	r := newRemote(t, c, Options{})
	ctx := t.Context()

	const k = "fence"
	n := r.space.Names(k)
	// wantTTL checks that the fence key expires in ttl + 10 s, give or take
	// how long the calls took.
	wantTTL := func(what string, ttl time.Duration) {
		t.Helper()
		want := ttl + 10*time.Second
		got, err := c.PTTL(ctx, n.Fence).Result()
		if err != nil || got > want || got < want-deadline {
			t.Fatalf("after %s: PTTL of the fence key = %v, %v; want %v", what, got, err, want)
		}
	}
	now, err := c.Time(ctx).Result()
	if err != nil {
		t.Fatalf("TIME: %v", err)
	}
	f, err := r.Set(ctx, k, fresh("v"), time.Second)
	if err != nil {
		t.Fatalf("Set: %v", err)
	}
	if us := uint64(now.UnixMicro()); f < us || f > envelope.MaxFence {
		t.Fatalf("Set's fence = %d, want one in [the server's clock %d µs, 2^53)", f, us)
	}
	if got, err := c.Get(ctx, n.Fence).Result(); err != nil || got != strconv.FormatUint(f, 10) {
		t.Fatalf("fence key = %q, %v; want %d", got, err, f)
	}
	wantTTL("Set for 1s", time.Minute)

	last := f
	advanced := func(what string, f uint64) {
		t.Helper()
		if f <= last {
			t.Fatalf("%s: fence %d, not above %d", what, f, last)
		}
		last = f
	}
	f, err = r.Set(ctx, k, fresh("v"), 2*time.Hour)
	if err != nil {
		t.Fatalf("Set: %v", err)
	}
	advanced("Set", f)
	wantTTL("Set for 2h", 2*time.Hour)
	f, err = r.Set(ctx, k, fresh("v"), time.Second)
	if err != nil {
		t.Fatalf("Set: %v", err)
	}
	advanced("Set", f)
	wantTTL("Set for 1s after one for 2h", 2*time.Hour)

	// A fence key left without a TTL by an older version gets one.
	if err := c.Persist(ctx, n.Fence).Err(); err != nil {
		t.Fatalf("PERSIST: %v", err)
	}
	if err := r.Invalidate(ctx, k); err != nil {
		t.Fatalf("Invalidate: %v", err)
	}
	wantTTL("Invalidate of a fence key without a TTL", time.Minute)
	f, err = c.Get(ctx, n.Fence).Uint64()
	if err != nil {
		t.Fatalf("GET fence: %v", err)
	}
	advanced("Invalidate", f)

	g, err := r.Acquire(ctx, k, 3*time.Hour, time.Time{})
	if err != nil || g.Token == "" {
		t.Fatalf("Acquire = %+v, %v; want a lease", g, err)
	}
	advanced("Acquire", g.Fence)
	wantTTL("Acquire for 3h", 3*time.Hour)
	if ok, err := r.Extend(ctx, k, g.Token, 5*time.Hour); !ok || err != nil {
		t.Fatalf("Extend = %v, %v; want true", ok, err)
	}
	wantTTL("Extend for 5h", 5*time.Hour)
	if ok, err := r.Extend(ctx, k, "not the token", 9*time.Hour); ok || err != nil {
		t.Fatalf("Extend with another token = %v, %v; want false", ok, err)
	}
	wantTTL("a refused Extend", 5*time.Hour)
	if ok, err := r.Write(ctx, k, fresh("v"), g.Fence, 6*time.Hour); !ok || err != nil {
		t.Fatalf("Write = %v, %v; want true", ok, err)
	}
	wantTTL("Write for 6h", 6*time.Hour)
	if ok, err := r.Write(ctx, k, fresh("v"), g.Fence-1, 9*time.Hour); ok || err != nil {
		t.Fatalf("Write under a stale fence = %v, %v; want false", ok, err)
	}
	wantTTL("a refused Write", 6*time.Hour)
	if ok, err := r.WriteRelease(ctx, k, fresh("v"), g.Fence, 7*time.Hour, g.Token); !ok || err != nil {
		t.Fatalf("WriteRelease = %v, %v; want true", ok, err)
	}
	wantTTL("WriteRelease for 7h", 7*time.Hour)
	if ok, err := r.WriteRelease(ctx, k, fresh("v"), g.Fence-1, 9*time.Hour, g.Token); ok || err != nil {
		t.Fatalf("WriteRelease under a stale fence = %v, %v; want false", ok, err)
	}
	wantTTL("a refused WriteRelease", 7*time.Hour)

	// A write under fence 0 to a key never fenced makes no fence key.
	if ok, err := r.Write(ctx, "unfenced", fresh("v"), 0, time.Minute); !ok || err != nil {
		t.Fatalf("Write under fence 0 = %v, %v; want true", ok, err)
	}
	if got, err := c.Exists(ctx, r.space.Names("unfenced").Fence).Result(); got != 0 || err != nil {
		t.Fatalf("EXISTS of the fence key after a write under fence 0 = %d, %v; want 0", got, err)
	}

	for _, bad := range []string{strconv.FormatUint(envelope.MaxFence, 10), "99999999999999999999", "not a number", "", "-5", "1e3", "0x10", " 7"} {
		if err := c.Set(ctx, n.Fence, bad, 0).Err(); err != nil {
			t.Fatalf("SET: %v", err)
		}
		before, err := r.Load(ctx, k)
		if err != nil {
			t.Fatalf("Load: %v", err)
		}
		if f, err := r.Set(ctx, k, fresh("other"), time.Minute); !errors.Is(err, remote.ErrRejected) || !strings.HasPrefix(err.Error(), "redisstore: ") {
			t.Errorf("fence %q: Set = %d, %v; want a redisstore error wrapping remote.ErrRejected", bad, f, err)
		}
		if err := r.Invalidate(ctx, k); err == nil {
			t.Errorf("fence %q: Invalidate = nil, want an error", bad)
		}
		if g, err := r.Acquire(ctx, k, time.Minute, time.Now().Add(24*time.Hour)); err == nil {
			t.Errorf("fence %q: Acquire = %+v, nil; want an error", bad, g)
		}
		if got, _ := c.Get(ctx, n.Fence).Result(); got != bad {
			t.Errorf("fence %q changed to %q", bad, got)
		}
		if after, _ := r.Load(ctx, k); !bytes.Equal(after, before) {
			t.Errorf("fence %q: value changed", bad)
		}
		if held, _ := c.Exists(ctx, n.Lease).Result(); held != 0 {
			t.Errorf("fence %q: a refused Acquire took the lease", bad)
		}
	}
}

func TestNewRejects(t *testing.T) {
	t.Parallel()
	single := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"})
	cluster := redis.NewClusterClient(&redis.ClusterOptions{Addrs: []string{"127.0.0.1:1"}})
	failover := redis.NewFailoverClient(&redis.FailoverOptions{MasterName: "m", SentinelAddrs: []string{"127.0.0.1:1"}})
	ring := redis.NewRing(&redis.RingOptions{Addrs: map[string]string{"a": "127.0.0.1:1"}, ContextTimeoutEnabled: true})
	ok := NewClient(&redis.UniversalOptions{Addrs: []string{"127.0.0.1:1"}})
	for _, c := range []redis.UniversalClient{single, cluster, failover, ring, ok} {
		t.Cleanup(func() { _ = c.Close() })
	}
	for _, tc := range []struct {
		name string
		o    Options
		want string
	}{
		{"NoClient", Options{}, "Client is nil"},
		{"NilClient", Options{Client: (*redis.Client)(nil)}, "nil *redis.Client"},
		{"Single", Options{Client: single}, "ContextTimeoutEnabled"},
		{"Cluster", Options{Client: cluster}, "ContextTimeoutEnabled"},
		{"Failover", Options{Client: failover}, "ContextTimeoutEnabled"},
		{"Ring", Options{Client: ring}, "Ring"},
		{"BraceOpen", Options{Client: ok, Prefix: "app{"}, "braces"},
		{"BraceClose", Options{Client: ok, Prefix: "}app:"}, "braces"},
		{"NegativeTimeout", Options{Client: ok, Timeout: -time.Second}, "negative"},
		{"NegativeBatchKeys", Options{Client: ok, BatchKeys: -1}, "BatchKeys -1 is negative"},
		{"NegativeBatchBytes", Options{Client: ok, BatchBytes: -1}, "BatchBytes -1 is negative"},
	} {
		r, err := New(tc.o)
		if err == nil {
			_ = r.Close()
			t.Errorf("%s: New succeeded, want an error", tc.name)
			continue
		}
		if !strings.HasPrefix(err.Error(), "redisstore: ") || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: New error %q, want one prefixed \"redisstore: \" that mentions %q", tc.name, err, tc.want)
		}
	}
}

func TestNewClient(t *testing.T) {
	t.Parallel()
	for _, o := range []*redis.UniversalOptions{
		nil,
		{Addrs: []string{"127.0.0.1:1"}},
		{Addrs: []string{"127.0.0.1:1", "127.0.0.1:2"}},
		{Addrs: []string{"127.0.0.1:1"}, MasterName: "m"},
	} {
		var before redis.UniversalOptions
		if o != nil {
			before = *o
		}
		c := NewClient(o)
		t.Cleanup(func() { _ = c.Close() })
		if o != nil && o.ContextTimeoutEnabled != before.ContextTimeoutEnabled {
			t.Errorf("NewClient changed the options it was given")
		}
		var enabled bool
		switch c := c.(type) {
		case *redis.Client:
			enabled = c.Options().ContextTimeoutEnabled
		case *redis.ClusterClient:
			enabled = c.Options().ContextTimeoutEnabled
		default:
			t.Fatalf("NewClient(%+v) = %T", o, c)
		}
		if !enabled || checkClient(c) != nil {
			t.Errorf("NewClient(%+v) = %T without ContextTimeoutEnabled", o, c)
		}
	}
}

// TestDeadline checks that calls to a server that stopped answering (SIGSTOP)
// or died fail within about Timeout instead of hanging: go-redis's own
// read timeout is 3s, and it retries.
func TestDeadline(t *testing.T) {
	t.Parallel()
	const timeout = 200 * time.Millisecond
	const limit = timeout + 800*time.Millisecond
	n := redistest.Server(t)
	r := newRemote(t, n.Client(), Options{Timeout: timeout})
	ctx := t.Context()
	g, err := r.Acquire(ctx, "k", time.Minute, time.Time{})
	if err != nil || g.Token == "" {
		t.Fatalf("Acquire = %+v, %v", g, err)
	}
	calls := map[string]func() error{
		"Load":       func() error { _, err := r.Load(ctx, "k"); return err },
		"Write":      func() error { _, err := r.Write(ctx, "k", fresh("v"), g.Fence, time.Minute); return err },
		"Set":        func() error { _, err := r.Set(ctx, "k", fresh("v"), time.Minute); return err },
		"Invalidate": func() error { return r.Invalidate(ctx, "k") },
		"Acquire":    func() error { _, err := r.Acquire(ctx, "k", time.Minute, time.Time{}); return err },
		"Extend":     func() error { _, err := r.Extend(ctx, "k", g.Token, time.Minute); return err },
		"Release":    func() error { return r.Release(ctx, "k", g.Token) },
	}
	check := func(state string) {
		t.Helper()
		for name, call := range calls {
			start := time.Now()
			err := call()
			took := time.Since(start)
			if err == nil || !strings.HasPrefix(err.Error(), "redisstore: ") {
				t.Errorf("%s on a %s server = %v, want a redisstore error", name, state, err)
			}
			if took > limit {
				t.Errorf("%s on a %s server took %v, want at most %v (Timeout %v)", name, state, took, limit, timeout)
			}
		}
	}

	n.Pause()
	check("paused")
	start := time.Now()
	r2, err := New(Options{Client: n.Client(), Timeout: timeout})
	if err != nil {
		t.Fatalf("New against a paused server: %v", err)
	}
	if took := time.Since(start); took > limit {
		t.Errorf("New against a paused server took %v, want at most %v", took, limit)
	}
	_ = r2.Close()
	n.Kill()
	check("killed")
}

// subscribe returns what a new subscription of r is told until the test ends.
func subscribe(t *testing.T, r *Remote) <-chan notify.Notice {
	ch := make(chan notify.Notice, 1024)
	stop := r.Subscribe(func(n remote.Notice) { ch <- notify.Notice(n) })
	t.Cleanup(stop)
	return ch
}

// next returns the next notice, failing the test if none comes in time.
func next(t *testing.T, ch <-chan notify.Notice) notify.Notice {
	t.Helper()
	select {
	case n := <-ch:
		return n
	case <-time.After(deadline):
		t.Fatalf("no notice within %v", deadline)
		return notify.Notice{}
	}
}

// TestReconnect kills and restarts the server: the subscription reconnects,
// subscribers are told to drop everything, Wait-ers wake, and notices flow
// again.
func TestReconnect(t *testing.T) {
	t.Parallel()
	n := redistest.Server(t)
	r := newRemote(t, n.Client(), Options{})
	registered := make(chan struct{}, 1)
	r.onWait = func(string) { registered <- struct{}{} }
	notices := subscribe(t, r)
	ctx := t.Context()

	waited := make(chan error, 1)
	wctx, cancel := context.WithTimeout(ctx, deadline)
	defer cancel()
	go func() { waited <- r.Wait(wctx, "waiting") }()
	<-registered

	n.Kill()
	n.Restart()
	if got := next(t, notices); got != (notify.Notice{}) {
		t.Fatalf("first notice after restart = %+v, want (\"\", 0)", got)
	}
	if err := <-waited; err != nil {
		t.Fatalf("Wait across the restart: %v", err)
	}

	f, err := r.Set(ctx, "after", fresh("v"), time.Minute)
	if err != nil {
		t.Fatalf("Set after restart: %v", err)
	}
	if got := plain(next(t, notices)); got != (notify.Notice{Key: "after", Fence: f}) {
		t.Fatalf("notice after restart = %+v, want {after %d}", got, f)
	}
}

// TestWaitAcrossRemotes checks that a Release through one Remote (and
// client) wakes the Wait-ers of that key on another, and only of that key.
func TestWaitAcrossRemotes(t *testing.T) {
	t.Parallel()
	n := redistest.Server(t)
	waiter := newRemote(t, n.Client(), Options{})
	holder := newRemote(t, n.Client(), Options{})
	registered := make(chan string, 2)
	waiter.onWait = func(key string) { registered <- key }
	ctx, cancel := context.WithTimeout(t.Context(), deadline)
	defer cancel()

	gA, err := holder.Acquire(ctx, "a", time.Minute, time.Time{})
	if err != nil || gA.Token == "" {
		t.Fatalf("Acquire(a) = %+v, %v", gA, err)
	}
	waitA, waitB := make(chan error, 1), make(chan error, 1)
	go func() { waitA <- waiter.Wait(ctx, "a") }()
	<-registered
	go func() { waitB <- waiter.Wait(ctx, "b") }()
	<-registered

	// Notices arrive in order on one connection: once b's has woken its
	// Wait, a's Wait has seen every notice published before it.
	if err := holder.Release(ctx, "b", "no-token"); err != nil {
		t.Fatalf("Release(b): %v", err)
	}
	if err := <-waitB; err != nil {
		t.Fatalf("Wait(b): %v", err)
	}
	if !waiting(waiter, "a") {
		t.Fatal("Wait(a) woken by a completion of b")
	}
	if err := holder.Release(ctx, "a", gA.Token); err != nil {
		t.Fatalf("Release(a): %v", err)
	}
	if err := <-waitA; err != nil {
		t.Fatalf("Wait(a) after Release(a) on another Remote: %v", err)
	}
}

// TestNoticesAnyKey checks that change notices carry keys of any bytes, and
// their fences, from one Remote to another, and not across prefixes.
func TestNoticesAnyKey(t *testing.T) {
	t.Parallel()
	n := redistest.Server(t)
	writer := newRemote(t, n.Client(), Options{})
	reader := newRemote(t, n.Client(), Options{})
	other := newRemote(t, n.Client(), Options{Prefix: "other:"})
	notices := subscribe(t, reader)
	otherNotices := subscribe(t, other)
	ctx := t.Context()

	keys := []string{"c1:x", "d", ":", "::", "{}", "a\x00b", "\n\r", "\xff\xfe", "c" + strings.Repeat("é", 300)}
	for _, k := range keys {
		f, err := writer.Set(ctx, k, fresh("v"), time.Minute)
		if err != nil {
			t.Fatalf("Set(%q): %v", k, err)
		}
		got := next(t, notices)
		if plain(got) != (notify.Notice{Key: k, Fence: f}) {
			t.Fatalf("notice of Set(%q) = %+v, want fence %d", k, got, f)
		}
		if stored, err := writer.Load(ctx, k); err != nil || got.Value != string(stored) {
			t.Fatalf("notice of Set(%q) carries %q, want the stored envelope %q (%v)", k, got.Value, stored, err)
		}
		if err := writer.Invalidate(ctx, k); err != nil {
			t.Fatalf("Invalidate(%q): %v", k, err)
		}
		f2, err := n.Client().Get(ctx, writer.space.Names(k).Fence).Uint64()
		if err != nil || f2 <= f {
			t.Fatalf("fence after Invalidate(%q) = %d, %v; want one above %d", k, f2, err, f)
		}
		if got := next(t, notices); got != (notify.Notice{Key: k, Fence: f2, Dropped: true}) {
			t.Fatalf("notice of Invalidate(%q) = %+v, want fence %d, Dropped", k, got, f2)
		}
	}
	// The other prefix shares the server, not the channel.
	f, err := other.Set(ctx, "mine", fresh("v"), time.Minute)
	if err != nil {
		t.Fatalf("Set under another prefix: %v", err)
	}
	if got := plain(next(t, otherNotices)); got != (notify.Notice{Key: "mine", Fence: f}) {
		t.Fatalf("notice under another prefix = %+v", got)
	}
	select {
	case got := <-otherNotices:
		t.Fatalf("a Remote with another prefix got notice %+v", got)
	default:
	}
	if b, err := reader.Load(ctx, "mine"); b != nil || err != nil {
		t.Fatalf("Load across prefixes = %q, %v; want nil", b, err)
	}
}

// plain returns n without the value it carries.
func plain(n notify.Notice) notify.Notice {
	n.Value = ""
	return n
}

// waiting reports whether key has Wait-ers that no notice has woken yet.
func waiting(r *Remote, key string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.waits.Has(key)
}

// TestOwnCompletionEcho checks that the echo of a Remote's own completion,
// which Release has already delivered to its Wait-ers, does not end a Wait
// that began after the Release, while another Remote's completion does.
func TestOwnCompletionEcho(t *testing.T) {
	t.Parallel()
	r := newRemote(t, redistest.Server(t).Client(), Options{})
	registered := make(chan struct{}, 1)
	r.onWait = func(string) { registered <- struct{}{} }
	waited := make(chan error, 1)
	go func() { waited <- r.Wait(t.Context(), "k") }()
	<-registered

	r.dispatch("d" + r.id + "k")
	if !waiting(r, "k") {
		t.Fatal("Wait ended by the echo of this Remote's own completion")
	}
	other := strings.Repeat("0", originLen)
	if other == r.id {
		other = strings.Repeat("1", originLen)
	}
	r.dispatch("d" + other + "k")
	if err := <-waited; err != nil {
		t.Fatalf("Wait after another Remote's completion: %v", err)
	}
}

func TestClose(t *testing.T) {
	t.Parallel()
	r, err := New(Options{Client: redistest.Server(t).Client(), Timeout: testTimeout})
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	registered := make(chan struct{}, 1)
	r.onWait = func(string) { registered <- struct{}{} }
	called := make(chan notify.Notice, 1)
	r.Subscribe(func(n remote.Notice) { called <- notify.Notice(n) })
	ctx, cancel := context.WithTimeout(t.Context(), deadline)
	defer cancel()
	waited := make(chan error, 1)
	go func() { waited <- r.Wait(ctx, "k") }()
	<-registered

	if err := r.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if err := <-waited; !errors.Is(err, ErrClosed) {
		t.Fatalf("pending Wait after Close = %v, want ErrClosed", err)
	}
	if err := r.Wait(t.Context(), "k"); !errors.Is(err, ErrClosed) {
		t.Fatalf("Wait after Close = %v, want ErrClosed", err)
	}
	if _, err := r.Load(t.Context(), "k"); !errors.Is(err, ErrClosed) {
		t.Fatalf("Load after Close = %v, want ErrClosed", err)
	}
	if _, err := r.Set(t.Context(), "k", fresh("v"), time.Minute); !errors.Is(err, ErrClosed) {
		t.Fatalf("Set after Close = %v, want ErrClosed", err)
	}
	r.Subscribe(func(n remote.Notice) { called <- notify.Notice(n) })()
	select {
	case n := <-called:
		t.Fatalf("a subscriber was called with %+v after Close", n)
	default:
	}
	if err := r.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
}

// TestRemoteHitIsOneGet checks that a cache read served by Redis costs
// exactly one GET and no script.
func TestRemoteHitIsOneGet(t *testing.T) {
	t.Parallel()
	n := redistest.Server(t)
	c := n.Client()
	r := newRemote(t, c, Options{})
	cache, err := herd.New(&herd.Options[[]byte]{
		NoNearCache: true,
		NoBreaker:   true,
		MaxEntries:  100,
		SoftTTL:     time.Hour,
		Store:       r,
		Codec:       herd.Bytes(),
	})
	if err != nil {
		t.Fatalf("herd.New: %v", err)
	}
	t.Cleanup(func() { _ = cache.Close(context.Background()) })
	ctx := t.Context()
	value := bytes.Repeat([]byte("x"), 1024)
	if err := cache.Set(ctx, "hit", value); err != nil {
		t.Fatalf("Set: %v", err)
	}
	load := func(context.Context) ([]byte, error) {
		return nil, errors.New("load called on a remote hit")
	}

	if err := c.ConfigResetStat(ctx).Err(); err != nil {
		t.Fatalf("CONFIG RESETSTAT: %v", err)
	}
	const gets = 100
	for range gets {
		if v, err := cache.Get(ctx, "hit", load); err != nil || !bytes.Equal(v, value) {
			t.Fatalf("Get = %d bytes, %v; want the stored value", len(v), err)
		}
	}
	stats, err := c.Info(ctx, "commandstats").Result()
	if err != nil {
		t.Fatalf("INFO commandstats: %v", err)
	}
	calls := commandCalls(t, stats)
	if calls["get"] != gets {
		t.Errorf("%d Gets made %d GET calls, want %d:\n%s", gets, calls["get"], gets, stats)
	}
	for cmd, n := range calls {
		switch cmd {
		case "get", "info", "config|resetstat", "ping": // ours, and the subscription's health check
		default:
			t.Errorf("remote hits made %d %s calls, want none:\n%s", n, cmd, stats)
		}
	}
}

// commandCalls parses INFO commandstats: calls by command name.
func commandCalls(t *testing.T, stats string) map[string]int {
	t.Helper()
	calls := make(map[string]int)
	for line := range strings.Lines(stats) {
		name, rest, ok := strings.Cut(strings.TrimSpace(line), ":")
		if !ok || !strings.HasPrefix(name, "cmdstat_") {
			continue
		}
		field, _, _ := strings.Cut(rest, ",")
		n, err := strconv.Atoi(strings.TrimPrefix(field, "calls="))
		if err != nil {
			t.Fatalf("INFO commandstats line %q: %v", line, err)
		}
		calls[strings.TrimPrefix(name, "cmdstat_")] = n
	}
	return calls
}

func FuzzParseNotice(f *testing.F) {
	const origin = "0123456789abcdef"
	for _, seed := range []string{"", "c", "d", "dk", "d" + origin, "d" + origin + "k", "c1:k", "c0:k", "c01:k", "c:k", "c1:", "c12",
		"c1::", "c9007199254740991:k", "c9007199254740992:k", "c-1:k", "c+1:k", "x1:k", "x0:k", "x:k", "d\x00", "c18446744073709551616:k",
		"g1", "g0", "g01", "g", "t1:tag", "t0:tag", "t1:", "t:tag", "t01:x",
		"l5000:" + origin + "k", "l5000:" + origin, "l5000:" + origin[1:], "l0:" + origin + "k", "l05:" + origin + "k", "l:" + origin,
		"l86400000:" + origin + "k", "l86400001:" + origin + "k", "l+5:" + origin + "k", "l5" + origin + "k", "l5:" + origin + ":k",
		"v1:1:kenv", "v1:0:env", "v1:0:", "v1:1:k", "v1:2:k", "v1:01:kk", "v0:1:kv", "v01:1:kv", "v1::kv", "v1:1kv", "v:1:kv",
		"v9007199254740991:3:k:\x01garbage", "v9007199254740992:1:kv", "v1:18446744073709551616:k", "v1:-1:k",
		"v12:1:k" + string(envelope.Append(nil, &envelope.Envelope{Soft: 1, Hard: 2, Fence: 12, Value: []byte("x")}))} {
		f.Add(seed)
	}
	for _, seed := range batchNoticeSeeds() {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, p string) {
		checkBatchNotice(t, p)
		m, ok := parseNotice(p)
		if !ok {
			return
		}
		if (m.kind == changeNotice || m.kind == valueNotice || m.kind == dropNotice || m.kind == tagNotice || m.kind == clearNotice) && m.fence == 0 {
			t.Fatalf("parseNotice(%q) gave a change under fence 0, which reads as a lost notice", p)
		}
		if m.kind != valueNotice && m.value != "" {
			t.Fatalf("parseNotice(%q) gave a value with kind %q", p, m.kind)
		}
		var back string
		switch m.kind {
		case clearNotice:
			back = "g" + strconv.FormatUint(m.fence, 10)
			if m.fence > envelope.MaxFence {
				t.Fatalf("parseNotice(%q) gave generation %d above 2^53", p, m.fence)
			}
		case changeNotice, dropNotice, tagNotice:
			back = string(m.kind) + strconv.FormatUint(m.fence, 10) + ":" + m.key
			if m.fence > envelope.MaxFence {
				t.Fatalf("parseNotice(%q) gave fence %d above 2^53", p, m.fence)
			}
		case valueNotice:
			back = "v" + strconv.FormatUint(m.fence, 10) + ":" + strconv.Itoa(len(m.key)) + ":" + m.key + m.value
			if m.fence > envelope.MaxFence {
				t.Fatalf("parseNotice(%q) gave fence %d above 2^53", p, m.fence)
			}
		case doneNotice:
			back = "d" + m.origin + m.key
			if len(m.origin) != originLen {
				t.Fatalf("parseNotice(%q) gave origin %q", p, m.origin)
			}
		case holdNotice:
			back = "l" + strconv.FormatUint(m.fence, 10) + ":" + m.origin + m.key
			if len(m.origin) != originLen {
				t.Fatalf("parseNotice(%q) gave origin %q", p, m.origin)
			}
			if m.fence == 0 || m.fence > maxHoldMs {
				t.Fatalf("parseNotice(%q) gave a hold of %d ms", p, m.fence)
			}
		default:
			t.Fatalf("parseNotice(%q) gave kind %q", p, m.kind)
		}
		if back != p {
			t.Fatalf("parseNotice(%q) = %+v, which formats back as %q", p, m, back)
		}
	})
}

func FuzzNoticeRoundTrip(f *testing.F) {
	f.Add("k", uint64(1))
	f.Add("c1:k", uint64(0))
	f.Add(":", uint64(envelope.MaxFence))
	f.Add("\x00{}", uint64(42))
	const origin = "0123456789abcdef"
	f.Add("", uint64(7))
	f.Fuzz(func(t *testing.T, key string, fence uint64) {
		fence = fence%envelope.MaxFence + 1 // a change's fence is in [1, MaxFence]
		for _, value := range []string{"", key, ":" + key, "\x01" + key + "1:"} {
			want := message{kind: valueNotice, key: key, fence: fence, value: value}
			p := "v" + strconv.FormatUint(fence, 10) + ":" + strconv.Itoa(len(key)) + ":" + key + value
			if m, ok := parseNotice(p); !ok || m != want {
				t.Fatalf("change %q under %d carrying %q parsed as %+v, %v", key, fence, value, m, ok)
			}
		}
		// As the scripts format them.
		want := message{kind: changeNotice, key: key, fence: fence}
		if m, ok := parseNotice("c" + strconv.FormatUint(fence, 10) + ":" + key); !ok || m != want {
			t.Fatalf("change %q under %d parsed as %+v, %v", key, fence, m, ok)
		}
		want = message{kind: dropNotice, key: key, fence: fence}
		if m, ok := parseNotice("x" + strconv.FormatUint(fence, 10) + ":" + key); !ok || m != want {
			t.Fatalf("drop %q under %d parsed as %+v, %v", key, fence, m, ok)
		}
		want = message{kind: doneNotice, origin: origin, key: key}
		if m, ok := parseNotice("d" + origin + key); !ok || m != want {
			t.Fatalf("completion %q parsed as %+v, %v", key, m, ok)
		}
		ms := fence%maxHoldMs + 1 // a hold's time is in [1, maxHoldMs]
		want = message{kind: holdNotice, origin: origin, key: key, fence: ms}
		if m, ok := parseNotice("l" + strconv.FormatUint(ms, 10) + ":" + origin + key); !ok || m != want {
			t.Fatalf("hold of %q for %d ms parsed as %+v, %v", key, ms, m, ok)
		}
		checkBatchRoundTrip(t, key, fence)
	})
}
