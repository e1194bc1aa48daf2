package main

import (
	"bytes"
	"context"
	"flag"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/herdcache/herd/cmd/herd/internal/lab"
)

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
// explicit flags override it, and --redis drops node-kill from the default
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
	if o.Replicas != 5 || o.TTL != q.TTL || o.Duration != q.Duration || !o.ClosedLoop || !o.Check {
		t.Errorf("--quick --replicas 5: %+v", o)
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
// stdout, the report files in --out, exit 0 when every promise holds.
func TestRunWritesReport(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "out")
	code, stdout, stderr := herd(t, "lab", "--scenarios", "hot-key", "--layers", "none,lease",
		"--replicas", "2", "--rate", "50", "--latency", "fixed:20ms", "--ttl", "100ms",
		"--duration", "600ms", "--client-timeout", "500ms", "--check", "--out", dir)
	if code != exitOK {
		t.Fatalf("exit %d\nstdout:\n%s\nstderr:\n%s", code, stdout, stderr)
	}
	for _, want := range []string{"scenario hot-key", "open-loop (Poisson arrivals)", "PASS  hot-key / lease"} {
		if !strings.Contains(stdout, want) {
			t.Errorf("stdout lacks %q:\n%s", want, stdout)
		}
	}
	for _, f := range []string{"results.json", "results.csv", "report.html"} {
		if fi, err := os.Stat(filepath.Join(dir, f)); err != nil || fi.Size() == 0 {
			t.Errorf("%s: %v", f, err)
		}
	}
}

// TestCheckFailsExit1 checks that a promise that cannot be shown to hold
// exits 1 and names it: a run too short for the key to expire measures no
// expiry, so "≤ 1 load per replica per expiry" is unverified.
func TestCheckFailsExit1(t *testing.T) {
	code, stdout, stderr := herd(t, "lab", "--scenarios", "hot-key", "--layers", "coalescing",
		"--replicas", "1", "--rate", "20", "--latency", "fixed:5ms", "--ttl", "1m",
		"--duration", "200ms", "--check")
	if code != exitFail {
		t.Fatalf("exit %d, want 1\nstdout:\n%s\nstderr:\n%s", code, stdout, stderr)
	}
	if !strings.Contains(stderr, "1 promise(s) missed") || !strings.Contains(stderr, "hot-key / coalescing: ≤ 1 load per replica per expiry") {
		t.Errorf("stderr does not name the missed promise:\n%s", stderr)
	}
	if !strings.Contains(stdout, "FAIL  hot-key / coalescing") {
		t.Errorf("table lacks the FAIL line:\n%s", stdout)
	}
}
