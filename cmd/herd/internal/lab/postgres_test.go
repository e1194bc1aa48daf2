package lab

import (
	"context"
	"testing"
	"time"

	"github.com/herdcache/herd/storetest/pgtest"
	"github.com/jackc/pgx/v5/pgxpool"
)

// TestSlowOriginPostgres runs slow-origin against a throwaway PostgreSQL:
// it ends within its bound (three rungs one after the other, each its run
// and a load timeout), every rung's calls reach the database, and the
// static limit at the default, which lets far more calls in than the
// capacity, finds the database slower by the backends PostgreSQL counts
// itself: it keeps at least twice the calls in flight of the static limit
// tuned to the capacity, and its p99 while overloaded is at least 1.5× that
// limit's.
func TestSlowOriginPostgres(t *testing.T) {
	dsn := pgtest.Start(t)
	o := Quick()
	o.Scenarios = []string{slowScenario}
	o.SlowScale = 0
	o.PostgresDSN = dsn
	bound := 3*(slowDuration(&o)+slowLoadTimeout(&o)) + 30*time.Second
	ctx, cancel := context.WithTimeout(t.Context(), bound)
	defer cancel()
	s, err := RunSuite(ctx, o)
	if err != nil {
		t.Fatalf("after %v (bound %v): %v", time.Since(s.Started), bound, err)
	}
	if len(s.Runs) != len(SlowRungs) {
		t.Fatalf("%d runs, want %d", len(s.Runs), len(SlowRungs))
	}
	for _, r := range s.Runs {
		if r.OriginCalls == 0 {
			t.Errorf("%s: no database call", r.Layer)
		}
	}
	// A busy machine slows every query alike and so narrows the p99 ratio
	// (3× and more on a quiet machine, 2.5× seen beside other work): the
	// promise held under load is that the default lets in at least twice
	// the backends and the database answers it clearly slower.
	defIn, tunedIn := s.Runs[0].Extra["db_mean_inflight"], s.Runs[1].Extra["db_mean_inflight"]
	if defIn < 2*tunedIn {
		t.Errorf("database calls in flight: static-default %.1f, want at least twice static-tuned's %.1f", defIn, tunedIn)
	}
	def, tuned := s.Runs[0].Extra["db_p99_overload_ms"], s.Runs[1].Extra["db_p99_overload_ms"]
	if def < 1.5*tuned {
		t.Errorf("database p99 while overloaded: static-default %.0fms, want at least 1.5× static-tuned's %.0fms", def, tuned)
	}
	t.Logf("database p99 while overloaded: static-default %.0fms, static-tuned %.0fms, adaptive %.0fms; in flight %.1f, %.1f, %.1f",
		def, tuned, s.Runs[2].Extra["db_p99_overload_ms"], defIn, tunedIn, s.Runs[2].Extra["db_mean_inflight"])
}

// TestOpenPoolTooLarge asks a server that allows 5 connections for a pool
// of 20: openPool returns the server's refusal, well within its bound,
// rather than waiting forever for the connections it holds to come back to
// the pool it closes.
func TestOpenPoolTooLarge(t *testing.T) {
	dsn := pgtest.StartWith(t, &pgtest.Options{Settings: map[string]string{"max_connections": "5"}})
	cfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	done := make(chan error, 1)
	go func() {
		pool, err := openPool(ctx, cfg, 20)
		if pool != nil {
			pool.Close()
		}
		done <- err
	}()
	select {
	case err := <-done:
		if err == nil {
			t.Fatal("openPool opened 20 connections to a server that allows 5")
		}
		t.Log(err)
	case <-ctx.Done():
		t.Fatal("openPool has not returned within a minute")
	}
	// The server is usable again: the refused pool closed its connections.
	pool, err := openPool(t.Context(), cfg, 2)
	if err != nil {
		t.Fatalf("a pool of 2 after the refused one: %v", err)
	}
	pool.Close()
}
