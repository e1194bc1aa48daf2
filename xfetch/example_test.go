package xfetch_test

import (
	"fmt"
	"time"

	"github.com/herdcache/herd/xfetch"
)

// An entry that took 100ms to compute, 50ms before it expires: with beta 1 a
// reader refreshes it early with probability exp(−0.5) ≈ 0.61, namely when its
// draw u is at most that.
func ExampleRefresh() {
	expiry := time.Date(2025, 6, 1, 12, 0, 0, 0, time.UTC)
	now := expiry.Add(-50 * time.Millisecond)
	delta := 100 * time.Millisecond

	fmt.Printf("p = %.3f\n", xfetch.Probability(expiry.Sub(now), delta, 1))
	for _, u := range []float64{0.9, 0.6, 0.3} {
		fmt.Printf("u = %.1f: refresh %v\n", u, xfetch.Refresh(now, expiry, delta, 1, u))
	}
	fmt.Println("at expiry:", xfetch.Refresh(expiry, expiry, delta, 1, 1))
	// Output:
	// p = 0.607
	// u = 0.9: refresh false
	// u = 0.6: refresh true
	// u = 0.3: refresh true
	// at expiry: true
}

// Far from expiry Decide answers without drawing; near it, it draws once.
func ExampleDecide() {
	delta := int64(100 * time.Millisecond)
	now := int64(0)
	draw := func() float64 {
		fmt.Println("  drew")
		return 0.5
	}

	fmt.Println("an hour before expiry:")
	fmt.Println(" ", xfetch.Decide(now, now+int64(time.Hour), delta, 1, draw))
	fmt.Println("50ms before expiry:")
	fmt.Println(" ", xfetch.Decide(now, now+int64(50*time.Millisecond), delta, 1, draw))
	// Output:
	// an hour before expiry:
	//   false
	// 50ms before expiry:
	//   drew
	//   true
}
