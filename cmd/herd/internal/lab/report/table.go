package report

import (
	"fmt"
	"io"
	"slices"
	"strings"
	"unicode/utf8"

	"github.com/herdcache/herd/cmd/herd/internal/lab"
)

// WriteTable writes the terminal summary: the configuration header; per
// scenario a table with one row per layer (and variant) holding origin
// calls, calls per expiry (one decimal), peak origin concurrency, p50, p99
// and p999 client latency (ms, one decimal), errors, shed, stale-served and
// waited-on-origin counts, followed by any scenario-specific figures; then predicted against
// measured figures with their ±20% verdict, if any; then one PASS or FAIL
// line per check, if any.
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
		b.WriteString("\ncalls = origin calls; /expiry = origin calls per expiry event; " +
			"peak = peak origin concurrency; p50, p99, p999 = client latency in ms\n")
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
		for _, r := range g.Runs {
			if len(r.Extra) == 0 {
				continue
			}
			fmt.Fprintf(&b, "  %s:", layerLabel(r))
			for _, k := range sortedKeys(r.Extra) {
				fmt.Fprintf(&b, " %s=%s", k, fmtSig(r.Extra[k]))
			}
			b.WriteString("\n")
		}
	}

	if len(s.Predictions) > 0 {
		b.WriteString("\npredictions (measured within ±20% of predicted?)\n")
		rows := [][]string{{"preset", "layer", "what", "predicted", "measured", "ratio", "verdict"}}
		for _, p := range s.Predictions {
			rows = append(rows, []string{
				p.Preset, p.Layer, p.What, fmtSig(p.Predicted), fmtSig(p.Measured), ratio(p), verdict(p),
			})
		}
		writeAligned(&b, rows, []bool{true, true, true, false, false, false, true})
	}

	if len(s.Checks) > 0 {
		passed, failed := countChecks(s.Checks)
		fmt.Fprintf(&b, "\nchecks: %d passed, %d failed\n", passed, failed)
		for _, c := range s.Checks {
			fmt.Fprintf(&b, "  %s  %s / %s: %s", passFail(c.OK), c.Scenario, c.Layer, c.Promise)
			if c.Measured != "" {
				fmt.Fprintf(&b, " (measured %s)", c.Measured)
			}
			b.WriteString("\n")
		}
	}

	if _, err := io.WriteString(w, b.String()); err != nil {
		return fmt.Errorf("report: writing table: %w", err)
	}
	return nil
}

// writeAligned writes rows as columns two spaces apart, indented by two,
// padding text columns (left[i]) on the right and numbers on the left.
// The first row is the header.
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
