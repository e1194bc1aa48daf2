package herd_test

import (
	"strconv"
	"strings"
	"testing"
	"testing/synctest"

	"github.com/herdcache/herd"
)

// With MaxWeight the local tier holds at most that much weight: values of
// 100 bytes under a bound of 1,000 leave at most ten of them, however many
// are put, and one value heavier than the bound is not kept at all.
func TestMaxWeight(t *testing.T) {
	synctest.Test(t, testMaxWeight)
}

func testMaxWeight(t *testing.T) {
	c, err := herd.New(&herd.Options[string]{
		MaxWeight: 1000,
		Weigher:   func(_ string, v string) uint32 { return uint32(len(v)) },
		SoftTTL:   testSoft,
	})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close(t.Context())
	v := strings.Repeat("x", 100)
	for i := range 100 {
		if err := c.Set(t.Context(), strconv.Itoa(i), v); err != nil {
			t.Fatal(err)
		}
	}
	synctest.Wait() // the local tier's maintenance runs in the background
	held := 0
	for i := range 100 {
		if _, ok := c.GetIfPresent(strconv.Itoa(i)); ok {
			held++
		}
	}
	if held == 0 || held > 10 {
		t.Errorf("%d values of 100 held under MaxWeight 1000; want 1 to 10", held)
	}
	if err := c.Set(t.Context(), "big", strings.Repeat("x", 2000)); err != nil {
		t.Fatal(err)
	}
	synctest.Wait()
	if _, ok := c.GetIfPresent("big"); ok {
		t.Error("a value heavier than MaxWeight is held")
	}
}

// MaxWeight and Weigher go together, and replace MaxEntries.
func TestMaxWeightOptions(t *testing.T) {
	w := func(string, int) uint32 { return 1 }
	for _, o := range []herd.Options[int]{
		{MaxWeight: 10, SoftTTL: testSoft},
		{MaxEntries: 10, Weigher: w, SoftTTL: testSoft},
		{MaxEntries: 10, MaxWeight: 10, Weigher: w, SoftTTL: testSoft},
	} {
		if _, err := herd.New(&o); err == nil || !strings.HasPrefix(err.Error(), "herd: ") {
			t.Errorf("New(MaxEntries %d, MaxWeight %d, Weigher set %v) = %v; want an error starting with \"herd: \"", o.MaxEntries, o.MaxWeight, o.Weigher != nil, err)
		}
	}
}
