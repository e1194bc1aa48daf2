package redisstore

import (
	"bytes"
	"context"
	"errors"
	"testing"
	"time"

	"github.com/herdcache/herd"
	"github.com/herdcache/herd/redisstore/internal/redistest"
)

// BenchmarkRemoteHit compares a cache read served by Redis (no near-cache, so
// every Get reads Redis) with a plain go-redis GET of the same bytes over
// the same client, on a redis-server the benchmark starts; impl=store is
// Remote.Load alone.
func BenchmarkRemoteHit(b *testing.B) {
	c := redistest.Server(b).Client()
	r := newRemote(b, c, Options{})
	cache, err := herd.New(&herd.Options[[]byte]{
		NoBreaker:  true,
		MaxEntries: 100,
		SoftTTL:    time.Hour,
		Store:      r,
		Codec:      herd.Bytes(),
		NearTTL:    0, // every Get asks Redis
	})
	if err != nil {
		b.Fatalf("herd.New: %v", err)
	}
	b.Cleanup(func() { _ = cache.Close(context.Background()) })
	ctx := context.Background()
	const key = "bench/hit"
	value := bytes.Repeat([]byte("v"), 1024)
	if err := cache.Set(ctx, key, value); err != nil {
		b.Fatalf("Set: %v", err)
	}
	load := func(context.Context) ([]byte, error) { return nil, errors.New("load called on a remote hit") }

	b.Run("impl=herd", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			v, err := cache.Get(ctx, key, load)
			if err != nil || len(v) != len(value) {
				b.Fatalf("Get = %d bytes, %v", len(v), err)
			}
		}
	})
	// The Remote alone, to tell its cost from the cache's.
	b.Run("impl=store", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			v, err := r.Load(ctx, key)
			if err != nil || len(v) < len(value) {
				b.Fatalf("Load = %d bytes, %v", len(v), err)
			}
		}
	})
	b.Run("impl=raw", func(b *testing.B) {
		b.ReportAllocs()
		name := r.space.Names(key).Value
		for b.Loop() {
			v, err := c.Get(ctx, name).Bytes()
			if err != nil || len(v) < len(value) {
				b.Fatalf("GET = %d bytes, %v", len(v), err)
			}
		}
	})
}
