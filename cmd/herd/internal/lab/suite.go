package lab

import (
	"context"
	"fmt"
	"io"
	"slices"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

// defaultPoolSize is the PostgreSQL pool size when Capacity is zero.
const defaultPoolSize = 50

// RunSuite runs every selected scenario under every selected layer, one run at a
// time, and returns what they measured. When ctx ends or a run fails it
// returns the runs finished so far with the error.
func RunSuite(ctx context.Context, o Options) (*Suite, error) {
	if err := o.Validate(); err != nil {
		return nil, err
	}
	s := &Suite{
		Started:   time.Now(),
		Config:    o.config(),
		LoadModel: o.loadModel(),
	}
	notes := o.Notes
	if notes == nil {
		notes = io.Discard
	}

	var b backend = embedded{}
	if o.RedisAddr != "" || o.SpawnRedis {
		rb, err := newRedisBackend(ctx, o.RedisAddr, o.SpawnRedis)
		if err != nil {
			return nil, err
		}
		b = rb
	}
	defer b.close()
	s.Backend = b.describe()

	var query func(context.Context, time.Duration) error
	if o.PostgresDSN != "" {
		pool, size, err := openPostgres(ctx, o.PostgresDSN, o.Capacity)
		if err != nil {
			return nil, err
		}
		defer pool.Close()
		query = func(ctx context.Context, d time.Duration) error {
			_, err := pool.Exec(ctx, "SELECT pg_sleep($1)", d.Seconds())
			return err
		}
		s.Origin = fmt.Sprintf("postgres %s (SELECT pg_sleep(%s), pool of %d connections; failure rate %g)",
			pool.Config().ConnConfig.Host, o.Latency, size, o.FailureRate)
	} else {
		capacity := "no capacity limit"
		if o.Capacity > 0 {
			capacity = fmt.Sprintf("capacity %d, slower beyond", o.Capacity)
		}
		s.Origin = fmt.Sprintf("simulated (%s, %s; failure rate %g)", o.Latency, capacity, o.FailureRate)
	}

	plans := o.plans()
	total := len(plans)
	if slices.Contains(o.Scenarios, slowScenario) {
		total++
	}
	for i, p := range plans {
		if o.Progress != nil {
			o.Progress(Step{Done: i, Total: total, Name: p.name()})
		}
		began := time.Now()
		r, m, err := runOne(ctx, &o, b, query, i, p)
		if err != nil {
			s.Finished = time.Now()
			return s, err
		}
		s.Runs = append(s.Runs, r)
		if o.Progress != nil {
			o.Progress(Step{Done: i + 1, Total: total, Name: p.name(), Run: &r, Took: time.Since(began)})
		}
		if o.Check {
			s.Checks = append(s.Checks, checks(m)...)
		}
		if p.scenario == "hot-key" && r.Expiries == 0 {
			fmt.Fprintf(notes, "lab: %s saw no expiry after warm-up; make --duration longer than --ttl\n", p.name())
		}
	}
	if slices.Contains(o.Scenarios, slowScenario) {
		// slow-origin is one step of the progress, after the ladder's runs.
		if o.Progress != nil {
			o.Progress(Step{Done: len(plans), Total: total, Name: slowScenario})
		}
		if o.SlowScale != 0 && o.SlowScale != 1 {
			so := slowScaled(&o)
			fmt.Fprintf(notes, "lab: %s runs at %g× the suite's timings: latency %s, TTL %v, client timeout %v\n",
				slowScenario, o.SlowScale, so.Latency, so.TTL, so.ClientTimeout)
		}
		began := time.Now()
		runs, checks, err := runSlowOrigin(ctx, &o, b, len(plans))
		s.Runs = append(s.Runs, runs...)
		s.Checks = append(s.Checks, checks...)
		if err != nil {
			s.Finished = time.Now()
			return s, err
		}
		if o.Progress != nil && len(runs) > 0 {
			o.Progress(Step{Done: total, Total: total, Name: slowScenario, Run: &runs[len(runs)-1], Took: time.Since(began)})
		}
	}
	s.Predictions = predictions(&o, s.Runs)
	for _, p := range s.Predictions {
		if o.Check && p.Checked {
			s.Checks = append(s.Checks, Check{
				Scenario:     "hot-key",
				Layer:        p.Layer,
				Promise:      fmt.Sprintf("%s within ±%.0f%% of the formula's %g", p.What, 100*p.Band, p.Predicted),
				Measured:     fmt.Sprintf("%.1f", p.Measured),
				Observations: p.Expiries,
				Observed:     "expiries",
				OK:           p.Within,
			})
		}
		if !p.Within {
			fmt.Fprintf(notes, "lab: prediction missed: hot-key/%s measured %.3g %s, the formula %.3g ±%.0f%%%s\n",
				p.Layer, p.Measured, p.What, p.Predicted, 100*p.Band, missNote(p))
		}
	}
	s.Finished = time.Now()
	return s, nil
}

// Step is where a suite stands, as [Options.Progress] reports it: a run
// about to start (Run nil) or one just finished.
type Step struct {
	// Done is the number of runs finished, Total the number of runs of the
	// suite.
	Done, Total int
	// Name is the run's scenario and layer (and variant), e.g.
	// "cold-start/lease/warm".
	Name string
	// Run is what the run just finished measured, and Took how long it
	// took; nil and zero before a run.
	Run  *Run
	Took time.Duration
}

// missNote says what a missed prediction means for the exit status.
func missNote(p Prediction) string {
	if p.Checked {
		return " (a failed check)"
	}
	return " (not a check: only a --preset, whose runs measure enough expiries, checks its predictions)"
}

// plans lists the runs of o: scenario by scenario, the layers in ladder
// order, cold-start once cold, once warm and once warm from the fleet per
// layer.
func (o *Options) plans() []plan {
	var out []plan
	for _, sc := range Scenarios {
		if !slices.Contains(o.Scenarios, sc) || sc == slowScenario {
			continue
		}
		for _, l := range Layers {
			if !slices.Contains(o.Layers, l) {
				continue
			}
			if sc == "cold-start" {
				out = append(out, plan{sc, l, "cold"}, plan{sc, l, "warm"}, plan{sc, l, "fleet"})
				continue
			}
			out = append(out, plan{sc, l, ""})
		}
	}
	return out
}

// Failed returns the checks of s that did not hold.
func (s *Suite) Failed() []Check {
	var out []Check
	for _, c := range s.Checks {
		if !c.OK {
			out = append(out, c)
		}
	}
	return out
}

// openPostgres connects a pool of capacity connections (defaultPoolSize when
// zero), all opened before it returns.
func openPostgres(ctx context.Context, dsn string, capacity int) (*pgxpool.Pool, int, error) {
	cfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		return nil, 0, fmt.Errorf("lab: --origin-postgres: %w", err)
	}
	size := capacity
	if size <= 0 {
		size = defaultPoolSize
	}
	pool, err := openPool(ctx, cfg, size)
	return pool, size, err
}

// poolOpenTimeout bounds the opening of a pool's connections: each costs
// the server a process, which a busy machine starts slowly.
const poolOpenTimeout = 20 * time.Second

// openPool connects a pool of size connections of cfg, all opened before
// it returns. When the server refuses one (it allows fewer connections
// than size, or is down), it returns the error, having closed the pool.
func openPool(ctx context.Context, cfg *pgxpool.Config, size int) (*pgxpool.Pool, error) {
	cfg.MaxConns = int32(size)
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("lab: --origin-postgres: %w", err)
	}
	pctx, cancel := context.WithTimeout(ctx, poolOpenTimeout)
	defer cancel()
	// Open every connection now, so that no measured call pays for one.
	conns := make([]*pgxpool.Conn, 0, size)
	for range size {
		c, err := pool.Acquire(pctx)
		if err != nil {
			err = fmt.Errorf("lab: --origin-postgres: opening connection %d of %d: %w", len(conns)+1, size, err)
			// Close waits for every acquired connection to be released.
			releaseAll(conns)
			pool.Close()
			return nil, err
		}
		conns = append(conns, c)
	}
	releaseAll(conns)
	return pool, nil
}

func releaseAll(conns []*pgxpool.Conn) {
	for _, c := range conns {
		c.Release()
	}
}
