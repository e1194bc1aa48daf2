// Package report renders a lab.Suite as JSON, CSV, a terminal table and a self-contained HTML page.
package report

import (
	"bytes"
	"encoding/csv"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/herdcache/herd/cmd/herd/internal/lab"
)

// errNilSuite is returned by every writer given a nil suite.
var errNilSuite = errors.New("report: nil suite")

// WriteJSON writes the whole suite as indented JSON.
func WriteJSON(w io.Writer, s *lab.Suite) error {
	if s == nil {
		return errNilSuite
	}
	b, err := json.MarshalIndent(s, "", "  ")
	if err != nil {
		return fmt.Errorf("report: encoding JSON: %w", err)
	}
	b = append(b, '\n')
	if _, err := w.Write(b); err != nil {
		return fmt.Errorf("report: writing JSON: %w", err)
	}
	return nil
}

// csvHeader names the columns of WriteCSV, one row per Run.
var csvHeader = []string{
	"scenario", "layer", "variant", "requests", "origin_calls", "expiries",
	"calls_per_expiry", "peak_origin_concurrency", "errors", "shed",
	"stale_served", "waited_on_origin", "p50_ms", "p99_ms", "p999_ms",
}

// WriteCSV writes a header row, then one row per Run with the columns of
// csvHeader; latencies are in milliseconds at full precision.
func WriteCSV(w io.Writer, s *lab.Suite) error {
	if s == nil {
		return errNilSuite
	}
	cw := csv.NewWriter(w)
	if err := cw.Write(csvHeader); err != nil {
		return fmt.Errorf("report: writing CSV: %w", err)
	}
	for _, r := range s.Runs {
		row := []string{
			r.Scenario, r.Layer, r.Variant,
			itoa(r.Requests), itoa(r.OriginCalls), itoa(r.Expiries),
			strconv.FormatFloat(r.CallsPerExpiry, 'f', -1, 64),
			strconv.Itoa(r.PeakOrigin),
			itoa(r.Errors), itoa(r.Shed), itoa(r.StaleServed), itoa(r.WaitedOnOrigin),
			strconv.FormatFloat(ms(r.P50), 'f', -1, 64),
			strconv.FormatFloat(ms(r.P99), 'f', -1, 64),
			strconv.FormatFloat(ms(r.P999), 'f', -1, 64),
		}
		if err := cw.Write(row); err != nil {
			return fmt.Errorf("report: writing CSV: %w", err)
		}
	}
	cw.Flush()
	if err := cw.Error(); err != nil {
		return fmt.Errorf("report: writing CSV: %w", err)
	}
	return nil
}

// WriteDir creates dir (and its parents) and writes results.json,
// results.csv and report.html into it. Every file is rendered in memory
// first, so a rendering error leaves no partial file behind.
func WriteDir(dir string, s *lab.Suite) error {
	if s == nil {
		return errNilSuite
	}
	if dir == "" {
		return errors.New("report: empty directory name")
	}
	files := []struct {
		name  string
		write func(io.Writer, *lab.Suite) error
	}{
		{"results.json", WriteJSON},
		{"results.csv", WriteCSV},
		{"report.html", WriteHTML},
	}
	bufs := make([]bytes.Buffer, len(files))
	for i, f := range files {
		if err := f.write(&bufs[i], s); err != nil {
			return err
		}
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("report: %w", err)
	}
	for i, f := range files {
		if err := os.WriteFile(filepath.Join(dir, f.name), bufs[i].Bytes(), 0o644); err != nil {
			return fmt.Errorf("report: %w", err)
		}
	}
	return nil
}

// field is one line of the configuration header.
type field struct {
	Name, Value string
}

// headerFields lists the configuration header shared by the table and the
// HTML page. Optional settings appear only when set.
func headerFields(s *lab.Suite) []field {
	c := s.Config
	var f []field
	add := func(name, value string) { f = append(f, field{name, value}) }
	if c.Preset != "" {
		add("preset", c.Preset)
	}
	add("load model", orDash(s.LoadModel))
	add("backend", orDash(s.Backend))
	add("origin", orDash(s.Origin))
	add("replicas", strconv.Itoa(c.Replicas))
	if c.ClosedLoop {
		add("clients", strconv.Itoa(c.Clients)+" per replica")
	} else {
		add("rate", strconv.FormatFloat(c.Rate, 'f', -1, 64)+" req/s per replica")
	}
	if c.Keys > 0 {
		add("keys", strconv.Itoa(c.Keys))
	}
	add("latency", orDash(c.Latency))
	if c.Capacity > 0 {
		add("capacity", strconv.Itoa(c.Capacity))
	}
	if c.FailureRate > 0 {
		add("failure rate", strconv.FormatFloat(c.FailureRate*100, 'f', -1, 64)+"%")
	}
	add("TTL", c.TTL.String())
	add("duration", c.Duration.String())
	if c.ClientTimeout > 0 {
		add("client timeout", c.ClientTimeout.String())
	}
	add("seed", strconv.FormatUint(c.Seed, 10))
	return f
}

// started describes when the suite ran and for how long; empty when unknown.
func started(s *lab.Suite) string {
	if s.Started.IsZero() {
		return ""
	}
	out := s.Started.Format("2006-01-02 15:04:05 MST")
	if !s.Finished.IsZero() && s.Finished.After(s.Started) {
		out += ", took " + s.Finished.Sub(s.Started).Round(time.Second).String()
	}
	return out
}

// column is one column of the per-scenario summary table.
type column struct {
	Short string // terminal header
	Long  string // HTML header
	Left  bool   // left-aligned (text) rather than right-aligned (numbers)
}

// summaryColumns are the columns of the per-scenario summary, in both the
// terminal table and the HTML page; summaryCells fills them.
var summaryColumns = []column{
	{"layer", "layer", true},
	{"calls", "origin calls", false},
	{"/expiry", "calls per expiry", false},
	{"peak", "peak origin concurrency", false},
	{"p50", "p50 ms", false},
	{"p99", "p99 ms", false},
	{"p999", "p999 ms", false},
	{"errors", "errors", false},
	{"shed", "shed", false},
	{"stale", "stale served", false},
	{"waited", "waited on origin", false},
}

// summaryCells formats one Run as the cells of summaryColumns: counts as
// plain integers, calls per expiry and latencies (ms) with one decimal.
func summaryCells(r lab.Run) []string {
	return []string{
		layerLabel(r),
		itoa(r.OriginCalls),
		perExpiry(r),
		strconv.Itoa(r.PeakOrigin),
		fmtMS(r.P50),
		fmtMS(r.P99),
		fmtMS(r.P999),
		itoa(r.Errors),
		itoa(r.Shed),
		itoa(r.StaleServed),
		itoa(r.WaitedOnOrigin),
	}
}

// scenarioRuns is the runs of one scenario, in suite order.
type scenarioRuns struct {
	Name string
	Runs []lab.Run
}

// byScenario groups runs by scenario in order of first appearance.
func byScenario(runs []lab.Run) []scenarioRuns {
	var out []scenarioRuns
	index := map[string]int{}
	for _, r := range runs {
		i, ok := index[r.Scenario]
		if !ok {
			i = len(out)
			index[r.Scenario] = i
			out = append(out, scenarioRuns{Name: r.Scenario})
		}
		out[i].Runs = append(out[i].Runs, r)
	}
	return out
}

// layerLabel is the layer name, with the variant in parentheses if any.
func layerLabel(r lab.Run) string {
	if r.Variant == "" {
		return r.Layer
	}
	return r.Layer + " (" + r.Variant + ")"
}

// perExpiry formats calls per expiry with one decimal, or "-" when the run
// had no expiry events or the figure is not a number.
func perExpiry(r lab.Run) string {
	if r.Expiries == 0 || !finite(r.CallsPerExpiry) {
		return "-"
	}
	return strconv.FormatFloat(r.CallsPerExpiry, 'f', 1, 64)
}

// ratio formats measured/predicted as e.g. "0.97×", or "-" when undefined.
func ratio(p lab.Prediction) string {
	q := p.Measured / p.Predicted
	if p.Predicted == 0 || !finite(q) {
		return "-"
	}
	return strconv.FormatFloat(q, 'f', 2, 64) + "×"
}

// verdict is the ±20% judgement of a prediction.
func verdict(p lab.Prediction) string {
	if p.Within {
		return "within ±20%"
	}
	return "outside ±20%"
}

// passFail is the word a check line starts with.
func passFail(ok bool) string {
	if ok {
		return "PASS"
	}
	return "FAIL"
}

// countChecks returns how many checks passed and failed.
func countChecks(cs []lab.Check) (passed, failed int) {
	for _, c := range cs {
		if c.OK {
			passed++
		} else {
			failed++
		}
	}
	return passed, failed
}

// fmtMS formats a duration in milliseconds with one decimal.
func fmtMS(d time.Duration) string {
	return strconv.FormatFloat(ms(d), 'f', 1, 64)
}

// fmtSig formats v with three significant digits, keeping every integer
// digit and dropping trailing zeros: 12345, 500, 12.3, 2.5, 0.0123.
func fmtSig(v float64) string {
	if !finite(v) {
		return "-"
	}
	if v == 0 {
		return "0"
	}
	dec := 2 - int(math.Floor(math.Log10(math.Abs(v))))
	dec = max(dec, 0)
	out := strconv.FormatFloat(v, 'f', dec, 64)
	if strings.Contains(out, ".") {
		out = strings.TrimRight(strings.TrimRight(out, "0"), ".")
	}
	return out
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

func itoa(n int64) string { return strconv.FormatInt(n, 10) }

func finite(f float64) bool { return !math.IsNaN(f) && !math.IsInf(f, 0) }

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
