// Command herd runs herd's load-test lab (`herd lab` measures what reaches the backing store under each layer of stampede protection) and a caching reverse proxy (`herd proxy`).
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"slices"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/schollz/progressbar/v3"
	"golang.org/x/term"

	"github.com/herdcache/herd/cmd/herd/internal/lab"
	"github.com/herdcache/herd/cmd/herd/internal/lab/report"
)

// Exit codes.
const (
	exitOK    = 0
	exitFail  = 1 // a run failed, or --check found a missed promise
	exitUsage = 2 // bad command line
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

// run is the whole command: it returns the exit code.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, topUsage)
		return exitUsage
	}
	switch args[0] {
	case "lab":
		return runLab(ctx, args[1:], stdout, stderr)
	case "proxy":
		return runProxy(ctx, args[1:], stdout, stderr)
	case "help", "-h", "-help", "--help":
		fmt.Fprint(stdout, topUsage)
		return exitOK
	}
	fmt.Fprintf(stderr, "herd: unknown command %q\n\n%s", args[0], topUsage)
	return exitUsage
}

const topUsage = `Usage: herd <command> [flags]

Commands:
  lab    run the load-test lab (herd lab --help)
  proxy  run a caching reverse proxy in front of an HTTP service (herd proxy --help)
`

// labFlags holds the values of herd lab's flags.
type labFlags struct {
	scenarios, layers, latency, preset   string
	replicas, clients, keys, capacity    int
	rate, failureRate                    float64
	ttl, duration, clientTimeout         time.Duration
	seed                                 uint64
	closedLoop, spawnRedis, quick, check bool
	list                                 bool
	redis, postgres, out                 string
}

func newLabFlagSet(f *labFlags) *flag.FlagSet {
	d := lab.Defaults()
	fs := flag.NewFlagSet("herd lab", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	fs.StringVar(&f.scenarios, "scenarios", strings.Join(d.Scenarios, ","), "comma-separated `list` of scenarios to run")
	fs.StringVar(&f.layers, "layers", strings.Join(d.Layers, ","), "comma-separated `list` of protection layers (rungs of the ladder) to run each scenario under")
	fs.IntVar(&f.replicas, "replicas", d.Replicas, "number of cache replicas sharing the remote tier")
	fs.Float64Var(&f.rate, "rate", d.Rate, "requests per second per replica (closed loop: sets the think time to clients/rate)")
	fs.IntVar(&f.clients, "clients", d.Clients, "clients per replica with --closed-loop")
	fs.BoolVar(&f.closedLoop, "closed-loop", false, "run a fixed number of clients per replica instead of open-loop Poisson arrivals")
	fs.IntVar(&f.keys, "keys", d.Keys, "number of keys (Zipf popularity) in flush, node-kill and cold-start")
	fs.StringVar(&f.latency, "latency", d.Latency.Flag(), "recompute latency `distribution`: fixed:250ms, lognormal:MEAN,SD or uniform:LOW,HIGH")
	fs.IntVar(&f.capacity, "capacity", d.Capacity, "backing-store calls at full speed at once (latency × (1+(inflight−capacity)/capacity) beyond); 0 = no limit; the pool size with --origin-postgres")
	fs.Float64Var(&f.failureRate, "failure-rate", 0, "probability that a backing-store call fails")
	fs.DurationVar(&f.ttl, "ttl", d.TTL, "fresh time of a value in hot-key and node-kill")
	fs.DurationVar(&f.duration, "duration", d.Duration, "traffic time of each run (cold-start: half; warm from the fleet: a quarter)")
	fs.DurationVar(&f.clientTimeout, "client-timeout", d.ClientTimeout, "timeout of each client request")
	fs.Uint64Var(&f.seed, "seed", d.Seed, "seed of arrivals, keys, latencies and failures")
	fs.StringVar(&f.redis, "redis", "", "use the Redis at this loopback `addr` (host:port) as the remote tier, under a key prefix per run")
	fs.BoolVar(&f.spawnRedis, "spawn-redis", false, "start a local redis-server as the remote tier; node-kill kills it with SIGKILL and restarts it")
	fs.StringVar(&f.postgres, "origin-postgres", "", "make each backing-store call SELECT pg_sleep(drawn latency) on this loopback PostgreSQL `dsn`")
	fs.StringVar(&f.out, "out", "", "write results.json, results.csv, checks.csv and report.html to `dir` (created if need be, checked before the runs)")
	fs.BoolVar(&f.quick, "quick", false, "a short suite (every scenario and layer, 40ms recomputes, 600ms runs): under 30 seconds; slow-origin, when named, at 8× those timings (about 20 seconds)")
	fs.StringVar(&f.preset, "preset", "", "run a preset that checks the stampede formula: "+strings.Join(lab.Presets, " or "))
	fs.BoolVar(&f.check, "check", false, "check every layer's promises; exit 1 if one is missed or judged nothing")
	fs.BoolVar(&f.list, "list", false, "list scenarios, layers and presets, and exit")
	return fs
}

func labUsage(w io.Writer, fs *flag.FlagSet) {
	fmt.Fprint(w, `Usage: herd lab [flags]

Runs every scenario under every layer of protection, one rung of the ladder
at a time (none → coalescing → lease → xfetch → swr → jitter → limiter →
ahead, each adding one layer; ahead, refresh-ahead of the hottest keys,
takes over from xfetch), and prints origin calls, calls per expiry, peak
origin concurrency and client latency per run, with a legend of the layers
and columns. The remote tier is an in-process store shared by the replicas
unless --redis or --spawn-redis is given; the backing store is simulated
unless --origin-postgres is given.

With --check, each promise of a layer is checked against the observations
it judged (expiries, keys, calls or requests); one that judged none fails.
Hot-key runs under none, coalescing and lease set the stampede formula
beside the measured calls per expiry, within a band of ±20% or wider when
the runs measure too few expiries; only a --preset checks them.

Flags set explicitly override those of --quick and --preset.

Flags:
`)
	fs.SetOutput(w)
	fs.PrintDefaults()
	fs.SetOutput(io.Discard)
	fmt.Fprint(w, `
Exit status: 0 on success, 1 when a run fails or --check finds a missed
promise (or one that judged nothing), 2 on a bad command line or an --out
directory that cannot be written.
`)
}

func printList(w io.Writer) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "scenarios:")
	for _, s := range lab.Scenarios {
		fmt.Fprintf(tw, "  %s\t%s\n", s, lab.ScenarioDocs[s])
	}
	fmt.Fprintln(tw, "layers (each rung adds one to the rungs above it):")
	for _, l := range lab.Layers {
		fmt.Fprintf(tw, "  %s\t%s\n", l, lab.LayerDocs[l])
	}
	fmt.Fprintln(tw, "presets:")
	for _, p := range lab.Presets {
		fmt.Fprintf(tw, "  %s\t%s\n", p, lab.PresetDocs[p])
	}
	tw.Flush()
}

func runLab(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	var f labFlags
	fs := newLabFlagSet(&f)
	err := fs.Parse(args)
	switch {
	case errors.Is(err, flag.ErrHelp):
		labUsage(stdout, fs)
		return exitOK
	case err != nil:
		return badUsage(stderr, err)
	case fs.NArg() > 0:
		return badUsage(stderr, fmt.Errorf("unexpected argument %q", fs.Arg(0)))
	}
	if f.list {
		printList(stdout)
		return exitOK
	}
	o, err := labOptions(fs, &f, stderr)
	if err != nil {
		return badUsage(stderr, err)
	}

	if f.out != "" {
		if err := report.PrepareDir(f.out); err != nil {
			return badUsage(stderr, fmt.Errorf("--out: %s", strings.TrimPrefix(err.Error(), "report: ")))
		}
	}

	prog := newProgress(stderr, isTerminal(stdout) && isTerminal(stderr))
	o.Progress = prog.step
	o.Notes = noteWriter{prog}
	suite, err := lab.RunSuite(ctx, o)
	prog.finish()
	if suite != nil && len(suite.Runs) > 0 {
		if werr := report.WriteTable(stdout, suite); werr != nil {
			fmt.Fprintf(stderr, "herd lab: %v\n", werr)
			return exitFail
		}
	}
	if err != nil {
		fmt.Fprintf(stderr, "herd lab: %s\n", message(err))
		return exitFail
	}
	if f.out != "" {
		if err := report.WriteDir(f.out, suite); err != nil {
			fmt.Fprintf(stderr, "herd lab: %v\n", err)
			return exitFail
		}
		fmt.Fprintf(stderr, "herd lab: wrote %s to %s\n", strings.Join(report.Files, ", "), f.out)
	}
	if failed := suite.Failed(); len(failed) > 0 {
		fmt.Fprintf(stderr, "herd lab: %d promise(s) missed:\n", len(failed))
		for _, c := range failed {
			fmt.Fprintf(stderr, "  %s / %s: %s (measured %s; judged %d %s)\n",
				c.Scenario, c.Layer, c.Promise, c.Measured, c.Observations, c.Observed)
		}
		return exitFail
	}
	return exitOK
}

// noteWriter writes the lab's notes ("lab: …" lines) as the command's own
// ("herd lab: note: …").
type noteWriter struct{ w io.Writer }

func (n noteWriter) Write(p []byte) (int, error) {
	var b strings.Builder
	for line := range strings.Lines(string(p)) {
		b.WriteString("herd lab: note: " + strings.TrimPrefix(line, "lab: "))
	}
	if _, err := io.WriteString(n.w, b.String()); err != nil {
		return 0, err
	}
	return len(p), nil
}

func badUsage(stderr io.Writer, err error) int {
	fmt.Fprintf(stderr, "herd lab: %s\nRun 'herd lab --help' for usage.\n", message(err))
	return exitUsage
}

// message is err's text without the lab package's prefix on each line,
// which "herd lab: " already stands for.
func message(err error) string {
	lines := strings.Split(err.Error(), "\n")
	for i, l := range lines {
		if i == 0 {
			lines[i] = strings.TrimPrefix(l, "lab: ")
		} else if strings.HasPrefix(l, "lab: ") {
			lines[i] = "  " + strings.TrimPrefix(l, "lab: ")
		}
	}
	return strings.Join(lines, "\n")
}

// labOptions resolves the flags: the defaults of --preset, --quick or the
// default suite, overridden by every flag set explicitly.
func labOptions(fs *flag.FlagSet, f *labFlags, stderr io.Writer) (lab.Options, error) {
	set := map[string]bool{}
	fs.Visit(func(fl *flag.Flag) { set[fl.Name] = true })

	o := lab.Defaults()
	switch {
	case f.preset != "" && f.quick:
		return o, errors.New("--preset and --quick exclude each other")
	case f.preset != "":
		p, err := lab.PresetOptions(f.preset)
		if err != nil {
			return o, err
		}
		o = p
	case f.quick:
		o = lab.Quick()
	}
	if set["scenarios"] {
		o.Scenarios = splitList(f.scenarios)
	}
	if set["layers"] {
		o.Layers = splitList(f.layers)
	}
	if set["replicas"] {
		o.Replicas = f.replicas
	}
	if set["rate"] {
		o.Rate = f.rate
	}
	if set["clients"] {
		o.Clients = f.clients
	}
	if set["keys"] {
		o.Keys = f.keys
	}
	if set["latency"] {
		l, err := lab.ParseLatency(f.latency)
		if err != nil {
			return o, err
		}
		o.Latency = l
	}
	if set["capacity"] {
		o.Capacity = f.capacity
	}
	if set["failure-rate"] {
		o.FailureRate = f.failureRate
	}
	if set["ttl"] {
		o.TTL = f.ttl
	}
	if set["duration"] {
		o.Duration = f.duration
	}
	if set["client-timeout"] {
		o.ClientTimeout = f.clientTimeout
	}
	if set["seed"] {
		o.Seed = f.seed
	}
	if set["latency"] || set["ttl"] || set["client-timeout"] {
		o.SlowScale = 0 // slow-origin runs at the timings given
	}
	o.ClosedLoop = f.closedLoop
	o.RedisAddr = f.redis
	o.SpawnRedis = f.spawnRedis
	o.PostgresDSN = f.postgres
	o.Check = f.check
	if o.RedisAddr != "" && !set["scenarios"] && slices.Contains(o.Scenarios, "node-kill") {
		o.Scenarios = slices.DeleteFunc(o.Scenarios, func(s string) bool { return s == "node-kill" })
		fmt.Fprintln(stderr, "herd lab: note: node-kill skipped: it cannot kill a Redis the lab did not start (use --spawn-redis)")
	}
	return o, o.Validate()
}

// splitList splits a comma-separated list, dropping blanks.
func splitList(s string) []string {
	var out []string
	for p := range strings.SplitSeq(s, ",") {
		if p = strings.TrimSpace(p); p != "" {
			out = append(out, p)
		}
	}
	return out
}

// isTerminal reports whether w is a terminal (not a file, a pipe or
// /dev/null).
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	return ok && term.IsTerminal(int(f.Fd()))
}

// progress reports the lab's runs on w. With bar set (stdout and stderr
// both terminals) it draws a progress bar, redrawn as each run starts and
// ends, that ends at 100%; otherwise (CI, a pipe to tee) it writes one line
// per finished run, so a log shows the suite advancing. It is also the
// writer of the lab's notes, so that a note does not land inside the bar.
type progress struct {
	w        io.Writer
	bar      bool
	pb       *progressbar.ProgressBar // nil before the first step
	finished bool                     // the bar has reached 100% and ended its line
}

func newProgress(w io.Writer, bar bool) *progress {
	return &progress{w: w, bar: bar}
}

// step is the lab's Progress callback.
func (p *progress) step(s lab.Step) {
	if !p.bar {
		if s.Run != nil {
			fmt.Fprintf(p.w, "herd lab: %d/%d %s done in %s: %d backing-store calls, p99 %s\n",
				s.Done, s.Total, s.Name, s.Took.Round(10*time.Millisecond), s.Run.OriginCalls, report.FormatLatency(s.Run.P99))
		}
		return
	}
	if p.pb == nil {
		p.pb = progressbar.NewOptions(s.Total,
			progressbar.OptionSetWriter(p.w),
			progressbar.OptionSetItsString("runs"),
			progressbar.OptionShowCount(),
			progressbar.OptionSetWidth(30),
			progressbar.OptionSetPredictTime(true),
			progressbar.OptionShowElapsedTimeOnFinish(),
			progressbar.OptionOnCompletion(func() {
				p.finished = true
				fmt.Fprintln(p.w)
			}),
		)
	}
	switch {
	case s.Done == s.Total:
		p.pb.Describe("herd lab: done")
	case s.Run == nil:
		p.pb.Describe("herd lab: " + s.Name)
	}
	_ = p.pb.Set(s.Done)
}

// Write writes a note, clearing the bar first: the next step redraws it.
func (p *progress) Write(b []byte) (int, error) {
	if p.pb != nil && !p.finished {
		_ = p.pb.Clear()
	}
	return p.w.Write(b)
}

// finish ends the bar's line if the suite stopped before its last run.
func (p *progress) finish() {
	if p.pb != nil && !p.finished {
		_ = p.pb.Exit()
	}
}
