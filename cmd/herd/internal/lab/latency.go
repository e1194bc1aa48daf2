package lab

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"strings"
	"time"
)

// maxLatency bounds every parameter of a latency distribution.
const maxLatency = time.Minute

// Latency is a distribution of backing-store call durations. The zero value
// is not valid; use [ParseLatency] or set the fields.
type Latency struct {
	// Kind is "fixed", "lognormal" or "uniform".
	Kind string
	// A and B are the parameters: fixed uses A; lognormal has mean A and
	// standard deviation B; uniform draws from [A, B].
	A, B time.Duration
}

// ParseLatency reads a distribution: "fixed:250ms" (or just "250ms"),
// "lognormal:250ms,50ms" (mean and standard deviation; "lognormal:250ms"
// means a standard deviation of a fifth of the mean) or
// "uniform:200ms,300ms". Errors are prefixed "lab: ".
func ParseLatency(s string) (Latency, error) {
	kind, args, ok := strings.Cut(strings.TrimSpace(s), ":")
	if !ok {
		kind, args = "fixed", kind
	}
	parts := strings.Split(args, ",")
	ds := make([]time.Duration, 0, len(parts))
	for _, p := range parts {
		d, err := time.ParseDuration(strings.TrimSpace(p))
		if err != nil {
			return Latency{}, fmt.Errorf("lab: latency %q: %q is not a duration (e.g. 250ms)", s, p)
		}
		ds = append(ds, d)
	}
	var l Latency
	switch kind {
	case "fixed":
		if len(ds) != 1 {
			return Latency{}, fmt.Errorf("lab: latency %q: fixed takes one duration, e.g. fixed:250ms", s)
		}
		l = Latency{Kind: kind, A: ds[0]}
	case "lognormal":
		switch len(ds) {
		case 1:
			l = Latency{Kind: kind, A: ds[0], B: ds[0] / 5}
		case 2:
			l = Latency{Kind: kind, A: ds[0], B: ds[1]}
		default:
			return Latency{}, fmt.Errorf("lab: latency %q: lognormal takes a mean and a standard deviation, e.g. lognormal:250ms,50ms", s)
		}
	case "uniform":
		if len(ds) != 2 {
			return Latency{}, fmt.Errorf("lab: latency %q: uniform takes two durations, e.g. uniform:200ms,300ms", s)
		}
		l = Latency{Kind: kind, A: ds[0], B: ds[1]}
	default:
		return Latency{}, fmt.Errorf("lab: latency %q: unknown distribution %q (want fixed, lognormal or uniform)", s, kind)
	}
	if err := l.validate(); err != nil {
		return Latency{}, fmt.Errorf("lab: latency %q: %w", s, err)
	}
	return l, nil
}

func (l Latency) validate() error {
	switch l.Kind {
	case "fixed", "lognormal", "uniform":
	default:
		return fmt.Errorf("unknown distribution %q", l.Kind)
	}
	if l.A <= 0 || l.A > maxLatency {
		return fmt.Errorf("%v must lie in (0, %v]", l.A, maxLatency)
	}
	if l.Kind == "lognormal" && (l.B < 0 || l.B > maxLatency) {
		return fmt.Errorf("standard deviation %v must lie in [0, %v]", l.B, maxLatency)
	}
	if l.Kind == "uniform" && (l.B < l.A || l.B > maxLatency) {
		return errors.New("uniform bounds must satisfy 0 < low <= high <= 1m")
	}
	return nil
}

// Draw returns one duration drawn with r.
func (l Latency) Draw(r *rand.Rand) time.Duration {
	switch l.Kind {
	case "lognormal":
		if l.B == 0 {
			return l.A
		}
		mu, sigma := l.logParams()
		return time.Duration(math.Exp(mu + sigma*r.NormFloat64()))
	case "uniform":
		return l.A + time.Duration(r.Int64N(int64(l.B-l.A)+1))
	}
	return l.A
}

// logParams returns the mean and standard deviation of the logarithm of a
// lognormal draw, in log-nanoseconds.
func (l Latency) logParams() (mu, sigma float64) {
	m, sd := float64(l.A), float64(l.B)
	s2 := math.Log(1 + sd*sd/(m*m))
	return math.Log(m) - s2/2, math.Sqrt(s2)
}

// Mean returns the distribution's mean.
func (l Latency) Mean() time.Duration {
	if l.Kind == "uniform" {
		return (l.A + l.B) / 2
	}
	return l.A
}

// CV returns the distribution's coefficient of variation: its standard
// deviation over its mean.
func (l Latency) CV() float64 {
	m := float64(l.Mean())
	if m <= 0 {
		return 0
	}
	switch l.Kind {
	case "lognormal":
		return float64(l.B) / m
	case "uniform":
		return float64(l.B-l.A) / math.Sqrt(12) / m
	}
	return 0
}

// String describes the distribution, e.g. "lognormal(mean=250ms,sd=50ms)".
func (l Latency) String() string {
	switch l.Kind {
	case "lognormal":
		return fmt.Sprintf("lognormal(mean=%v,sd=%v)", l.A, l.B)
	case "uniform":
		return fmt.Sprintf("uniform(%v..%v)", l.A, l.B)
	}
	return fmt.Sprintf("fixed(%v)", l.A)
}

// Flag returns the distribution in the form ParseLatency reads.
func (l Latency) Flag() string {
	switch l.Kind {
	case "lognormal":
		return fmt.Sprintf("lognormal:%v,%v", l.A, l.B)
	case "uniform":
		return fmt.Sprintf("uniform:%v,%v", l.A, l.B)
	}
	return fmt.Sprintf("fixed:%v", l.A)
}
