package report

import (
	"context"
	"encoding/xml"
	"errors"
	"fmt"
	"io"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"testing/synctest"
	"time"

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
// with its data-bucket-ms; a latency chart without its unit; a check
// without its observation count, or one that judged nothing yet passed.
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
	}
	for _, fig := range root.all(tagClass("figure", "latency-chart")) {
		if units := fig.all(tagClass("text", "unit")); len(units) != 1 || !strings.Contains(units[0].content(), "(ms") {
			bad("latency chart %s does not state its unit", fig.attrs["data-scenario"])
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
	})
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
		"a latency chart without its unit": {
			`client latency (ms, log scale)`, `client latency`,
			"does not state its unit"},
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
