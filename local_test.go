package herd_test

import (
	"fmt"
	"strconv"
	"strings"
	"testing"
	"testing/synctest"

	"github.com/herdcache/herd"
)

// A value heavier than otter's admission window (about 1% of MaxWeight)
// is kept once Set, even when the tier is full of values read more often:
// a new heavy value would otherwise lose to the first victim it meets.
func TestLocalTierKeepsHeavy(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const budget = 1 << 20
		c, err := herd.New(&herd.Options[string]{
			MaxWeight: budget,
			Weigher:   declaredWeight,
			SoftTTL:   testSoft,
		})
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close(t.Context())
		small := sized(1000, 0) // light: under budget/256
		for i := range 2 * budget / 1000 {
			k := "small" + strconv.Itoa(i)
			if err := c.Set(t.Context(), k, small); err != nil {
				t.Fatal(err)
			}
			for range 3 {
				c.GetIfPresent(k) // read often: otter's victims are warm
			}
		}
		synctest.Wait()
		for i, size := range []int{budget / 100, budget / 20, budget / 5} {
			k := "heavy" + strconv.Itoa(i)
			if err := c.Set(t.Context(), k, sized(size, i)); err != nil {
				t.Fatal(err)
			}
			synctest.Wait()
			if _, ok := c.GetIfPresent(k); !ok {
				t.Errorf("a value of %d bytes under MaxWeight %d was not kept", size, budget)
			}
		}
	})
}

// Light and heavy values put and dropped from several goroutines leave
// the local tier within MaxWeight, the heavy ones within half of it, and
// each key with the last value put under it or none.
func TestLocalTierBound(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const budget = 1 << 20
		c, err := herd.New(&herd.Options[string]{
			MaxWeight: budget,
			Weigher:   declaredWeight,
			SoftTTL:   testSoft,
		})
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close(t.Context())
		// Light values fill otter past its bound first.
		for i := range 2 * budget / 3000 {
			if err := c.Set(t.Context(), "light"+strconv.Itoa(i), sized(3000, i)); err != nil {
				t.Fatal(err)
			}
		}
		// Sizes from light to heavier than half the budget; each key
		// changes size as it is put again.
		sizes := []int{100, budget / 300, budget / 200, budget / 30, budget / 7, budget/2 + 1}
		const workers, keys = 4, 40
		last := make([][]string, workers)
		done := make(chan struct{})
		for w := range workers {
			last[w] = make([]string, keys)
			go func() {
				defer func() { done <- struct{}{} }()
				for i := range 400 {
					k := i % keys
					key := strconv.Itoa(w) + "/" + strconv.Itoa(k)
					if i%11 == 0 {
						c.Invalidate(t.Context(), key)
						last[w][k] = ""
						continue
					}
					v := sized(sizes[(i*7+w)%len(sizes)], i)
					if err := c.Set(t.Context(), key, v); err != nil {
						t.Error(err)
					}
					last[w][k] = v
				}
			}()
		}
		for range workers {
			<-done
		}
		synctest.Wait()
		main, heavy := herd.LocalParts(c)
		if main+heavy > budget || heavy > budget/2 {
			t.Errorf("the local tier holds %d in otter and %d in its list; want at most %d together and %d in the list", main, heavy, budget, budget/2)
		}
		if w := c.Stats().LocalWeight; w > budget {
			t.Errorf("Stats().LocalWeight = %d; want at most %d", w, budget)
		}
		kept := 0
		for w := range workers {
			for k := range keys {
				got, ok := c.GetIfPresent(strconv.Itoa(w) + "/" + strconv.Itoa(k))
				switch {
				case !ok:
				case got != last[w][k]:
					t.Errorf("key %d/%d holds %q; the last put was %q", w, k, got, last[w][k])
				case declaredWeight("", got) > budget/2:
					t.Errorf("key %d/%d holds %q, heavier than half of MaxWeight", w, k, got)
				default:
					kept++
				}
			}
		}
		if kept == 0 {
			t.Error("no value kept")
		}
	})
}

// sized is a value that declaredWeight weighs at weight; n tells apart
// values of one weight.
func sized(weight, n int) string { return fmt.Sprintf("%d/%d", weight, n) }

// declaredWeight is the weight sized gave v: the tests weigh large values
// without making them.
func declaredWeight(_ string, v string) uint32 {
	w, _, _ := strings.Cut(v, "/")
	n, _ := strconv.Atoi(w)
	return uint32(n)
}
