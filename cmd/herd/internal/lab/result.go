package lab

import "time"

// Suite is everything one `herd lab` invocation measured.
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
	// Predictions holds predicted vs measured figures of a preset.
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
	TTL           time.Duration `json:"ttl"`
	Duration      time.Duration `json:"duration"`
	ClientTimeout time.Duration `json:"client_timeout"`
	Seed          uint64        `json:"seed"`
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

	P50  time.Duration `json:"p50"`
	P99  time.Duration `json:"p99"`
	P999 time.Duration `json:"p999"`

	// Timeline is origin calls started per Bucket since the run began.
	Bucket   time.Duration `json:"bucket"`
	Timeline []int64       `json:"timeline"`
	// Concurrency is the peak origin concurrency in each bucket.
	Concurrency []int `json:"concurrency"`

	// Extra holds scenario-specific figures (e.g. "loads_per_replica_while_down").
	Extra map[string]float64 `json:"extra,omitempty"`
}

// Check is one promise of a layer in a scenario, and whether it held.
type Check struct {
	Scenario string `json:"scenario"`
	Layer    string `json:"layer"`
	Promise  string `json:"promise"`
	Measured string `json:"measured"`
	OK       bool   `json:"ok"`
}

// Prediction sets the formula's figure beside the measured one.
type Prediction struct {
	Preset    string  `json:"preset"`
	Layer     string  `json:"layer"`
	What      string  `json:"what"`
	Predicted float64 `json:"predicted"`
	Measured  float64 `json:"measured"`
	// Within reports whether measured lies within ±20% of predicted.
	Within bool `json:"within"`
}
