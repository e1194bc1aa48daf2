package herd_test

import (
	"strings"
	"testing"
	"time"

	"github.com/herdcache/herd"
	"github.com/herdcache/herd/memory"
)

// TestStoreNeedsProtectionChoices: a literal that sets a Store and leaves
// the near-cache or the breaker out is refused with an error naming the
// choice to make; saying either way is accepted, both ways is refused.
func TestStoreNeedsProtectionChoices(t *testing.T) {
	r := memory.New()
	for _, tt := range []struct {
		name string
		mod  func(o *herd.Options[int])
		want []string // each a line of the error; none when New accepts
	}{
		{"neither", func(o *herd.Options[int]) {}, []string{"NearTTL", "NoNearCache", "BreakerThreshold", "NoBreaker"}},
		{"near only", func(o *herd.Options[int]) { o.NearTTL = time.Second }, []string{"BreakerThreshold", "NoBreaker"}},
		{"breaker only", func(o *herd.Options[int]) { o.BreakerThreshold, o.BreakerCooldown = 5, time.Second }, []string{"NearTTL", "NoNearCache"}},
		{"both set", func(o *herd.Options[int]) {
			o.NearTTL, o.BreakerThreshold, o.BreakerCooldown = time.Second, 5, time.Second
		}, nil},
		{"both off", func(o *herd.Options[int]) { o.NoNearCache, o.NoBreaker = true, true }, nil},
		{"NearTTL and NoNearCache", func(o *herd.Options[int]) {
			o.NearTTL, o.NoNearCache, o.NoBreaker = time.Second, true, true
		}, []string{"NearTTL and NoNearCache"}},
		{"BreakerThreshold and NoBreaker", func(o *herd.Options[int]) {
			o.NoNearCache, o.BreakerThreshold, o.BreakerCooldown, o.NoBreaker = true, 5, time.Second, true
		}, []string{"BreakerThreshold and NoBreaker"}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			o := &herd.Options[int]{MaxEntries: 10, SoftTTL: time.Minute, Store: r}
			tt.mod(o)
			c, err := herd.New(o)
			if tt.want == nil {
				if err != nil {
					t.Fatalf("New: %v", err)
				}
				c.Close(t.Context())
				return
			}
			if err == nil {
				c.Close(t.Context())
				t.Fatalf("New accepted %+v", o)
			}
			for _, w := range tt.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not name %s", err, w)
				}
			}
		})
	}
	// Without a Store there is nothing to protect: a literal needs neither.
	if _, err := herd.New(&herd.Options[int]{MaxEntries: 10, SoftTTL: time.Minute}); err != nil {
		t.Fatalf("New without a Store: %v", err)
	}
	// DefaultOptions says both: setting a Store on it is enough.
	o := herd.DefaultOptions[int]()
	o.Store, o.Lease = r, r
	c, err := herd.New(o)
	if err != nil {
		t.Fatalf("New over DefaultOptions with a Store: %v", err)
	}
	c.Close(t.Context())
}

// TestDefaultOptionsShareOneLimiter: every DefaultOptions, whatever its
// value type, carries the process's one limiter, so that two caches over
// one database share its slots.
func TestDefaultOptionsShareOneLimiter(t *testing.T) {
	a, b := herd.DefaultOptions[int](), herd.DefaultOptions[string]()
	if a.Limiter == nil || a.Limiter != b.Limiter || a.Limiter != herd.SharedLimiter() {
		t.Fatalf("DefaultOptions limiters %p and %p, SharedLimiter %p: want one", a.Limiter, b.Limiter, herd.SharedLimiter())
	}
	if n := a.Limiter.Limit(); n != 32 {
		t.Fatalf("shared limiter's limit %d, want 32", n)
	}
}
