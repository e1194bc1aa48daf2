// Package herdprom exports the statistics of herd caches as Prometheus metrics.
package herdprom

import (
	"errors"
	"fmt"
	"reflect"
	"slices"
	"sync"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/herdcache/herd/observe"
	"github.com/herdcache/herd/observe/metricdef"
)

// Source is what a Collector reads: any [herd.Cache], whatever its value
// type. Its Name is the value of the "cache" label.
type Source interface {
	Name() string
	Stats() observe.Stats
}

// DefaultName is the cache label of a Source whose Name is empty (a
// herd.Cache never is: it calls itself "default").
const DefaultName = "default"

// Collector is a prometheus.Collector for herd caches. At every scrape it
// reads each cache's Stats once and sends constant metrics labelled with the
// cache's name (label "cache"). One Collector serves any number of caches:
// register one per registry (a second is refused as a duplicate) and Add
// caches to it, before or after registering. It is safe for concurrent use.
//
// The metrics are those herdotel exports, under the same names with
// underscores: herd.requests is herd_requests_total, herd.load.duration is
// herd_load_duration_seconds. Each reads the Stats field of the same name;
// the help text of each says what it counts.
//
// Every label has a bounded set of values. The only label whose values come
// from keys is "key" on the herd_hot_key_* metrics: at most Options.HotKeys
// values per cache (the keys with the most traffic now), as the cache
// reports them, that is a namespace and a short hash unless
// Options.HotKeyNames is set. A key that leaves the top-K stops being
// exported; if it comes back its counters start again from zero, which
// rate() treats as a counter reset. Two keys whose short hashes collide are
// exported as one, their counts summed.
//
// The herd_limiter_* metrics describe the limiter the cache uses: caches
// that share a limiter report the same figures, so aggregate them with max,
// not sum (herd_shed_total is the cache's own share). They, herd_shed_total
// and herd_queue_wait_seconds are exported only for caches that have a
// limiter.
type Collector struct {
	mu sync.RWMutex
	// caches maps each cache label to its Source; names are never empty and
	// sources never nil. Guarded by mu.
	caches map[string]Source
}

// New returns a Collector for caches, each under its Name; more may be
// added with [Collector.Add]. A nil Source or two of one name is an error.
func New(caches ...Source) (*Collector, error) {
	c := &Collector{}
	for _, s := range caches {
		if err := c.Add(s); err != nil {
			return nil, err
		}
	}
	return c, nil
}

// Add makes c export s under the cache label s.Name(); the empty name
// stands for [DefaultName]. A nil s or a name already in use is an error.
func (c *Collector) Add(s Source) error {
	if s == nil {
		return errors.New("herdprom: nil Source")
	}
	name := s.Name()
	if name == "" {
		name = DefaultName
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.caches == nil {
		c.caches = map[string]Source{}
	}
	if _, dup := c.caches[name]; dup {
		return fmt.Errorf("herdprom: cache %q added twice", name)
	}
	c.caches[name] = s
	return nil
}

// family is one metric of metricdef.Metrics as Prometheus sees it.
type family struct {
	def  *metricdef.Metric
	desc *prometheus.Desc
	typ  prometheus.ValueType
}

var families = func() []family {
	fs := make([]family, len(metricdef.Metrics))
	for i := range metricdef.Metrics {
		m := &metricdef.Metrics[i]
		labels := []string{metricdef.CacheLabel}
		if m.Scope == metricdef.PerHotKey {
			labels = append(labels, metricdef.KeyLabel)
		}
		if m.Label != "" {
			labels = append(labels, m.Label)
		}
		typ := prometheus.GaugeValue
		if m.Kind == metricdef.Counter {
			typ = prometheus.CounterValue
		}
		fs[i] = family{def: m, desc: prometheus.NewDesc(m.PromName(), m.Help, labels, nil), typ: typ}
	}
	return fs
}()

// Describe sends the descriptors of every metric c may export.
func (c *Collector) Describe(ch chan<- *prometheus.Desc) {
	for _, f := range families {
		ch <- f.desc
	}
}

// Collect reads the Stats of every cache once and sends their metrics.
func (c *Collector) Collect(ch chan<- prometheus.Metric) {
	c.mu.RLock()
	names := make([]string, 0, len(c.caches))
	sources := make([]Source, 0, len(c.caches))
	for name, s := range c.caches {
		names = append(names, name)
		sources = append(sources, s)
	}
	c.mu.RUnlock()
	for i, name := range names {
		collect(ch, name, sources[i].Stats())
	}
}

func collect(ch chan<- prometheus.Metric, name string, st observe.Stats) {
	stats := reflect.ValueOf(st)
	for _, f := range families {
		if !f.def.Exported(&st) {
			continue
		}
		switch f.def.Scope {
		case metricdef.PerHotKey:
			for _, k := range st.HotKeys {
				send(ch, f, reflect.ValueOf(k), name, k.Key)
			}
			continue
		}
		if f.def.Kind == metricdef.Histogram {
			ch <- histogram(f.desc, f.def.Series[0].Histogram(stats), name)
			continue
		}
		send(ch, f, stats, name)
	}
}

// send sends each series of f read from v, labelled with labels and the
// series' own label value.
func send(ch chan<- prometheus.Metric, f family, v reflect.Value, labels ...string) {
	for i := range f.def.Series {
		s := &f.def.Series[i]
		ls := labels
		if f.def.Label != "" {
			ls = append(slices.Clip(labels), s.Value)
		}
		ch <- prometheus.MustNewConstMetric(f.desc, f.typ, s.Float64(v), ls...)
	}
}

// histogram converts h to a Prometheus histogram: bounds in seconds, counts
// cumulative, the implied top bucket as +Inf. A malformed h fails the scrape
// of this one metric with an error.
func histogram(d *prometheus.Desc, h observe.Histogram, name string) prometheus.Metric {
	if err := check(h); err != nil {
		return prometheus.NewInvalidMetric(d, fmt.Errorf("herdprom: cache %q: %w", name, err))
	}
	buckets := make(map[float64]uint64, len(h.Bounds))
	var cum uint64
	for i, b := range h.Bounds {
		cum += h.Counts[i]
		buckets[b.Seconds()] = cum
	}
	return prometheus.MustNewConstHistogram(d, h.Count, h.Sum.Seconds(), buckets, name)
}

// check reports whether h is a histogram as [observe.Histogram] describes it;
// the zero Histogram is an empty one.
func check(h observe.Histogram) error {
	if len(h.Counts) == 0 && len(h.Bounds) == 0 {
		if h.Count != 0 {
			return fmt.Errorf("histogram without buckets has count %d", h.Count)
		}
		return nil
	}
	if len(h.Counts) != len(h.Bounds)+1 {
		return fmt.Errorf("histogram has %d bounds and %d counts, want one count more", len(h.Bounds), len(h.Counts))
	}
	var n uint64
	for i, c := range h.Counts {
		if i > 0 && i < len(h.Bounds) && h.Bounds[i] <= h.Bounds[i-1] {
			return fmt.Errorf("histogram bounds not ascending: %v", h.Bounds)
		}
		n += c
	}
	if n != h.Count {
		return fmt.Errorf("histogram counts add up to %d, count is %d", n, h.Count)
	}
	return nil
}
