package report

import (
	"bytes"
	"encoding/csv"
	"encoding/json"
	"errors"
	"html"
	"io"
	"math"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/herdcache/herd/cmd/herd/internal/lab"
)

// spikes returns n buckets of base calls with peak calls every fifth bucket.
func spikes(n int, base, peak int64) []int64 {
	t := make([]int64, n)
	for i := range t {
		t[i] = base
		if i%5 == 2 {
			t[i] = peak
		}
	}
	return t
}

// testSuite is two scenarios under three layers, with predictions and
// checks. Figures are distinct per run so a swapped column shows.
func testSuite() *lab.Suite {
	start := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	s := &lab.Suite{
		Started:  start,
		Finished: start.Add(95 * time.Second),
		Config: lab.Config{
			Preset:        "stampede",
			Scenarios:     []string{"hot-key", "flush"},
			Layers:        []string{"none", "coalescing", "lease"},
			Replicas:      20,
			Rate:          50,
			Keys:          1000,
			Latency:       "lognormal(mean=250ms,sd=50ms)",
			Capacity:      64,
			FailureRate:   0.01,
			TTL:           10 * time.Second,
			Duration:      30 * time.Second,
			ClientTimeout: 2 * time.Second,
			Seed:          42,
		},
		LoadModel: "open-loop (Poisson arrivals)",
		Backend:   "embedded",
		Origin:    "simulated (lognormal)",
	}
	type fig struct {
		layer                        string
		calls                        int64
		perExpiry                    float64
		p50, p99, p999               time.Duration
		errs, shed, stale, waited    int64
		bucket                       time.Duration
		timeline                     []int64
		extra                        map[string]float64
		requests, expiries, peakConc int64
	}
	add := func(scenario string, f fig) {
		s.Runs = append(s.Runs, lab.Run{
			Scenario: scenario, Layer: f.layer,
			Requests: f.requests, OriginCalls: f.calls, Expiries: f.expiries,
			CallsPerExpiry: f.perExpiry, PeakOrigin: int(f.peakConc),
			Errors: f.errs, Shed: f.shed, StaleServed: f.stale, WaitedOnOrigin: f.waited,
			P50: f.p50, P99: f.p99, P999: f.p999,
			Bucket: f.bucket, Timeline: f.timeline,
			Concurrency: []int{int(f.peakConc), 1},
			Extra:       f.extra,
		})
	}
	ms := func(f float64) time.Duration { return time.Duration(f * float64(time.Millisecond)) }
	add("hot-key", fig{layer: "none", requests: 30000, calls: 1500, expiries: 20, perExpiry: 75, peakConc: 480,
		p50: ms(1.26), p99: ms(251.34), p999: ms(612.01), errs: 3, shed: 0, stale: 0, waited: 1400,
		bucket: 100 * time.Millisecond, timeline: spikes(20, 0, 50)})
	add("hot-key", fig{layer: "coalescing", requests: 30001, calls: 400, expiries: 20, perExpiry: 20, peakConc: 20,
		p50: ms(1.11), p99: ms(248.76), p999: ms(301.5), errs: 2, shed: 4, stale: 0, waited: 380,
		bucket: 100 * time.Millisecond, timeline: spikes(20, 0, 2)})
	add("hot-key", fig{layer: "lease", requests: 30002, calls: 21, expiries: 20, perExpiry: 1.05, peakConc: 1,
		p50: ms(0.94), p99: ms(3.21), p999: ms(255.55), errs: 1, shed: 5, stale: 600, waited: 19,
		bucket: 100 * time.Millisecond, timeline: spikes(20, 0, 1),
		extra: map[string]float64{"calls_while_down": 1.5, "zz_unlisted": 2}})
	add("flush", fig{layer: "none", requests: 20000, calls: 9000, expiries: 1, perExpiry: 9000, peakConc: 900,
		p50: ms(250.2), p99: ms(700.44), p999: ms(1900.08), errs: 40, shed: 0, stale: 0, waited: 9000,
		bucket: 250 * time.Millisecond, timeline: spikes(40, 1, 100)})
	add("flush", fig{layer: "coalescing", requests: 20001, calls: 1000, expiries: 1, perExpiry: 1000, peakConc: 64,
		p50: ms(240.1), p99: ms(400.16), p999: ms(800.9), errs: 7, shed: 120, stale: 0, waited: 1000,
		bucket: 250 * time.Millisecond, timeline: spikes(40, 1, 10)})
	add("flush", fig{layer: "lease", requests: 20002, calls: 1000, expiries: 1, perExpiry: 999.5, peakConc: 50,
		p50: ms(2.04), p99: ms(260.3), p999: ms(420.7), errs: 0, shed: 6, stale: 15000, waited: 30,
		bucket: 250 * time.Millisecond, timeline: spikes(40, 1, 5)})
	// hot-key's expiries at its spikes; the flush a quarter into the run.
	for i := range 3 {
		for _, at := range []float64{200, 700, 1200, 1700} {
			s.Runs[i].Events = append(s.Runs[i].Events, lab.Event{Kind: lab.EventExpiry, At: ms(at)})
		}
	}
	for i := 3; i < 6; i++ {
		s.Runs[i].Events = []lab.Event{{Kind: lab.EventFlush, At: ms(2500)}}
	}
	s.Predictions = []lab.Prediction{
		{Preset: "stampede", Layer: "none", What: "calls per expiry", Predicted: 80, Measured: 75,
			Expiries: 3, Band: 0.35, Within: true, Checked: true, Note: "±35% rather than ±20%: few expiries."},
		{Preset: "stampede", Layer: "coalescing", What: "calls per expiry", Predicted: 10, Measured: 20,
			Expiries: 3, Band: 0.2, Within: false, Checked: true},
	}
	s.Checks = []lab.Check{
		{Scenario: "hot-key", Layer: "lease", Promise: "at most 2 origin calls per expiry", Measured: "1.05",
			Observations: 20, Observed: "expiries", OK: true},
		{Scenario: "flush", Layer: "coalescing", Promise: "no request shed", Measured: "120 shed",
			Observations: 20001, Observed: "requests", OK: false},
		{Scenario: "flush", Layer: "lease", Promise: "≤ 1 load per key", Measured: "max 0",
			Observations: 0, Observed: "keys loaded", OK: false},
	}
	return s
}

func render(t *testing.T, write func(io.Writer, *lab.Suite) error, s *lab.Suite) string {
	t.Helper()
	var b bytes.Buffer
	if err := write(&b, s); err != nil {
		t.Fatalf("write: %v", err)
	}
	return b.String()
}

func TestWriteJSONRoundTrip(t *testing.T) {
	want := testSuite()
	out := render(t, WriteJSON, want)
	if !strings.Contains(out, "\n  \"config\": {\n    \"preset\"") {
		t.Errorf("JSON is not indented by two spaces:\n%.300s", out)
	}
	var got lab.Suite
	if err := json.Unmarshal([]byte(out), &got); err != nil {
		t.Fatalf("unmarshal: %v", err)
	}
	if diff := cmp.Diff(want, &got); diff != "" {
		t.Errorf("round trip differs (-want +got):\n%s", diff)
	}
}

func TestWriteCSV(t *testing.T) {
	s := testSuite()
	s.Runs[4].Variant = "cold"
	rows, err := csv.NewReader(strings.NewReader(render(t, WriteCSV, s))).ReadAll()
	if err != nil {
		t.Fatalf("parse CSV: %v", err)
	}
	if len(rows) != 1+len(s.Runs) {
		t.Fatalf("got %d rows, want %d", len(rows), 1+len(s.Runs))
	}
	wantHeader := []string{"scenario", "layer", "variant", "requests", "origin_calls", "expiries",
		"calls_per_expiry", "peak_origin_concurrency", "errors", "shed", "stale_served",
		"waited_on_origin", "p50_ms", "p99_ms", "p999_ms"}
	if diff := cmp.Diff(wantHeader, rows[0]); diff != "" {
		t.Errorf("header (-want +got):\n%s", diff)
	}
	num := func(row []string, col int) float64 {
		t.Helper()
		f, err := strconv.ParseFloat(row[col], 64)
		if err != nil {
			t.Fatalf("row %v column %s: %v", row, wantHeader[col], err)
		}
		return f
	}
	msOf := func(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
	for i, r := range s.Runs {
		row := rows[i+1]
		if row[0] != r.Scenario || row[1] != r.Layer || row[2] != r.Variant {
			t.Errorf("row %d names = %q, want %q %q %q", i, row[:3], r.Scenario, r.Layer, r.Variant)
		}
		want := []float64{float64(r.Requests), float64(r.OriginCalls), float64(r.Expiries),
			r.CallsPerExpiry, float64(r.PeakOrigin), float64(r.Errors), float64(r.Shed),
			float64(r.StaleServed), float64(r.WaitedOnOrigin), msOf(r.P50), msOf(r.P99), msOf(r.P999)}
		for j, w := range want {
			if got := num(row, j+3); got != w {
				t.Errorf("run %d %s = %v, want %v", i, wantHeader[j+3], got, w)
			}
		}
	}
}

// tableRows returns the fields of the rows of the table of scenario name in
// a WriteTable output, header row first.
func tableRows(t *testing.T, out, name string) [][]string {
	t.Helper()
	_, after, ok := strings.Cut(out, "\nscenario "+name+"\n")
	if !ok {
		t.Fatalf("no table for scenario %q in:\n%s", name, out)
	}
	var rows [][]string
	for line := range strings.Lines(after) {
		if strings.TrimSpace(line) == "" {
			break
		}
		rows = append(rows, strings.Fields(line))
	}
	return rows
}

func TestWriteTable(t *testing.T) {
	s := testSuite()
	out := render(t, WriteTable, s)
	for _, want := range []string{
		"2026-03-01 12:00:00 UTC, took 1m35s",
		"preset:", "stampede",
		"load model:", "open-loop (Poisson arrivals)",
		"backend:", "embedded",
		"origin:", "simulated (lognormal)",
		"replicas:", "20",
		"rate:", "50 req/s per replica",
		"latency:", "lognormal(mean=250ms,sd=50ms)",
		"TTL:", "10s",
		"duration:", "30s",
		"seed:", "42",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("table lacks %q:\n%s", want, out)
		}
	}
	// Latencies to 3 significant digits with their unit: a sub-millisecond
	// p50 in µs.
	wantHot := [][]string{
		{"layer", "calls", "/expiry", "peak", "p50", "p99", "p999", "errors", "shed", "stale", "waited"},
		{"none", "1500", "75.0", "480", "1.26ms", "251ms", "612ms", "3", "0", "0", "1400"},
		{"coalescing", "400", "20.0", "20", "1.11ms", "249ms", "302ms", "2", "4", "0", "380"},
		{"lease", "21", "1.1", "1", "940µs", "3.21ms", "256ms", "1", "5", "600", "19"},
	}
	if diff := cmp.Diff(wantHot, tableRows(t, out, "hot-key")[:4]); diff != "" {
		t.Errorf("hot-key table (-want +got):\n%s\n%s", diff, out)
	}
	wantFlush := [][]string{
		{"layer", "calls", "/expiry", "peak", "p50", "p99", "p999", "errors", "shed", "stale", "waited"},
		{"none", "9000", "9000.0", "900", "250ms", "700ms", "1900ms", "40", "0", "0", "9000"},
		{"coalescing", "1000", "1000.0", "64", "240ms", "400ms", "801ms", "7", "120", "0", "1000"},
		{"lease", "1000", "999.5", "50", "2.04ms", "260ms", "421ms", "0", "6", "15000", "30"},
	}
	if diff := cmp.Diff(wantFlush, tableRows(t, out, "flush")); diff != "" {
		t.Errorf("flush table (-want +got):\n%s\n%s", diff, out)
	}
	// The figures by their labels, one column per layer; a figure the lab
	// does not list by its key, after those it lists.
	figures := figureLines(t, out, "hot-key")
	wantFigures := []string{
		"lease",
		"calls while Redis is down 1.5",
		"zz_unlisted 2",
	}
	if diff := cmp.Diff(wantFigures, figures); diff != "" {
		t.Errorf("hot-key figures (-want +got):\n%s\n%s", diff, out)
	}

	for _, want := range []string{
		"predictions: the formula's calls per expiry beside the measured mean\n",
		"  none: ±35% rather than ±20%: few expiries.\n",
		"checks: 1 passed, 2 failed\n",
		"  PASS  hot-key / lease: at most 2 origin calls per expiry (measured 1.05; judged 20 expiries)\n",
		"  FAIL  flush / coalescing: no request shed (measured 120 shed; judged 20001 requests)\n",
		"  FAIL  flush / lease: ≤ 1 load per key (measured max 0; judged 0 keys loaded: nothing to judge)\n",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("table lacks %q:\n%s", want, out)
		}
	}
	preds := tableRows(t, strings.Replace(out, "predictions: the formula's calls per expiry beside the measured mean", "scenario P", 1), "P")
	wantPreds := [][]string{
		{"layer", "predicted", "measured", "ratio", "band", "expiries", "verdict"},
		{"none", "80", "75", "0.94×", "±35%", "3", "within"},
		{"coalescing", "10", "20", "2.00×", "±20%", "3", "outside"},
	}
	if diff := cmp.Diff(wantPreds, preds[:3]); diff != "" {
		t.Errorf("predictions (-want +got):\n%s\n%s", diff, out)
	}
}

// figureLines returns the lines of the figures table of scenario name in a
// WriteTable output, its words joined by single spaces.
func figureLines(t *testing.T, out, name string) []string {
	t.Helper()
	_, after, ok := strings.Cut(out, "\nscenario "+name+"\n")
	if !ok {
		t.Fatalf("no table for scenario %q in:\n%s", name, out)
	}
	_, after, ok = strings.Cut(after, "\n\n")
	if !ok {
		t.Fatalf("no figures for scenario %q in:\n%s", name, out)
	}
	var lines []string
	for line := range strings.Lines(after) {
		if strings.TrimSpace(line) == "" {
			break
		}
		lines = append(lines, strings.Join(strings.Fields(line), " "))
	}
	return lines
}

// TestWriteTableLegend checks that the terminal output explains the ladder
// of the suite's layers, every column of its tables and what a check judges.
func TestWriteTableLegend(t *testing.T) {
	s := testSuite()
	out := render(t, WriteTable, s)
	legend, _, ok := strings.Cut(out, "\nscenario ")
	if !ok {
		t.Fatalf("no scenario table:\n%s", out)
	}
	for _, want := range []string{ladderIntro, checksIntro} {
		if !strings.Contains(legend, want) {
			t.Errorf("legend lacks %q:\n%s", want, legend)
		}
	}
	for _, l := range []string{"none", "coalescing", "lease"} {
		if want := "\n  " + l + "  "; !strings.Contains(legend, want) || !strings.Contains(legend, lab.LayerDocs[l]) {
			t.Errorf("legend does not explain layer %q:\n%s", l, legend)
		}
	}
	if strings.Index(legend, "\n  none ") > strings.Index(legend, "\n  coalescing ") {
		t.Error("the legend does not list the layers in ladder order")
	}
	for _, c := range summaryColumns {
		if !regexp.MustCompile(`\n  ` + regexp.QuoteMeta(c.Short) + ` +` + regexp.QuoteMeta(c.Doc) + `\n`).MatchString(legend) {
			t.Errorf("legend does not explain column %q:\n%s", c.Short, legend)
		}
	}
	s.Checks = nil
	if out := render(t, WriteTable, s); strings.Contains(out, checksIntro) {
		t.Error("the legend explains checks in a suite without them")
	}
}

func TestWriteTableClosedLoopAndVariant(t *testing.T) {
	s := testSuite()
	s.Config.ClosedLoop = true
	s.Config.Clients = 8
	s.Runs[0].Variant = "cold"
	s.Runs[0].Expiries = 0
	out := render(t, WriteTable, s)
	if !strings.Contains(out, "clients:") || !strings.Contains(out, "8 per replica") {
		t.Errorf("closed-loop header lacks the client count:\n%s", out)
	}
	if strings.Contains(out, "req/s per replica") {
		t.Errorf("closed-loop header shows a rate:\n%s", out)
	}
	row := tableRows(t, out, "hot-key")[1]
	if want := []string{"none", "(cold)", "1500", "-"}; !slices.Equal(row[:4], want) {
		t.Errorf("variant row starts %q, want %q", row[:4], want)
	}
}

// chartRE matches the attributes of every element whose class is exactly "chart".
var chartRE = regexp.MustCompile(`<figure class="chart"([^>]*)>`)

func attr(attrs, name string) string {
	m := regexp.MustCompile(` ` + name + `="([^"]*)"`).FindStringSubmatch(attrs)
	if m == nil {
		return "<missing>"
	}
	return html.UnescapeString(m[1])
}

func TestWriteHTMLCharts(t *testing.T) {
	s := testSuite()
	s.Runs[5].Layer = "coalescing+lease"
	s.Runs[5].Variant = "warm"
	out := render(t, WriteHTML, s)
	if n := strings.Count(out, `class="chart"`); n != len(s.Runs) {
		t.Errorf(`got %d class="chart" elements, want one per run (%d)`, n, len(s.Runs))
	}
	var got, want []string
	ymax := map[string][]string{}
	bucket := map[string][]string{}
	for _, m := range chartRE.FindAllStringSubmatch(out, -1) {
		sc := attr(m[1], "data-scenario")
		got = append(got, sc+"/"+attr(m[1], "data-layer")+"/"+attr(m[1], "data-variant"))
		ymax[sc] = append(ymax[sc], attr(m[1], "data-ymax"))
		bucket[sc] = append(bucket[sc], attr(m[1], "data-bucket-ms"))
	}
	for _, r := range s.Runs {
		variant := r.Variant
		if variant == "" {
			variant = "<missing>"
		}
		want = append(want, r.Scenario+"/"+r.Layer+"/"+variant)
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("charts (-want +got):\n%s", diff)
	}
	// Calls per bucket, not per second: hot-key peaks at 50 calls in a
	// 100ms bucket, flush at 100 in a 250ms bucket; one round axis top for
	// every layer of a scenario.
	wantYMax := map[string][]string{"hot-key": {"50", "50", "50"}, "flush": {"100", "100", "100"}}
	if diff := cmp.Diff(wantYMax, ymax); diff != "" {
		t.Errorf("data-ymax per scenario (-want +got):\n%s", diff)
	}
	wantBucket := map[string][]string{"hot-key": {"100", "100", "100"}, "flush": {"250", "250", "250"}}
	if diff := cmp.Diff(wantBucket, bucket); diff != "" {
		t.Errorf("data-bucket-ms per scenario (-want +got):\n%s", diff)
	}
	for _, want := range []string{
		"max 50 calls in a 100 ms bucket", "max 2 calls in a 100 ms bucket", "max 1 call in a 100 ms bucket",
		"max 100 calls in a 250 ms bucket", "max 10 calls in a 250 ms bucket", "max 5 calls in a 250 ms bucket",
		">calls per 100 ms bucket</text>", ">calls per 250 ms bucket</text>",
		">time since the run began (s)</text>", "share one y-axis scale (0 to 50 calls per bucket)",
		"started in each 100 ms bucket of the run (a count per bucket, not a rate per second)",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("HTML lacks %q", want)
		}
	}
	if strings.Contains(out, "calls/s") {
		t.Error("HTML still speaks of calls/s")
	}

	lat := regexp.MustCompile(`<figure class="latency-chart" data-scenario="([^"]*)">`).FindAllStringSubmatch(out, -1)
	var latScen []string
	for _, m := range lat {
		latScen = append(latScen, m[1])
	}
	if diff := cmp.Diff([]string{"hot-key", "flush"}, latScen); diff != "" {
		t.Errorf("latency charts (-want +got):\n%s", diff)
	}
	for _, want := range []string{
		"<title>none p99: 251ms</title>", "<title>coalescing&#43;lease (warm) p999: 421ms</title>",
		"<title>lease p50: 940µs</title>",
		`<rect class="p50"`, `<rect class="p99"`, `<rect class="p999"`,
		">p50</text>", ">p99</text>", ">p999</text>", // legend
	} {
		if !strings.Contains(out, want) {
			t.Errorf("HTML lacks %q", want)
		}
	}
	if n := strings.Count(out, `<rect class="p99"`); n != len(s.Runs)+len(lat) {
		t.Errorf("got %d p99 rects, want one per run plus one legend swatch per chart (%d)", n, len(s.Runs)+len(lat))
	}
}

func TestWriteHTMLTables(t *testing.T) {
	out := render(t, WriteHTML, testSuite())
	for _, want := range []string{
		"<title>herd lab report: stampede</title>",
		"<dt>load model</dt><dd>open-loop (Poisson arrivals)</dd>",
		"<dt>seed</dt><dd>42</dd>",
		`>calls per expiry</th>`,
		`<tr><td class="l">none</td><td>1500</td><td>75.0</td><td>480</td><td>1.26ms</td><td>251ms</td><td>612ms</td><td>3</td><td>0</td><td>0</td><td>1400</td></tr>`,
		`<tr><td class="l">none</td><td>80</td><td>75</td><td>0.94×</td><td>±35%</td><td>3</td><td class="l pass">within</td></tr>`,
		`<td class="l fail">outside</td>`,
		`<strong>none:</strong> ±35% rather than ±20%: few expiries.`,
		`<td class="l pass">PASS</td><td class="l">hot-key</td><td class="l">lease</td>`,
		`<td class="l fail">FAIL</td><td class="l">flush</td>`,
		`<td class="l obs" data-observations="20">20 expiries</td>`,
		`<td class="l obs fail" data-observations="0">0 keys loaded</td>`,
		`>calls while Redis is down</th><td>1.5</td></tr>`,
		`>zz_unlisted</th><td>2</td></tr>`,
		`(calls_while_down in results.json)`,
	} {
		if !strings.Contains(out, want) {
			t.Errorf("HTML lacks %q", want)
		}
	}
	// Without a preset, the page says predictions are not checks.
	s := testSuite()
	for i := range s.Predictions {
		s.Predictions[i].Checked = false
	}
	if out := render(t, WriteHTML, s); !strings.Contains(out, "Without a --preset these are not checks") {
		t.Error("HTML does not say that predictions without a preset are not checks")
	}
}

func TestWriteHTMLSelfContained(t *testing.T) {
	out := render(t, WriteHTML, testSuite())
	for _, bad := range []string{
		`src="http`, `href="http`, "@import", "url(http", "http://", "https://",
		"<script", "<link", "<img", "<iframe", "src=",
	} {
		if strings.Contains(out, bad) {
			t.Errorf("HTML contains %q", bad)
		}
	}
	if !strings.HasPrefix(out, "<!doctype html>") || !strings.Contains(out, "<style>") {
		t.Errorf("HTML is not a page with inline CSS:\n%.200s", out)
	}
}

func TestWriteHTMLBalanced(t *testing.T) {
	s := testSuite()
	out := render(t, WriteHTML, s)
	want := len(s.Runs) + 2 // one per run, one latency chart per scenario
	for _, tag := range []string{"svg", "figure", "table", "tr", "text", "html", "body", "dl", "dt", "dd"} {
		open := strings.Count(out, "<"+tag+">") + strings.Count(out, "<"+tag+" ")
		if closed := strings.Count(out, "</"+tag+">"); open != closed {
			t.Errorf("<%s>: %d opened, %d closed", tag, open, closed)
		}
	}
	if n := strings.Count(out, "<svg "); n != want {
		t.Errorf("got %d <svg> elements, want %d", n, want)
	}
}

func TestWriteHTMLEscapes(t *testing.T) {
	s := testSuite()
	const evil = `<script>alert(1)</script>`
	for i := range s.Runs[:3] {
		s.Runs[i].Scenario = evil
	}
	s.Runs[1].Layer = `"><b onmouseover=x>`
	s.Checks[0].Promise = "<b>bold</b>"
	s.Origin = "</style><script>"
	out := render(t, WriteHTML, s)
	for _, bad := range []string{"<script", "<b ", "<b>"} {
		if strings.Contains(out, bad) {
			t.Errorf("HTML contains unescaped %q", bad)
		}
	}
	if n := strings.Count(out, `data-scenario="&lt;script&gt;alert(1)&lt;/script&gt;"`); n != 5 {
		t.Errorf("escaped scenario appears in %d data-scenario attributes, want 5 (summary table, 3 charts, 1 latency chart)", n)
	}
	if !strings.Contains(out, "<dt>&lt;script&gt;alert(1)&lt;/script&gt;</dt>") {
		t.Error("escaped scenario missing from the scenario legend")
	}
	if !strings.Contains(out, "<h2>Scenario &lt;script&gt;alert(1)&lt;/script&gt;<a ") {
		t.Error("escaped scenario heading missing")
	}
	if !strings.Contains(out, `<section class="scenario" id="scenario-script-alert-1-script">`) ||
		!strings.Contains(out, `<a href="#scenario-script-alert-1-script">`) {
		t.Error("the scenario's section and its link lack a plain anchor")
	}
	if n := strings.Count(out, `class="chart"`); n != len(s.Runs) {
		t.Errorf(`got %d class="chart", want %d`, n, len(s.Runs))
	}
}

func TestWriteHTMLMissingTimeline(t *testing.T) {
	s := testSuite()
	s.Runs[1].Timeline = nil
	s.Runs[2].Bucket = 0
	out := render(t, WriteHTML, s)
	if n := strings.Count(out, "no timeline recorded"); n != 2 {
		t.Errorf("got %d empty-timeline notes, want 2", n)
	}
	if n := strings.Count(out, `class="chart"`); n != len(s.Runs) {
		t.Errorf(`got %d class="chart", want %d`, n, len(s.Runs))
	}
}

func TestEmptySuite(t *testing.T) {
	s := &lab.Suite{}
	for name, write := range map[string]func(io.Writer, *lab.Suite) error{
		"json": WriteJSON, "csv": WriteCSV, "checks": WriteChecksCSV, "table": WriteTable, "html": WriteHTML,
	} {
		var b bytes.Buffer
		if err := write(&b, s); err != nil {
			t.Errorf("%s: %v", name, err)
		}
		if b.Len() == 0 {
			t.Errorf("%s: wrote nothing", name)
		}
	}
	if out := render(t, WriteTable, s); !strings.Contains(out, "\nno runs\n") {
		t.Errorf("empty table does not say so:\n%s", out)
	}
	out := render(t, WriteHTML, s)
	if strings.Contains(out, "<svg") || !strings.Contains(out, "No runs.") {
		t.Errorf("empty HTML has charts or lacks the note:\n%s", out)
	}
	if err := WriteDir(filepath.Join(t.TempDir(), "empty"), s); err != nil {
		t.Errorf("WriteDir: %v", err)
	}
}

func TestNilSuite(t *testing.T) {
	for name, write := range map[string]func(io.Writer, *lab.Suite) error{
		"json": WriteJSON, "csv": WriteCSV, "checks": WriteChecksCSV, "table": WriteTable, "html": WriteHTML,
		"dir": func(io.Writer, *lab.Suite) error { return WriteDir(t.TempDir(), nil) },
	} {
		err := write(io.Discard, nil)
		if err == nil || !strings.HasPrefix(err.Error(), "report: ") {
			t.Errorf("%s: err = %v, want a report: error", name, err)
		}
	}
}

type failWriter struct{}

func (failWriter) Write([]byte) (int, error) { return 0, errors.New("disk full") }

func TestWriteError(t *testing.T) {
	for name, write := range map[string]func(io.Writer, *lab.Suite) error{
		"json": WriteJSON, "csv": WriteCSV, "checks": WriteChecksCSV, "table": WriteTable, "html": WriteHTML,
	} {
		err := write(failWriter{}, testSuite())
		if err == nil || !strings.HasPrefix(err.Error(), "report: ") || !strings.Contains(err.Error(), "disk full") {
			t.Errorf("%s: err = %v, want a report: error wrapping the write error", name, err)
		}
	}
}

func TestNotANumber(t *testing.T) {
	s := testSuite()
	s.Runs[0].CallsPerExpiry = math.NaN()
	s.Predictions[0].Measured = math.Inf(1)
	if row := tableRows(t, render(t, WriteTable, s), "hot-key")[1]; row[2] != "-" {
		t.Errorf("NaN calls per expiry shown as %q, want -", row[2])
	}
	render(t, WriteHTML, s)
	render(t, WriteCSV, s)
	err := WriteJSON(io.Discard, s)
	if err == nil || !strings.HasPrefix(err.Error(), "report: ") {
		t.Errorf("WriteJSON of NaN: err = %v, want a report: error", err)
	}
	dir := filepath.Join(t.TempDir(), "out")
	if err := WriteDir(dir, s); err == nil {
		t.Error("WriteDir of NaN succeeded")
	}
	if _, err := os.Stat(dir); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("WriteDir left %s behind after a rendering error (stat: %v)", dir, err)
	}
}

func TestWriteDir(t *testing.T) {
	s := testSuite()
	dir := filepath.Join(t.TempDir(), "a", "b")
	if err := WriteDir(dir, s); err != nil {
		t.Fatalf("WriteDir: %v", err)
	}
	for name, write := range map[string]func(io.Writer, *lab.Suite) error{
		"results.json": WriteJSON, "results.csv": WriteCSV, "checks.csv": WriteChecksCSV, "report.html": WriteHTML,
	} {
		got, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil {
			t.Errorf("%s: %v", name, err)
			continue
		}
		if want := render(t, write, s); string(got) != want {
			t.Errorf("%s differs from its writer's output", name)
		}
	}

	file := filepath.Join(t.TempDir(), "file")
	if err := os.WriteFile(file, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := WriteDir(file, s); err == nil || !strings.HasPrefix(err.Error(), "report: ") {
		t.Errorf("WriteDir onto a file: err = %v, want a report: error", err)
	}
}

func TestNiceScale(t *testing.T) {
	for _, c := range []struct{ peak, top, step float64 }{
		{500, 500, 100}, {6220, 7000, 1000}, {401, 500, 100}, {7, 7, 1},
		{0.3, 0.3, 0.1}, {1, 1, 0.25}, {12345, 12500, 2500}, {0, 1, 1}, {math.NaN(), 1, 1},
	} {
		top, step := niceScale(c.peak)
		if math.Abs(top-c.top) > 1e-9*c.top || math.Abs(step-c.step) > 1e-9*c.step {
			t.Errorf("niceScale(%v) = %v, %v; want %v, %v", c.peak, top, step, c.top, c.step)
		}
		if top < c.peak {
			t.Errorf("niceScale(%v) top %v is below the peak", c.peak, top)
		}
	}
}

func TestNiceCeil(t *testing.T) {
	for _, c := range []struct{ in, want float64 }{
		{125, 200}, {100, 100}, {0.3, 0.5}, {7, 10}, {1.5, 2}, {0, 1},
	} {
		if got := niceCeil(c.in); math.Abs(got-c.want) > 1e-12 {
			t.Errorf("niceCeil(%v) = %v, want %v", c.in, got, c.want)
		}
	}
}

// TestJSONUnits checks that results.json gives every duration in
// milliseconds under a name ending in _ms, as results.csv does, and that
// every check carries the number of observations it judged, zero included.
func TestJSONUnits(t *testing.T) {
	s := testSuite()
	var doc struct {
		Config map[string]any   `json:"config"`
		Runs   []map[string]any `json:"runs"`
		Checks []map[string]any `json:"checks"`
	}
	if err := json.Unmarshal([]byte(render(t, WriteJSON, s)), &doc); err != nil {
		t.Fatal(err)
	}
	for key, want := range map[string]float64{"ttl_ms": 10000, "duration_ms": 30000, "client_timeout_ms": 2000} {
		if got := doc.Config[key]; got != want {
			t.Errorf("config %s = %v, want %v", key, got, want)
		}
	}
	for _, key := range []string{"ttl", "duration", "client_timeout"} {
		if _, ok := doc.Config[key]; ok {
			t.Errorf("config has %q without a unit", key)
		}
	}
	run := doc.Runs[0]
	for key, want := range map[string]float64{"p50_ms": 1.26, "p99_ms": 251.34, "p999_ms": 612.01, "bucket_ms": 100} {
		if got, ok := run[key].(float64); !ok || math.Abs(got-want) > 1e-9 {
			t.Errorf("run %s = %v, want %v", key, run[key], want)
		}
	}
	for _, key := range []string{"p50", "p99", "p999", "bucket"} {
		if _, ok := run[key]; ok {
			t.Errorf("run has %q without a unit", key)
		}
	}
	if len(doc.Checks) != len(s.Checks) {
		t.Fatalf("%d checks in JSON, want %d", len(doc.Checks), len(s.Checks))
	}
	for i, c := range doc.Checks {
		n, ok := c["observations"].(float64)
		if !ok || int64(n) != s.Checks[i].Observations || c["observed"] != s.Checks[i].Observed {
			t.Errorf("check %d: observations %v %v, want %d %q", i, c["observations"], c["observed"],
				s.Checks[i].Observations, s.Checks[i].Observed)
		}
	}
}

func TestWriteChecksCSV(t *testing.T) {
	s := testSuite()
	rows, err := csv.NewReader(strings.NewReader(render(t, WriteChecksCSV, s))).ReadAll()
	if err != nil {
		t.Fatal(err)
	}
	want := [][]string{
		{"scenario", "layer", "promise", "measured", "observations", "observed", "ok"},
		{"hot-key", "lease", "at most 2 origin calls per expiry", "1.05", "20", "expiries", "true"},
		{"flush", "coalescing", "no request shed", "120 shed", "20001", "requests", "false"},
		{"flush", "lease", "≤ 1 load per key", "max 0", "0", "keys loaded", "false"},
	}
	if diff := cmp.Diff(want, rows); diff != "" {
		t.Errorf("checks.csv (-want +got):\n%s", diff)
	}
}

// TestPrepareDir checks that an output directory is created and proved
// writable before a suite runs, and that one that cannot be is refused.
func TestPrepareDir(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "a", "b")
	if err := PrepareDir(dir); err != nil {
		t.Fatalf("PrepareDir(%s): %v", dir, err)
	}
	entries, err := os.ReadDir(dir)
	if err != nil || len(entries) != 0 {
		t.Errorf("PrepareDir left %v behind (%v)", entries, err)
	}
	file := filepath.Join(t.TempDir(), "file")
	if err := os.WriteFile(file, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	for _, bad := range []string{"", file, filepath.Join(file, "sub")} {
		if err := PrepareDir(bad); err == nil || !strings.HasPrefix(err.Error(), "report: ") {
			t.Errorf("PrepareDir(%q) = %v, want a report: error", bad, err)
		}
	}
}

func TestCountScale(t *testing.T) {
	for _, c := range []struct{ peak, top, step float64 }{
		{0, 3, 1}, {1, 3, 1}, {2, 3, 1}, {5, 5, 1}, {12, 12, 2}, {22, 25, 5}, {50, 50, 10}, {101, 120, 20},
	} {
		top, step := countScale(c.peak)
		if top != c.top || step != c.step {
			t.Errorf("countScale(%v) = %v, %v; want %v, %v", c.peak, top, step, c.top, c.step)
		}
		if step != math.Trunc(step) || top < c.peak {
			t.Errorf("countScale(%v) = %v, %v: not whole calls, or below the peak", c.peak, top, step)
		}
	}
}

func TestFormatLatency(t *testing.T) {
	for _, c := range []struct {
		in   time.Duration
		want string
	}{
		{0, "0"},
		{-time.Millisecond, "0"},
		{1, "1ns"},
		{950 * time.Nanosecond, "950ns"},
		{time.Microsecond, "1µs"},
		{1234 * time.Nanosecond, "1.23µs"},
		{821 * time.Microsecond, "821µs"},
		{999_400 * time.Nanosecond, "999µs"},
		{999_700 * time.Nanosecond, "1ms"}, // rounds to 1000µs: the next unit
		{time.Millisecond, "1ms"},
		{1_260_000 * time.Nanosecond, "1.26ms"},
		{251_340 * time.Microsecond, "251ms"},
		{1900 * time.Millisecond, "1900ms"},
		{12_345 * time.Millisecond, "12345ms"}, // every integer digit kept, as elsewhere
	} {
		if got := FormatLatency(c.in); got != c.want {
			t.Errorf("FormatLatency(%v) = %q, want %q", c.in, got, c.want)
		}
	}
}
