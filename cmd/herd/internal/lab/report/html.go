package report

import (
	"bytes"
	_ "embed"
	"fmt"
	"html/template"
	"io"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/herdcache/herd/cmd/herd/internal/lab"
)

//go:embed report.html.tmpl
var pageSource string

// pageTemplate renders report.html; every value reaches the page through
// html/template, so names and labels are escaped.
var pageTemplate = template.Must(template.New("report.html").Parse(pageSource))

// WriteHTML writes report.html: a self-contained page (inline CSS and SVG,
// no script, no external resource) with a table of contents linking to
// each section; the configuration header; how to read it (the ladder of
// layers, the scenarios, the summary columns); a section per scenario
// holding its summary table of WriteTable, one chart per Run of the
// backing-store calls started per timeline bucket (shared y scale, the
// bucket width on every chart, the scenario's events marked: expiries,
// the flush, the kill and restart, the start), its scenario-specific
// figures and their legend, and a chart of client latency percentiles by
// layer; then predictions and checks when present, with their columns
// explained. Every table header carries its explanation (a title) and
// appears in a visible legend.
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
	LadderIntro    string
	Ladder         []term // the suite's layers
	ScenarioDocs   []term
	Columns        []head // of the summary tables
	ColumnLegend   []term
	Scenarios      []scenarioView
	Predictions    []predictionRow
	PredColumns    []head
	PredLegend     []term
	PredChecked    bool // the predictions are checks (a preset)
	CheckGroups    []checkGroup
	CheckColumns   []head
	CheckLegend    []term
	ChecksIntro    string
	Passed, Failed int
}

// head is a table header and its explanation (its title, and an entry of a
// legend on the page).
type head struct {
	Text, Doc string
	Left      bool
}

// term is one entry of a legend.
type term struct {
	Term, Doc string
}

type scenarioView struct {
	Name         string
	ID           string // the anchor of its section
	Doc          string
	Runs         int
	Checks       *checkGroup // nil when the suite has no check of the scenario
	Rows         [][]string  // summaryCells of each run
	Figures      []figureView
	FigureLegend []term
	Bucket       string // width of the timeline buckets, e.g. "10 ms"; empty if the runs differ
	YMax         string // shared top of the y axis of Timelines, in calls per bucket
	Plotted      bool   // some run of the scenario has a timeline to plot
	Timelines    []timelineGroup
	EventLegend  []term // the kinds of event its charts mark
	Latency      latencyChart
}

// timelineGroup is the timeline charts of one variant of a scenario, in
// run order.
type timelineGroup struct {
	Variant string
	Charts  []timelineChart
}

// figureView is one table of scenario-specific figures: one row per
// figure, one column per layer.
type figureView struct {
	Variant string
	Columns []head
	Rows    []figureRowView
}

type figureRowView struct {
	Label, Doc string
	Cells      []string
}

type predictionRow struct {
	Layer, Predicted, Measured, Ratio string
	Band, Expiries, Verdict, Note     string
	Within                            bool
}

// checkGroup is the checks of one scenario, folded on the page unless one
// failed.
type checkGroup struct {
	Scenario, ID   string
	Passed, Failed int
	Rows           []checkRow
}

type checkRow struct {
	Result, Scenario, Layer, Promise, Measured string
	Observations                               string
	Count                                      int64
	OK                                         bool
}

// heads returns the HTML headers of cols.
func heads(cols []column) []head {
	out := make([]head, len(cols))
	for i, c := range cols {
		out[i] = head{Text: c.Long, Doc: c.Doc, Left: c.Left}
	}
	return out
}

// legend returns the legend entries of hs that explained has not seen,
// and marks them seen.
func legend(hs []head, explained map[string]bool) []term {
	var out []term
	for _, h := range hs {
		if !explained[h.Text] {
			explained[h.Text] = true
			out = append(out, term{h.Text, h.Doc})
		}
	}
	return out
}

func newPage(s *lab.Suite) page {
	p := page{
		Title:       "herd lab report",
		When:        started(s),
		RunCount:    len(s.Runs),
		Header:      headerFields(s),
		LadderIntro: ladderIntro,
		Columns:     heads(summaryColumns),
		ChecksIntro: checksIntro,
	}
	if s.Config.Preset != "" {
		p.Title += ": " + s.Config.Preset
	}
	explained := map[string]bool{}
	for _, l := range ladder(s.Runs) {
		p.Ladder = append(p.Ladder, term{l, layerDoc(l)})
		explained[l] = true
	}
	p.ColumnLegend = legend(p.Columns, explained)
	ids := map[string]bool{}
	groups := map[string]int{}
	for _, c := range s.Checks {
		i, ok := groups[c.Scenario]
		if !ok {
			i = len(p.CheckGroups)
			groups[c.Scenario] = i
			p.CheckGroups = append(p.CheckGroups, checkGroup{Scenario: c.Scenario, ID: anchor("checks-", c.Scenario, ids)})
		}
		g := &p.CheckGroups[i]
		if c.OK {
			g.Passed++
		} else {
			g.Failed++
		}
		g.Rows = append(g.Rows, checkRow{
			Result: passFail(c.OK), Scenario: c.Scenario, Layer: c.Layer,
			Promise: c.Promise, Measured: c.Measured,
			Observations: observations(c), Count: c.Observations, OK: c.OK,
		})
	}
	for _, g := range byScenario(s.Runs) {
		doc, ok := lab.ScenarioDocs[g.Name]
		if !ok {
			doc = "a scenario this version of the lab does not know"
		}
		p.ScenarioDocs = append(p.ScenarioDocs, term{g.Name, doc})

		v := scenarioView{Name: g.Name, ID: anchor("scenario-", g.Name, ids), Doc: doc, Runs: len(g.Runs)}
		if i, ok := groups[g.Name]; ok {
			v.Checks = &p.CheckGroups[i]
		}
		for _, r := range g.Runs {
			v.Rows = append(v.Rows, summaryCells(r))
		}
		seen := map[string]bool{}
		for _, fg := range figureGroups(g.Runs) {
			fv := figureView{Variant: fg.Variant}
			for _, l := range fg.Layers {
				fv.Columns = append(fv.Columns, head{Text: l, Doc: layerDoc(l)})
			}
			for _, fr := range fg.Rows {
				fv.Rows = append(fv.Rows, figureRowView{Label: fr.Figure.Label, Doc: figureDoc(fr.Figure), Cells: fr.Cells})
				if !seen[fr.Figure.Label] {
					seen[fr.Figure.Label] = true
					v.FigureLegend = append(v.FigureLegend, term{fr.Figure.Label, figureDoc(fr.Figure)})
				}
			}
			v.Figures = append(v.Figures, fv)
		}
		v.Bucket = commonBucket(g.Runs)
		yMax, step := sharedScale(g.Runs)
		v.YMax = fmtTick(yMax)
		variants := map[string]int{}
		kinds := map[string]bool{}
		for _, r := range g.Runs {
			c := newTimelineChart(r, yMax, step)
			v.Plotted = v.Plotted || !c.Empty
			i, ok := variants[r.Variant]
			if !ok {
				i = len(v.Timelines)
				variants[r.Variant] = i
				v.Timelines = append(v.Timelines, timelineGroup{Variant: r.Variant})
			}
			v.Timelines[i].Charts = append(v.Timelines[i].Charts, c)
			for _, ev := range c.Events {
				kinds[ev.Kind] = true
			}
		}
		for _, k := range eventKinds {
			if kinds[k.Term] {
				v.EventLegend = append(v.EventLegend, k)
			}
		}
		v.Latency = newLatencyChart(g.Name, g.Runs)
		p.Scenarios = append(p.Scenarios, v)
	}
	if len(s.Predictions) > 0 {
		p.PredColumns = heads(predictionColumns)
		p.PredLegend = legend(p.PredColumns, explained)
	}
	for _, pr := range s.Predictions {
		p.PredChecked = p.PredChecked || pr.Checked
		p.Predictions = append(p.Predictions, predictionRow{
			Layer: pr.Layer, Predicted: fmtSig(pr.Predicted), Measured: fmtSig(pr.Measured),
			Ratio: ratio(pr), Band: band(pr), Expiries: itoa(pr.Expiries), Verdict: verdict(pr),
			Note: pr.Note, Within: pr.Within,
		})
	}
	if len(s.Checks) > 0 {
		p.CheckColumns = heads(checkColumns)
		p.CheckLegend = legend(p.CheckColumns, explained)
	}
	p.Passed, p.Failed = countChecks(s.Checks)
	return p
}

// figureDoc is a figure's explanation, naming its key in results.json.
func figureDoc(f lab.Figure) string {
	doc := f.Doc
	if doc == "" {
		doc = "a figure this version of the report does not describe"
	}
	return doc + " (" + f.Key + " in results.json)"
}

// commonBucket returns the bucket width every run with a timeline shares,
// formatted; empty when they differ or none has one.
func commonBucket(runs []lab.Run) string {
	var b time.Duration
	for _, r := range runs {
		if r.Bucket <= 0 || len(r.Timeline) == 0 {
			continue
		}
		if b != 0 && r.Bucket != b {
			return ""
		}
		b = r.Bucket
	}
	if b == 0 {
		return ""
	}
	return fmtBucket(b)
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

// timelineChart is one Run's backing-store calls started per bucket.
type timelineChart struct {
	box
	Scenario, Layer, Variant, Label string
	YMax                            float64 // top of the y axis, calls per bucket
	Bucket                          string  // bucket width, e.g. "10 ms"
	BucketMS                        float64 // bucket width in milliseconds
	Unit                            string  // the y axis's label: "calls per 10 ms bucket"
	Empty                           bool    // no timeline or no bucket width: nothing to plot
	Path                            string  // step area of calls per bucket
	YTicks, XTicks                  []tick
	Events                          []eventMark // the run's events inside the plotted time
	MaxLabel                        string
	MaxY, XTickEnd, XLabelY         float64
	AxisLabelY                      float64
}

// eventKinds are the kinds of lab.Event the charts mark, in legend order,
// with what each marks.
var eventKinds = []term{
	{lab.EventExpiry, "an expiry event the run measured, at its first backing-store call (under xfetch and ahead, a refresh that began before the key expired)"},
	{lab.EventFlush, "the remote tier flushed, every replica given an empty cache"},
	{lab.EventKill, "the Redis node killed (embedded: the shared remote tier stops answering)"},
	{lab.EventRestart, "the node back"},
	{lab.EventStart, "client traffic begins (cold: at once; warm and fleet: once the replicas have warmed)"},
}

// eventMark is a vertical line at an event's instant on a timeline chart,
// named beside it unless it is an expiry (there may be dozens).
type eventMark struct {
	Kind   string
	AtMS   float64
	X      float64
	Title  string // tooltip: what and when
	Label  string // drawn beside the line; empty for expiries
	LabelX float64
	LabelY float64
	Anchor string // text-anchor of the label: start, or end near the right edge
}

// eventMarks places the events of r on a chart whose time axis x maps
// seconds to SVG units up to total seconds; events outside it, or of a kind
// the page does not know, are left out. Labels that would overlap step
// down a line.
func eventMarks(c *timelineChart, r lab.Run, x func(float64) float64, total float64) []eventMark {
	var out []eventMark
	var lineEnd []float64 // right edge of the last label on each line
	for _, ev := range r.Events {
		at := ev.At.Seconds()
		known := slices.ContainsFunc(eventKinds, func(k term) bool { return k.Term == ev.Kind })
		if !known || at < 0 || at > total {
			continue
		}
		m := eventMark{Kind: ev.Kind, AtMS: ms(ev.At), X: round1(x(at)),
			Title: ev.Kind + " at " + fmtSig(at) + " s"}
		if ev.Kind != lab.EventExpiry {
			m.Label = ev.Kind
			w := float64(utf8.RuneCountInString(m.Label)) * eventCharWidth
			left := m.X + 3
			m.Anchor, m.LabelX = "start", left
			if left+w > c.X1 {
				left, m.Anchor, m.LabelX = m.X-3-w, "end", m.X-3
			}
			line := 0
			for line < len(lineEnd) && left < lineEnd[line]+4 {
				line++
			}
			if line == len(lineEnd) {
				lineEnd = append(lineEnd, 0)
			}
			lineEnd[line] = left + w
			m.LabelX = round1(m.LabelX)
			m.LabelY = round1(c.Y0 + 10 + 11*float64(line))
		}
		out = append(out, m)
	}
	return out
}

// counts returns a Run's timeline as calls per bucket; nil when there is
// nothing to plot (no timeline, or a bucket width that is not positive).
func counts(r lab.Run) []float64 {
	if r.Bucket <= 0 || len(r.Timeline) == 0 {
		return nil
	}
	out := make([]float64, len(r.Timeline))
	for i, n := range r.Timeline {
		out[i] = float64(n)
	}
	return out
}

// sharedScale returns the top of the y axis and the tick step shared by the
// timeline charts of one scenario, from the most calls any of its runs
// started in one bucket: whole numbers of calls, at least 0 to 3.
func sharedScale(runs []lab.Run) (yMax, step float64) {
	peak := 0.0
	for _, r := range runs {
		for _, v := range counts(r) {
			peak = max(peak, v)
		}
	}
	return countScale(peak)
}

// countScale is niceScale for counts: a whole step, a top of at least 3.
func countScale(peak float64) (top, step float64) {
	top, step = niceScale(max(peak, 3))
	if step < 1 || step != math.Trunc(step) {
		step = math.Max(1, math.Ceil(step))
		top = math.Ceil(max(peak, 3)/step) * step
	}
	return top, step
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
		box:      newBox(300, 190, 44, 22, 10, 36),
		Scenario: r.Scenario, Layer: r.Layer, Variant: r.Variant, Label: layerLabel(r),
		YMax: yMax,
	}
	c.XTickEnd = c.Y1 + 4
	c.XLabelY = c.Y1 + 16
	c.AxisLabelY = c.H - 6
	c.MaxY = c.Y0 - 8
	cs := counts(r)
	if cs == nil {
		c.Empty = true
		c.Unit = "calls per bucket"
		return c
	}
	c.Bucket, c.BucketMS = fmtBucket(r.Bucket), ms(r.Bucket)
	c.Unit = "calls per " + c.Bucket + " bucket"
	y := func(v float64) float64 { return c.Y1 - v/yMax*c.PlotH }
	for i := 0; float64(i)*step <= yMax*(1+1e-9); i++ {
		v := float64(i) * step
		c.YTicks = append(c.YTicks, tick{round1(y(v)), fmtTick(v)})
	}

	total := float64(len(cs)) * r.Bucket.Seconds()
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
	for i, v := range cs {
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
	c.Events = eventMarks(&c, r, x, total)
	calls := "calls"
	if peak == 1 {
		calls = "call"
	}
	c.MaxLabel = "max " + fmtSig(peak) + " " + calls + " in a " + c.Bucket + " bucket"
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
	Rotate       bool // the label reads upwards from the bar's top: it is wider than the bar
}

type legendItem struct {
	Class, Label string
	X, TextX     float64
}

// approximate width of one character of the 11px chart font, and of the
// 9px font of the bars' values, in SVG units
const (
	charWidth      = 6.2
	valueWidth     = 5.2
	eventCharWidth = 5.6 // the 10px font of event labels
)

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
		c.YTicks = append(c.YTicks, tick{round1(y(v)), FormatLatency(fromMS(v))})
	}
	// Label a top that is not a decade unless it would crowd the last one.
	if top := math.Pow(10, dhi); dhi-math.Floor(dhi) > 0.45 {
		c.YTicks = append(c.YTicks, tick{round1(y(top)), FormatLatency(fromMS(top))})
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
				Title: fmt.Sprintf("%s %s: %s", layerLabel(r), classes[j], FormatLatency(d)),
			}
			top := c.Y1
			if v > 0 {
				top = min(y(v), c.Y1-1)
			}
			b.Y, b.H = round1(top), round1(c.Y1-top)
			if barW >= 24 {
				b.Value = FormatLatency(d)
				b.TextX, b.TextY = round1(b.X+b.W/2), round1(top-3)
				b.Rotate = float64(utf8.RuneCountInString(b.Value))*valueWidth > barW
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

// fromMS converts milliseconds to a duration, to the nearest nanosecond.
func fromMS(v float64) time.Duration { return time.Duration(math.Round(v * float64(time.Millisecond))) }

// anchor returns an id for name, unique among used (which it adds it to):
// prefix, then name's letters and digits lower-cased, each run of other
// characters a hyphen; a number follows when that is taken or empty.
func anchor(prefix, name string, used map[string]bool) string {
	var b strings.Builder
	hyphen := false
	for _, r := range strings.ToLower(name) {
		if (r >= 'a' && r <= 'z') || (r >= '0' && r <= '9') {
			if hyphen && b.Len() > 0 {
				b.WriteByte('-')
			}
			b.WriteRune(r)
			hyphen = false
		} else {
			hyphen = true
		}
	}
	id := prefix + b.String()
	if b.Len() == 0 || used[id] {
		for i := 2; ; i++ {
			if c := id + "-" + strconv.Itoa(i); !used[c] {
				id = c
				break
			}
		}
	}
	used[id] = true
	return id
}

func coord(v float64) string { return strconv.FormatFloat(round1(v), 'f', -1, 64) }
