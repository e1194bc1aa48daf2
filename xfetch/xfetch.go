// Package xfetch decides when a cache entry should be refreshed before it
// expires, with the probabilistic early expiration of Vattani, Chierichetti
// and Lowenstein, "Optimal Probabilistic Cache Stampede Prevention" (VLDB 2015).
//
// The paper draws once per read: [Decide] and [Refresh] are that rule. Its
// chance that some read refreshes early grows with the number of reads, so
// at a high read rate the refresh starts about delta·beta·ln(rate·delta·beta)
// before expiry, and a hot key is reloaded several times per TTL for
// nothing. [Lead] decides once per value instead, so that how early a value
// is refreshed does not depend on how often it is read: the refresh starts
// delta·(1+margin) + delta·beta·D before expiry, with D uniform on [0, 1).
// The floor delta·(1+margin) makes the refresh finish before expiry
// whenever the next load takes no longer than the last did (plus the
// margin), which a single draw alone would miss 63% of the time at beta 1.
// Decided once per value, the draw no longer keeps readers from refreshing
// together (one decision and a lease do); what it does is spread the
// refreshes of values written together over delta·beta. A uniform draw
// does that at half the mean cost of the paper's exponential one of the
// same scale, and with no tail: an exponential draw at beta 1 refreshes
// one value in 45, for a load a fifth of the TTL, as soon as it is
// written. Every replica derives the same D from what it knows of the
// value ([UOf] of a hash of it), so they agree on the instant and the
// first read after it, on any replica, starts the refresh.
package xfetch

import (
	"math"
	"math/rand/v2"
	"time"
)

// cutoff is the scaled time to expiry, gap/(delta·beta), beyond which [Decide]
// answers false without drawing or taking a logarithm. The exact probability
// it ignores is below e^-40 ≈ 4.2e-18, so each decision changes by less than
// 1e-17; for draws from [U], whose smallest value is 2^-53 (−ln 2^-53 ≈ 36.7),
// the answer does not change at all.
const cutoff = 40

// Refresh reports whether an entry that expires at expiry, and took delta to
// compute, should be refreshed at now, given a draw u uniform on (0, 1].
//
// It is true when now − delta·beta·ln(u) ≥ expiry, so at gap = expiry − now
// before expiry it is true with probability exp(−gap/(delta·beta)) (see
// [Probability]), and it is always true once now ≥ expiry. beta scales how
// early refreshes happen: 1 is the paper's recommended value, larger values
// refresh earlier. A beta or delta of zero disables early refresh, and so does
// a negative or NaN beta or a negative delta: Refresh is then true only once
// now ≥ expiry. A beta of +Inf refreshes on every call.
//
// A u of 0 or below counts as the limit u → 0 (refresh); a u above 1 counts as
// 1 and a NaN u as 1 (no early refresh). Refresh evaluates the inequality
// exactly; [Decide] is the form for hot paths. Times compare as [time.Time.Sub]
// does, so on the monotonic clock when both carry a reading.
func Refresh(now, expiry time.Time, delta time.Duration, beta, u float64) bool {
	// Sub saturates instead of overflowing.
	return refresh(int64(expiry.Sub(now)), int64(delta), beta, u)
}

// RefreshNano is [Refresh] over int64 nanoseconds: now and expiry on one
// nanosecond clock, delta a duration in nanoseconds.
func RefreshNano(now, expiry, delta int64, beta, u float64) bool {
	return refresh(gapNano(now, expiry), delta, beta, u)
}

// Decide is [RefreshNano] for the hot path: far from expiry it answers false
// after a few comparisons and a multiplication, without calling draw or
// taking a logarithm.
//
// draw is called at most once, and only when the answer depends on it: not
// when now ≥ expiry, not when early refresh is disabled, and not when the
// scaled time to expiry gap/(delta·beta) exceeds 40, where the probability of
// an early refresh is below e^-40 ≈ 4.2e-18. That cutoff changes the
// probability of any decision by less than 1e-17 and, for draws from [U], never
// changes an answer. draw should return values in (0, 1], others count as in
// [Refresh]; a nil draw means [U].
func Decide(now, expiry, delta int64, beta float64, draw func() float64) bool {
	gap := gapNano(now, expiry)
	if gap <= 0 {
		return true
	}
	scale, ok := scaleOf(delta, beta)
	if !ok || float64(gap) > cutoff*scale {
		return false
	}
	var u float64
	if draw == nil {
		u = U()
	} else {
		u = draw()
	}
	return early(float64(gap)/scale, u)
}

// Probability returns the probability that [Refresh] is true at gap before
// expiry for a u uniform on (0, 1]: exp(−gap/(delta·beta)) when gap > 0, 1 when
// gap ≤ 0, and 0 when early refresh is disabled (beta or delta zero, beta
// negative or NaN, delta negative).
func Probability(gap, delta time.Duration, beta float64) float64 {
	if gap <= 0 {
		return 1
	}
	scale, ok := scaleOf(int64(delta), beta)
	if !ok {
		return 0
	}
	return math.Exp(-float64(gap) / scale)
}

// U returns a draw uniform on (0, 1] from math/rand/v2's top-level source,
// which is safe for concurrent use without a lock. It never returns 0, so its
// logarithm is finite; its smallest value is 2^-53.
func U() float64 {
	return unit(rand.Float64())
}

// unit maps f in [0, 1) to 1 − f in (0, 1]; it is exact for every value
// rand.Float64 returns.
func unit(f float64) float64 {
	return 1 - f
}

// refresh is the shared body of Refresh and RefreshNano over gap = expiry − now.
func refresh(gap, delta int64, beta, u float64) bool {
	if gap <= 0 {
		return true
	}
	scale, ok := scaleOf(delta, beta)
	if !ok {
		return false
	}
	return early(float64(gap)/scale, u)
}

// scaleOf returns delta·beta in nanoseconds, and false when early refresh is
// disabled. When it is true, scale is positive (delta ≥ 1 and beta > 0) and may
// be +Inf.
func scaleOf(delta int64, beta float64) (scale float64, ok bool) {
	if delta <= 0 || !(beta > 0) {
		return 0, false
	}
	return float64(delta) * beta, true
}

// early reports whether −ln(u) ≥ x, which is now − delta·beta·ln(u) ≥ expiry
// divided through by delta·beta > 0, for x = gap/(delta·beta) ≥ 0.
func early(x, u float64) bool {
	switch {
	case u <= 0:
		return true
	case u > 1 || math.IsNaN(u):
		u = 1
	}
	return -math.Log(u) >= x
}

// gapNano returns expiry − now, saturating at math.MaxInt64 instead of
// wrapping; it is 0 when now ≥ expiry.
func gapNano(now, expiry int64) int64 {
	if now >= expiry {
		return 0
	}
	gap := expiry - now
	if gap < 0 {
		return math.MaxInt64
	}
	return gap
}

// DefaultMargin is the margin [Lead] is usually given: a fifth of delta, for
// the gap between reads, the lease's round trip and the write that follow a
// refresh's start.
const DefaultMargin = 0.2

// Lead returns how long before its expiry a value that took delta to
// compute should start its refresh, decided once for the value:
// delta·(1+margin) + delta·beta·(1−u), for u uniform on (0, 1]. Over values
// the lead is uniform between delta·(1+margin) and delta·(1+margin+beta),
// with mean delta·(1+margin+beta/2), so a value that lives ttl after its
// load ends is replaced on average every ttl − delta·(margin+beta/2): at
// margin 0.2 and beta 1, 1.16 loads per TTL for a load a fifth of the TTL.
// A beta or delta of zero disables early refresh (Lead is 0), as do a
// negative or NaN beta and a negative delta; a negative or NaN margin
// counts as 0. A u of 0 or below counts as the smallest draw of [U]; one
// above 1, or NaN, as 1. The result saturates at the longest Duration.
func Lead(delta time.Duration, beta, margin, u float64) time.Duration {
	scale, ok := scaleOf(int64(delta), beta)
	if !ok {
		return 0
	}
	if !(margin > 0) {
		margin = 0
	}
	switch {
	case u <= 0:
		u = minU
	case u > 1 || math.IsNaN(u):
		u = 1
	}
	lead := float64(delta)*(1+margin) + scale*(1-u)
	if !(lead < math.MaxInt64) {
		return math.MaxInt64
	}
	return time.Duration(lead)
}

// minU is the smallest value [U] returns, 2^-53.
const minU = 1.0 / (1 << 53)

// UOf maps a 64-bit hash to a number uniform on (0, 1], as [U] draws: the
// same hash gives the same number, so replicas that hash the same facts of
// a value agree on its draw.
func UOf(h uint64) float64 {
	return float64(h>>11+1) * minU
}
