package herd

import (
	"testing"
	"time"
)

// TestExtendBudget: a watchdog's round has LeaseTTL/6 for up to 1024
// leases, as much again for each further 1024, and never more than half
// the lease TTL.
func TestExtendBudget(t *testing.T) {
	ttl := 6 * time.Second
	for _, tc := range []struct {
		n    int
		want time.Duration
	}{
		{1, time.Second}, {1024, time.Second}, {1025, 2 * time.Second},
		{2048, 2 * time.Second}, {2049, 3 * time.Second}, {100_000, 3 * time.Second},
	} {
		if got := extendBudget(ttl, tc.n); got != tc.want {
			t.Errorf("extendBudget(%v, %d) = %v, want %v", ttl, tc.n, got, tc.want)
		}
	}
}
