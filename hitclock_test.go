package herd_test

import (
	"context"
	"testing"
	"testing/synctest"
	"time"

	"github.com/herdcache/herd"
)

// A hit judges a value far from its expiry by the coarse clock, and one
// within a resolution of it by the precise time: with or without
// PreciseClock, the value is reloaded by the first read at its expiry.
func TestHitClock(t *testing.T) {
	for _, tc := range []struct {
		name    string
		precise bool
	}{
		{"coarse", false},
		{"precise", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				ctx := context.Background()
				c := herd.Must(herd.New(&herd.Options[int]{
					MaxEntries: 8, SoftTTL: time.Second, PreciseClock: tc.precise,
				}))
				defer c.Close(ctx)
				var loads []time.Time
				load := func(context.Context) (int, error) {
					loads = append(loads, time.Now())
					return len(loads), nil
				}
				// Hits read continuously across the expiry, one every 100µs.
				for range 10_100 {
					if _, err := c.Get(ctx, "k", load); err != nil {
						t.Fatal(err)
					}
					if len(loads) == 2 {
						break
					}
					time.Sleep(100 * time.Microsecond)
				}
				if len(loads) != 2 {
					t.Fatalf("%d loads across the expiry, want 2", len(loads))
				}
				expiry := loads[0].Add(time.Second)
				if !loads[1].Equal(expiry) {
					t.Errorf("value reloaded %v after its expiry, want at it", loads[1].Sub(expiry))
				}
			})
		})
	}
}
