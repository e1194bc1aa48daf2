package metricdef

import (
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/herdcache/herd/observe"
)

// leaves returns the paths of t's fields that hold values, recursing into
// structs (embedded ones by their fields' names, as a promoted path reads
// them) and into the element of a slice of structs.
func leaves(t reflect.Type, prefix string) []string {
	var out []string
	for f := range t.Fields() {
		if !f.IsExported() {
			continue
		}
		path := prefix + f.Name
		if f.Anonymous {
			out = append(out, leaves(f.Type, prefix)...)
			continue
		}
		switch {
		case f.Type == histogramType || f.Type == durationType:
			out = append(out, path)
		case f.Type.Kind() == reflect.Struct:
			out = append(out, leaves(f.Type, path+".")...)
		case f.Type.Kind() == reflect.Slice && f.Type.Elem().Kind() == reflect.Struct:
			out = append(out, path)
			out = append(out, leaves(f.Type.Elem(), path+".")...)
		default:
			out = append(out, path)
		}
	}
	return out
}

// Every field of observe.Stats, down to the limiter's and the hot keys', is
// read by a metric or listed as not needing one; a field added to Stats
// without a metric fails here.
func TestEveryStatsFieldIsExported(t *testing.T) {
	read := map[string]bool{}
	for _, m := range Metrics {
		for _, s := range m.Series {
			prefix := ""
			if m.Scope == PerHotKey {
				prefix = "HotKeys."
			}
			read[prefix+s.Field] = true
			for _, f := range s.Minus {
				read[prefix+f] = true
			}
		}
	}
	all := leaves(statsType, "")
	if len(all) < 40 {
		t.Fatalf("found only %d Stats fields: %q", len(all), all)
	}
	for _, f := range all {
		if !read[f] && Unlisted[f] == "" {
			t.Errorf("Stats field %s is read by no metric", f)
		}
		delete(read, f)
	}
	for f := range read {
		t.Errorf("a metric reads %s, which is not a Stats field path", f)
	}
}

// Each series reads the field it names: with every numeric field of a Stats
// set to a distinct value, a series gives its field's value less its
// Minus fields'.
func TestSeriesReadTheirFields(t *testing.T) {
	var st observe.Stats
	var hk observe.HotKey
	want := map[string]float64{}
	set := func(v reflect.Value, t reflect.Type, prefix string) {
		n := 1.0
		for _, path := range leaves(t, "") {
			if strings.HasPrefix(path, "HotKeys") {
				continue // set in hk
			}
			idx, ft := index(t, path)
			f := v.FieldByIndex(idx)
			switch {
			case ft == durationType:
				f.SetInt(int64(n)) // nanoseconds, read as seconds
				want[prefix+path] = time.Duration(n).Seconds()
				n *= 2
				continue
			case f.Kind() == reflect.Bool:
				f.SetBool(true)
				want[prefix+path] = 1
				continue
			case f.CanInt():
				f.SetInt(int64(n))
			case f.CanUint():
				f.SetUint(uint64(n))
			default:
				continue
			}
			want[prefix+path] = n
			n *= 2 // distinct sums of distinct powers of two
		}
	}
	set(reflect.ValueOf(&st).Elem(), statsType, "")
	set(reflect.ValueOf(&hk).Elem(), hotKeyType, "HotKeys.")
	st.Loads = 1 << 20 // above the fields subtracted from it
	want["Loads"] = 1 << 20

	checked := 0
	for _, m := range Metrics {
		v, prefix := reflect.ValueOf(st), ""
		if m.Scope == PerHotKey {
			v, prefix = reflect.ValueOf(hk), "HotKeys."
		}
		for _, s := range m.Series {
			if m.Kind == Histogram {
				continue
			}
			w := want[prefix+s.Field]
			for _, f := range s.Minus {
				w -= want[prefix+f]
			}
			if got := s.Float64(v); got != w {
				t.Errorf("%s{%s=%q} = %v, want %v (from %s)", m.Name, m.Label, s.Value, got, w, s.Field)
			}
			checked++
		}
	}
	if checked < 50 {
		t.Errorf("checked only %d series", checked)
	}
}

// Names follow the one rule, and no two metrics or series share one.
func TestNames(t *testing.T) {
	prom := map[string]bool{}
	for _, m := range Metrics {
		if m.Help == "" || m.Unit == "" {
			t.Errorf("%s has no help or unit", m.Name)
		}
		if prom[m.PromName()] {
			t.Errorf("two metrics are named %s", m.PromName())
		}
		prom[m.PromName()] = true
		values := map[string]bool{}
		for _, s := range m.Series {
			if (s.Value == "") != (m.Label == "") || values[s.Value] {
				t.Errorf("%s: series %q under label %q", m.Name, s.Value, m.Label)
			}
			values[s.Value] = true
		}
		for _, o := range Metrics {
			if strings.HasPrefix(o.Name, m.Name+".") {
				t.Errorf("metric %s is also the namespace of %s", m.Name, o.Name)
			}
		}
	}
	for name, want := range map[string]string{
		"requests": "herd_requests_total", "load.duration": "herd_load_duration_seconds",
		"key.concurrency": "herd_key_concurrency", "degraded_time": "herd_degraded_time_seconds_total",
	} {
		if got := Lookup(name).PromName(); got != want {
			t.Errorf("%s's Prometheus name is %s, want %s", name, got, want)
		}
	}
}
