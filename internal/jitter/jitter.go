// Package jitter spreads cache TTLs by a random fraction so that entries
// written together do not expire together.
package jitter

import (
	"fmt"
	"math"
	"time"
)

// Jitter moves TTLs by up to ± a fixed fraction of the TTL. The zero value
// leaves every TTL unchanged. A Jitter is a small value, safe to copy and to
// use from many goroutines.
type Jitter struct {
	// f is the fraction, always in [0, 1) (New checks it), so a positive TTL
	// stays positive: base·(1−f) > 0.
	f float64
}

// New returns a Jitter that moves TTLs by up to ± fraction of their length.
// fraction must be in [0, 1); 0 turns jitter off.
func New(fraction float64) (Jitter, error) {
	if !(fraction >= 0 && fraction < 1) {
		return Jitter{}, fmt.Errorf("jitter: fraction %v must be in [0, 1)", fraction)
	}
	return Jitter{f: fraction}, nil
}

// Fraction returns the fraction j was made with; 0 means off.
func (j Jitter) Fraction() float64 {
	return j.f
}

// TTL returns base moved by an offset uniform in [−f·base, +f·base] for a u
// uniform in [0, 1): base·(1−f) at u = 0, base at u = 0.5, and towards
// base·(1+f) as u nears 1. The cache passes rand.Float64() as u.
//
// A positive base gives a positive TTL: base·(1−f) > 0 because f < 1, and the
// result is at least 1ns even where rounding to whole nanoseconds would
// reach 0; there is no larger floor, so short TTLs keep their full spread.
// A base of 0 or below is returned unchanged, and so is every base when f is
// 0. A u outside [0, 1] is clamped to it; a NaN u means no offset. The result
// saturates at the largest Duration instead of wrapping.
func (j Jitter) TTL(base time.Duration, u float64) time.Duration {
	return addSat(base, j.offset(base, u))
}

// Pair moves a soft and a hard TTL by one offset d uniform in
// [−f·soft, +f·soft] (for u uniform in [0, 1), as in [Jitter.TTL]), so the
// stale window hard − soft keeps its exact length and the soft TTL is spread
// exactly as TTL(soft, u) is.
//
// The soft TTL stays positive when soft is positive (see [Jitter.TTL]); when
// soft is 0 or below both are returned unchanged. The only case where the
// window changes is a hard TTL so near the largest (or smallest) Duration that
// hard + d would pass it: hard then saturates there instead of wrapping.
func (j Jitter) Pair(soft, hard time.Duration, u float64) (time.Duration, time.Duration) {
	d := j.offset(soft, u)
	return addSat(soft, d), addSat(hard, d)
}

// offset returns the offset for base and u: f·base·(2u−1), truncated towards
// zero, raised where needed so base + offset ≥ 1ns, and 0 when base ≤ 0.
func (j Jitter) offset(base time.Duration, u float64) time.Duration {
	if j.f == 0 || base <= 0 || math.IsNaN(u) {
		return 0
	}
	u = min(max(u, 0), 1)
	// |f·base·(2u−1)| < 2^63, so the conversion does not overflow.
	d := time.Duration(j.f * float64(base) * (2*u - 1))
	if d < 0 && base+d < 1 { // base > 0 and d < 0: no overflow
		d = 1 - base
	}
	return d
}

// addSat returns a + d, saturating at the largest or smallest Duration
// instead of wrapping.
func addSat(a, d time.Duration) time.Duration {
	switch {
	case d > 0 && a > math.MaxInt64-d:
		return math.MaxInt64
	case d < 0 && a < math.MinInt64-d:
		return math.MinInt64
	}
	return a + d
}
