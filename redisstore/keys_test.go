package redisstore

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"maps"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/herdcache/herd"
	"github.com/herdcache/herd/redisstore/internal/redistest"
	"github.com/herdcache/herd/remote/envelope"
)

// listed is what the package documentation says of one Redis key: its TTL
// (zero: none) and its length (STRLEN; -1 for a key that is no string).
type listed struct {
	ttl time.Duration
	len int64
}

// hashTag is the hash tag the documentation gives a key (or, after a zero
// byte, a tag): the first 8 bytes of its SHA-256, in hex.
func hashTag(b []byte) string {
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:8])
}

// TestKeysListed writes one key through a herd cache with a lease, as a
// 100-byte value, then tags one, retires them all and adds one to the hot
// set, and checks after each step that the keys in Redis, their TTLs and
// their lengths are those the package documentation lists. It logs what
// each key takes (MEMORY USAGE), the figures the documentation gives.
func TestKeysListed(t *testing.T) {
	t.Parallel()
	c := redistest.Server(t).Client()
	r := newRemote(t, c, Options{})
	ctx := t.Context()
	const (
		soft, hard = 10 * time.Second, 90 * time.Second
		leaseTTL   = 5 * time.Second
		key        = "profile|acme|42" // herd.Key("profile", "acme", "42")
		tag        = "product:42"
	)
	value := strings.Repeat("x", 100)
	tagged := herd.Key("profile", "acme", "43")
	newCache := func() *herd.Cache[string] {
		t.Helper()
		cache, err := herd.New(&herd.Options[string]{
			NoNearCache: true,
			NoBreaker:   true,
			MaxEntries:  100, SoftTTL: soft, HardTTL: hard,
			Store: r, Lease: r, LeaseTTL: leaseTTL,
		})
		if err != nil {
			t.Fatal(err)
		}
		return cache
	}
	closeCache := func(cache *herd.Cache[string]) {
		t.Helper()
		if err := cache.Close(ctx); err != nil { // waits for the write-back
			t.Fatal(err)
		}
	}

	// Under the lease, while the load runs: the lease and the fence.
	base := "herd:{" + hashTag([]byte(key)) + "}:" + key
	cache := newCache()
	entered, release := make(chan struct{}), make(chan struct{})
	done := make(chan error, 1)
	go func() {
		_, err := cache.Get(ctx, key, func(context.Context) (string, error) {
			close(entered)
			<-release
			return value, nil
		})
		done <- err
	}()
	select {
	case <-entered:
	case <-time.After(deadline):
		t.Fatalf("the load did not start within %v", deadline)
	}
	keysAre(t, c, "a load under its lease", map[string]listed{
		base + ":l": {leaseTTL, 32},
		base + ":f": {minFenceTTL + fenceMargin, 16},
	})
	chans, err := c.PubSubChannels(ctx, "*").Result()
	if err != nil || !slices.Equal(chans, []string{"herd:events"}) {
		t.Errorf("PUBSUB CHANNELS = %q, %v; want [herd:events]", chans, err)
	}

	// Written and released: the value and the fence, which outlives it.
	close(release)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	closeCache(cache)
	keysAre(t, c, "the load's write", map[string]listed{
		base + ":v": {hard, envelope.HeaderSize + int64(len(value))},
		base + ":f": {hard + fenceMargin, 16},
	})

	// A tagged value: its tags in the envelope, and the tag's version.
	cache = newCache()
	if _, err := cache.Get(ctx, tagged, func(ctx context.Context) (string, error) {
		herd.Tags(ctx, tag)
		return value, nil
	}); err != nil {
		t.Fatal(err)
	}
	closeCache(cache)
	tbase := "herd:{" + hashTag([]byte(tagged)) + "}:" + tagged
	fence, err := c.Get(ctx, tbase+":f").Uint64()
	if err != nil {
		t.Fatal(err)
	}
	// Since (the fence) and the number of tags as uvarints, then the tag's
	// length and bytes.
	tags := int64(len(binary.AppendUvarint(nil, fence)) + 1 + 1 + len(tag))
	tagKey := "herd:{" + hashTag(append([]byte{0}, tag...)) + "}:" + tag + ":t"
	keysAre(t, c, "a tagged write", map[string]listed{
		base + ":v":  {hard, envelope.HeaderSize + int64(len(value))},
		base + ":f":  {hard + fenceMargin, 16},
		tbase + ":v": {hard, envelope.HeaderSize + tags + int64(len(value))},
		tbase + ":f": {hard + fenceMargin, 16},
		tagKey:       {TagKeep, 16},
	})

	// InvalidateAll: the generation key, without a TTL, and the names of
	// the new generation; those of generation 0 expire at their TTLs.
	cache = newCache()
	if err := cache.InvalidateAll(ctx); err != nil {
		t.Fatal(err)
	}
	gen, err := c.Get(ctx, "herd:{gen}").Result()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cache.Get(ctx, key, func(context.Context) (string, error) { return value, nil }); err != nil {
		t.Fatal(err)
	}
	closeCache(cache)
	gbase := "herd:{" + hashTag([]byte(key)) + "}#" + gen + ":" + key
	keysAre(t, c, "a write after InvalidateAll", map[string]listed{
		base + ":v":  {hard, envelope.HeaderSize + int64(len(value))},
		base + ":f":  {hard + fenceMargin, 16},
		tbase + ":v": {hard, envelope.HeaderSize + tags + int64(len(value))},
		tbase + ":f": {hard + fenceMargin, 16},
		tagKey:       {TagKeep, 16},
		"herd:{gen}": {0, 16},
		gbase + ":v": {hard, envelope.HeaderSize + int64(len(value))},
		gbase + ":f": {hard + fenceMargin, 16},
	})

	// The hot set: a sorted set per period, kept for three periods.
	if err := c.FlushAll(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	const period = time.Minute
	before := time.Now().UnixNano() / int64(period)
	if err := r.AddHot(ctx, map[string]uint64{key: 3}, 10, period); err != nil {
		t.Fatal(err)
	}
	hot := "herd:hot:{hot}:60000:" + strconv.FormatInt(before, 10)
	if n, err := c.Exists(ctx, hot).Result(); err == nil && n == 0 { // the period turned meanwhile
		hot = "herd:hot:{hot}:60000:" + strconv.FormatInt(before+1, 10)
	}
	keysAre(t, c, "a hot set", map[string]listed{hot: {3 * period, -1}})
}

// keysAre checks that the keys in Redis are exactly those of want, each
// with a TTL no longer than listed and not much shorter (zero: none) and
// the length listed (-1: not a string); it logs what each takes.
func keysAre(t *testing.T, c redis.UniversalClient, step string, want map[string]listed) {
	t.Helper()
	ctx := t.Context()
	got, err := c.Keys(ctx, "*").Result()
	if err != nil {
		t.Fatal(err)
	}
	slices.Sort(got)
	if names := slices.Sorted(maps.Keys(want)); !slices.Equal(got, names) {
		t.Fatalf("%s: Redis holds\n\t%q\nwant\n\t%q", step, got, names)
	}
	var total int64
	for _, name := range got {
		w := want[name]
		ttl, err := c.PTTL(ctx, name).Result()
		if err != nil {
			t.Fatal(err)
		}
		switch {
		case w.ttl == 0 && ttl != -1:
			t.Errorf("%s: %s has PTTL %v, want none", step, name, ttl)
		case w.ttl != 0 && (ttl > w.ttl || ttl < w.ttl-deadline):
			t.Errorf("%s: %s has PTTL %v, want %v (less the test's time)", step, name, ttl, w.ttl)
		}
		mem, err := c.MemoryUsage(ctx, name, 0).Result()
		if err != nil {
			t.Fatal(err)
		}
		total += mem
		if w.len < 0 {
			t.Logf("%s: %s: PTTL %v, MEMORY USAGE %d", step, name, ttl, mem)
			continue
		}
		n, err := c.StrLen(ctx, name).Result()
		if err != nil {
			t.Fatal(err)
		}
		if n != w.len {
			t.Errorf("%s: %s holds %d bytes, want %d", step, name, n, w.len)
		}
		t.Logf("%s: %s: PTTL %v, STRLEN %d, MEMORY USAGE %d", step, name, ttl, n, mem)
	}
	t.Logf("%s: MEMORY USAGE %d in all", step, total)
}
