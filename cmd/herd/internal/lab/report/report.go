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
	rows := [][]string{csvHeader}
	for _, r := range s.Runs {
		rows = append(rows, []string{
			r.Scenario, r.Layer, r.Variant,
			itoa(r.Requests), itoa(r.OriginCalls), itoa(r.Expiries),
			strconv.FormatFloat(r.CallsPerExpiry, 'f', -1, 64),
			strconv.Itoa(r.PeakOrigin),
			itoa(r.Errors), itoa(r.Shed), itoa(r.StaleServed), itoa(r.WaitedOnOrigin),
			strconv.FormatFloat(ms(r.P50), 'f', -1, 64),
			strconv.FormatFloat(ms(r.P99), 'f', -1, 64),
			strconv.FormatFloat(ms(r.P999), 'f', -1, 64),
		})
	}
	return writeCSV(w, rows)
}

// checksHeader names the columns of WriteChecksCSV, one row per Check.
var checksHeader = []string{
	"scenario", "layer", "promise", "measured", "observations", "observed", "ok",
}

// WriteChecksCSV writes a header row, then one row per Check with the
// columns of checksHeader: ok is false for a check that judged no
// observation, whatever it measured.
func WriteChecksCSV(w io.Writer, s *lab.Suite) error {
	if s == nil {
		return errNilSuite
	}
	rows := [][]string{checksHeader}
	for _, c := range s.Checks {
		rows = append(rows, []string{
			c.Scenario, c.Layer, c.Promise, c.Measured,
			itoa(c.Observations), c.Observed, strconv.FormatBool(c.OK),
		})
	}
	return writeCSV(w, rows)
}

// writeCSV writes rows to w as CSV.
func writeCSV(w io.Writer, rows [][]string) error {
	if err := csv.NewWriter(w).WriteAll(rows); err != nil {
		return fmt.Errorf("report: writing CSV: %w", err)
	}
	return nil
}

// Files are the files WriteDir writes, in order.
var Files = []string{"results.json", "results.csv", "checks.csv", "report.html"}

// PrepareDir creates dir (and its parents) if need be and makes sure a file
// can be written in it, so that a bad output directory fails before a suite
// runs rather than after.
func PrepareDir(dir string) error {
	if dir == "" {
		return errors.New("report: empty directory name")
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("report: cannot create directory %s: %w", dir, err)
	}
	f, err := os.CreateTemp(dir, ".herd-lab-*")
	if err != nil {
		return fmt.Errorf("report: cannot write in directory %s: %w", dir, err)
	}
	if err := errors.Join(f.Close(), os.Remove(f.Name())); err != nil {
		return fmt.Errorf("report: %w", err)
	}
	return nil
}

// WriteDir creates dir (and its parents) and writes the [Files] into it:
// results.json, results.csv, checks.csv (a header alone without checks)
// and report.html. Every file is rendered in memory first, so a rendering
// error leaves no partial file behind.
func WriteDir(dir string, s *lab.Suite) error {
	if s == nil {
		return errNilSuite
	}
	if dir == "" {
		return errors.New("report: empty directory name")
	}
	writers := map[string]func(io.Writer, *lab.Suite) error{
		"results.json": WriteJSON,
		"results.csv":  WriteCSV,
		"checks.csv":   WriteChecksCSV,
		"report.html":  WriteHTML,
	}
	bufs := make([]bytes.Buffer, len(Files))
	for i, name := range Files {
		if err := writers[name](&bufs[i], s); err != nil {
			return err
		}
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("report: %w", err)
	}
	for i, name := range Files {
		if err := os.WriteFile(filepath.Join(dir, name), bufs[i].Bytes(), 0o644); err != nil {
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

// column is one column of a table, with what it means.
type column struct {
	Short string // terminal header
	Long  string // HTML header
	Left  bool   // left-aligned (text) rather than right-aligned (numbers)
	Doc   string // what the column holds, for the legends
}

// summaryColumns are the columns of the per-scenario summary, in both the
// terminal table and the HTML page; summaryCells fills them.
var summaryColumns = []column{
	{"layer", "layer", true,
		"the rung of the ladder the run used; cold-start's variant (cold, warm or fleet) in parentheses"},
	{"calls", "backing-store calls", false,
		"calls to the backing store (the origin) the run counted: after warm-up in hot-key, flush and node-kill; from the start in cold-start"},
	{"/expiry", "calls per expiry", false,
		"backing-store calls per expiry event: per expiry of the key in hot-key; elsewhere the one event (the flush, the kill, the start), so it equals the calls; - when none was measured"},
	{"peak", "peak concurrency", false,
		"the most backing-store calls in flight at once, fleet-wide"},
	{"p50", "p50 latency", false,
		"median client latency, to 3 significant digits: in ms, below a millisecond in µs (below a microsecond, ns)"},
	{"p99", "p99 latency", false,
		"99th-percentile client latency, to 3 significant digits: in ms, below a millisecond in µs (below a microsecond, ns)"},
	{"p999", "p999 latency", false,
		"99.9th-percentile client latency, to 3 significant digits: in ms, below a millisecond in µs (below a microsecond, ns)"},
	{"errors", "errors", false,
		"requests that failed, shed ones included"},
	{"shed", "shed", false,
		"requests the limiter refused at once (herd.ErrOverloaded)"},
	{"stale", "stale served", false,
		"reads answered at once with a stale value while it was refreshed (Stats.StaleServed)"},
	{"waited", "waited on origin", false,
		"requests after warm-up whose answer waited for a backing-store call (or failed) and took at least a quarter of a mean recompute"},
}

// summaryCells formats one Run as the cells of summaryColumns: counts as
// plain integers, calls per expiry with one decimal, latencies as
// [FormatLatency] does.
func summaryCells(r lab.Run) []string {
	return []string{
		layerLabel(r),
		itoa(r.OriginCalls),
		perExpiry(r),
		strconv.Itoa(r.PeakOrigin),
		FormatLatency(r.P50),
		FormatLatency(r.P99),
		FormatLatency(r.P999),
		itoa(r.Errors),
		itoa(r.Shed),
		itoa(r.StaleServed),
		itoa(r.WaitedOnOrigin),
	}
}

// predictionColumns and checkColumns are the columns of the predictions
// and the checks, in both outputs.
var predictionColumns = []column{
	{"layer", "layer", true, summaryColumns[0].Doc},
	{"predicted", "predicted", false,
		"the formula's calls per expiry: replicas × rate per replica × mean recompute time unprotected (at least 1), one per replica with coalescing, one with the lease"},
	{"measured", "measured", false,
		"the mean calls per expiry the run measured"},
	{"ratio", "measured / predicted", false,
		"the measured mean over the prediction"},
	{"band", "band", false,
		"how far the measured mean may lie from the prediction: ±20%, wider when too few expiries were measured for that (the note below says why)"},
	{"expiries", "expiries", false,
		"how many expiry events the measured mean is of"},
	{"verdict", "verdict", true,
		"whether the measured mean lies within the band"},
}

var checkColumns = []column{
	{"result", "result", true,
		"PASS or FAIL; a check that judged no observation fails, whatever it measured"},
	{"scenario", "scenario", true,
		"the scenario of the run"},
	{"layer", "layer", true, summaryColumns[0].Doc},
	{"promise", "promise", true,
		"what the layer promises in the scenario; it holds on every rung above the layer too"},
	{"measured", "measured", true,
		"what the run measured against the promise"},
	{"observations", "observations", true,
		"how many things the check judged (expiries, keys, calls or requests): 0 means nothing was judged, and the check fails"},
}

// layerDoc is the description of a layer for the legends: the lab's, or a
// note that the layer is not one of the lab's.
func layerDoc(layer string) string {
	if d, ok := lab.LayerDocs[layer]; ok {
		return d
	}
	return "a layer this version of the lab does not know"
}

// ladder returns the layers of runs, in ladder order (layers the lab does
// not know last, in order of appearance).
func ladder(runs []lab.Run) []string {
	seen := map[string]bool{}
	for _, r := range runs {
		seen[r.Layer] = true
	}
	var out []string
	for _, l := range lab.Layers {
		if seen[l] {
			out = append(out, l)
			delete(seen, l)
		}
	}
	for _, r := range runs {
		if seen[r.Layer] {
			out = append(out, r.Layer)
			delete(seen, r.Layer)
		}
	}
	return out
}

// ladderIntro says how the layers relate, in both outputs.
const ladderIntro = "The layers form a ladder: each adds one protection to the layers before it, " +
	"so a run of lease has coalescing too. Ahead (refresh-ahead) takes early refresh over from xfetch."

// checksIntro says what a check is, in both outputs.
const checksIntro = "Each check judges a number of observations (expiries, keys, calls or requests); " +
	"a check that judged none fails, whatever it measured."

// figureGroup is the scenario-specific figures of the runs of one variant
// of a scenario: one row per figure some run reports, one column per run.
type figureGroup struct {
	Variant string
	Layers  []string // column heads: the runs' layers
	Rows    []figureRow
}

type figureRow struct {
	Figure lab.Figure
	Cells  []string // one per run; "-" where a run lacks the figure
}

// figureGroups pivots the Extra figures of runs (of one scenario): one
// group per variant in order of appearance, figures in the order of
// lab.Figures, then figures it does not list, sorted.
func figureGroups(runs []lab.Run) []figureGroup {
	var out []figureGroup
	index := map[string]int{}
	var members [][]lab.Run
	for _, r := range runs {
		if len(r.Extra) == 0 {
			continue
		}
		i, ok := index[r.Variant]
		if !ok {
			i = len(out)
			index[r.Variant] = i
			out = append(out, figureGroup{Variant: r.Variant})
			members = append(members, nil)
		}
		members[i] = append(members[i], r)
		out[i].Layers = append(out[i].Layers, r.Layer)
	}
	for i := range out {
		for _, key := range figureKeys(members[i]) {
			row := figureRow{Figure: lab.FigureOf(key)}
			for _, r := range members[i] {
				v, ok := r.Extra[key]
				if !ok {
					row.Cells = append(row.Cells, "-")
					continue
				}
				row.Cells = append(row.Cells, fmtSig(v))
			}
			out[i].Rows = append(out[i].Rows, row)
		}
	}
	return out
}

// figureKeys returns the Extra keys of runs: those lab.Figures lists in its
// order, then the others sorted.
func figureKeys(runs []lab.Run) []string {
	seen := map[string]float64{}
	for _, r := range runs {
		for k, v := range r.Extra {
			seen[k] = v
		}
	}
	var out []string
	for _, f := range lab.Figures {
		if _, ok := seen[f.Key]; ok {
			out = append(out, f.Key)
			delete(seen, f.Key)
		}
	}
	return append(out, sortedKeys(seen)...)
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

// verdict is the judgement of a prediction against its band.
func verdict(p lab.Prediction) string {
	switch {
	case p.Expiries == 0:
		return "nothing measured"
	case p.Within:
		return "within"
	}
	return "outside"
}

// band formats a prediction's band, e.g. "±20%".
func band(p lab.Prediction) string {
	return "±" + strconv.FormatFloat(math.Round(100*p.Band), 'f', -1, 64) + "%"
}

// observations formats what a check judged, e.g. "3 expiries".
func observations(c lab.Check) string {
	out := itoa(c.Observations)
	if c.Observed != "" {
		out += " " + c.Observed
	}
	return out
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

// FormatLatency formats a latency to 3 significant digits with its unit:
// milliseconds ("251ms", "1.26ms", "1900ms"), or below a millisecond
// microseconds ("821µs"), or below a microsecond nanoseconds ("950ns");
// "0" for none. The unit is chosen after rounding, so 999.7µs is "1ms".
func FormatLatency(d time.Duration) string {
	if d <= 0 {
		return "0"
	}
	ns := float64(d)
	exp := math.Pow(10, math.Floor(math.Log10(ns))-2)
	switch rounded := math.Round(ns/exp) * exp; {
	case rounded >= float64(time.Millisecond):
		return fmtSig(ms(d)) + "ms"
	case rounded >= float64(time.Microsecond):
		return fmtSig(ns/float64(time.Microsecond)) + "µs"
	}
	return fmtSig(ns) + "ns"
}

// fmtBucket formats a bucket width with its unit: "10 ms", "2 s".
func fmtBucket(d time.Duration) string {
	if d < time.Second {
		return strconv.FormatFloat(ms(d), 'f', -1, 64) + " ms"
	}
	return strconv.FormatFloat(d.Seconds(), 'f', -1, 64) + " s"
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
