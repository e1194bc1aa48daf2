package report

import (
	"context"
	"encoding/xml"
	"errors"
	"fmt"
	"io"
	"math"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/herdcache/herd/cmd/herd/internal/lab"
)

// node is an element of a parsed page, or a text node (tag "").
type node struct {
	tag      string
	attrs    map[string]string
	text     string
	children []*node
}

// parsePage parses report.html into a tree. The page is well-formed XML
// as well as HTML (every element closed, in order; the void elements
// self-closed), so encoding/xml reads it strictly, told HTML's named
// entities: a misnested or unclosed tag is an error.
func parsePage(src string) (*node, error) {
	d := xml.NewDecoder(strings.NewReader(src))
	d.Entity = xml.HTMLEntity
	root := &node{tag: "#document"}
	stack := []*node{root}
	for {
		tok, err := d.Token()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, err
		}
		top := stack[len(stack)-1]
		switch tok := tok.(type) {
		case xml.StartElement:
			n := &node{tag: tok.Name.Local, attrs: map[string]string{}}
			for _, a := range tok.Attr {
				n.attrs[a.Name.Local] = a.Value
			}
			top.children = append(top.children, n)
			stack = append(stack, n)
		case xml.EndElement:
			if len(stack) == 1 || top.tag != tok.Name.Local {
				return nil, fmt.Errorf("unexpected </%s>", tok.Name.Local)
			}
			stack = stack[:len(stack)-1]
		case xml.CharData:
			top.children = append(top.children, &node{text: string(tok)})
		}
	}
	if len(stack) != 1 {
		return nil, fmt.Errorf("<%s> never closed", stack[len(stack)-1].tag)
	}
	return root, nil
}

// all returns the descendants of n that match, in document order.
func (n *node) all(match func(*node) bool) []*node {
	var out []*node
	var walk func(*node)
	walk = func(n *node) {
		for _, c := range n.children {
			if c.tag != "" && match(c) {
				out = append(out, c)
			}
			walk(c)
		}
	}
	walk(n)
	return out
}

// content is the text of n and its descendants, spaces collapsed.
func (n *node) content() string {
	var b strings.Builder
	var walk func(*node)
	walk = func(n *node) {
		b.WriteString(n.text)
		for _, c := range n.children {
			walk(c)
		}
	}
	walk(n)
	return strings.Join(strings.Fields(b.String()), " ")
}

func (n *node) hasClass(class string) bool {
	for c := range strings.FieldsSeq(n.attrs["class"]) {
		if c == class {
			return true
		}
	}
	return false
}

func tagClass(tag, class string) func(*node) bool {
	return func(n *node) bool { return n.tag == tag && (class == "" || n.hasClass(class)) }
}

// unitRE is how a timeline chart names its unit and bucket width.
var unitRE = regexp.MustCompile(`^calls per ([0-9.]+) (ms|s) bucket$`)

// pageProblems returns what report.html fails to explain: a table header
// (column or row) without a title or without an entry in a visible legend;
// a timeline chart without its bucket width and unit, or one that disagrees
// with its data-bucket-ms; an event marker of an unknown kind, outside its
// chart's time axis, out of time order, or of a kind its scenario's section
// does not explain; a latency chart without its label or a tick without
// its unit; a check without its observation count, or one that judged
// nothing yet passed.
func pageProblems(root *node) []string {
	var problems []string
	bad := func(format string, args ...any) { problems = append(problems, fmt.Sprintf(format, args...)) }

	legend := map[string]string{}
	for _, dl := range root.all(tagClass("dl", "legend")) {
		var term string
		for _, c := range dl.children {
			switch c.tag {
			case "dt":
				term = c.content()
			case "dd":
				if term != "" && c.content() != "" {
					legend[term] = c.content()
				}
				term = ""
			}
		}
	}
	for _, th := range root.all(tagClass("th", "")) {
		text := th.content()
		if strings.TrimSpace(th.attrs["title"]) == "" {
			bad("header %q has no explanation (title)", text)
		}
		if legend[text] == "" {
			bad("header %q is in no legend", text)
		}
	}

	for _, fig := range root.all(tagClass("figure", "chart")) {
		name := fig.attrs["data-scenario"] + "/" + fig.attrs["data-layer"] + "/" + fig.attrs["data-variant"]
		if strings.Contains(fig.content(), "no timeline recorded") {
			continue // plots nothing
		}
		widthMS, err := strconv.ParseFloat(fig.attrs["data-bucket-ms"], 64)
		if err != nil || widthMS <= 0 {
			bad("chart %s has no bucket width (data-bucket-ms %q)", name, fig.attrs["data-bucket-ms"])
			continue
		}
		units := fig.all(tagClass("text", "unit"))
		if len(units) != 1 {
			bad("chart %s has %d unit labels, want 1", name, len(units))
			continue
		}
		m := unitRE.FindStringSubmatch(units[0].content())
		if m == nil {
			bad("chart %s: unit label %q does not state the bucket width and unit", name, units[0].content())
			continue
		}
		v, _ := strconv.ParseFloat(m[1], 64)
		if m[2] == "s" {
			v *= 1000
		}
		if v != widthMS {
			bad("chart %s: unit label %q, but buckets of %vms", name, units[0].content(), widthMS)
		}
		if max := fig.all(tagClass("text", "max")); len(max) != 1 || !strings.HasSuffix(max[0].content(), " "+m[1]+" "+m[2]+" bucket") {
			bad("chart %s: its maximum does not name the bucket", name)
		}
		for _, p := range markerProblems(fig) {
			bad("chart %s: %s", name, p)
		}
	}
	for _, sec := range root.all(tagClass("section", "scenario")) {
		explained := map[string]bool{}
		for _, dl := range sec.all(tagClass("dl", "events")) {
			for _, dt := range dl.all(tagClass("dt", "")) {
				explained[dt.content()] = true
			}
		}
		for _, ev := range sec.all(tagClass("line", "event")) {
			if k := ev.attrs["data-event"]; !explained[k] {
				bad("section %s marks %s events without a legend of them", sec.attrs["id"], k)
				explained[k] = true
			}
		}
	}
	for _, fig := range root.all(tagClass("figure", "latency-chart")) {
		if units := fig.all(tagClass("text", "unit")); len(units) != 1 || !strings.Contains(units[0].content(), "client latency") {
			bad("latency chart %s does not say what it plots", fig.attrs["data-scenario"])
		}
		ticks := fig.all(tagClass("text", "tick"))
		if len(ticks) < 2 && !strings.Contains(fig.content(), "no latency recorded") {
			bad("latency chart %s has %d tick labels", fig.attrs["data-scenario"], len(ticks))
		}
		for _, tk := range ticks {
			if d, err := time.ParseDuration(tk.content()); err != nil || d <= 0 {
				bad("latency chart %s: tick %q has no unit", fig.attrs["data-scenario"], tk.content())
			}
		}
	}

	for _, table := range root.all(tagClass("table", "checks")) {
		for i, tr := range table.all(tagClass("tr", "")) {
			cells := tr.all(tagClass("td", ""))
			if len(cells) == 0 {
				continue // the header row
			}
			obs := tr.all(tagClass("td", "obs"))
			if len(obs) != 1 {
				bad("check %d has no observation count", i)
				continue
			}
			n, err := strconv.ParseInt(obs[0].attrs["data-observations"], 10, 64)
			if err != nil || n < 0 {
				bad("check %d: observation count %q is not a count", i, obs[0].attrs["data-observations"])
				continue
			}
			if count, what, _ := strings.Cut(obs[0].content(), " "); count != strconv.FormatInt(n, 10) || what == "" {
				bad("check %d: observations shown as %q, want %d and what they are", i, obs[0].content(), n)
			}
			if n == 0 && cells[0].content() != "FAIL" {
				bad("check %d judged nothing but shows %s", i, cells[0].content())
			}
		}
	}
	return problems
}

// eventKindNames are the kinds of event a chart may mark.
var eventKindNames = []string{lab.EventExpiry, lab.EventFlush, lab.EventKill, lab.EventRestart, lab.EventStart}

// markers returns the events a timeline chart marks, in document order,
// with their x positions.
func markers(fig *node) (evs []lab.Event, xs []float64, err error) {
	for _, ln := range fig.all(tagClass("line", "event")) {
		at, err := strconv.ParseFloat(ln.attrs["data-at-ms"], 64)
		if err != nil {
			return nil, nil, fmt.Errorf("marker at %q", ln.attrs["data-at-ms"])
		}
		x1, err1 := strconv.ParseFloat(ln.attrs["x1"], 64)
		x2, err2 := strconv.ParseFloat(ln.attrs["x2"], 64)
		if err1 != nil || err2 != nil || x1 != x2 {
			return nil, nil, fmt.Errorf("marker at %vms is not a vertical line (x1 %q, x2 %q)", at, ln.attrs["x1"], ln.attrs["x2"])
		}
		evs = append(evs, lab.Event{Kind: ln.attrs["data-event"], At: time.Duration(at * float64(time.Millisecond))})
		xs = append(xs, x1)
	}
	return evs, xs, nil
}

// markerProblems returns what is wrong with a timeline chart's event
// markers: a kind the page does not know, a line outside the time axis (the
// chart's horizontal axis line), markers whose positions do not grow with
// their instants, a label other than the kind beside a marker.
func markerProblems(fig *node) []string {
	evs, xs, err := markers(fig)
	if err != nil {
		return []string{err.Error()}
	}
	var out []string
	lo, hi := math.Inf(1), math.Inf(-1)
	for _, ln := range fig.all(tagClass("line", "axis")) {
		if ln.attrs["y1"] == ln.attrs["y2"] {
			x1, _ := strconv.ParseFloat(ln.attrs["x1"], 64)
			x2, _ := strconv.ParseFloat(ln.attrs["x2"], 64)
			lo, hi = min(lo, x1, x2), max(hi, x1, x2)
		}
	}
	for i, ev := range evs {
		if !slices.Contains(eventKindNames, ev.Kind) {
			out = append(out, fmt.Sprintf("marker of unknown kind %q", ev.Kind))
		}
		if xs[i] < lo || xs[i] > hi {
			out = append(out, fmt.Sprintf("%s marker at x %v, outside the time axis [%v, %v]", ev.Kind, xs[i], lo, hi))
		}
		if i > 0 && (ev.At < evs[i-1].At || (ev.At > evs[i-1].At) != (xs[i] > xs[i-1])) {
			out = append(out, fmt.Sprintf("markers out of time order: %v at x %v after %v at x %v", ev.At, xs[i], evs[i-1].At, xs[i-1]))
		}
	}
	for _, l := range fig.all(tagClass("text", "ev-label")) {
		if !slices.Contains(eventKindNames, l.content()) || !l.hasClass("ev-"+l.content()) {
			out = append(out, fmt.Sprintf("event label %q names no kind of event, or another than its own", l.content()))
		}
	}
	return out
}

func checkPage(t *testing.T, out string) {
	t.Helper()
	root, err := parsePage(out)
	if err != nil {
		t.Fatalf("report.html does not parse: %v", err)
	}
	for _, p := range pageProblems(root) {
		t.Error(p)
	}
	if n := len(root.all(tagClass("th", ""))); n == 0 {
		t.Error("the page has no table header")
	}
}

// TestHTMLExplained parses report.html of the test suite and checks that
// every column header is explained, every chart states its bucket width
// and unit, and every check its observation count.
func TestHTMLExplained(t *testing.T) {
	checkPage(t, render(t, WriteHTML, testSuite()))
}

// TestHTMLExplainedRun does the same for the page of a real (embedded,
// fake-clock) run of every scenario, with its checks.
func TestHTMLExplainedRun(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		o := lab.Defaults()
		o.Replicas, o.Rate, o.Keys = 2, 100, 10
		o.Latency = lab.Latency{Kind: "fixed", A: 20 * time.Millisecond}
		o.Capacity = 0
		o.TTL, o.Duration, o.ClientTimeout = 200*time.Millisecond, time.Second, 500*time.Millisecond
		o.Layers = []string{"none", "lease", "limiter"}
		o.Scenarios = lab.Scenarios // slow-origin too, which runs only when named
		o.Check = true
		s, err := lab.RunSuite(context.Background(), o)
		if err != nil {
			t.Fatal(err)
		}
		out := render(t, WriteHTML, s)
		checkPage(t, out)
		root, err := parsePage(out)
		if err != nil {
			t.Fatal(err)
		}
		if n := len(root.all(tagClass("figure", "chart"))); n != len(s.Runs) {
			t.Errorf("%d timeline charts, want one per run (%d)", n, len(s.Runs))
		}
		if n := len(root.all(tagClass("td", "obs"))); n != len(s.Checks) || n == 0 {
			t.Errorf("%d observation cells, want one per check (%d)", n, len(s.Checks))
		}
		if n := len(root.all(tagClass("table", "figures"))); n != 3+3+1 {
			t.Errorf("%d tables of figures, want 7 (hot-key, flush, node-kill, cold-start cold and warm and fleet, slow-origin)", n)
		}
		checkContents(t, root, s)
		// Every run's events are marked on its chart, and every run of a
		// scenario with events has them.
		for _, fig := range root.all(tagClass("figure", "chart")) {
			name := fig.attrs["data-scenario"] + "/" + fig.attrs["data-layer"] + "/" + fig.attrs["data-variant"]
			i := slices.IndexFunc(s.Runs, func(r lab.Run) bool {
				return r.Scenario+"/"+r.Layer+"/"+r.Variant == name
			})
			if i < 0 {
				t.Errorf("chart %s of no run", name)
				continue
			}
			got, _, err := markers(fig)
			if err != nil {
				t.Errorf("chart %s: %v", name, err)
			}
			want := s.Runs[i].Events
			if len(want) == 0 && slices.Contains([]string{"hot-key", "flush", "node-kill", "cold-start"}, s.Runs[i].Scenario) {
				t.Errorf("run %s has no event", name)
			}
			round := cmp.Transformer("ms", func(d time.Duration) time.Duration { return d.Round(time.Microsecond) })
			if diff := cmp.Diff(want, got, round); diff != "" {
				t.Errorf("chart %s: markers (-events +marked):\n%s", name, diff)
			}
		}
	})
}

// checkContents checks the page's table of contents: a link to every
// section, each to an element of the page; the sections in suite order,
// one per scenario, each holding its scenario's summary table, then its
// backing-store call charts (one per run) before anything else of the
// scenario, then its latency chart; no table or chart of a scenario
// outside its section.
func checkContents(t *testing.T, root *node, s *lab.Suite) {
	t.Helper()
	ids := map[string]*node{}
	for _, n := range root.all(func(n *node) bool { return n.attrs["id"] != "" }) {
		if ids[n.attrs["id"]] != nil {
			t.Errorf("id %q is not unique", n.attrs["id"])
		}
		ids[n.attrs["id"]] = n
	}
	navs := root.all(tagClass("nav", "toc"))
	if len(navs) != 1 {
		t.Fatalf("%d tables of contents, want 1", len(navs))
	}
	var linked []string
	var targets []*node
	for _, a := range navs[0].all(tagClass("a", "")) {
		id, ok := strings.CutPrefix(a.attrs["href"], "#")
		if !ok || ids[id] == nil {
			t.Errorf("contents link %q (%s) leads nowhere on the page", a.attrs["href"], a.content())
			continue
		}
		linked = append(linked, a.content())
		targets = append(targets, ids[id])
	}
	var want []string
	want = append(want, "Configuration", "How to read this report")
	groups := byScenario(s.Runs)
	for _, g := range groups {
		want = append(want, "Scenario "+g.Name)
	}
	if len(s.Predictions) > 0 {
		want = append(want, "Predictions")
	}
	if len(s.Checks) > 0 {
		want = append(want, "Checks")
	}
	if diff := cmp.Diff(want, linked); diff != "" {
		t.Fatalf("contents (-want +got):\n%s", diff)
	}

	sections := root.all(tagClass("section", "scenario"))
	if len(sections) != len(groups) {
		t.Fatalf("%d scenario sections, want %d", len(sections), len(groups))
	}
	for i, g := range groups {
		sec := targets[2+i]
		if sec != sections[i] {
			t.Errorf("the contents' link to %s does not lead to its section", g.Name)
			continue
		}
		if h := sec.all(tagClass("h2", "")); len(h) != 1 || !strings.HasPrefix(h[0].content(), "Scenario "+g.Name) {
			t.Errorf("section %d is not headed Scenario %s", i, g.Name)
		}
		// The section's parts in document order: the summary table, the
		// charts of calls, the figures, the latency chart.
		var order []string
		for _, n := range sec.all(func(n *node) bool {
			return (n.tag == "table" && (n.hasClass("summary") || n.hasClass("figures"))) ||
				(n.tag == "figure" && (n.hasClass("chart") || n.hasClass("latency-chart")))
		}) {
			if sc, ok := n.attrs["data-scenario"]; ok && sc != g.Name {
				t.Errorf("section %s holds a %s of scenario %s", g.Name, n.tag, sc)
			}
			part := n.attrs["class"]
			if len(order) == 0 || order[len(order)-1] != part {
				order = append(order, part)
			}
		}
		wantOrder := []string{"summary", "chart", "latency-chart"}
		if slices.ContainsFunc(g.Runs, func(r lab.Run) bool { return len(r.Extra) > 0 }) {
			wantOrder = []string{"summary", "chart", "figures", "latency-chart"}
		}
		if diff := cmp.Diff(wantOrder, order); diff != "" {
			t.Errorf("section %s: parts in order (-want +got):\n%s", g.Name, diff)
		}
		if n := len(sec.all(tagClass("figure", "chart"))); n != len(g.Runs) {
			t.Errorf("section %s: %d charts of calls, want one per run (%d)", g.Name, n, len(g.Runs))
		}
	}
}

// TestHTMLContents checks the table of contents and the scenario sections
// of the test suite's page, and that an unknown scenario name still gets
// an anchor of its own.
func TestHTMLContents(t *testing.T) {
	s := testSuite()
	root, err := parsePage(render(t, WriteHTML, s))
	if err != nil {
		t.Fatal(err)
	}
	checkContents(t, root, s)

	for i := range s.Runs[3:] {
		s.Runs[3+i].Scenario = "Hot Key!" // the same anchor as hot-key but for its case
	}
	root, err = parsePage(render(t, WriteHTML, s))
	if err != nil {
		t.Fatal(err)
	}
	checkContents(t, root, s)
}

// TestHTMLMarkers checks the event markers of the test suite's charts:
// hot-key's four expiries unnamed on each chart, flush's flush named, one
// legend entry per kind in each section; an event past the end of a
// timeline is not drawn; labels of events close together do not overlap.
func TestHTMLMarkers(t *testing.T) {
	s := testSuite()
	s.Runs[0].Events = append(s.Runs[0].Events, lab.Event{Kind: lab.EventExpiry, At: time.Hour})
	root, err := parsePage(render(t, WriteHTML, s))
	if err != nil {
		t.Fatal(err)
	}
	for _, fig := range root.all(tagClass("figure", "chart")) {
		evs, _, err := markers(fig)
		if err != nil {
			t.Fatal(err)
		}
		want := []string{lab.EventFlush}
		if fig.attrs["data-scenario"] == "hot-key" {
			want = slices.Repeat([]string{lab.EventExpiry}, 4)
		}
		var kinds []string
		for _, ev := range evs {
			kinds = append(kinds, ev.Kind)
		}
		if !slices.Equal(kinds, want) {
			t.Errorf("chart %s/%s marks %q, want %q", fig.attrs["data-scenario"], fig.attrs["data-layer"], kinds, want)
		}
		var labels, wantLabels []string
		for _, l := range fig.all(tagClass("text", "ev-label")) {
			labels = append(labels, l.content())
		}
		if fig.attrs["data-scenario"] == "flush" {
			wantLabels = []string{"flush"}
		}
		if !slices.Equal(labels, wantLabels) {
			t.Errorf("chart %s/%s: event labels %q, want %q (expiries unnamed)", fig.attrs["data-scenario"], fig.attrs["data-layer"], labels, wantLabels)
		}
	}
	for _, sec := range root.all(tagClass("section", "scenario")) {
		var terms []string
		for _, dt := range sec.all(tagClass("dt", "")) {
			if slices.Contains(eventKindNames, dt.content()) {
				terms = append(terms, dt.content())
			}
		}
		if len(terms) != 1 {
			t.Errorf("section %s explains events %q, want its one kind once", sec.attrs["id"], terms)
		}
	}

	// A kill and a restart a few pixels apart: the restart's label goes
	// below the kill's rather than over it.
	c := newTimelineChart(lab.Run{Bucket: 10 * time.Millisecond, Timeline: make([]int64, 100), Events: []lab.Event{
		{Kind: lab.EventKill, At: 300 * time.Millisecond}, {Kind: lab.EventRestart, At: 320 * time.Millisecond},
		{Kind: lab.EventFlush, At: 990 * time.Millisecond},
	}}, 3, 1)
	if len(c.Events) != 3 {
		t.Fatalf("%d marks, want 3", len(c.Events))
	}
	kill, restart, flush := c.Events[0], c.Events[1], c.Events[2]
	if kill.LabelY == restart.LabelY || kill.Anchor != "start" || restart.Anchor != "start" {
		t.Errorf("kill label at (%v, %v), restart at (%v, %v): overlapping", kill.LabelX, kill.LabelY, restart.LabelX, restart.LabelY)
	}
	if flush.Anchor != "end" || flush.LabelX >= flush.X || flush.LabelY != kill.LabelY {
		t.Errorf("flush at the right edge: label at %v anchored %s, line at %v; want it left of the line, on the first line", flush.LabelX, flush.Anchor, flush.X)
	}
}

// TestPageProblems checks that pageProblems catches each thing it looks
// for, on the test suite's page with one flaw added.
func TestPageProblems(t *testing.T) {
	out := render(t, WriteHTML, testSuite())
	cpe := summaryColumns[2]
	for name, tc := range map[string]struct {
		old, new string
		want     string
	}{
		"a header without a title": {
			` title="` + cpe.Doc + `">` + cpe.Long + `</th>`, `>` + cpe.Long + `</th>`,
			`header "calls per expiry" has no explanation`},
		"a header in no legend": {
			`<dt>peak concurrency</dt>`, `<dt>peak</dt>`,
			`header "peak concurrency" is in no legend`},
		"a figure row without a title": {
			`title="` + figureDoc(lab.FigureOf("calls_while_down")) + `">`, `>`,
			`header "calls while Redis is down" has no explanation`},
		"a chart without its unit": {
			`>calls per 100 ms bucket</text>`, `>calls</text>`,
			"does not state the bucket width and unit"},
		"a chart whose unit disagrees": {
			`>calls per 100 ms bucket</text>`, `>calls per 10 ms bucket</text>`,
			"but buckets of 100ms"},
		"a chart without its width": {
			` data-bucket-ms="100"`, ``,
			"has no bucket width"},
		"a latency chart without its label": {
			`>client latency (log scale)<`, `>log scale<`,
			"does not say what it plots"},
		"a latency tick without its unit": {
			`>100µs</text>`, `>100</text>`,
			`tick "100" has no unit`},
		"a marker outside its chart": {
			`data-at-ms="2500" x1="105.5" x2="105.5"`, `data-at-ms="2500" x1="299" x2="299"`,
			"outside the time axis"},
		"markers out of order": {
			`data-at-ms="700" x1="130.1" x2="130.1"`, `data-at-ms="700" x1="60" x2="60"`,
			"out of time order"},
		"a marker of an unknown kind": {
			`data-event="flush"`, `data-event="fire"`,
			`unknown kind "fire"`},
		"a marker without a legend": {
			`<span class="swatch ev-flush"></span>flush</dt>`, `<span class="swatch ev-flush"></span>flash</dt>`,
			"marks flush events without a legend"},
		"a check without its count": {
			` data-observations="20">20 expiries</td>`, `></td>`,
			"is not a count"},
		"a check judging nothing shown passed": {
			`<td class="l fail">FAIL</td><td class="l">flush</td><td class="l">lease</td>`,
			`<td class="l pass">PASS</td><td class="l">flush</td><td class="l">lease</td>`,
			"judged nothing but shows PASS"},
	} {
		if !strings.Contains(out, tc.old) {
			t.Errorf("%s: the page lacks %q", name, tc.old)
			continue
		}
		root, err := parsePage(strings.Replace(out, tc.old, tc.new, 1))
		if err != nil {
			t.Errorf("%s: %v", name, err)
			continue
		}
		problems := strings.Join(pageProblems(root), "\n")
		if !strings.Contains(problems, tc.want) {
			t.Errorf("%s: problems %q, want one with %q", name, problems, tc.want)
		}
	}
	if _, err := parsePage(strings.Replace(out, "</table>", "", 1)); err == nil {
		t.Error("a page with an unclosed table parsed")
	}
}

// TestHTMLChecksFolded checks that the checks are grouped by scenario,
// each check once, a group folded when all its checks passed and open when
// one failed, and that each scenario's section links to its group.
func TestHTMLChecksFolded(t *testing.T) {
	s := testSuite()
	root, err := parsePage(render(t, WriteHTML, s))
	if err != nil {
		t.Fatal(err)
	}
	type group struct {
		id      string
		open    bool
		results []string
	}
	var got []group
	for _, d := range root.all(tagClass("details", "checks")) {
		g := group{id: d.attrs["id"], open: d.attrs["open"] != ""}
		for _, tr := range d.all(tagClass("tr", "")) {
			if cells := tr.all(tagClass("td", "")); len(cells) > 0 {
				g.results = append(g.results, cells[0].content()+" "+cells[1].content()+"/"+cells[2].content())
			}
		}
		got = append(got, g)
	}
	want := []group{
		{"checks-hot-key", false, []string{"PASS hot-key/lease"}},
		{"checks-flush", true, []string{"FAIL flush/coalescing", "FAIL flush/lease"}},
	}
	if diff := cmp.Diff(want, got, cmp.AllowUnexported(group{})); diff != "" {
		t.Errorf("check groups (-want +got):\n%s", diff)
	}
	for _, sec := range root.all(tagClass("section", "scenario")) {
		var links []string
		for _, p := range sec.all(tagClass("p", "checks-line")) {
			for _, a := range p.all(tagClass("a", "")) {
				links = append(links, a.attrs["href"])
			}
		}
		want := "#checks-" + strings.TrimPrefix(sec.attrs["id"], "scenario-")
		if !slices.Equal(links, []string{want}) {
			t.Errorf("section %s links to checks %q, want %q", sec.attrs["id"], links, want)
		}
	}
}
