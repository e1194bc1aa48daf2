package main

import (
	"bytes"
	"context"
	"encoding/csv"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/herdcache/herd/cmd/herd/internal/lab"
	"github.com/herdcache/herd/cmd/herd/internal/lab/report"
)

// TestMain runs the command itself, as main does, when the test binary is
// started again by herdProcess.
func TestMain(m *testing.M) {
	if os.Getenv("HERD_TEST_RUN_COMMAND") == "1" {
		main()
	}
	os.Exit(m.Run())
}

// herdProcess runs the command in a process of its own (this test binary,
// started again), so that what any library writes to the process's own
// stderr shows; it returns the exit code and output.
func herdProcess(t *testing.T, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	cmd := exec.Command(os.Args[0], args...)
	cmd.Env = append(os.Environ(), "HERD_TEST_RUN_COMMAND=1")
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	err := cmd.Run()
	var exit *exec.ExitError
	switch {
	case errors.As(err, &exit):
		code = exit.ExitCode()
	case err != nil:
		t.Fatal(err)
	}
	return code, out.String(), errOut.String()
}

// herd runs the command in-process and returns its exit code and output.
func herd(t *testing.T, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	var out, errOut bytes.Buffer
	code = run(context.Background(), args, &out, &errOut)
	return code, out.String(), errOut.String()
}

// TestBadFlags checks that every bad command line exits 2 with a clear
// message on stderr and nothing on stdout.
func TestBadFlags(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{nil, "Usage: herd <command>"},
		{[]string{"stampede"}, `unknown command "stampede"`},
		{[]string{"lab", "--bogus"}, "flag provided but not defined: -bogus"},
		{[]string{"lab", "--replicas", "many"}, `invalid value "many" for flag -replicas`},
		{[]string{"lab", "--replicas", "0"}, "replicas must lie in [1, 1000], got 0"},
		{[]string{"lab", "--rate", "-5"}, "rate must be positive"},
		{[]string{"lab", "--scenarios", "hot-key,meltdown"}, `unknown scenario "meltdown"`},
		{[]string{"lab", "--layers", "none,cdn"}, `unknown layer "cdn"`},
		{[]string{"lab", "--latency", "gamma:1s"}, `unknown distribution "gamma"`},
		{[]string{"lab", "--latency", "uniform:3s,1s"}, "uniform bounds"},
		{[]string{"lab", "--ttl", "0s"}, "TTL must lie in"},
		{[]string{"lab", "--failure-rate", "1.5"}, "failure rate must lie in [0, 1)"},
		{[]string{"lab", "--preset", "seed-z"}, `unknown preset "seed-z"`},
		{[]string{"lab", "--preset", "seed-a", "--quick"}, "--preset and --quick exclude each other"},
		{[]string{"lab", "--redis", "10.0.0.7:6379"}, "only loopback addresses"},
		{[]string{"lab", "--redis", "127.0.0.1:6379", "--spawn-redis"}, "exclude each other"},
		{[]string{"lab", "--redis", "127.0.0.1:6379", "--scenarios", "node-kill"}, "node-kill cannot kill a Redis it did not start"},
		{[]string{"lab", "--origin-postgres", "postgres://postgres@db.example.com/postgres"}, "not a loopback address"},
		{[]string{"lab", "extra"}, `unexpected argument "extra"`},
	} {
		code, stdout, stderr := herd(t, tc.args...)
		if code != exitUsage || !strings.Contains(stderr, tc.want) || stdout != "" {
			t.Errorf("herd %s: exit %d, stderr %q, stdout %q; want exit 2 and %q on stderr only",
				strings.Join(tc.args, " "), code, stderr, stdout, tc.want)
		}
	}
}

// TestList checks that --list names every scenario, layer and preset.
func TestList(t *testing.T) {
	code, stdout, stderr := herd(t, "lab", "--list")
	if code != exitOK || stderr != "" {
		t.Fatalf("exit %d, stderr %q", code, stderr)
	}
	for _, name := range slices.Concat(lab.Scenarios, lab.Layers, lab.Presets) {
		if !strings.Contains(stdout, "\n  "+name+" ") {
			t.Errorf("--list does not list %q:\n%s", name, stdout)
		}
	}
}

// TestHelp checks that --help prints the usage with every flag on stdout and
// exits 0.
func TestHelp(t *testing.T) {
	for _, args := range [][]string{{"lab", "--help"}, {"lab", "-h"}} {
		code, stdout, stderr := herd(t, args...)
		if code != exitOK || stderr != "" || !strings.HasPrefix(stdout, "Usage: herd lab") {
			t.Fatalf("herd %v: exit %d, stderr %q, stdout starts %.40q", args, code, stderr, stdout)
		}
		var f labFlags
		newLabFlagSet(&f).VisitAll(func(fl *flag.Flag) {
			if !strings.Contains(stdout, "-"+fl.Name) {
				t.Errorf("--help does not mention -%s", fl.Name)
			}
		})
	}
	if code, stdout, _ := herd(t, "help"); code != exitOK || !strings.Contains(stdout, "lab") {
		t.Errorf("herd help: exit %d, %q", code, stdout)
	}
}

// TestOptions checks how flags resolve: a preset or --quick sets the base,
// explicit flags override it (a timing given runs slow-origin unscaled),
// and --redis drops node-kill from the default
// scenarios with a note.
func TestOptions(t *testing.T) {
	resolve := func(args ...string) (lab.Options, string) {
		t.Helper()
		var f labFlags
		fs := newLabFlagSet(&f)
		if err := fs.Parse(args); err != nil {
			t.Fatal(err)
		}
		var notes bytes.Buffer
		o, err := labOptions(fs, &f, &notes)
		if err != nil {
			t.Fatalf("%v: %v", args, err)
		}
		return o, notes.String()
	}
	o, _ := resolve("--preset", "seed-b", "--rate", "80")
	if o.Preset != "seed-b" || o.Replicas != 20 || o.Rate != 80 || o.Latency.String() != "fixed(400ms)" {
		t.Errorf("seed-b with --rate 80: %+v", o)
	}
	o, _ = resolve("--quick", "--replicas", "5", "--closed-loop", "--check")
	q := lab.Quick()
	if o.Replicas != 5 || o.TTL != q.TTL || o.Duration != q.Duration || !o.ClosedLoop || !o.Check || o.SlowScale != q.SlowScale {
		t.Errorf("--quick --replicas 5: %+v", o)
	}
	if o, _ = resolve("--quick", "--ttl", "300ms"); o.SlowScale != 0 {
		t.Errorf("--quick --ttl 300ms: slow-origin's scale %g, want 0: the timings given", o.SlowScale)
	}
	o, notes := resolve("--redis", "127.0.0.1:6379")
	if slices.Contains(o.Scenarios, "node-kill") || !strings.Contains(notes, "node-kill skipped") {
		t.Errorf("--redis: scenarios %v, notes %q; want node-kill dropped with a note", o.Scenarios, notes)
	}
	o, _ = resolve("--latency", "uniform:10ms,20ms", "--scenarios", " flush, cold-start ,")
	if o.Latency.Flag() != "uniform:10ms,20ms" || !slices.Equal(o.Scenarios, []string{"flush", "cold-start"}) {
		t.Errorf("latency %v, scenarios %q", o.Latency, o.Scenarios)
	}
}

// TestRunWritesReport runs a small embedded suite in-process: the table on
// stdout, the report files in --out, exit 0 when every promise holds; every
// check in results.json and checks.csv carries the observations it judged,
// and results.json gives durations in milliseconds.
func TestRunWritesReport(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "out")
	code, stdout, stderr := herd(t, "lab", "--scenarios", "hot-key", "--layers", "none,lease",
		"--replicas", "2", "--rate", "50", "--latency", "fixed:20ms", "--ttl", "100ms",
		"--duration", "600ms", "--client-timeout", "500ms", "--check", "--out", dir)
	if code != exitOK {
		t.Fatalf("exit %d\nstdout:\n%s\nstderr:\n%s", code, stdout, stderr)
	}
	for _, want := range []string{"scenario hot-key", "open-loop (Poisson arrivals)", "PASS  hot-key / lease", "expiries)\n"} {
		if !strings.Contains(stdout, want) {
			t.Errorf("stdout lacks %q:\n%s", want, stdout)
		}
	}
	for _, f := range report.Files {
		if fi, err := os.Stat(filepath.Join(dir, f)); err != nil || fi.Size() == 0 {
			t.Errorf("%s: %v", f, err)
		}
	}
	if want := "wrote results.json, results.csv, checks.csv, report.html to " + dir; !strings.Contains(stderr, want) {
		t.Errorf("stderr lacks %q:\n%s", want, stderr)
	}

	b, err := os.ReadFile(filepath.Join(dir, "results.json"))
	if err != nil {
		t.Fatal(err)
	}
	var doc struct {
		Config map[string]any   `json:"config"`
		Runs   []map[string]any `json:"runs"`
		Checks []map[string]any `json:"checks"`
	}
	if err := json.Unmarshal(b, &doc); err != nil {
		t.Fatal(err)
	}
	if len(doc.Checks) == 0 {
		t.Fatal("results.json has no checks")
	}
	for _, c := range doc.Checks {
		n, ok := c["observations"].(float64)
		if !ok || n < 1 || c["observed"] == "" || c["ok"] != true {
			t.Errorf("check %v: want it passed, with the observations it judged", c)
		}
	}
	if doc.Config["ttl_ms"] != 100.0 || doc.Runs[0]["bucket_ms"] != 10.0 || doc.Runs[0]["p99_ms"] == nil {
		t.Errorf("durations in results.json: config %v, run %v; want milliseconds under _ms names", doc.Config, doc.Runs[0])
	}
	f, err := os.Open(filepath.Join(dir, "checks.csv"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	rows, err := csv.NewReader(f).ReadAll()
	if err != nil || len(rows) != 1+len(doc.Checks) || rows[0][4] != "observations" {
		t.Errorf("checks.csv: %v rows %q, want a header and one row per check", err, rows)
	}
}

// TestCheckFailsExit1 checks that a promise that cannot be shown to hold
// exits 1 and names it: a run too short for the key to expire measures no
// expiry, so "≤ 1 load per replica per expiry" judged nothing.
func TestCheckFailsExit1(t *testing.T) {
	code, stdout, stderr := herd(t, "lab", "--scenarios", "hot-key", "--layers", "coalescing",
		"--replicas", "1", "--rate", "20", "--latency", "fixed:5ms", "--ttl", "1m",
		"--duration", "200ms", "--check")
	if code != exitFail {
		t.Fatalf("exit %d, want 1\nstdout:\n%s\nstderr:\n%s", code, stdout, stderr)
	}
	if !strings.Contains(stderr, "1 promise(s) missed") ||
		!strings.Contains(stderr, "hot-key / coalescing: ≤ 1 load per replica per expiry (measured max 0; judged 0 expiries)") {
		t.Errorf("stderr does not name the missed promise and what it judged:\n%s", stderr)
	}
	if !strings.Contains(stdout, "FAIL  hot-key / coalescing: ≤ 1 load per replica per expiry (measured max 0; judged 0 expiries: nothing to judge)") {
		t.Errorf("table lacks the FAIL line:\n%s", stdout)
	}
}

// TestNodeKillNothingDownExit1 forces node-kill to make no backing-store
// call while the node is down (one replica, whose local tier holds every
// key it seeded, and keys that live an hour, so none expires then): its
// per-key promise judged nothing, fails, and --check exits 1, though the
// maximum it measured (0) is within the promise.
func TestNodeKillNothingDownExit1(t *testing.T) {
	code, stdout, stderr := herd(t, "lab", "--scenarios", "node-kill", "--layers", "coalescing",
		"--replicas", "1", "--rate", "50", "--keys", "5", "--latency", "fixed:5ms", "--ttl", "1h",
		"--duration", "400ms", "--client-timeout", "500ms", "--check")
	if code != exitFail {
		t.Fatalf("exit %d, want 1\nstdout:\n%s\nstderr:\n%s", code, stdout, stderr)
	}
	want := "node-kill / coalescing: ≤ 1 load per replica per key per expiry while Redis is down (measured max 0; judged 0 loads while down)"
	if !strings.Contains(stderr, "1 promise(s) missed") || !strings.Contains(stderr, want) {
		t.Errorf("stderr lacks %q:\n%s", want, stderr)
	}
	if !strings.Contains(stdout, "PASS  node-kill / coalescing: no client error") {
		t.Errorf("the error promise, which judged the requests while down, did not pass:\n%s", stdout)
	}
}

// TestBadOutFailsAtOnce checks that an --out directory that cannot be
// created or written is refused before any run, with exit 2.
func TestBadOutFailsAtOnce(t *testing.T) {
	file := filepath.Join(t.TempDir(), "file")
	if err := os.WriteFile(file, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	bad := []string{filepath.Join(file, "out")}
	if fi, err := os.Stat("/proc/self"); err == nil && fi.IsDir() {
		bad = append(bad, "/proc/nope")
	}
	for _, dir := range bad {
		// A whole default suite would take minutes: an exit before it
		// shows that nothing ran.
		code, stdout, stderr := herd(t, "lab", "--out", dir)
		if code != exitUsage || stdout != "" || !strings.HasPrefix(stderr, "herd lab: --out: cannot create directory "+dir) {
			t.Errorf("--out %s: exit %d, stdout %q, stderr %q; want exit 2 and a clear error at once", dir, code, stdout, stderr)
		}
	}
}

// TestRedisUnreachableQuiet runs the command against a Redis that refuses
// connections: it prints its own clear error and nothing of go-redis's
// logging, which writes to the process's stderr (hence a process).
func TestRedisUnreachableQuiet(t *testing.T) {
	code, stdout, stderr := herdProcess(t, "lab", "--redis", "127.0.0.1:1", "--scenarios", "hot-key")
	if code != exitFail || stdout != "" {
		t.Fatalf("exit %d, stdout %q, stderr %q; want exit 1", code, stdout, stderr)
	}
	want := "herd lab: redis at 127.0.0.1:1 does not answer: dial tcp 127.0.0.1:1: connect: connection refused\n"
	if stderr != want {
		t.Errorf("stderr:\n%s\nwant only:\n%s", stderr, want)
	}
}

// TestPredictionMissNoted checks that a prediction outside its band is not
// passed over in silence: the table says "outside" and stderr says what
// missed and that without a preset it is not a check (exit 0). At 5
// requests per second per replica, few replicas see a request while a
// recompute runs, so coalescing loads about once per expiry where the
// formula says once per replica.
func TestPredictionMissNoted(t *testing.T) {
	code, stdout, stderr := herd(t, "lab", "--scenarios", "hot-key", "--layers", "coalescing",
		"--replicas", "4", "--rate", "5", "--latency", "fixed:20ms", "--ttl", "100ms",
		"--duration", "1s", "--client-timeout", "500ms")
	if code != exitOK {
		t.Fatalf("exit %d\nstdout:\n%s\nstderr:\n%s", code, stdout, stderr)
	}
	if !regexp.MustCompile(`\n  coalescing +4 +[0-9.]+ +[0-9.]+× +±20% +[0-9]+ +outside\n`).MatchString(stdout) {
		t.Errorf("the predictions do not show coalescing outside its band:\n%s", stdout)
	}
	for _, want := range []string{
		"herd lab: note: prediction missed: hot-key/coalescing measured ",
		"the formula 4 ±20% (not a check: only a --preset",
	} {
		if !strings.Contains(stderr, want) {
			t.Errorf("stderr lacks %q:\n%s", want, stderr)
		}
	}
}

// TestProgressLinesOnAPipe runs the command with stdout and stderr piped,
// as in CI or under tee: no progress bar, but a line on stderr per
// finished run, with its place in the suite, name, duration, backing-store
// calls and p99.
func TestProgressLinesOnAPipe(t *testing.T) {
	code, stdout, stderr := herdProcess(t, "lab", "--scenarios", "hot-key", "--layers", "none,lease",
		"--replicas", "2", "--rate", "50", "--latency", "fixed:20ms", "--ttl", "100ms",
		"--duration", "300ms", "--client-timeout", "500ms")
	if code != exitOK {
		t.Fatalf("exit %d\nstdout:\n%s\nstderr:\n%s", code, stdout, stderr)
	}
	if strings.Contains(stderr, "\r") {
		t.Errorf("stderr of a pipe holds a progress bar:\n%q", stderr)
	}
	for line := range strings.Lines(stderr) {
		// A note may give a band in percent; a bar's line is no note.
		if !strings.HasPrefix(line, "herd lab: note: ") && strings.Contains(line, "%") {
			t.Errorf("stderr of a pipe holds a progress bar's line %q:\n%q", line, stderr)
		}
	}
	var lines []string
	for line := range strings.Lines(stderr) {
		if strings.HasPrefix(line, "herd lab: ") && !strings.HasPrefix(line, "herd lab: note: ") {
			lines = append(lines, line)
		}
	}
	want := []*regexp.Regexp{
		regexp.MustCompile(`^herd lab: 1/2 hot-key/none done in [0-9.]+m?s: [0-9]+ backing-store calls, p99 [0-9.]+(ms|µs|ns)\n$`),
		regexp.MustCompile(`^herd lab: 2/2 hot-key/lease done in [0-9.]+m?s: [0-9]+ backing-store calls, p99 [0-9.]+(ms|µs|ns)\n$`),
	}
	if len(lines) != len(want) {
		t.Fatalf("stderr has %d progress lines, want one per run (%d):\n%s", len(lines), len(want), stderr)
	}
	for i, re := range want {
		if !re.MatchString(lines[i]) {
			t.Errorf("progress line %d %q does not match %s", i+1, lines[i], re)
		}
	}
}

// TestProgressLines feeds a progress on a plain writer the steps of a
// suite: one line per finished run, nothing as a run starts.
func TestProgressLines(t *testing.T) {
	var b bytes.Buffer
	p := newProgress(&b, false)
	p.step(lab.Step{Done: 0, Total: 2, Name: "flush/none"})
	if b.Len() != 0 {
		t.Errorf("a run's start wrote %q", b.String())
	}
	p.step(lab.Step{Done: 1, Total: 2, Name: "flush/none", Took: 1234 * time.Millisecond,
		Run: &lab.Run{OriginCalls: 45, P99: 821 * time.Microsecond}})
	p.step(lab.Step{Done: 1, Total: 2, Name: "flush/lease"})
	p.step(lab.Step{Done: 2, Total: 2, Name: "flush/lease", Took: 600 * time.Millisecond,
		Run: &lab.Run{OriginCalls: 20, P99: 71100 * time.Microsecond}})
	p.finish()
	want := "herd lab: 1/2 flush/none done in 1.23s: 45 backing-store calls, p99 821µs\n" +
		"herd lab: 2/2 flush/lease done in 600ms: 20 backing-store calls, p99 71.1ms\n"
	if b.String() != want {
		t.Errorf("progress wrote\n%q\nwant\n%q", b.String(), want)
	}
}

// frames splits what a progress bar wrote into the frames it drew (the
// text between carriage returns), dropping blank ones.
func frames(out string) []string {
	var fs []string
	for f := range strings.SplitSeq(out, "\r") {
		if strings.TrimSpace(f) != "" {
			fs = append(fs, f)
		}
	}
	return fs
}

// TestProgressBarEnds feeds a terminal's progress bar the steps of a
// suite, with a note in the middle: its last frame shows 100% and every
// run, and ends the line; the note starts on a cleared line. A suite that
// stops early leaves the bar where it stood, its line ended.
func TestProgressBarEnds(t *testing.T) {
	var b bytes.Buffer
	p := newProgress(&b, true)
	notes := noteWriter{p}
	names := []string{"hot-key/none", "hot-key/lease", "flush/none"}
	for i, n := range names {
		p.step(lab.Step{Done: i, Total: 3, Name: n})
		if i == 1 {
			fmt.Fprintln(notes, "lab: something to say")
		}
		p.step(lab.Step{Done: i + 1, Total: 3, Name: n, Run: &lab.Run{}})
	}
	p.finish()
	out := b.String()
	fs := frames(out)
	last := fs[len(fs)-1]
	if !strings.Contains(last, "100%") || !strings.Contains(last, "(3/3") || !strings.HasSuffix(last, "\n") {
		t.Errorf("the bar's last frame %q does not show 100%% of 3 runs, its line ended", last)
	}
	if strings.Count(out, "100%") != 1 {
		t.Errorf("the bar was drawn at 100%% %d times, want once:\n%q", strings.Count(out, "100%"), out)
	}
	if !regexp.MustCompile(`\r *\rherd lab: note: something to say\n`).MatchString(out) {
		t.Errorf("the note is not on a line of its own:\n%q", out)
	}

	b.Reset()
	p = newProgress(&b, true)
	p.step(lab.Step{Done: 0, Total: 3, Name: "hot-key/none"})
	p.step(lab.Step{Done: 1, Total: 3, Name: "hot-key/none", Run: &lab.Run{}})
	p.step(lab.Step{Done: 1, Total: 3, Name: "hot-key/lease"})
	p.finish()
	fs = frames(b.String())
	if last := fs[len(fs)-1]; !strings.Contains(last, "33%") || !strings.HasSuffix(last, "\n") {
		t.Errorf("a bar stopped after 1 of 3 runs ends on %q; want 33%% and its line ended", last)
	}
}
