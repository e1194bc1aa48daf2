package topk

import (
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
)

// exactMap is the standard alternative: an exact count per key under a
// mutex, whose memory grows with every distinct key.
type exactMap struct {
	mu sync.Mutex
	m  map[string]*Counts
}

func (e *exactMap) Add(key string, c Counts) {
	e.mu.Lock()
	defer e.mu.Unlock()
	p := e.m[key]
	if p == nil {
		p = new(Counts)
		e.m[key] = p
	}
	p.Traffic += c.Traffic
	p.Misses += c.Misses
	p.Loads += c.Loads
	p.Stale += c.Stale
}

type adder interface{ Add(string, Counts) }

func benchKeys(n int) []string {
	keys := make([]string, n)
	for i := range keys {
		keys[i] = fmt.Sprintf("tenant-42:user:%08d", i)
	}
	return keys
}

// zipfStream is 2^16 draws of Zipf(s=1.1) over 10^5 keys.
func zipfStream() []string {
	keys := benchKeys(100_000)
	z := rand.NewZipf(rand.New(rand.NewPCG(1, 1)), 1.1, 1, uint64(len(keys)-1))
	s := make([]string, 1<<16)
	for i := range s {
		s[i] = keys[z.Uint64()]
	}
	return s
}

func BenchmarkAdd(b *testing.B) {
	c := Counts{Traffic: 1, Misses: 1}
	// A key already tracked (topk) or already counted (map).
	tracked := func(b *testing.B, a adder) {
		a.Add("tenant-42:user:hot", c)
		b.ReportAllocs()
		for b.Loop() {
			a.Add("tenant-42:user:hot", c)
		}
	}
	zipf := func(b *testing.B, a adder) {
		s := zipfStream()
		b.ReportAllocs()
		i := 0
		for b.Loop() {
			a.Add(s[i&(len(s)-1)], c)
			i++
		}
	}
	b.Run("impl=topk/tracked", func(b *testing.B) { tracked(b, New(10)) })
	b.Run("impl=map/tracked", func(b *testing.B) { tracked(b, &exactMap{m: map[string]*Counts{}}) })
	// Every Add takes a slot over: 2^16 keys cycle through 100 full slots,
	// and a slot cannot survive the 2^16 takeovers before its key returns.
	b.Run("impl=topk/untracked-full", func(b *testing.B) {
		tr := New(10)
		keys := benchKeys(1 << 16)
		for _, k := range keys[:tr.m] {
			tr.Add(k, c)
		}
		b.ReportAllocs()
		i := tr.m // the first key not tracked
		for b.Loop() {
			tr.Add(keys[i&(len(keys)-1)], c)
			i++
		}
	})
	b.Run("impl=topk/zipf", func(b *testing.B) { zipf(b, New(10)) })
	b.Run("impl=map/zipf", func(b *testing.B) { zipf(b, &exactMap{m: map[string]*Counts{}}) })
}

func BenchmarkTop(b *testing.B) {
	tr := New(10)
	for _, k := range zipfStream() {
		tr.Add(k, Counts{Traffic: 1})
	}
	b.ReportAllocs()
	for b.Loop() {
		tr.Top()
	}
}
