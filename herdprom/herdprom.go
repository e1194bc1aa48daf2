// Package herdprom exports the statistics of herd caches as Prometheus metrics.
package herdprom

import (
	"fmt"
	"slices"
	"sync"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/herdcache/herd"
	"github.com/herdcache/herd/limiter"
)

// Source is what a Collector reads: any [herd.Cache], whatever its value type.
type Source interface {
	Stats() herd.Stats
}

// DefaultName is the cache label of a cache added under the empty name, as
// herd.Options.Name calls a cache without a name.
const DefaultName = "default"

// Collector is a prometheus.Collector for herd caches. At every scrape it
// reads each cache's Stats once and sends constant metrics labelled with the
// cache's name (label "cache"). One Collector serves any number of caches:
// register one per registry (a second is refused as a duplicate) and Add
// caches to it, before or after registering. It is safe for concurrent use.
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
// The herd_shed_total, herd_shed_by_priority_total and herd_limiter_*
// metrics describe the limiter the cache uses: caches that share a limiter
// report the same figures, so aggregate them with max, not sum
// (herd_loads_shed_total is the cache's own share). They are exported only
// for caches that have a limiter.
type Collector struct {
	mu sync.RWMutex
	// caches maps each cache label to its Source; names are never empty and
	// sources never nil. Guarded by mu.
	caches map[string]Source
}

// NewCollector returns a Collector for caches, keyed by the value of their
// "cache" label; the empty name stands for [DefaultName]. A nil Source is an
// error. The map is copied.
func NewCollector(caches map[string]Source) (*Collector, error) {
	c := &Collector{caches: make(map[string]Source, len(caches))}
	names := make([]string, 0, len(caches))
	for name := range caches {
		names = append(names, name)
	}
	slices.Sort(names) // the same error for the same map
	for _, name := range names {
		if err := c.Add(name, caches[name]); err != nil {
			return nil, err
		}
	}
	return c, nil
}

// Add makes c export s under the cache label name; the empty name stands for
// [DefaultName]. A nil s or a name already in use is an error.
func (c *Collector) Add(name string, s Source) error {
	if s == nil {
		return fmt.Errorf("herdprom: cache %q: nil Source", name)
	}
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

// New returns a Collector for the one cache s under the cache label name;
// more may be added with [Collector.Add].
func New(name string, s Source) (*Collector, error) {
	c := &Collector{}
	if err := c.Add(name, s); err != nil {
		return nil, err
	}
	return c, nil
}

func desc(name, help string, labels ...string) *prometheus.Desc {
	return prometheus.NewDesc(name, help, append([]string{"cache"}, labels...), nil)
}

var (
	requestsDesc = desc("herd_requests_total",
		"Get calls by how they were answered: hit (a fresh value, from either tier; not counted with DisableStats), "+
			"miss (waited for the remote tier, a lease holder or a load), "+
			"stale (stale value served, including misses answered stale, which also count as miss), "+
			"negative (ErrNotFound served from a negative entry, also counted as hit or miss).",
		"result")
	remoteHitsDesc = desc("herd_remote_hits_total",
		"Fresh values read from the remote tier; also counted in herd_requests_total{result=\"hit\"}.")
	remoteWaitsDesc = desc("herd_remote_waits_total",
		"Get calls that waited on a read of the remote tier: no local copy, or one older than twice NearTTL.")
	revalidationsDesc = desc("herd_revalidations_total",
		"Background reads of the remote tier that replaced a local copy past NearTTL or superseded by a change notice, while readers were served the copy.")
	loadsDesc = desc("herd_loads_total",
		"Calls of a load function (backing-store calls), by outcome.", "outcome")
	loadDurationDesc = desc("herd_load_duration_seconds",
		"How long load functions took.")
	coalescedDesc = desc("herd_coalesced_total",
		"Callers that joined another caller's load instead of calling their own.")
	refreshesDesc = desc("herd_refreshes_total",
		"Background refreshes started: early (a read came after the value's early-refresh instant), stale (a stale value was read) "+
			"or ahead (refresh-ahead of a pinned or hot key).",
		"kind")
	refreshFailuresDesc = desc("herd_refresh_failures_total",
		"Background refreshes whose load failed; the old value is kept until its hard TTL.")
	staleIfErrorDesc = desc("herd_stale_if_error_total",
		"Stale values served because a load failed.")
	concurrencyDesc = desc("herd_recompute_concurrency",
		"The most loads of one key running at once in this process now; above 1 only without coalescing.")
	concurrencyMaxDesc = desc("herd_recompute_concurrency_max",
		"The most loads of one key ever running at once in this process.")
	loadsRunningDesc = desc("herd_loads_running",
		"Loads running now in this process, all keys together.")
	flightsDesc = desc("herd_flights_running",
		"Coalesced loads (flights, with their waiting callers) running now.")
	leaseEventsDesc = desc("herd_lease_events_total",
		"Cross-replica lease events: acquired (this replica loads), contended (another replica held it), "+
			"wait_timeout (a waiting loser gave up), lost (expired or moved before release), "+
			"extended (watchdog extension), fenced_write (a write refused because a newer write or invalidation won).",
		"event")
	leaseWakeupsDesc = desc("herd_lease_wakeups_total",
		"Waiting lease losers that got the holder's value, by what woke them: push (completion notice) or poll (fallback re-read).",
		"by")
	leaseWaitDesc = desc("herd_lease_wait_seconds",
		"How long lease losers waited for the holder's value.")
	queueWaitDesc = desc("herd_limiter_queue_wait_seconds",
		"How long this cache's foreground loads waited for a limiter slot, shed ones included.")
	limiterInUseDesc = desc("herd_limiter_in_use",
		"Limiter slots held now (the limiter may be shared by several caches).")
	limiterLimitDesc = desc("herd_limiter_limit",
		"Limiter slots in all: the cap on concurrent backing-store calls.")
	limiterWaitingDesc = desc("herd_limiter_waiting",
		"Loads waiting for a limiter slot now.")
	limiterAcquiredDesc = desc("herd_limiter_acquired_total",
		"Limiter slots granted, foreground and background.")
	limiterCanceledDesc = desc("herd_limiter_canceled_total",
		"Calls whose context ended while they waited for a limiter slot; not shed.")
	limiterMaxDesc = desc("herd_limiter_in_use_max",
		"The most limiter slots ever held at once.")
	loadsShedDesc = desc("herd_loads_shed_total",
		"Loads of this cache that the limiter refused; herd_shed_total counts the whole limiter, which caches may share.")
	shedDesc = desc("herd_shed_total",
		"Calls the limiter refused, by reason: queue-timeout, queue-full (Low priority, queue too long) or reserve (background, only reserved slots free).",
		"reason")
	shedPriorityDesc = desc("herd_shed_by_priority_total",
		"Calls the limiter refused, by priority of the call: low, normal, high or background.",
		"priority")
	remoteErrorsDesc = desc("herd_remote_errors_total",
		"Failed calls to the remote tier (Store and Lease).")
	decodeErrorsDesc = desc("herd_decode_errors_total",
		"Remote values that could not be decoded, served as misses.")
	encodeErrorsDesc = desc("herd_encode_errors_total",
		"Values the codec could not encode, served but not cached.")
	breakerOpenDesc = desc("herd_breaker_open",
		"1 while the breaker is open and remote calls are skipped, else 0.")
	breakerOpensDesc = desc("herd_breaker_opens_total",
		"Times the breaker opened after repeated remote failures.")
	degradedDesc = desc("herd_degraded_seconds_total",
		"Total time the breaker has been open, the current spell included.")
	hotRequestsDesc = desc("herd_hot_key_requests_total",
		"Estimated requests for each of the keys with the most traffic (hits sampled, may overcount); at most Options.HotKeys keys per cache.",
		"key")
	hotMissesDesc = desc("herd_hot_key_misses_total",
		"Misses of each hot key since it was first tracked.", "key")
	hotLoadsDesc = desc("herd_hot_key_loads_total",
		"Loads of each hot key since it was first tracked.", "key")
	hotStaleDesc = desc("herd_hot_key_stale_total",
		"Stale values served for each hot key since it was first tracked.", "key")
)

var allDescs = []*prometheus.Desc{
	requestsDesc, remoteHitsDesc, remoteWaitsDesc, revalidationsDesc, loadsDesc, loadDurationDesc, coalescedDesc, refreshesDesc,
	refreshFailuresDesc, staleIfErrorDesc, concurrencyDesc, concurrencyMaxDesc,
	loadsRunningDesc, flightsDesc, leaseEventsDesc, leaseWakeupsDesc, leaseWaitDesc,
	queueWaitDesc, limiterInUseDesc, limiterLimitDesc, limiterWaitingDesc,
	limiterAcquiredDesc, limiterCanceledDesc, limiterMaxDesc, loadsShedDesc, shedDesc, shedPriorityDesc, remoteErrorsDesc,
	decodeErrorsDesc, encodeErrorsDesc, breakerOpenDesc, breakerOpensDesc,
	degradedDesc, hotRequestsDesc, hotMissesDesc, hotLoadsDesc, hotStaleDesc,
}

// Describe sends the descriptors of every metric c may export.
func (c *Collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range allDescs {
		ch <- d
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

func collect(ch chan<- prometheus.Metric, name string, st herd.Stats) {
	counter := func(d *prometheus.Desc, v float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, v, append([]string{name}, labels...)...)
	}
	gauge := func(d *prometheus.Desc, v float64) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, name)
	}
	count := func(d *prometheus.Desc, n int64, labels ...string) { counter(d, float64(n), labels...) }

	count(requestsDesc, st.Hits, "hit")
	count(requestsDesc, st.Misses, "miss")
	count(requestsDesc, st.StaleServed, "stale")
	count(requestsDesc, st.NegativeHits, "negative")
	count(remoteHitsDesc, st.RemoteHits)
	count(remoteWaitsDesc, st.RemoteWaits)
	count(revalidationsDesc, st.Revalidations)
	count(loadsDesc, st.Loads-st.LoadErrors, "ok")
	count(loadsDesc, st.LoadErrors, "error")
	ch <- histogram(loadDurationDesc, st.LoadDuration, name)
	count(coalescedDesc, st.Coalesced)
	count(refreshesDesc, st.EarlyRefreshes, "early")
	count(refreshesDesc, st.StaleRefreshes, "stale")
	count(refreshesDesc, st.AheadRefreshes, "ahead")
	count(refreshFailuresDesc, st.RefreshFailures)
	count(staleIfErrorDesc, st.StaleIfError)
	gauge(concurrencyDesc, float64(st.KeyConcurrency))
	gauge(concurrencyMaxDesc, float64(st.KeyConcurrencyMax))
	gauge(loadsRunningDesc, float64(st.LoadsRunning))
	gauge(flightsDesc, float64(st.InFlight))

	count(leaseEventsDesc, st.LeaseAcquired, "acquired")
	count(leaseEventsDesc, st.LeaseContended, "contended")
	count(leaseEventsDesc, st.LeaseWaitTimeouts, "wait_timeout")
	count(leaseEventsDesc, st.LeaseLost, "lost")
	count(leaseEventsDesc, st.LeaseExtended, "extended")
	count(leaseEventsDesc, st.FencedWrites, "fenced_write")
	count(leaseWakeupsDesc, st.WokenByPush, "push")
	count(leaseWakeupsDesc, st.WokenByPoll, "poll")
	ch <- histogram(leaseWaitDesc, st.LeaseWait, name)

	if l := st.Limiter; l.Limit > 0 {
		ch <- histogram(queueWaitDesc, st.QueueWait, name)
		gauge(limiterInUseDesc, float64(l.InUse))
		gauge(limiterLimitDesc, float64(l.Limit))
		gauge(limiterWaitingDesc, float64(l.Waiting))
		counter(limiterAcquiredDesc, float64(l.Acquired))
		counter(limiterCanceledDesc, float64(l.Canceled))
		gauge(limiterMaxDesc, float64(l.MaxInUse))
		count(loadsShedDesc, st.Shed)
		counter(shedDesc, float64(l.ShedQueueTimeout), limiter.ReasonQueueTimeout)
		counter(shedDesc, float64(l.ShedQueueFull), limiter.ReasonQueueFull)
		counter(shedDesc, float64(l.ShedReserve), limiter.ReasonReserve)
		counter(shedPriorityDesc, float64(l.ShedLow), "low")
		counter(shedPriorityDesc, float64(l.ShedNormal), "normal")
		counter(shedPriorityDesc, float64(l.ShedHigh), "high")
		counter(shedPriorityDesc, float64(l.ShedBackground), "background")
	}

	count(remoteErrorsDesc, st.RemoteErrors)
	count(decodeErrorsDesc, st.DecodeErrors)
	count(encodeErrorsDesc, st.EncodeErrors)
	open := 0.0
	if st.Degraded {
		open = 1
	}
	gauge(breakerOpenDesc, open)
	count(breakerOpensDesc, st.BreakerOpens)
	counter(degradedDesc, st.DegradedTime.Seconds())

	for _, k := range st.HotKeys {
		counter(hotRequestsDesc, float64(k.Traffic), k.Key)
		counter(hotMissesDesc, float64(k.Misses), k.Key)
		counter(hotLoadsDesc, float64(k.Loads), k.Key)
		counter(hotStaleDesc, float64(k.Stale), k.Key)
	}
}

// histogram converts h to a Prometheus histogram: bounds in seconds, counts
// cumulative, the implied top bucket as +Inf. A malformed h fails the scrape
// of this one metric with an error.
func histogram(d *prometheus.Desc, h herd.Histogram, name string) prometheus.Metric {
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

// check reports whether h is a histogram as [herd.Histogram] describes it;
// the zero Histogram is an empty one.
func check(h herd.Histogram) error {
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
