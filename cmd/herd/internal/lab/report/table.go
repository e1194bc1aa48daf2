package report

import (
	"fmt"
	"io"
	"slices"
	"strings"
	"unicode/utf8"

	"github.com/herdcache/herd/cmd/herd/internal/lab"
)

// WriteTable writes the terminal summary: the configuration header; a
// legend of the ladder and of the columns; per scenario a table with one
// row per layer (and variant) holding origin calls, calls per expiry (one
// decimal), peak origin concurrency, p50, p99 and p999 client latency (3
// significant digits with a unit: ms, µs below a millisecond), errors, shed,
// stale-served and waited-on-origin counts, then the scenario-specific
// figures by their labels, one row per figure and one column per layer (a
// table per variant); then predicted against measured figures with their
// band and verdict, and notes on them, if any; then one PASS or FAIL line
// per check with what it judged, if any.
func WriteTable(w io.Writer, s *lab.Suite) error {
	if s == nil {
		return errNilSuite
	}
	var b strings.Builder

	b.WriteString("herd lab")
	if when := started(s); when != "" {
		b.WriteString(" — " + when)
	}
	b.WriteString("\n")
	hdr := headerFields(s)
	width := 0
	for _, f := range hdr {
		width = max(width, utf8.RuneCountInString(f.Name))
	}
	for _, f := range hdr {
		fmt.Fprintf(&b, "  %-*s  %s\n", width+1, f.Name+":", f.Value)
	}

	groups := byScenario(s.Runs)
	if len(groups) == 0 {
		b.WriteString("\nno runs\n")
	} else {
		writeLegend(&b, s)
	}
	for _, g := range groups {
		fmt.Fprintf(&b, "\nscenario %s\n", g.Name)
		head := make([]string, len(summaryColumns))
		left := make([]bool, len(summaryColumns))
		for i, c := range summaryColumns {
			head[i], left[i] = c.Short, c.Left
		}
		rows := [][]string{head}
		for _, r := range g.Runs {
			rows = append(rows, summaryCells(r))
		}
		writeAligned(&b, rows, left)
		for _, fg := range figureGroups(g.Runs) {
			corner := ""
			if fg.Variant != "" {
				corner = "(" + fg.Variant + ")"
			}
			rows := [][]string{append([]string{corner}, fg.Layers...)}
			for _, fr := range fg.Rows {
				rows = append(rows, append([]string{fr.Figure.Label}, fr.Cells...))
			}
			b.WriteString("\n")
			writeAligned(&b, rows, []bool{true})
		}
	}

	if len(s.Predictions) > 0 {
		checked := slices.ContainsFunc(s.Predictions, func(p lab.Prediction) bool { return p.Checked })
		b.WriteString("\npredictions: the formula's calls per expiry beside the measured mean")
		if !checked {
			b.WriteString(" (not checks: only a --preset checks them)")
		}
		b.WriteString("\n")
		rows := [][]string{{}}
		left := make([]bool, len(predictionColumns))
		for i, c := range predictionColumns {
			rows[0] = append(rows[0], c.Short)
			left[i] = c.Left
		}
		for _, p := range s.Predictions {
			rows = append(rows, []string{
				p.Layer, fmtSig(p.Predicted), fmtSig(p.Measured), ratio(p), band(p), itoa(p.Expiries), verdict(p),
			})
		}
		writeAligned(&b, rows, left)
		for _, p := range s.Predictions {
			if p.Note != "" {
				fmt.Fprintf(&b, "  %s: %s\n", p.Layer, p.Note)
			}
		}
	}

	if len(s.Checks) > 0 {
		passed, failed := countChecks(s.Checks)
		fmt.Fprintf(&b, "\nchecks: %d passed, %d failed\n", passed, failed)
		for _, c := range s.Checks {
			fmt.Fprintf(&b, "  %s  %s / %s: %s (", passFail(c.OK), c.Scenario, c.Layer, c.Promise)
			if c.Measured != "" {
				fmt.Fprintf(&b, "measured %s; ", c.Measured)
			}
			fmt.Fprintf(&b, "judged %s", observations(c))
			if c.Observations <= 0 {
				b.WriteString(": nothing to judge")
			}
			b.WriteString(")\n")
		}
	}

	if _, err := io.WriteString(w, b.String()); err != nil {
		return fmt.Errorf("report: writing table: %w", err)
	}
	return nil
}

// writeLegend explains the ladder of the suite's layers and the columns of
// the scenario tables, and, with checks, what a check judges.
func writeLegend(b *strings.Builder, s *lab.Suite) {
	b.WriteString("\nHow to read this report. " + ladderIntro + "\n")
	rows := [][]string{}
	for _, l := range ladder(s.Runs) {
		rows = append(rows, []string{l, layerDoc(l)})
	}
	writeAligned(b, rows, []bool{true, true})
	b.WriteString("Columns of the scenario tables (the rows below each table are scenario-specific figures, per layer):\n")
	rows = rows[:0]
	for _, c := range summaryColumns {
		rows = append(rows, []string{c.Short, c.Doc})
	}
	writeAligned(b, rows, []bool{true, true})
	if len(s.Checks) > 0 {
		b.WriteString(checksIntro + "\n")
	}
}

// writeAligned writes rows as columns two spaces apart, indented by two,
// padding text columns (left[i]) on the right and numbers on the left.
func writeAligned(b *strings.Builder, rows [][]string, left []bool) {
	var widths []int
	for _, row := range rows {
		for i, cell := range row {
			if i >= len(widths) {
				widths = append(widths, 0)
			}
			widths[i] = max(widths[i], utf8.RuneCountInString(cell))
		}
	}
	for _, row := range rows {
		var line strings.Builder
		for i, cell := range row {
			pad := strings.Repeat(" ", widths[i]-utf8.RuneCountInString(cell))
			line.WriteString("  ")
			if i < len(left) && left[i] {
				line.WriteString(cell + pad)
			} else {
				line.WriteString(pad + cell)
			}
		}
		b.WriteString(strings.TrimRight(line.String(), " "))
		b.WriteString("\n")
	}
}

// sortedKeys returns the keys of m in ascending order.
func sortedKeys(m map[string]float64) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}
