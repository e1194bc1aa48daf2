package limiter

import (
	"context"
	"testing"

	"golang.org/x/sync/semaphore"
)

// The benchmarks compare Acquire and Release with golang.org/x/sync/semaphore,
// the standard FIFO alternative, when a slot is always free.

func BenchmarkAcquireRelease(b *testing.B) {
	ctx := context.Background()
	b.Run("impl=limiter", func(b *testing.B) {
		l, err := New(Options{Limit: 1})
		if err != nil {
			b.Fatal(err)
		}
		b.ReportAllocs()
		for b.Loop() {
			if err := l.Acquire(ctx); err != nil {
				b.Fatal(err)
			}
			l.Release()
		}
	})
	b.Run("impl=semaphore", func(b *testing.B) {
		s := semaphore.NewWeighted(1)
		b.ReportAllocs()
		for b.Loop() {
			if err := s.Acquire(ctx, 1); err != nil {
				b.Fatal(err)
			}
			s.Release(1)
		}
	})
}

func BenchmarkTryAcquire(b *testing.B) {
	b.Run("impl=limiter", func(b *testing.B) {
		l, err := New(Options{Limit: 2, Reserve: 1})
		if err != nil {
			b.Fatal(err)
		}
		b.ReportAllocs()
		for b.Loop() {
			if !l.TryAcquireBackground() {
				b.Fatal("TryAcquireBackground = false")
			}
			l.Release()
		}
	})
	b.Run("impl=semaphore", func(b *testing.B) {
		s := semaphore.NewWeighted(1)
		b.ReportAllocs()
		for b.Loop() {
			if !s.TryAcquire(1) {
				b.Fatal("TryAcquire = false")
			}
			s.Release(1)
		}
	})
}

// BenchmarkAcquireReleaseParallel runs on every P with more slots than
// goroutines, so no call waits but the mutex is shared.
func BenchmarkAcquireReleaseParallel(b *testing.B) {
	ctx := context.Background()
	const slots = 1 << 20
	b.Run("impl=limiter", func(b *testing.B) {
		l, err := New(Options{Limit: slots})
		if err != nil {
			b.Fatal(err)
		}
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				if err := l.Acquire(ctx); err != nil {
					b.Error(err)
					return
				}
				l.Release()
			}
		})
	})
	b.Run("impl=semaphore", func(b *testing.B) {
		s := semaphore.NewWeighted(slots)
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				if err := s.Acquire(ctx, 1); err != nil {
					b.Error(err)
					return
				}
				s.Release(1)
			}
		})
	})
}
