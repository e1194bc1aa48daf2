package xfetch

import (
	"math"
	"math/rand/v2"
	"testing"
	"time"
)

// smallestU is the smallest value U can return: 1 − (2^53−1)/2^53.
const smallestU = 0x1p-53

func TestRefreshEdgeCases(t *testing.T) {
	const delta = 100 * time.Millisecond
	base := time.Date(2025, 1, 2, 3, 4, 5, 0, time.UTC)
	expiry := base.Add(time.Second)
	tests := []struct {
		name   string
		now    time.Time
		delta  time.Duration
		beta   float64
		u      float64
		expect bool
	}{
		{"u=1 before expiry never refreshes early", expiry.Add(-time.Nanosecond), delta, 1, 1, false},
		{"u=1 at expiry refreshes", expiry, delta, 1, 1, true},
		{"u=1 after expiry refreshes", expiry.Add(time.Nanosecond), delta, 1, 1, true},
		{"tiny u close to expiry refreshes", expiry.Add(-delta), delta, 1, smallestU, true},
		{"smallest U far from expiry does not refresh", expiry.Add(-37 * delta), delta, 1, smallestU, false},
		{"smallest U just inside its reach refreshes", expiry.Add(-36 * delta), delta, 1, smallestU, true},
		{"smallest float far from expiry refreshes", expiry.Add(-700 * delta), delta, 1, math.SmallestNonzeroFloat64, true},
		{"u=0 counts as the limit and refreshes", expiry.Add(-1000 * delta), delta, 1, 0, true},
		{"negative u counts as 0", expiry.Add(-1000 * delta), delta, 1, -0.5, true},
		{"u above 1 counts as 1", expiry.Add(-time.Nanosecond), delta, 1, 2, false},
		{"NaN u counts as 1", expiry.Add(-time.Nanosecond), delta, 1, math.NaN(), false},
		{"u above 1 counts as 1 with infinite beta", base, delta, math.Inf(1), 2, true},
		{"beta 0 disables early refresh", expiry.Add(-time.Nanosecond), delta, 0, smallestU, false},
		{"beta 0 refreshes at expiry", expiry, delta, 0, 1, true},
		{"delta 0 disables early refresh", expiry.Add(-time.Nanosecond), 0, 1, smallestU, false},
		{"delta 0 refreshes after expiry", expiry.Add(time.Hour), 0, 1, 1, true},
		{"negative delta disables early refresh", expiry.Add(-time.Nanosecond), -delta, 1, smallestU, false},
		{"negative beta counts as 0", expiry.Add(-time.Nanosecond), delta, -1, smallestU, false},
		{"negative beta refreshes at expiry", expiry, delta, -1, 1, true},
		{"NaN beta counts as 0", expiry.Add(-time.Nanosecond), delta, math.NaN(), smallestU, false},
		{"infinite beta always refreshes", base, delta, math.Inf(1), 1, true},
		{"now long past expiry", expiry.Add(1000 * time.Hour), delta, 1, 1, true},
		{"gap beyond a Duration saturates", time.Date(1, 1, 1, 0, 0, 0, 0, time.UTC), delta, 1, 0.5, false},
		{"expiry beyond a Duration in the past saturates", time.Date(9999, 1, 1, 0, 0, 0, 0, time.UTC), delta, 1, 1, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := Refresh(tt.now, expiry, tt.delta, tt.beta, tt.u); got != tt.expect {
				t.Errorf("Refresh(now=expiry%+v, delta=%v, beta=%v, u=%v) = %v, want %v",
					tt.now.Sub(expiry), tt.delta, tt.beta, tt.u, got, tt.expect)
			}
			now, exp := tt.now.Sub(base).Nanoseconds(), expiry.Sub(base).Nanoseconds()
			if got := RefreshNano(now, exp, int64(tt.delta), tt.beta, tt.u); got != tt.expect {
				t.Errorf("RefreshNano(%d, %d, %d, %v, %v) = %v, want %v",
					now, exp, tt.delta, tt.beta, tt.u, got, tt.expect)
			}
		})
	}
}

// TestRefreshThreshold checks that Refresh is true exactly for the draws
// u ≤ Probability(gap), which is what makes its probability exp(−gap/(delta·beta)).
func TestRefreshThreshold(t *testing.T) {
	const delta = 250 * time.Millisecond
	for _, beta := range []float64{0.5, 1, 2} {
		for _, gap := range []time.Duration{time.Nanosecond, time.Millisecond, 100 * time.Millisecond, time.Second, 5 * time.Second} {
			p := Probability(gap, delta, beta)
			now, expiry := int64(1e12), int64(1e12)+int64(gap)
			if !RefreshNano(now, expiry, int64(delta), beta, p*(1-1e-9)) {
				t.Errorf("beta=%v gap=%v: u just below p=%v did not refresh", beta, gap, p)
			}
			if RefreshNano(now, expiry, int64(delta), beta, math.Min(1, p*(1+1e-9))) {
				t.Errorf("beta=%v gap=%v: u just above p=%v refreshed", beta, gap, p)
			}
		}
	}
}

func TestRefreshNanoSaturates(t *testing.T) {
	// expiry − now overflows int64: the gap is huge, not negative.
	if RefreshNano(math.MinInt64, math.MaxInt64, int64(time.Second), 1, 0.5) {
		t.Error("RefreshNano with an overflowing gap refreshed")
	}
	if !RefreshNano(math.MaxInt64, math.MinInt64, int64(time.Second), 1, 1) {
		t.Error("RefreshNano with now far past expiry did not refresh")
	}
	if Decide(math.MinInt64, math.MaxInt64, int64(time.Second), 1, func() float64 { return smallestU }) {
		t.Error("Decide with an overflowing gap refreshed")
	}
}

func TestProbability(t *testing.T) {
	tests := []struct {
		name  string
		gap   time.Duration
		delta time.Duration
		beta  float64
		want  float64
	}{
		{"gap zero", 0, time.Second, 1, 1},
		{"gap negative", -time.Second, time.Second, 1, 1},
		{"gap negative, beta 0", -time.Second, time.Second, 0, 1},
		{"beta 0", time.Second, time.Second, 0, 0},
		{"delta 0", time.Second, 0, 1, 0},
		{"negative beta", time.Second, time.Second, -2, 0},
		{"NaN beta", time.Second, time.Second, math.NaN(), 0},
		{"negative delta", time.Second, -time.Second, 1, 0},
		{"gap = delta·beta", 2 * time.Second, time.Second, 2, math.Exp(-1)},
		{"gap = 3·delta·beta", 3 * time.Second, 2 * time.Second, 0.5, math.Exp(-3)},
		{"gap = delta·beta/4", 250 * time.Millisecond, time.Second, 1, math.Exp(-0.25)},
		{"infinite beta", time.Hour, time.Second, math.Inf(1), 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := Probability(tt.gap, tt.delta, tt.beta)
			if math.Abs(got-tt.want) > 1e-15 {
				t.Errorf("Probability(%v, %v, %v) = %v, want %v", tt.gap, tt.delta, tt.beta, got, tt.want)
			}
		})
	}
}

func TestUnit(t *testing.T) {
	if got := unit(0); got != 1 {
		t.Errorf("unit(0) = %v, want 1", got)
	}
	largest := math.Nextafter(1, 0) // the largest value rand.Float64 returns
	if got := unit(largest); got != smallestU {
		t.Errorf("unit(%v) = %v, want 2^-53", largest, got)
	}
	for range 10000 {
		if u := U(); !(u > 0 && u <= 1) {
			t.Fatalf("U() = %v, want a value in (0, 1]", u)
		}
	}
}

func TestDecideCallsDrawOnlyWhenNeeded(t *testing.T) {
	const delta = int64(100 * time.Millisecond)
	const now = int64(1e15)
	tests := []struct {
		name      string
		expiry    int64
		delta     int64
		beta      float64
		wantCalls int
		want      bool
	}{
		{"at expiry", now, delta, 1, 0, true},
		{"past expiry", now - 1, delta, 1, 0, true},
		{"beta 0", now + 1, delta, 0, 0, false},
		{"negative beta", now + 1, delta, -1, 0, false},
		{"NaN beta", now + 1, delta, math.NaN(), 0, false},
		{"negative delta", now + 1, -delta, 1, 0, false},
		{"delta 0", now + 1, 0, 1, 0, false},
		{"beyond the cutoff", now + 41*delta, delta, 1, 0, false},
		{"beyond the cutoff with beta 2", now + 81*delta, delta, 2, 0, false},
		{"at the cutoff", now + 40*delta, delta, 1, 1, false},
		{"inside the cutoff, u=1", now + delta, delta, 1, 1, false},
		{"inside the cutoff with beta 2", now + 79*delta, delta, 2, 1, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			calls := 0
			draw := func() float64 { calls++; return 1 }
			if got := Decide(now, tt.expiry, tt.delta, tt.beta, draw); got != tt.want {
				t.Errorf("Decide = %v, want %v", got, tt.want)
			}
			if calls != tt.wantCalls {
				t.Errorf("draw called %d times, want %d", calls, tt.wantCalls)
			}
		})
	}
}

func TestDecideNilDrawUsesU(t *testing.T) {
	const now = int64(1e15)
	// Far beyond the cutoff: false with no draw.
	if Decide(now, now+int64(time.Hour), int64(time.Millisecond), 1, nil) {
		t.Error("Decide far from expiry refreshed")
	}
	// gap/(delta·beta) = 1e-9: refresh unless U() < exp(−1e-9) fails, which has
	// probability 1e-9 per draw.
	for range 1000 {
		if !Decide(now, now+1, int64(time.Second), 1, nil) {
			t.Fatal("Decide with nil draw a nanosecond before expiry did not refresh")
		}
	}
}

// TestDecideAgreesWithRefresh sweeps draws over the whole range U can return
// and scaled gaps on both sides of the cutoff: Decide must answer as the exact
// formula does for each of them.
func TestDecideAgreesWithRefresh(t *testing.T) {
	var us []float64
	for k := 0; k <= 53; k++ {
		us = append(us, math.Ldexp(1, -k))
	}
	for k := 1; k < 1000; k++ {
		us = append(us, float64(k)/1000)
	}
	r := rand.New(rand.NewPCG(7, 11))
	for range 1000 {
		us = append(us, unit(r.Float64()))
	}
	const delta = int64(10 * time.Millisecond)
	for _, beta := range []float64{0.25, 1, 3} {
		for i := -10; i <= 500; i++ {
			x := float64(i) / 10 // scaled gap, −1 to 50
			gap := int64(x * float64(delta) * beta)
			now := int64(1e15)
			for _, u := range us {
				want := RefreshNano(now, now+gap, delta, beta, u)
				if got := Decide(now, now+gap, delta, beta, func() float64 { return u }); got != want {
					t.Fatalf("beta=%v gap=%d u=%v: Decide = %v, RefreshNano = %v", beta, gap, u, got, want)
				}
			}
		}
	}
}

// TestCutoffBound checks the documented bound on what the cutoff changes: it
// matters only for draws below e^-40, below the smallest value U returns.
func TestCutoffBound(t *testing.T) {
	if p := math.Exp(-cutoff); p >= 1e-17 {
		t.Errorf("e^-cutoff = %v, want < 1e-17", p)
	}
	if -math.Log(smallestU) >= cutoff {
		t.Errorf("−ln(2^-53) = %v reaches the cutoff %v", -math.Log(smallestU), cutoff)
	}
	// Beyond the cutoff a draw below e^-40 refreshes under the exact formula
	// but not under Decide: the only difference, with probability < 1e-17.
	const delta = int64(time.Millisecond)
	now, expiry := int64(0), 41*delta
	u := math.Exp(-45)
	if !RefreshNano(now, expiry, delta, 1, u) {
		t.Error("RefreshNano with u=e^-45 at gap 41·delta did not refresh")
	}
	if Decide(now, expiry, delta, 1, func() float64 { return u }) {
		t.Error("Decide refreshed beyond the cutoff")
	}
}

// TestRefreshFrequency draws u from a fixed-seed PCG and checks that the
// share of early refreshes at gap before expiry is exp(−gap/(delta·beta)).
// Each of the 3×7 cells uses n = 100,000 draws and allows 5 binomial standard
// deviations, 5·sqrt(p(1−p)/n) (at most 0.0079), plus 1/n for the cells where
// p is 0 or 1; a cell of an exact implementation lands outside that band with
// probability below 6e-7.
func TestRefreshFrequency(t *testing.T) {
	const n = 100_000
	const delta = 200 * time.Millisecond
	r := rand.New(rand.NewPCG(0x5eed, 0xfeed))
	draw := func() float64 { return unit(r.Float64()) }
	for _, beta := range []float64{0.5, 1, 2} {
		for _, ratio := range []float64{0, 0.05, 0.25, 0.5, 1, 2, 4} {
			gap := time.Duration(ratio * beta * float64(delta))
			p := Probability(gap, delta, beta)
			now := int64(1e15)
			hits := 0
			for range n {
				if Decide(now, now+int64(gap), int64(delta), beta, draw) {
					hits++
				}
			}
			got := float64(hits) / n
			tol := 5*math.Sqrt(p*(1-p)/n) + 1.0/n
			if math.Abs(got-p) > tol {
				t.Errorf("beta=%v gap=%v: refresh frequency %.5f, want %.5f ± %.5f", beta, gap, got, p, tol)
			}
		}
	}
}

// FuzzDecide checks that Decide and Refresh never panic, agree with
// RefreshNano for every draw U can return, and that Probability stays in [0, 1].
func FuzzDecide(f *testing.F) {
	f.Add(int64(0), int64(1e9), int64(1e8), 1.0, uint64(0))
	f.Add(int64(0), int64(4e9), int64(1e8), 1.0, uint64(1<<53-1))
	f.Add(int64(5), int64(5), int64(0), 0.0, uint64(12345))
	f.Add(int64(math.MinInt64), int64(math.MaxInt64), int64(1), math.Inf(1), uint64(1<<52))
	f.Add(int64(10), int64(-10), int64(-1), math.NaN(), uint64(7))
	f.Add(int64(0), int64(41e6), int64(1e6), 1.0, uint64(1<<53-1))
	f.Fuzz(func(t *testing.T, now, expiry, delta int64, beta float64, bits uint64) {
		u := unit(float64(bits&(1<<53-1)) / (1 << 53)) // every value U can return
		calls := 0
		got := Decide(now, expiry, delta, beta, func() float64 { calls++; return u })
		if want := RefreshNano(now, expiry, delta, beta, u); got != want {
			t.Errorf("Decide = %v, RefreshNano = %v (u=%v)", got, want, u)
		}
		if calls > 1 {
			t.Errorf("draw called %d times", calls)
		}
		if now >= expiry && !got {
			t.Error("Decide at or past expiry did not refresh")
		}
		at := time.Unix(0, now)
		if want := RefreshNano(now, expiry, delta, beta, u); Refresh(at, at.Add(time.Duration(gapNano(now, expiry))), time.Duration(delta), beta, u) != want {
			t.Errorf("Refresh disagrees with RefreshNano = %v", want)
		}
		if p := Probability(time.Duration(gapNano(now, expiry)), time.Duration(delta), beta); !(p >= 0 && p <= 1) {
			t.Errorf("Probability = %v", p)
		}
	})
}

func BenchmarkDecide(b *testing.B) {
	const delta = int64(50 * time.Millisecond)
	const now = int64(1e15)
	b.Run("far", func(b *testing.B) {
		b.ReportAllocs()
		expiry := now + int64(time.Minute)
		n := 0
		for b.Loop() {
			if Decide(now, expiry, delta, 1, nil) {
				n++
			}
		}
		if n != 0 {
			b.Fatal("refreshed far from expiry")
		}
	})
	b.Run("near", func(b *testing.B) {
		b.ReportAllocs()
		expiry := now + delta
		for b.Loop() {
			Decide(now, expiry, delta, 1, nil)
		}
	})
}

// BenchmarkRefreshWithU is the direct form of the decision: a draw and a
// logarithm on every call, whatever the time to expiry.
func BenchmarkRefreshWithU(b *testing.B) {
	const delta = int64(50 * time.Millisecond)
	const now = int64(1e15)
	b.Run("far", func(b *testing.B) {
		b.ReportAllocs()
		expiry := now + int64(time.Minute)
		for b.Loop() {
			RefreshNano(now, expiry, delta, 1, U())
		}
	})
	b.Run("near", func(b *testing.B) {
		b.ReportAllocs()
		expiry := now + delta
		for b.Loop() {
			RefreshNano(now, expiry, delta, 1, U())
		}
	})
}

func TestLead(t *testing.T) {
	const d = 250 * time.Millisecond
	for _, tt := range []struct {
		name         string
		delta        time.Duration
		beta, margin float64
		u            float64
		want         time.Duration
	}{
		{"u 1: the floor alone", d, 1, 0.2, 1, 300 * time.Millisecond},
		{"u 1/2: floor plus half delta·beta", d, 1, 0.2, 0.5, 425 * time.Millisecond},
		{"u 1/4: floor plus three quarters", d, 1, 0.2, 0.25, 487500 * time.Microsecond},
		{"beta 2 doubles the draw's part", d, 2, 0.2, 0.5, 550 * time.Millisecond},
		{"no margin", d, 1, 0, 1, d},
		{"negative margin counts as 0", d, 1, -1, 1, d},
		{"NaN margin counts as 0", d, 1, math.NaN(), 1, d},
		{"u above 1 counts as 1", d, 1, 0.2, 7, 300 * time.Millisecond},
		{"NaN u counts as 1", d, 1, 0.2, math.NaN(), 300 * time.Millisecond},
		{"beta 0: off", d, 0, 0.2, 0.5, 0},
		{"NaN beta: off", d, math.NaN(), 0.2, 0.5, 0},
		{"negative beta: off", d, -1, 0.2, 0.5, 0},
		{"delta 0: off", 0, 1, 0.2, 0.5, 0},
		{"negative delta: off", -d, 1, 0.2, 0.5, 0},
		{"infinite beta saturates", d, math.Inf(1), 0.2, 0.5, math.MaxInt64},
		{"huge delta saturates", math.MaxInt64, 1e3, 0.2, 0.5, math.MaxInt64},
	} {
		got := Lead(tt.delta, tt.beta, tt.margin, tt.u)
		if diff := got - tt.want; diff < -time.Microsecond || diff > time.Microsecond {
			t.Errorf("%s: Lead(%v, %v, %v, %v) = %v, want %v", tt.name, tt.delta, tt.beta, tt.margin, tt.u, got, tt.want)
		}
	}
	// u at or below 0 is the smallest draw of U: the longest lead U can
	// give, at most floor plus delta·beta.
	if got, want := Lead(d, 1, 0.2, 0), Lead(d, 1, 0.2, minU); got != want || got <= 0 || got > 550*time.Millisecond {
		t.Errorf("Lead(u 0) = %v, want Lead(u 2^-53) = %v, at most 550ms", got, want)
	}
}

// Over uniform draws the lead is uniform between the floor delta·(1+margin)
// and delta·(1+margin+beta): never outside them, its mean halfway, and each
// tenth of the span holding a tenth of the leads.
func TestLeadDistribution(t *testing.T) {
	const (
		n     = 200_000
		delta = time.Second
		beta  = 1.5
		m     = DefaultMargin
	)
	rng := rand.New(rand.NewPCG(5, 6))
	floor := float64(delta) * (1 + m)
	span := float64(delta) * beta
	var sum float64
	var bins [10]int
	for range n {
		l := float64(Lead(delta, beta, m, unit(rng.Float64())))
		if l < floor || l >= floor+span {
			t.Fatalf("Lead = %v, outside [%v, %v)", time.Duration(l), time.Duration(floor), time.Duration(floor+span))
		}
		sum += l / float64(time.Second)
		bins[min(int((l-floor)/span*10), 9)]++
	}
	if mean, want := sum/n, 1+m+beta/2; math.Abs(mean-want) > 0.01*want {
		t.Errorf("mean lead %.4fs, want %.4fs within 1%%", mean, want)
	}
	for i, b := range bins {
		if b < n/10*95/100 || b > n/10*105/100 {
			t.Errorf("tenth %d of the span holds %d of %d leads, want %d within 5%%", i, b, n, n/10)
		}
	}
}

func TestUOf(t *testing.T) {
	for _, h := range []uint64{0, 1, 1 << 11, math.MaxUint64} {
		if u := UOf(h); !(u > 0 && u <= 1) {
			t.Errorf("UOf(%#x) = %v, want it in (0, 1]", h, u)
		}
	}
	if UOf(0) != minU || UOf(math.MaxUint64) != 1 {
		t.Errorf("UOf(0) = %v, UOf(max) = %v; want 2^-53 and 1", UOf(0), UOf(math.MaxUint64))
	}
	// Uniform hashes give uniform numbers: ten equal bins within 5% (over 5
	// standard deviations).
	const n = 100_000
	rng := rand.New(rand.NewPCG(7, 8))
	var bins [10]int
	for range n {
		bins[min(int(UOf(rng.Uint64())*10), 9)]++
	}
	for i, b := range bins {
		if b < n/10*95/100 || b > n/10*105/100 {
			t.Errorf("bin %d holds %d of %d, want %d within 5%%", i, b, n, n/10)
		}
	}
}
