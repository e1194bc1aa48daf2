package report

import (
	"bytes"
	_ "embed"
	"fmt"
	"html/template"
	"io"
	"math"
	"strconv"
	"strings"
	"time"

	"github.com/herdcache/herd/cmd/herd/internal/lab"
)

//go:embed report.html.tmpl
var pageSource string

// pageTemplate renders report.html; every value reaches the page through
// html/template, so names and labels are escaped.
var pageTemplate = template.Must(template.New("report.html").Parse(pageSource))

// WriteHTML writes report.html: a self-contained page (inline CSS and SVG,
// no script, no external resource) with the configuration header, the
// summary tables of WriteTable, predictions and checks when present, and
// per scenario one origin-calls-per-second chart per Run (shared y scale)
// and one chart of client latency percentiles by layer.
func WriteHTML(w io.Writer, s *lab.Suite) error {
	if s == nil {
		return errNilSuite
	}
	var buf bytes.Buffer
	if err := pageTemplate.Execute(&buf, newPage(s)); err != nil {
		return fmt.Errorf("report: rendering HTML: %w", err)
	}
	if _, err := w.Write(buf.Bytes()); err != nil {
		return fmt.Errorf("report: writing HTML: %w", err)
	}
	return nil
}

// page is what the template renders.
type page struct {
	Title          string
	When           string
	RunCount       int
	Header         []field
	Columns        []column
	Scenarios      []scenarioView
	Predictions    []predictionRow
	Checks         []checkRow
	Passed, Failed int
}

type scenarioView struct {
	Name      string
	Rows      [][]string  // summaryCells of each run
	Extras    *extraTable // nil when no run of the scenario has extra figures
	YMax      string      // shared top of the y axis of Timelines, in calls/s
	Plotted   bool        // some run of the scenario has a timeline to plot
	Timelines []timelineChart
	Latency   latencyChart
}

// extraTable pivots the scenario-specific figures: one row per run that
// has any, one column per figure name; "-" where a run lacks a figure.
type extraTable struct {
	Names []string
	Rows  [][]string // layer label, then one value per name
}

func newExtraTable(runs []lab.Run) *extraTable {
	seen := map[string]float64{}
	for _, r := range runs {
		for k, v := range r.Extra {
			seen[k] = v
		}
	}
	if len(seen) == 0 {
		return nil
	}
	t := &extraTable{Names: sortedKeys(seen)}
	for _, r := range runs {
		if len(r.Extra) == 0 {
			continue
		}
		row := []string{layerLabel(r)}
		for _, k := range t.Names {
			v, ok := r.Extra[k]
			if !ok {
				row = append(row, "-")
				continue
			}
			row = append(row, fmtSig(v))
		}
		t.Rows = append(t.Rows, row)
	}
	return t
}

type predictionRow struct {
	Preset, Layer, What        string
	Predicted, Measured, Ratio string
	Verdict                    string
	Within                     bool
}

type checkRow struct {
	Result, Scenario, Layer, Promise, Measured string
	OK                                         bool
}

func newPage(s *lab.Suite) page {
	p := page{
		Title:    "herd lab report",
		When:     started(s),
		RunCount: len(s.Runs),
		Header:   headerFields(s),
		Columns:  summaryColumns,
	}
	if s.Config.Preset != "" {
		p.Title += ": " + s.Config.Preset
	}
	for _, g := range byScenario(s.Runs) {
		v := scenarioView{Name: g.Name}
		for _, r := range g.Runs {
			v.Rows = append(v.Rows, summaryCells(r))
		}
		v.Extras = newExtraTable(g.Runs)
		yMax, step := sharedScale(g.Runs)
		v.YMax = fmtTick(yMax)
		for _, r := range g.Runs {
			c := newTimelineChart(r, yMax, step)
			v.Plotted = v.Plotted || !c.Empty
			v.Timelines = append(v.Timelines, c)
		}
		v.Latency = newLatencyChart(g.Name, g.Runs)
		p.Scenarios = append(p.Scenarios, v)
	}
	for _, pr := range s.Predictions {
		p.Predictions = append(p.Predictions, predictionRow{
			Preset: pr.Preset, Layer: pr.Layer, What: pr.What,
			Predicted: fmtSig(pr.Predicted), Measured: fmtSig(pr.Measured),
			Ratio: ratio(pr), Verdict: verdict(pr), Within: pr.Within,
		})
	}
	for _, c := range s.Checks {
		p.Checks = append(p.Checks, checkRow{
			Result: passFail(c.OK), Scenario: c.Scenario, Layer: c.Layer,
			Promise: c.Promise, Measured: c.Measured, OK: c.OK,
		})
	}
	p.Passed, p.Failed = countChecks(s.Checks)
	return p
}

// tick is one labelled position on an axis, in SVG units.
type tick struct {
	Pos   float64
	Label string
}

// box is the plot area of a chart inside its SVG view box, with the
// derived positions the template needs.
type box struct {
	W, H           float64 // view box
	X0, Y0, X1, Y1 float64 // plot area: left, top, right, bottom (the x axis)
	PlotW, PlotH   float64
	MidX, MidY     float64
	YLabelX        float64 // right edge of y tick labels
}

func newBox(w, h, left, top, right, bottom float64) box {
	b := box{W: w, H: h, X0: left, Y0: top, X1: w - right, Y1: h - bottom}
	b.PlotW, b.PlotH = b.X1-b.X0, b.Y1-b.Y0
	b.MidX, b.MidY = round1((b.X0+b.X1)/2), round1((b.Y0+b.Y1)/2)
	b.YLabelX = b.X0 - 5
	return b
}

// timelineChart is one Run's origin calls per second over time.
type timelineChart struct {
	box
	Scenario, Layer, Variant, Label string
	YMax                            float64 // top of the y axis, calls/s
	Empty                           bool    // no timeline or no bucket width: nothing to plot
	Path                            string  // step area of calls/s per bucket
	YTicks, XTicks                  []tick
	MaxLabel                        string
	MaxY, XTickEnd, XLabelY         float64
	AxisLabelY                      float64
}

// rates converts a Run's timeline to origin calls per second per bucket;
// nil when it cannot (no timeline, or a bucket width that is not positive).
func rates(r lab.Run) []float64 {
	if r.Bucket <= 0 || len(r.Timeline) == 0 {
		return nil
	}
	sec := r.Bucket.Seconds()
	out := make([]float64, len(r.Timeline))
	for i, n := range r.Timeline {
		out[i] = float64(n) / sec
	}
	return out
}

// sharedScale returns the top of the y axis and the tick step shared by the
// timeline charts of one scenario, from the highest rate of any of its runs.
func sharedScale(runs []lab.Run) (yMax, step float64) {
	peak := 0.0
	for _, r := range runs {
		for _, v := range rates(r) {
			peak = max(peak, v)
		}
	}
	return niceScale(peak)
}

// niceScale returns the lowest axis top at or above peak that is a
// multiple of a step of 1, 2, 2.5 or 5 times a power of ten, split into 3
// to 7 steps; fewer steps break a tie. A peak of zero or less gives 0..1.
func niceScale(peak float64) (top, step float64) {
	if peak <= 0 || !finite(peak) {
		return 1, 1
	}
	top = math.Inf(1)
	p := math.Pow(10, math.Floor(math.Log10(peak/7)))
	for _, base := range []float64{10 * p, p} {
		for _, m := range []float64{5, 2.5, 2, 1} { // larger steps first: they win ties
			st := m * base
			n := math.Ceil(peak/st - 1e-9)
			if n < 3 || n > 7 {
				continue
			}
			if t := n * st; t < top*(1-1e-9) {
				top, step = t, st
			}
		}
	}
	if math.IsInf(top, 1) { // unreachable for finite peaks; keeps the axis sane
		step = niceCeil(peak / 4)
		top = math.Ceil(peak/step-1e-9) * step
	}
	return top, step
}

func newTimelineChart(r lab.Run, yMax, step float64) timelineChart {
	c := timelineChart{
		box:      newBox(360, 214, 50, 24, 14, 40),
		Scenario: r.Scenario, Layer: r.Layer, Variant: r.Variant, Label: layerLabel(r),
		YMax: yMax,
	}
	c.XTickEnd = c.Y1 + 4
	c.XLabelY = c.Y1 + 16
	c.AxisLabelY = c.H - 6
	c.MaxY = c.Y0 - 8
	rs := rates(r)
	if rs == nil {
		c.Empty = true
		return c
	}
	y := func(v float64) float64 { return c.Y1 - v/yMax*c.PlotH }
	for i := 0; float64(i)*step <= yMax*(1+1e-9); i++ {
		v := float64(i) * step
		c.YTicks = append(c.YTicks, tick{round1(y(v)), fmtTick(v)})
	}

	total := float64(len(rs)) * r.Bucket.Seconds()
	x := func(t float64) float64 { return c.X0 + t/total*c.PlotW }
	xstep := niceCeil(total / 6)
	for i := 0; ; i++ {
		t := float64(i) * xstep
		if t > total*(1+1e-9) {
			break
		}
		c.XTicks = append(c.XTicks, tick{round1(x(t)), fmtTick(t)})
	}

	var path strings.Builder
	peak := 0.0
	fmt.Fprintf(&path, "M%s %s", coord(c.X0), coord(c.Y1))
	for i, v := range rs {
		peak = max(peak, v)
		top := y(v)
		if v > 0 {
			top = min(top, c.Y1-1) // keep any non-zero bucket visible
		}
		x0 := x(float64(i) * r.Bucket.Seconds())
		x1 := x(float64(i+1) * r.Bucket.Seconds())
		fmt.Fprintf(&path, "L%s %sL%s %s", coord(x0), coord(top), coord(x1), coord(top))
	}
	fmt.Fprintf(&path, "L%s %sZ", coord(c.X1), coord(c.Y1))
	c.Path = path.String()
	c.MaxLabel = "max " + fmtSig(peak) + " calls/s"
	return c
}

// latencyChart is grouped bars of p50, p99 and p999 client latency per Run
// of one scenario, on a logarithmic axis.
type latencyChart struct {
	box
	Scenario string
	Empty    bool // no positive latency to plot
	YTicks   []tick
	Groups   []latencyGroup
	Legend   []legendItem
}

type latencyGroup struct {
	Label          string
	LabelX, LabelY float64
	Rotate         bool // the label is drawn slanted because it is wider than its group
	Bars           []latencyBar
}

type latencyBar struct {
	Class        string // p50, p99 or p999: the CSS fill
	X, Y, W, H   float64
	Title        string // tooltip with the exact value
	Value        string // label above the bar; empty when bars are too narrow
	TextX, TextY float64
}

type legendItem struct {
	Class, Label string
	X, TextX     float64
}

// approximate width of one character of the 11px chart font, in SVG units
const charWidth = 6.2

func newLatencyChart(scenario string, runs []lab.Run) latencyChart {
	const width = 1000.0
	left, right := 62.0, 16.0
	plotW := width - left - right
	gw := plotW / float64(max(len(runs), 1))
	rotate := false
	bottom := 30.0
	for _, r := range runs {
		if w := float64(len([]rune(layerLabel(r)))) * charWidth; w > gw-8 {
			rotate = true
			bottom = max(bottom, 22+min(w*0.5, 140)) // sin 30° of the slanted label
		}
	}
	c := latencyChart{box: newBox(width, 250+bottom, left, 34, right, bottom), Scenario: scenario}
	classes := []string{"p50", "p99", "p999"}
	for i, name := range classes {
		x := c.X1 - float64(len(classes)-i)*62
		c.Legend = append(c.Legend, legendItem{Class: name, Label: name, X: x, TextX: x + 16})
	}

	lo, hi := math.Inf(1), math.Inf(-1)
	for _, r := range runs {
		for _, d := range []time.Duration{r.P50, r.P99, r.P999} {
			if v := ms(d); v > 0 {
				lo, hi = min(lo, v), max(hi, v)
			}
		}
	}
	if math.IsInf(lo, 1) {
		c.Empty = true
		return c
	}
	// From a decade at least 20% below the lowest value (so it shows as a bar) to a round number a little
	// above the highest (room for the value labels).
	dlo, dhi := math.Floor(math.Log10(lo*0.8)), math.Log10(niceCeil(hi*1.2))
	if dhi-dlo < 1 {
		dhi = dlo + 1
	}
	y := func(v float64) float64 { return c.Y1 - (math.Log10(v)-dlo)/(dhi-dlo)*c.PlotH }
	for d := dlo; d <= dhi+1e-9; d++ {
		v := math.Pow(10, d)
		c.YTicks = append(c.YTicks, tick{round1(y(v)), fmtTick(v)})
	}
	// Label a top that is not a decade unless it would crowd the last one.
	if top := math.Pow(10, dhi); dhi-math.Floor(dhi) > 0.45 {
		c.YTicks = append(c.YTicks, tick{round1(y(top)), fmtTick(top)})
	}

	barW := min(gw*0.72/3, 44)
	for i, r := range runs {
		cx := c.X0 + gw*(float64(i)+0.5)
		g := latencyGroup{Label: layerLabel(r), LabelX: round1(cx), LabelY: c.Y1 + 16, Rotate: rotate}
		if rotate {
			g.LabelX = round1(cx + 4)
			g.LabelY = c.Y1 + 14
		}
		for j, d := range []time.Duration{r.P50, r.P99, r.P999} {
			v := ms(d)
			b := latencyBar{
				Class: classes[j],
				X:     round1(cx + (float64(j)-1.5)*barW),
				W:     round1(barW - 2),
				Title: fmt.Sprintf("%s %s: %s ms", layerLabel(r), classes[j], fmtMS(d)),
			}
			top := c.Y1
			if v > 0 {
				top = min(y(v), c.Y1-1)
			}
			b.Y, b.H = round1(top), round1(c.Y1-top)
			if barW >= 24 {
				b.Value = fmtSig(v)
				b.TextX, b.TextY = round1(b.X+b.W/2), round1(top-3)
			}
			g.Bars = append(g.Bars, b)
		}
		c.Groups = append(c.Groups, g)
	}
	return c
}

// niceCeil returns the smallest of 1, 2 or 5 times a power of ten that is
// at least v (v > 0).
func niceCeil(v float64) float64 {
	if v <= 0 || !finite(v) {
		return 1
	}
	p := math.Pow(10, math.Floor(math.Log10(v)))
	for _, m := range []float64{1, 2, 5, 10} {
		if m*p >= v*(1-1e-9) {
			return m * p
		}
	}
	return 10 * p
}

// fmtTick formats an axis value compactly: 0.25, 40, 1500, 12k.
func fmtTick(v float64) string {
	if v >= 10000 {
		return strconv.FormatFloat(v/1000, 'f', -1, 64) + "k"
	}
	return strconv.FormatFloat(math.Round(v*1e6)/1e6, 'f', -1, 64)
}

func round1(v float64) float64 { return math.Round(v*10) / 10 }

func coord(v float64) string { return strconv.FormatFloat(round1(v), 'f', -1, 64) }
