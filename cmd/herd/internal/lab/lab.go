package lab

import (
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

// Scenarios are the scenario names, in the order a suite runs them. A
// suite runs all but slow-origin unless told which.
var Scenarios = []string{"hot-key", "flush", "node-kill", "cold-start", slowScenario}

// Layers are the rungs of the protection ladder, from none to all. Each rung
// adds one layer to the rung below it: a run of "lease" has coalescing too.
// The last, refresh-ahead, takes early refresh over from XFetch.
var Layers = []string{"none", "coalescing", "lease", "xfetch", "swr", "jitter", "limiter", "ahead"}

// ScenarioDocs describes each scenario in one line, for --list.
var ScenarioDocs = map[string]string{
	"hot-key": "one key at the configured rate on every replica, expiring every TTL; " +
		"counts backing-store calls per expiry",
	"flush": "keys in steady use; the whole cache (the remote tier and every replica's local tier) " +
		"is flushed at a quarter of the run",
	"node-kill": "keys in steady use with the TTL; at a quarter of the run the Redis node dies " +
		"(embedded: the memory store goes down; --spawn-redis: SIGKILL) for 0.8×TTL, then comes back",
	"cold-start": "replicas start with an empty cache and take traffic at once (variant cold), " +
		"first warm the hottest fifth of the keys with Cache.Warm (variant warm), " +
		"or warm them from a running fleet's hot set in the Store with Cache.WarmHot (variant fleet)",
	slowScenario: "a database slower beyond its capacity (--capacity), then 5× slower for 30% of the run, under a hot key " +
		"and cold-key misses twice its capacity; its own rungs (static-default, static-tuned, adaptive) in place of the layers",
}

// LayerDocs describes each rung in one line, for --list.
var LayerDocs = map[string]string{
	"none":       "no protection: every miss calls the backing store (DisableCoalescing, no lease, no stale window)",
	"coalescing": "+ in-process coalescing: one load per key per replica",
	"lease":      "+ a fenced lease across replicas, losers wait for the holder: one load per key per fleet",
	"xfetch":     "+ XFetch early refresh (Beta 1)",
	"swr":        "+ stale-while-revalidate (HardTTL = 3×TTL; lease losers serve stale)",
	"jitter":     "+ TTL jitter of ±10%",
	"limiter":    "+ a backing-store limiter per replica (4 slots, 1 reserved for misses, queue timeout, shedding)",
	"ahead": "+ refresh-ahead of the hottest fifth of the keys (RefreshAheadHot), refreshed on a timer shortly " +
		"before soft expiry, in place of XFetch (Beta 0)",
	// the rungs of slow-origin, not on the ladder
	"static-default": "slow-origin: lease and stale serving, and limiter.DefaultOptions(32) per replica",
	"static-tuned":   "slow-origin: lease and stale serving, and limiter.DefaultOptions(capacity ÷ replicas) per replica: tuned for the healthy database",
	"adaptive": "slow-origin: lease and stale serving, and an adaptive limit per replica between half the tuned one (at least 2) and 32 " +
		"(MinLimit, Reserve 1), shedding Low-priority misses and refreshes once the queue's wait and the database's latency exceed 1.5× the queue timeout (ShedLatency)",
}

// Presets are the named configurations of --preset, each reproducing a
// figure of the design with fixed latency and no capacity limit.
var Presets = []string{"seed-a", "seed-b"}

// PresetDocs describes each preset in one line, for --list.
var PresetDocs = map[string]string{
	"seed-a": "1 replica × 2,000 req/s on one key, fixed 250ms recompute: ≈500 calls per expiry unprotected, 1 with coalescing",
	"seed-b": "20 replicas × 50 req/s on one key, fixed 400ms recompute: ≈400 unprotected, 20 with coalescing, 1 with the lease",
}

// Limits of Options, so that every load loop stays bounded.
const (
	maxReplicas  = 1000
	maxRate      = 100_000 // requests per second, fleet-wide
	maxClients   = 10_000  // fleet-wide
	maxKeys      = 1_000_000
	maxDuration  = 10 * time.Minute
	maxTTL       = time.Hour
	limiterSlots = 4
)

// Options configures a suite. Make one with [Defaults], [Quick] or
// [PresetOptions] and adjust it; [RunSuite] validates it.
type Options struct {
	// Preset names the preset the options came from; empty for none.
	Preset string
	// Scenarios and Layers select the runs: every layer under every scenario.
	Scenarios []string
	Layers    []string

	// Replicas is the number of cache replicas sharing one remote tier.
	Replicas int
	// Rate is the request rate per replica (requests per second). Open loop:
	// Poisson arrivals at this rate. Closed loop: each client waits
	// Clients/Rate seconds between requests, so the offered rate is Rate
	// while answers are fast and falls when they are slow.
	Rate float64
	// Clients is the number of clients per replica in the closed loop.
	Clients int
	// ClosedLoop runs Clients clients per replica instead of open-loop arrivals.
	ClosedLoop bool
	// Keys is the number of keys of flush, node-kill and cold-start, with
	// Zipf(1.1) popularity; hot-key uses one key.
	Keys int

	// Latency is the distribution of backing-store call durations.
	Latency Latency
	// Capacity is how many backing-store calls run at full speed at once;
	// beyond it they slow down (see [OriginOptions.Capacity]). Zero means no
	// limit. With PostgresDSN it is the connection pool's size instead.
	Capacity int
	// FailureRate is the probability that a backing-store call fails.
	FailureRate float64

	// TTL is the fresh time of a value (the soft TTL) in hot-key and
	// node-kill. Flush and cold-start keep values for ten times the run, so
	// that every load they count follows the flush or the start.
	TTL time.Duration
	// Duration is the length of each run's traffic (cold-start: half of it,
	// a quarter in its fleet variant).
	Duration time.Duration
	// ClientTimeout bounds each request.
	ClientTimeout time.Duration
	// Seed seeds arrivals, key choice, latencies and failures.
	Seed uint64

	// RedisAddr, when set, is a loopback Redis to use as the remote tier,
	// each run under a key prefix of its own; node-kill cannot run on it.
	RedisAddr string
	// SpawnRedis starts a local redis-server for the remote tier, which
	// node-kill kills with SIGKILL and restarts.
	SpawnRedis bool
	// PostgresDSN, when set, makes each backing-store call a real query,
	// SELECT pg_sleep(drawn latency), on this loopback PostgreSQL.
	PostgresDSN string

	// SlowScale multiplies slow-origin's latency, TTL and client timeout
	// (so its run length too), and no other scenario's; zero means one.
	// Quick sets it to 8, to a 320ms mean: at 40ms, a machine busy with
	// other work runs the timers and the Redis round trips of three rungs
	// side by side late by about as much as a call lasts, and the adaptive
	// limit, which reads that lateness as the database's latency, backs
	// off from a database that is not slow.
	SlowScale float64

	// Check evaluates every layer's promises into Suite.Checks.
	Check bool

	// Progress, when non-nil, is called before each run and after it, in
	// order, from the goroutine that called RunSuite: the call after the
	// last run has Done == Total.
	Progress func(Step)
	// Notes receives remarks about the suite (one line each); nil discards them.
	Notes io.Writer
}

// Defaults returns the default suite: every scenario under every layer,
// 4 replicas × 100 req/s, 100 keys, lognormal latency of mean 250ms,
// capacity 32, TTL 1s, 4s per run.
func Defaults() Options {
	return Options{
		Scenarios:     defaultScenarios(),
		Layers:        slices.Clone(Layers),
		Replicas:      4,
		Rate:          100,
		Clients:       4,
		Keys:          100,
		Latency:       Latency{Kind: "lognormal", A: 250 * time.Millisecond, B: 50 * time.Millisecond},
		Capacity:      32,
		TTL:           time.Second,
		Duration:      4 * time.Second,
		ClientTimeout: 2 * time.Second,
		Seed:          1,
	}
}

// Quick returns the defaults scaled down to finish in well under 30
// seconds: every scenario and layer, with 40ms recomputes, a 200ms TTL and
// 600ms runs; slow-origin, when named, at 8× those timings (SlowScale).
func Quick() Options {
	o := Defaults()
	o.Replicas = 3
	o.Rate = 200
	o.Keys = 20
	o.Latency = Latency{Kind: "lognormal", A: 40 * time.Millisecond, B: 8 * time.Millisecond}
	o.Capacity = 16
	o.TTL = 200 * time.Millisecond
	o.Duration = 600 * time.Millisecond
	o.ClientTimeout = time.Second
	o.SlowScale = 8
	return o
}

// PresetOptions returns the options of a named preset.
func PresetOptions(name string) (Options, error) {
	o := Defaults()
	o.Preset = name
	o.Scenarios = []string{"hot-key"}
	o.Layers = []string{"none", "coalescing", "lease"}
	o.Capacity = 0
	o.TTL = time.Second
	o.Duration = 8 * time.Second
	o.ClientTimeout = 2 * time.Second
	switch name {
	case "seed-a":
		o.Replicas, o.Rate = 1, 2000
		o.Latency = Latency{Kind: "fixed", A: 250 * time.Millisecond}
	case "seed-b":
		o.Replicas, o.Rate = 20, 50
		o.Latency = Latency{Kind: "fixed", A: 400 * time.Millisecond}
	default:
		return Options{}, fmt.Errorf("lab: unknown preset %q (want one of %s)", name, strings.Join(Presets, ", "))
	}
	return o, nil
}

// Validate reports every problem of o in one error, prefixed "lab: ".
func (o *Options) Validate() error {
	var errs []error
	bad := func(format string, args ...any) {
		errs = append(errs, fmt.Errorf("lab: "+format, args...))
	}
	if len(o.Scenarios) == 0 {
		bad("no scenario selected (choose from %s)", strings.Join(Scenarios, ", "))
	}
	for _, s := range o.Scenarios {
		if !slices.Contains(Scenarios, s) {
			bad("unknown scenario %q (choose from %s)", s, strings.Join(Scenarios, ", "))
		}
	}
	if len(o.Layers) == 0 {
		bad("no layer selected (choose from %s)", strings.Join(Layers, ", "))
	}
	for _, l := range o.Layers {
		if !slices.Contains(Layers, l) {
			bad("unknown layer %q (choose from %s)", l, strings.Join(Layers, ", "))
		}
	}
	if o.Replicas < 1 || o.Replicas > maxReplicas {
		bad("replicas must lie in [1, %d], got %d", maxReplicas, o.Replicas)
	}
	if !(o.Rate > 0) || math.IsInf(o.Rate, 0) || o.Rate*float64(max(o.Replicas, 1)) > maxRate {
		bad("rate must be positive and at most %d requests per second fleet-wide, got %v per replica × %d replicas", maxRate, o.Rate, o.Replicas)
	}
	if o.ClosedLoop && (o.Clients < 1 || o.Clients*max(o.Replicas, 1) > maxClients) {
		bad("clients must be at least 1 and at most %d fleet-wide in the closed loop, got %d per replica", maxClients, o.Clients)
	}
	if o.Keys < 1 || o.Keys > maxKeys {
		bad("keys must lie in [1, %d], got %d", maxKeys, o.Keys)
	}
	if err := o.Latency.validate(); err != nil {
		bad("latency: %v", err)
	}
	if o.Capacity < 0 {
		bad("capacity must not be negative, got %d", o.Capacity)
	}
	if !(o.FailureRate >= 0 && o.FailureRate < 1) {
		bad("failure rate must lie in [0, 1), got %v", o.FailureRate)
	}
	if o.TTL <= 0 || o.TTL > maxTTL {
		bad("TTL must lie in (0, %v], got %v", maxTTL, o.TTL)
	}
	if o.Duration <= 0 || o.Duration > maxDuration {
		bad("duration must lie in (0, %v], got %v", maxDuration, o.Duration)
	}
	if o.ClientTimeout <= 0 || o.ClientTimeout > time.Minute {
		bad("client timeout must lie in (0, 1m], got %v", o.ClientTimeout)
	}
	if o.SlowScale < 0 || o.SlowScale > 100 {
		bad("slow-origin's time scale must lie in [0, 100], got %g", o.SlowScale)
	}
	if o.RedisAddr != "" && o.SpawnRedis {
		bad("--redis and --spawn-redis exclude each other")
	}
	if o.RedisAddr != "" {
		if err := checkRedisAddr(o.RedisAddr); err != nil {
			bad("%v", err)
		}
		if slices.Contains(o.Scenarios, "node-kill") {
			bad("node-kill cannot kill a Redis it did not start: use --spawn-redis, or leave node-kill out with --redis")
		}
	}
	if o.PostgresDSN != "" {
		if err := checkPostgresDSN(o.PostgresDSN); err != nil {
			bad("%v", err)
		}
	}
	return errors.Join(errs...)
}

// checkRedisAddr accepts host:port with a loopback host.
func checkRedisAddr(addr string) error {
	host, port, err := net.SplitHostPort(addr)
	if err != nil || port == "" {
		return fmt.Errorf("--redis %q: want host:port, e.g. 127.0.0.1:6379", addr)
	}
	if !loopback(host) {
		return fmt.Errorf("--redis %q: only loopback addresses are allowed (127.0.0.1, ::1, localhost)", addr)
	}
	return nil
}

// checkPostgresDSN accepts a DSN whose every host is loopback or a local
// socket directory.
func checkPostgresDSN(dsn string) error {
	cfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		return fmt.Errorf("--origin-postgres: %v", err)
	}
	hosts := []string{cfg.ConnConfig.Host}
	for _, f := range cfg.ConnConfig.Fallbacks {
		hosts = append(hosts, f.Host)
	}
	for _, h := range hosts {
		if !strings.HasPrefix(h, "/") && !loopback(h) {
			return fmt.Errorf("--origin-postgres: host %q is not a loopback address; only 127.0.0.1, ::1, localhost or a local socket are allowed", h)
		}
	}
	return nil
}

func loopback(host string) bool {
	if strings.EqualFold(host, "localhost") {
		return true
	}
	ip := net.ParseIP(strings.Trim(host, "[]"))
	return ip != nil && ip.IsLoopback()
}

// config returns the Config a report shows for o.
func (o *Options) config() Config {
	keys := o.Keys
	if !slices.ContainsFunc(o.Scenarios, func(s string) bool { return s != "hot-key" }) {
		keys = 0 // hot-key alone uses one key
	}
	return Config{
		Preset:        o.Preset,
		Scenarios:     slices.Clone(o.Scenarios),
		Layers:        slices.Clone(o.Layers),
		Replicas:      o.Replicas,
		Rate:          o.Rate,
		Clients:       o.Clients,
		ClosedLoop:    o.ClosedLoop,
		Keys:          keys,
		Latency:       o.Latency.String(),
		Capacity:      o.Capacity,
		FailureRate:   o.FailureRate,
		TTL:           o.TTL,
		Duration:      o.Duration,
		ClientTimeout: o.ClientTimeout,
		Seed:          o.Seed,
	}
}

// loadModel describes the load model of o as Suite.LoadModel does.
func (o *Options) loadModel() string {
	if o.ClosedLoop {
		return fmt.Sprintf("closed-loop (%d clients per replica, think time %v)", o.Clients, o.thinkTime())
	}
	return "open-loop (Poisson arrivals)"
}

// thinkTime is how long a closed-loop client waits between requests.
func (o *Options) thinkTime() time.Duration {
	return time.Duration(float64(o.Clients) / o.Rate * float64(time.Second))
}

// rung returns the position of layer on the ladder, -1 if it is unknown.
func rung(layer string) int { return slices.Index(Layers, layer) }

// Predict returns the formula's backing-store calls per expiry of hot-key
// under one of the layers none, coalescing or lease, for replicas each
// receiving rate requests per second and a recompute of mean latency:
// replicas × rate × latency unprotected (at least one), one per replica with
// coalescing, one with the lease. ok is false for other layers.
func Predict(layer string, replicas int, rate float64, latency time.Duration) (calls float64, ok bool) {
	switch layer {
	case "none":
		return max(1, float64(replicas)*rate*latency.Seconds()), true
	case "coalescing":
		return float64(replicas), true
	case "lease":
		return 1, true
	}
	return 0, false
}

// minBand is the relative tolerance of a prediction: ±20%.
const minBand = 0.2

// predictionBand returns the relative band around predicted calls per
// expiry that the mean of n measured expiries must lie in, and why it is
// wider than minBand (or why nothing could be measured); note is empty
// otherwise. Unprotected, the calls of one expiry are the Poisson arrivals
// during one recompute: their number varies by 1/√predicted of itself (one
// standard deviation) and the recompute's length by the latency's
// coefficient of variation cv, so the mean of n expiries varies by
// σ = √(1/predicted + cv²)/√n. The band is 3σ, at least minBand: a
// --quick run measures two or three expiries, too few to hold ±20% (about
// 20 are needed). Coalescing and the lease are set by the replica count,
// not by chance: their band is minBand.
func predictionBand(layer string, predicted float64, n int64, l Latency) (band float64, note string) {
	if n <= 0 {
		return minBand, "no expiry measured: make --duration longer than --ttl"
	}
	if layer != "none" || predicted <= 0 {
		return minBand, ""
	}
	cv := l.CV()
	v := 1/predicted + cv*cv
	sigma := math.Sqrt(v / float64(n))
	if 3*sigma <= minBand {
		return minBand, ""
	}
	need := int(math.Ceil(9 * v / (minBand * minBand)))
	expiries := "expiries"
	if n == 1 {
		expiries = "expiry"
	}
	return 3 * sigma, fmt.Sprintf("±%.0f%% rather than ±20%%: with %.3g calls expected per recompute (Poisson arrivals) "+
		"and recompute times spread by %.0f%%, the mean of %d %s varies by ±%.0f%% at one standard deviation; "+
		"the band is three. ±20%% needs %d expiries or more (a longer --duration).",
		300*sigma, predicted, 100*cv, n, expiries, 100*sigma, need)
}

// within reports whether measured lies within ±band (relative) of predicted.
func within(predicted, measured, band float64) bool {
	return math.Abs(measured-predicted) <= band*predicted
}

// defaultScenarios are the scenarios a suite runs unless told which: all
// but slow-origin, whose checks judge an adaptive limit by timings that a
// busy machine may miss.
func defaultScenarios() []string {
	return slices.DeleteFunc(slices.Clone(Scenarios), func(s string) bool { return s == slowScenario })
}
