package lab

import (
	"encoding/json"
	"math"
	"time"
)

// Suite is everything one `herd lab` invocation measured. In JSON every
// duration is a number of milliseconds, named with an _ms suffix as in
// results.csv.
type Suite struct {
	Started   time.Time `json:"started"`
	Finished  time.Time `json:"finished"`
	Config    Config    `json:"config"`
	LoadModel string    `json:"load_model"` // "open-loop (Poisson arrivals)" or "closed-loop (N clients)"
	Backend   string    `json:"backend"`    // "embedded", "redis 127.0.0.1:6379", "spawned redis"
	Origin    string    `json:"origin"`     // "simulated (…)" or "postgres"
	Runs      []Run     `json:"runs"`
	// Checks holds one line per promise checked (only with --check).
	Checks []Check `json:"checks,omitempty"`
	// Predictions holds the formula's calls per expiry beside the measured
	// ones, for open-loop hot-key runs under none, coalescing and lease.
	Predictions []Prediction `json:"predictions,omitempty"`
}

// Config is the resolved settings of a suite, as the report shows them.
type Config struct {
	Preset        string        `json:"preset,omitempty"`
	Scenarios     []string      `json:"scenarios"`
	Layers        []string      `json:"layers"`
	Replicas      int           `json:"replicas"`
	Rate          float64       `json:"rate_per_replica"` // requests per second per replica (open loop)
	Clients       int           `json:"clients"`          // per replica (closed loop)
	ClosedLoop    bool          `json:"closed_loop"`
	Keys          int           `json:"keys"`
	Latency       string        `json:"latency"` // recompute latency distribution, e.g. "lognormal(mean=250ms,sd=50ms)"
	Capacity      int           `json:"capacity"`
	FailureRate   float64       `json:"failure_rate"`
	TTL           time.Duration `json:"-"` // ttl_ms in JSON
	Duration      time.Duration `json:"-"` // duration_ms in JSON
	ClientTimeout time.Duration `json:"-"` // client_timeout_ms in JSON
	Seed          uint64        `json:"seed"`
}

// configJSON is Config as JSON has it: durations in milliseconds.
type configJSON struct {
	*plainConfig
	TTL           float64 `json:"ttl_ms"`
	Duration      float64 `json:"duration_ms"`
	ClientTimeout float64 `json:"client_timeout_ms"`
}

type plainConfig Config

// MarshalJSON writes c with its durations in milliseconds.
func (c Config) MarshalJSON() ([]byte, error) {
	p := plainConfig(c)
	return json.Marshal(configJSON{&p, msOf(c.TTL), msOf(c.Duration), msOf(c.ClientTimeout)})
}

// UnmarshalJSON reads what MarshalJSON writes.
func (c *Config) UnmarshalJSON(b []byte) error {
	v := configJSON{plainConfig: (*plainConfig)(c)}
	if err := json.Unmarshal(b, &v); err != nil {
		return err
	}
	c.TTL, c.Duration, c.ClientTimeout = fromMS(v.TTL), fromMS(v.Duration), fromMS(v.ClientTimeout)
	return nil
}

// Run is one scenario under one layer of protection.
type Run struct {
	Scenario string `json:"scenario"`
	Layer    string `json:"layer"`
	// Variant distinguishes runs of one scenario and layer (cold-start's
	// "cold", "warm" and "fleet"); empty when there is one.
	Variant string `json:"variant,omitempty"`

	Requests       int64   `json:"requests"`
	OriginCalls    int64   `json:"origin_calls"`
	Expiries       int64   `json:"expiries"`         // expiry events of the scenario (hot-key expiries, flushes, kills, starts)
	CallsPerExpiry float64 `json:"calls_per_expiry"` // origin calls after warm-up per expiry event
	PeakOrigin     int     `json:"peak_origin_concurrency"`
	Errors         int64   `json:"errors"`
	Shed           int64   `json:"shed"`
	StaleServed    int64   `json:"stale_served"`
	// WaitedOnOrigin counts requests after warm-up whose answer waited for
	// an origin call.
	WaitedOnOrigin int64 `json:"waited_on_origin"`

	// Client latency percentiles; p50_ms, p99_ms and p999_ms in JSON.
	P50  time.Duration `json:"-"`
	P99  time.Duration `json:"-"`
	P999 time.Duration `json:"-"`

	// Timeline is origin calls started per Bucket since the run began
	// (bucket_ms in JSON); every run of a suite has the same Bucket.
	Bucket   time.Duration `json:"-"`
	Timeline []int64       `json:"timeline"`
	// Concurrency is the peak origin concurrency in each bucket.
	Concurrency []int `json:"concurrency"`
	// Events are the instants of the scenario's events, on the Timeline's
	// clock, in order: hot-key's measured expiries (each the first call of
	// its expiry event), the flush, node-kill's kill and restart,
	// cold-start's start of traffic.
	Events []Event `json:"events,omitempty"`

	// Extra holds scenario-specific figures, keyed by the names [Figures]
	// lists (e.g. "calls_while_down").
	Extra map[string]float64 `json:"extra,omitempty"`
}

// runJSON is Run as JSON has it: durations in milliseconds.
type runJSON struct {
	*plainRun
	P50    float64 `json:"p50_ms"`
	P99    float64 `json:"p99_ms"`
	P999   float64 `json:"p999_ms"`
	Bucket float64 `json:"bucket_ms"`
}

type plainRun Run

// MarshalJSON writes r with its durations in milliseconds.
func (r Run) MarshalJSON() ([]byte, error) {
	p := plainRun(r)
	return json.Marshal(runJSON{&p, msOf(r.P50), msOf(r.P99), msOf(r.P999), msOf(r.Bucket)})
}

// UnmarshalJSON reads what MarshalJSON writes.
func (r *Run) UnmarshalJSON(b []byte) error {
	v := runJSON{plainRun: (*plainRun)(r)}
	if err := json.Unmarshal(b, &v); err != nil {
		return err
	}
	r.P50, r.P99, r.P999, r.Bucket = fromMS(v.P50), fromMS(v.P99), fromMS(v.P999), fromMS(v.Bucket)
	return nil
}

// Event kinds of [Run.Events].
const (
	EventExpiry  = "expiry"
	EventFlush   = "flush"
	EventKill    = "kill"
	EventRestart = "restart"
	EventStart   = "start"
)

// Event is an instant of a run's scenario: At is the time since the run
// began (at_ms in JSON).
type Event struct {
	Kind string        `json:"kind"`
	At   time.Duration `json:"-"`
}

type eventJSON struct {
	Kind string  `json:"kind"`
	At   float64 `json:"at_ms"`
}

// MarshalJSON writes ev with its instant in milliseconds.
func (ev Event) MarshalJSON() ([]byte, error) {
	return json.Marshal(eventJSON{ev.Kind, msOf(ev.At)})
}

// UnmarshalJSON reads what MarshalJSON writes.
func (ev *Event) UnmarshalJSON(b []byte) error {
	var v eventJSON
	if err := json.Unmarshal(b, &v); err != nil {
		return err
	}
	ev.Kind, ev.At = v.Kind, fromMS(v.At)
	return nil
}

// Check is one promise of a layer in a scenario, and whether it held.
type Check struct {
	Scenario string `json:"scenario"`
	Layer    string `json:"layer"`
	Promise  string `json:"promise"`
	Measured string `json:"measured"`
	// Observations is how many things the check judged, and Observed what
	// they are ("expiries", "calls while down", "requests for warmed
	// keys", …). A check with no observation fails: nothing showed that
	// its promise held.
	Observations int64  `json:"observations"`
	Observed     string `json:"observed"`
	OK           bool   `json:"ok"`
}

// Prediction sets the formula's calls per expiry beside the measured mean.
type Prediction struct {
	// Preset names the preset of the suite, "flags" for none.
	Preset    string  `json:"preset"`
	Layer     string  `json:"layer"`
	What      string  `json:"what"`
	Predicted float64 `json:"predicted"`
	Measured  float64 `json:"measured"`
	// Expiries is how many expiry events Measured is the mean of.
	Expiries int64 `json:"expiries"`
	// Band is the relative tolerance: the prediction holds when Measured
	// lies within ±Band × Predicted. It is 0.2, or wider when the
	// measured mean of few expiries varies more than that by chance.
	Band float64 `json:"band"`
	// Within reports whether Measured lies within the band; never with no
	// expiry measured.
	Within bool `json:"within"`
	// Checked reports whether the prediction is also a check (a preset's).
	Checked bool `json:"checked"`
	// Note says why the band is wider than ±20%, or why nothing was
	// measured; empty otherwise.
	Note string `json:"note,omitempty"`
}

// msOf converts d to milliseconds.
func msOf(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// fromMS converts milliseconds to a duration, to the nearest nanosecond.
func fromMS(ms float64) time.Duration {
	return time.Duration(math.Round(ms * float64(time.Millisecond)))
}
