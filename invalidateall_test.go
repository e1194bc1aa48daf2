package herd_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"testing/synctest"

	"github.com/herdcache/herd"
	"github.com/herdcache/herd/memory"
)

// TestFleetInvalidateAll: an InvalidateAll on one of 5 replicas empties
// every replica's local tier and the Store, a load that was running on
// another replica writes its value into neither tier, and the next reads
// load each key once for the fleet.
func TestFleetInvalidateAll(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := memory.New()
		cs := fleetReplicas(t, 5, r, func(o *herd.Options[int]) { o.OnLeaseHeld = herd.Wait })
		ctx := bounded(t)
		keys := batchKeys("all", 20)
		loads := newKeyLoads(t)
		for _, c := range cs {
			wantItems(t, keys, c.GetMany(ctx, keys, loads.load(nil, func(k string) int { return len(k) })), nil)
		}
		release, held := fleetHold(t, cs[1], "running", 7)

		if err := cs[0].InvalidateAll(ctx); err != nil {
			t.Fatalf("InvalidateAll: %v", err)
		}
		synctest.Wait()
		for i, c := range cs {
			for _, k := range keys {
				if _, ok := c.GetIfPresent(k); ok {
					t.Fatalf("replica %d still holds %q after InvalidateAll", i, k)
				}
			}
		}
		release()
		if res := recv(t, held); res.err != nil || res.v != 7 {
			t.Errorf("the running load's caller got %d, %v; want its value 7", res.v, res.err)
		}
		synctest.Wait()
		if _, ok := cs[1].GetIfPresent("running"); ok {
			t.Error("a load that began before InvalidateAll put its value in its replica's local tier")
		}
		if env, _ := r.Load(ctx, "running"); env != nil {
			t.Error("a load that began before InvalidateAll wrote its value to the Store")
		}
		again := newKeyLoads(t)
		for _, c := range cs {
			wantItems(t, keys, c.GetMany(ctx, keys, again.load(nil, func(k string) int { return len(k) })), nil)
		}
		for _, k := range keys {
			if n := again.counts()[k]; n != 1 {
				t.Errorf("%q loaded %d times after InvalidateAll, want 1 for the fleet", k, n)
			}
		}
		if n := r.Stats().InvalidateAlls; n != 1 {
			t.Errorf("the Store saw %d InvalidateAll calls, want 1", n)
		}
	})
}

// TestInvalidateAllLocal: without a Store, InvalidateAll empties the local
// tier, and a load running meanwhile does not put its value back.
func TestInvalidateAllLocal(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := newCache(t, testOptions())
		ctx := bounded(t)
		mustGet(t, c, "a", fleetValue(1), 1)
		gate := make(chan struct{})
		res := getAsync(ctx, c, "b", func(ctx context.Context) (int, error) { return 2, hold(ctx, gate) })
		synctest.Wait()
		if err := c.InvalidateAll(ctx); err != nil {
			t.Fatal(err)
		}
		// A Get of the running key starts a new load rather than join the old.
		var loads atomic.Int32
		res2 := getAsync(ctx, c, "b", func(context.Context) (int, error) { loads.Add(1); return 3, nil })
		close(gate)
		if r := recv(t, res); r.v != 2 {
			t.Errorf("the running load's caller = %+v, want 2", r)
		}
		if r := recv(t, res2); r.v != 3 || loads.Load() != 1 {
			t.Errorf("a Get after InvalidateAll = %+v with %d loads, want a new load's 3", r, loads.Load())
		}
		if _, ok := c.GetIfPresent("a"); ok {
			t.Error("InvalidateAll left a value in the local tier")
		}
		if v, ok := c.GetIfPresent("b"); !ok || v != 3 {
			t.Errorf("b = %d, %v; want the new load's 3 (not the old load's 2)", v, ok)
		}
	})
}

// TestInvalidateAllUnsupported: a Store that cannot retire every key gives
// an error wrapping errors.ErrUnsupported, and the local tier is emptied.
func TestInvalidateAllUnsupported(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := memory.New()
		tier := singleCalls{Store: r, Lease: r}
		c := fleetReplica(t, r, func(o *herd.Options[int]) { o.Store, o.Lease = tier, tier })
		ctx := bounded(t)
		mustGet(t, c, "a", fleetValue(1), 1)
		if err := c.InvalidateAll(ctx); !errors.Is(err, errors.ErrUnsupported) {
			t.Errorf("InvalidateAll over a Store that is no Clearer = %v, want ErrUnsupported", err)
		}
		if _, ok := c.GetIfPresent("a"); ok {
			t.Error("the local tier was not emptied")
		}
	})
}

// TestInvalidateAllOwnNoticeKeepsNewLoads: the notice of a replica's own
// InvalidateAll, arriving while a load that began after the call is
// running, neither keeps that load's value out of the tiers nor makes the
// key load again.
func TestInvalidateAllOwnNoticeKeepsNewLoads(t *testing.T) {
	for _, lease := range []bool{true, false} {
		t.Run(map[bool]string{true: "lease", false: "no lease"}[lease], func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				r := memory.New()
				c := fleetReplica(t, r, func(o *herd.Options[int]) {
					if !lease {
						o.Lease = nil
					}
				})
				ctx := bounded(t)
				fleetMustGet(t, c, "k", fleetValue(1), 1)
				if err := c.InvalidateAll(ctx); err != nil {
					t.Fatalf("InvalidateAll: %v", err)
				}
				gate := make(chan struct{})
				res := getAsync(ctx, c, "k", func(ctx context.Context) (int, error) { return 2, hold(ctx, gate) })
				synctest.Wait() // the notice arrives while the load runs
				close(gate)
				if got := recv(t, res); got.err != nil || got.v != 2 {
					t.Fatalf("the Get after InvalidateAll = %d, %v; want 2, nil", got.v, got.err)
				}
				synctest.Wait()
				fleetMustGet(t, c, "k", fleetNoLoad(t, "a Get after the new load"), 2)
				if env, _ := r.Load(ctx, "k"); env == nil {
					t.Error("the load after InvalidateAll wrote nothing to the Store")
				}
			})
		})
	}
}
