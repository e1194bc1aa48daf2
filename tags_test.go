package herd_test

import (
	"context"
	"errors"
	"testing"
	"testing/synctest"
	"time"

	"github.com/herdcache/herd"
	"github.com/herdcache/herd/memory"
)

// tagged returns a load of v whose entry is tagged with tags.
func tagged(v int, tags ...string) herd.LoadFunc[int] {
	return func(ctx context.Context) (int, error) {
		herd.Tags(ctx, tags...)
		return v, nil
	}
}

// TestInvalidateTagLocal: without a Store, InvalidateTag retires the
// entries with the tag and no other, and a load that ran across it is
// served but not cached.
func TestInvalidateTagLocal(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := newCache(t, testOptions())
		ctx := bounded(t)
		mustGet(t, c, "a", tagged(1, "red"), 1)
		mustGet(t, c, "b", tagged(2, "red", "blue"), 2)
		mustGet(t, c, "c", tagged(3, "blue"), 3)
		mustGet(t, c, "plain", fleetValue(4), 4)
		gate := make(chan struct{})
		running := getAsync(ctx, c, "d", func(ctx context.Context) (int, error) {
			herd.Tags(ctx, "red")
			return 5, hold(ctx, gate)
		})
		synctest.Wait()
		time.Sleep(time.Millisecond) // a version after every load began
		if err := c.InvalidateTag(ctx, "red"); err != nil {
			t.Fatal(err)
		}
		close(gate)
		if r := recv(t, running); r.v != 5 || r.err != nil {
			t.Errorf("the load that ran across InvalidateTag = %+v, want its value served", r)
		}
		for k, want := range map[string]bool{"a": false, "b": false, "d": false, "c": true, "plain": true} {
			if _, ok := c.GetIfPresent(k); ok != want {
				t.Errorf("GetIfPresent(%q) = %v after InvalidateTag(red), want %v", k, ok, want)
			}
		}
		time.Sleep(time.Millisecond)              // a load in InvalidateTag's microsecond is not cached
		mustGet(t, c, "a", tagged(10, "red"), 10) // loaded again, and kept
		if v, ok := c.GetIfPresent("a"); !ok || v != 10 {
			t.Errorf("a after its reload = %d, %v; want 10 cached", v, ok)
		}
	})
}

// TestFleetInvalidateTag: InvalidateTag on one of 5 replicas retires the
// tag's entries on all of them and in the Store, with one call of the
// Store, whatever the tag's size; a load that ran across it on another
// replica is cached in neither tier; the next reads load each key once for
// the fleet.
func TestFleetInvalidateTag(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := memory.New()
		cs := fleetReplicas(t, 5, r, func(o *herd.Options[int]) { o.OnLeaseHeld = herd.Wait })
		ctx := bounded(t)
		keys := batchKeys("tagged", 50)
		load := func(v int) herd.BatchLoadFunc[int] {
			return func(ctx context.Context, ks []string) (map[string]int, error) {
				herd.Tags(ctx, "catalog")
				m := map[string]int{}
				for _, k := range ks {
					m[k] = v
					if k == keys[0] {
						herd.TagsFor(ctx, k, "first")
					}
				}
				return m, nil
			}
		}
		for _, c := range cs {
			items := c.GetMany(ctx, keys, load(1))
			for i, it := range items {
				if it.Err != nil || it.Value != 1 {
					t.Fatalf("%q = %+v, want 1", keys[i], it)
				}
			}
		}
		mustGet(t, cs[2], "other", tagged(7, "elsewhere"), 7)
		gate := make(chan struct{})
		running := getAsync(ctx, cs[3], "late", func(ctx context.Context) (int, error) {
			herd.Tags(ctx, "catalog")
			return 9, hold(ctx, gate)
		})
		synctest.Wait()
		time.Sleep(time.Millisecond)
		before := r.Stats()
		if err := cs[0].InvalidateTag(ctx, "catalog"); err != nil {
			t.Fatal(err)
		}
		if n := r.Stats().TagInvalidates - before.TagInvalidates; n != 1 {
			t.Errorf("%d InvalidateTag calls of the Store for 50 keys, want 1", n)
		}
		synctest.Wait()
		close(gate)
		if res := recv(t, running); res.v != 9 {
			t.Errorf("the load that ran across InvalidateTag = %+v, want 9 served", res)
		}
		synctest.Wait()
		for i, c := range cs {
			for _, k := range append(keys, "late") {
				if _, ok := c.GetIfPresent(k); ok {
					t.Fatalf("replica %d serves %q after InvalidateTag", i, k)
				}
			}
		}
		if _, ok := cs[2].GetIfPresent("other"); !ok {
			t.Error("an entry of another tag was retired")
		}
		// A new replica reads the retired values from the Store and refuses
		// them: each key is loaded once more for the whole fleet.
		loads := newKeyLoads(t)
		fresh := append(cs, fleetReplica(t, r, func(o *herd.Options[int]) { o.OnLeaseHeld = herd.Wait }))
		for _, c := range fresh {
			wantItems(t, keys, c.GetMany(ctx, keys, loads.load(nil, func(k string) int { return len(k) })), nil)
		}
		for _, k := range keys {
			if n := loads.counts()[k]; n != 1 {
				t.Errorf("%q loaded %d times after InvalidateTag, want 1", k, n)
			}
		}
	})
}

// TestInvalidateTagUnsupported: over a Store that keeps no tag versions,
// tags are ignored (the value is cached as if untagged) and InvalidateTag
// gives ErrUnsupported.
func TestInvalidateTagUnsupported(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := memory.New()
		tier := singleCalls{Store: r, Lease: r}
		c := fleetReplica(t, r, func(o *herd.Options[int]) { o.Store, o.Lease = tier, tier })
		ctx := bounded(t)
		mustGet(t, c, "a", tagged(1, "t"), 1)
		mustGet(t, c, "a", fleetNoLoad(t, "a Get of a cached value"), 1)
		if err := c.InvalidateTag(ctx, "t"); !errors.Is(err, errors.ErrUnsupported) {
			t.Errorf("InvalidateTag = %v, want ErrUnsupported", err)
		}
		if v, ok := c.GetIfPresent("a"); !ok || v != 1 {
			t.Errorf("a = %d, %v; want the value cached, its tags ignored", v, ok)
		}
	})
}
