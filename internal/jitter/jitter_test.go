package jitter

import (
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"
)

func mustNew(t testing.TB, f float64) Jitter {
	t.Helper()
	j, err := New(f)
	if err != nil {
		t.Fatal(err)
	}
	return j
}

func TestNew(t *testing.T) {
	for _, f := range []float64{-0.1, -1, 1, 1.5, math.NaN(), math.Inf(1), math.Inf(-1), math.Nextafter(0, -1)} {
		j, err := New(f)
		if err == nil {
			t.Errorf("New(%v) = %+v, want an error", f, j)
			continue
		}
		if msg := err.Error(); !strings.HasPrefix(msg, "jitter: fraction ") || !strings.HasSuffix(msg, " must be in [0, 1)") {
			t.Errorf("New(%v) error %q, want \"jitter: fraction … must be in [0, 1)\"", f, msg)
		}
	}
	if _, err := New(1); err == nil || err.Error() != "jitter: fraction 1 must be in [0, 1)" {
		t.Errorf("New(1) error = %v", err)
	}
	for _, f := range []float64{0, 0.1, 0.5, math.Nextafter(1, 0)} {
		j, err := New(f)
		if err != nil {
			t.Errorf("New(%v): %v", f, err)
		}
		if j.Fraction() != f {
			t.Errorf("New(%v).Fraction() = %v", f, j.Fraction())
		}
	}
}

func TestZeroFractionIsOff(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	us := []float64{0, 0.25, 0.5, math.Nextafter(1, 0), 1, -3, 7, math.NaN()}
	for range 1000 {
		us = append(us, r.Float64())
	}
	for _, j := range []Jitter{{}, mustNew(t, 0)} {
		for _, u := range us {
			for _, base := range []time.Duration{1, time.Second, 90 * time.Minute, math.MaxInt64} {
				if got := j.TTL(base, u); got != base {
					t.Fatalf("TTL(%v, %v) with f=0 = %v, want it unchanged", base, u, got)
				}
				soft, hard := j.Pair(base, base+time.Minute, u)
				if soft != base || hard != base+time.Minute {
					t.Fatalf("Pair(%v, %v, %v) with f=0 = %v, %v, want them unchanged", base, base+time.Minute, u, soft, hard)
				}
			}
		}
	}
}

func TestTTLPoints(t *testing.T) {
	j := mustNew(t, 0.25)
	const base = 8 * time.Second
	tests := []struct {
		name string
		base time.Duration
		u    float64
		want time.Duration
	}{
		{"u=0 is the low end", base, 0, 6 * time.Second},
		{"u=0.25", base, 0.25, 7 * time.Second},
		{"u=0.5 is base", base, 0.5, base},
		{"u=0.75", base, 0.75, 9 * time.Second},
		{"u=1 is the high end", base, 1, 10 * time.Second},
		{"u below 0 clamps to 0", base, -2, 6 * time.Second},
		{"u above 1 clamps to 1", base, 3, 10 * time.Second},
		{"NaN u means no offset", base, math.NaN(), base},
		{"zero base is unchanged", 0, 0, 0},
		{"negative base is unchanged", -time.Second, 0, -time.Second},
		{"largest base saturates", math.MaxInt64, 1, math.MaxInt64},
		{"largest base moves down", math.MaxInt64, 0, math.MaxInt64 - math.MaxInt64/4 - 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := j.TTL(tt.base, tt.u)
			// float64(math.MaxInt64) rounds up to 2^63, so allow 1µs there.
			if d := got - tt.want; d < -time.Microsecond || d > time.Microsecond || (tt.base < 1<<53 && d != 0) {
				t.Errorf("TTL(%v, %v) = %v, want %v", tt.base, tt.u, got, tt.want)
			}
		})
	}
}

// TestTTLDistribution draws u from a fixed-seed PCG, n = 100,000 per fraction,
// and checks that TTL is uniform on [base·(1−f), base·(1+f)]:
//   - every value lies in the interval;
//   - the smallest and largest values come within 20·width/n of its ends (an
//     exact implementation misses that with probability e^-20 per end);
//   - the mean is base within 5 standard deviations, width/sqrt(12n);
//   - a chi-square over 20 equal buckets is below 43.82, the 0.1% critical
//     value for 19 degrees of freedom;
//   - the Kolmogorov–Smirnov distance is below 1.95/sqrt(n), its 0.1% critical
//     value.
func TestTTLDistribution(t *testing.T) {
	const n = 100_000
	const buckets = 20
	const base = 10 * time.Second
	for _, f := range []float64{0.05, 0.25, 0.9} {
		j := mustNew(t, f)
		r := rand.New(rand.NewPCG(0x7e57, uint64(f*1000)))
		lo, hi := float64(base)*(1-f), float64(base)*(1+f)
		width := hi - lo
		xs := make([]float64, n)
		var sum float64
		var counts [buckets]int
		for i := range xs {
			x := float64(j.TTL(base, r.Float64()))
			if x < lo || x > hi {
				t.Fatalf("f=%v: TTL %v outside [%v, %v]", f, time.Duration(x), time.Duration(lo), time.Duration(hi))
			}
			xs[i] = x
			sum += x
			counts[min(int((x-lo)/width*buckets), buckets-1)]++
		}
		slices.Sort(xs)
		if gap := xs[0] - lo; gap > 20*width/n {
			t.Errorf("f=%v: smallest TTL %v is %v above the low end", f, time.Duration(xs[0]), time.Duration(gap))
		}
		if gap := hi - xs[n-1]; gap > 20*width/n {
			t.Errorf("f=%v: largest TTL %v is %v below the high end", f, time.Duration(xs[n-1]), time.Duration(gap))
		}
		mean, sd := sum/n, width/math.Sqrt(12*n)
		if math.Abs(mean-float64(base)) > 5*sd {
			t.Errorf("f=%v: mean TTL %v, want %v ± %v", f, time.Duration(mean), base, time.Duration(5*sd))
		}
		var chi2 float64
		want := float64(n) / buckets
		for _, c := range counts {
			chi2 += (float64(c) - want) * (float64(c) - want) / want
		}
		if chi2 > 43.82 {
			t.Errorf("f=%v: chi-square %.2f over %d buckets %v, want < 43.82", f, chi2, buckets, counts)
		}
		var ks float64
		for i, x := range xs {
			cdf := (x - lo) / width
			ks = max(ks, math.Abs(float64(i+1)/n-cdf), math.Abs(cdf-float64(i)/n))
		}
		if limit := 1.95 / math.Sqrt(n); ks > limit {
			t.Errorf("f=%v: Kolmogorov–Smirnov distance %.5f, want < %.5f", f, ks, limit)
		}
	}
}

// TestPairKeepsWindow checks, for fixed-seed random soft and hard TTLs and
// draws, that Pair keeps hard − soft exactly, moves soft by at most f·soft,
// keeps soft positive, and moves soft exactly as TTL does.
func TestPairKeepsWindow(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	for _, f := range []float64{0.1, 0.5, math.Nextafter(1, 0)} {
		j := mustNew(t, f)
		for range 100_000 {
			soft := time.Duration(1 + r.Int64N(int64(24*time.Hour)))
			hard := soft + time.Duration(r.Int64N(int64(time.Hour)))
			u := r.Float64()
			s, h := j.Pair(soft, hard, u)
			if h-s != hard-soft {
				t.Fatalf("f=%v Pair(%v, %v, %v) = %v, %v: window %v, want %v", f, soft, hard, u, s, h, h-s, hard-soft)
			}
			if s <= 0 {
				t.Fatalf("f=%v Pair(%v, %v, %v): soft %v is not positive", f, soft, hard, u, s)
			}
			if d := math.Abs(float64(s - soft)); d > f*float64(soft) {
				t.Fatalf("f=%v Pair(%v, %v, %v): soft moved by %v, more than f·soft", f, soft, hard, u, time.Duration(d))
			}
			if want := j.TTL(soft, u); s != want {
				t.Fatalf("f=%v Pair(%v, %v, %v): soft %v, TTL gives %v", f, soft, hard, u, s, want)
			}
		}
	}
}

func TestPositiveForTinyTTLs(t *testing.T) {
	j := mustNew(t, math.Nextafter(1, 0))
	for soft := time.Duration(1); soft <= 1000; soft++ {
		for _, u := range []float64{0, 1e-300, 0.001, 0.4} {
			if got := j.TTL(soft, u); got < 1 {
				t.Fatalf("TTL(%v, %v) = %v, want at least 1ns", soft, u, got)
			}
			s, h := j.Pair(soft, soft+time.Second, u)
			if s < 1 || h-s != time.Second {
				t.Fatalf("Pair(%v, %v, %v) = %v, %v", soft, soft+time.Second, u, s, h)
			}
		}
	}
}

func TestPairSaturates(t *testing.T) {
	j := mustNew(t, 0.5)
	s, h := j.Pair(time.Hour, math.MaxInt64-time.Minute, 1)
	if s != 90*time.Minute || h != math.MaxInt64 {
		t.Errorf("Pair(1h, max−1m, 1) = %v, %v; want 1h30m, the largest Duration", s, h)
	}
	s, h = j.Pair(time.Hour, math.MinInt64+time.Minute, 0)
	if s != 30*time.Minute || h != math.MinInt64 {
		t.Errorf("Pair(1h, min+1m, 0) = %v, %v; want 30m, the smallest Duration", s, h)
	}
	s, h = j.Pair(0, time.Hour, 0)
	if s != 0 || h != time.Hour {
		t.Errorf("Pair(0, 1h, 0) = %v, %v; want them unchanged", s, h)
	}
}

// FuzzPair checks that TTL and Pair never panic or wrap, keep a positive soft
// TTL positive and within f·soft of where it was, and keep the window exactly
// unless hard saturates.
func FuzzPair(f *testing.F) {
	f.Add(int64(time.Second), int64(2*time.Second), 0.1, 0.3)
	f.Add(int64(1), int64(1), 0.999, 0.0)
	f.Add(int64(math.MaxInt64), int64(math.MaxInt64), 0.5, 1.0)
	f.Add(int64(time.Hour), int64(math.MinInt64), 0.5, 0.0)
	f.Add(int64(-5), int64(10), 0.2, 0.9)
	f.Add(int64(time.Minute), int64(time.Hour), 0.0, math.NaN())
	f.Add(int64(math.MaxInt64-96), int64(math.MaxInt64-19), 0.05, -23.0)
	f.Fuzz(func(t *testing.T, soft, hard int64, frac, u float64) {
		j, err := New(frac)
		if err != nil {
			return
		}
		s, h := j.Pair(time.Duration(soft), time.Duration(hard), u)
		if got := j.TTL(time.Duration(soft), u); got != s {
			t.Errorf("TTL = %v, Pair soft = %v", got, s)
		}
		if soft <= 0 {
			if s != time.Duration(soft) || h != time.Duration(hard) {
				t.Errorf("non-positive soft changed: %v, %v", s, h)
			}
			return
		}
		if s <= 0 {
			t.Errorf("soft %v became %v", soft, s)
		}
		// Both are positive, so the difference does not overflow; float64(soft)
		// may be rounded, hence the relative slack.
		if d := math.Abs(float64(int64(s) - soft)); d > frac*float64(soft)*(1+1e-15)+1 {
			t.Errorf("soft moved by %v, more than f·soft = %v", d, frac*float64(soft))
		}
		if h != math.MaxInt64 && h != math.MinInt64 && int64(h-s) != hard-soft {
			t.Errorf("window %v became %v", hard-soft, h-s)
		}
	})
}
