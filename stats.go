package herd

import (
	"sync/atomic"
	"unsafe"

	"github.com/herdcache/herd/internal/topk"
	"github.com/herdcache/herd/observe"
)

// Stats returns a snapshot of the cache's counters.
func (c *Cache[V]) Stats() observe.Stats {
	s := &c.st
	degraded, opens := c.brk.degraded()
	running, keyNow, keyMax := c.keyLoads.snapshot()
	var ls observe.LimiterStats
	if l := c.cfg.Limiter; l != nil {
		ls = observe.LimiterStats{Limit: l.Limit(), InUse: l.InUse(), Waiting: l.Waiting(), Stats: l.Stats()}
	}
	return observe.Stats{
		Limiter:              ls,
		HotKeys:              c.hotKeys(),
		LoadsRunning:         running,
		KeyConcurrency:       keyNow,
		KeyConcurrencyMax:    keyMax,
		LoadDuration:         c.loadDur.snapshot(),
		LeaseWait:            c.waitDur.snapshot(),
		QueueWait:            c.queueDur.snapshot(),
		Degraded:             c.brk.open(),
		DegradedTime:         degraded,
		BreakerOpens:         opens,
		Hits:                 s.hits.load(),
		RemoteHits:           s.remoteHits.load(),
		RemoteWaits:          s.remoteWaits.load(),
		Revalidations:        s.revalidations.load(),
		NoticeValuesAdopted:  s.noticeValuesAdopted.load(),
		NoticeValuesRefused:  s.noticeValuesRefused.load(),
		Misses:               s.misses.load(),
		NegativeHits:         s.negativeHits.load(),
		StaleServed:          s.staleServed.load(),
		StaleIfError:         s.staleIfError.load(),
		EarlyRefreshes:       s.earlyRefreshes.load(),
		AheadRefreshes:       s.aheadRefreshes.load(),
		StaleRefreshes:       s.staleRefreshes.load(),
		RefreshFailures:      s.refreshFailures.load(),
		Loads:                s.loads.load(),
		LoadErrors:           s.loadErrors.load(),
		LoadsNotFound:        s.loadsNotFound.load(),
		Coalesced:            s.coalesced.load(),
		LeaseAcquired:        s.leaseAcquired.load(),
		LeaseContended:       s.leaseContended.load(),
		LeaseWaitTimeouts:    s.leaseWaitTimeouts.load(),
		LeaseWaitsAbandoned:  s.leaseWaitsAbandoned.load(),
		LeaseExtended:        s.leaseExtended.load(),
		LeaseLost:            s.leaseLost.load(),
		WokenByPush:          s.wokenByPush.load(),
		WokenByPoll:          s.wokenByPoll.load(),
		FencedWrites:         s.fencedWrites.load(),
		LeaseHoldsHeard:      s.leaseHoldsHeard.load(),
		LeaseAttemptsSkipped: s.leaseAttemptsSkipped.load(),
		Shed:                 s.shed.load(),
		RemoteErrors:         s.remoteErrors.load(),
		DecodeErrors:         s.decodeErrors.load(),
		EncodeErrors:         s.encodeErrors.load(),
		WriteBackErrors:      s.writeBackErrors.load(),
		InFlight:             c.flights.InFlight(),
		LocalWeight:          c.local.weight(),
	}
}

type counters struct {
	hits, remoteHits, misses, negativeHits, staleServed, staleIfError stripedCounter
	earlyRefreshes, staleRefreshes, refreshFailures                   stripedCounter
	loads, loadErrors, loadsNotFound, coalesced                       stripedCounter
	leaseAcquired, leaseContended, leaseWaitTimeouts                  stripedCounter
	leaseWaitsAbandoned, writeBackErrors                              stripedCounter
	leaseExtended, leaseLost, wokenByPush, wokenByPoll                stripedCounter
	fencedWrites, shed, remoteErrors, decodeErrors, encodeErrors      stripedCounter
	remoteWaits, revalidations, aheadRefreshes, hotSample             stripedCounter
	leaseHoldsHeard, leaseAttemptsSkipped                             stripedCounter
	noticeValuesAdopted, noticeValuesRefused                          stripedCounter
}

// got counts how a Get was answered.
func (c *Cache[V]) got(key string, r observe.GetResult) {
	c.recorder.RecordGet(r)
	switch r {
	case observe.ResultHit, observe.ResultNegative:
		if (c.hot != nil || c.shared != nil) && uint64(c.st.hotSample.add(1))*golden>>(64-hotSampleBits) == 0 {
			c.hot.Add(key, topk.Counts{Traffic: 1 << hotSampleBits})
			c.shared.Add(key, topk.Counts{Traffic: 1 << hotSampleBits})
		}
		if r == observe.ResultNegative {
			c.st.negativeHits.add(1)
		} else if !c.cfg.DisableStats {
			n := c.st.hits.add(1)
			// One hit in 256 of a stripe, on average, is handed to the hot-key
			// tracker; the Weyl-sequence test keeps a periodic access pattern
			// from always sampling the same keys.
			if c.top != nil && uint64(n)*golden>>(64-hitSampleBits) == 0 {
				c.top.Add(key, topk.Counts{Traffic: 1 << hitSampleBits})
			}
		}
	case observe.ResultStale:
		c.countStale(key)
		c.hot.Add(key, topk.Counts{Traffic: 1})
		c.shared.Add(key, topk.Counts{Traffic: 1})
	case observe.ResultMiss:
		c.st.misses.add(1)
		if c.top != nil {
			c.top.Add(key, topk.Counts{Traffic: 1, Misses: 1})
		}
		c.hot.Add(key, topk.Counts{Traffic: 1})
		c.shared.Add(key, topk.Counts{Traffic: 1})
	}
}

// hotSampleBits sets the sampling of hits for RefreshAheadHot: 1 in 16.
const hotSampleBits = 4

// hitSampleBits sets the hot-key tracker's sampling of hits: 1 in 256.
const hitSampleBits = 8

func (c *Cache[V]) countStale(key string) {
	c.st.staleServed.add(1)
	if c.top != nil {
		c.top.Add(key, topk.Counts{Traffic: 1, Stale: 1})
	}
}

func (c *Cache[V]) countLoad(key string) {
	if c.top != nil {
		c.top.Add(key, topk.Counts{Loads: 1})
	}
}

func (c *Cache[V]) hotKeys() []observe.HotKey {
	if c.top == nil {
		return nil
	}
	items := c.top.Top()
	hot := make([]observe.HotKey, 0, len(items))
	seen := make(map[string]int, len(items))
	for _, it := range items {
		key := it.Key
		if !c.cfg.HotKeyNames {
			key = RedactKey(key)
		}
		// Two keys whose redacted forms collide are reported as one, so
		// that every name appears once (a metrics series per name).
		if i, ok := seen[key]; ok {
			h := &hot[i]
			h.Traffic += it.Traffic
			h.Misses += it.Misses
			h.Loads += it.Loads
			h.Stale += it.Stale
			h.Error += it.Error
			continue
		}
		seen[key] = len(hot)
		hot = append(hot, observe.HotKey{Key: key, Traffic: it.Traffic, Misses: it.Misses, Loads: it.Loads, Stale: it.Stale, Error: it.Error})
	}
	return hot
}

// shed counts a load the limiter refused.
func (c *Cache[V]) shed(reason string, background bool) {
	c.st.shed.add(1)
	c.recorder.RecordShed(reason, background)
}

// stripedCounter is a counter that goroutines on many cores can add to
// without contending on one cache line: each goroutine adds to the stripe its
// stack address picks, which stays the same while it runs, so a stripe's line
// stays in one core's cache. Two goroutines that share a stripe only slow
// each other down. A shared random source or a sync.Pool of stripe tokens
// cost several times more on the hit path.
type stripedCounter struct {
	stripes [16]struct {
		n atomic.Int64
		_ [56]byte
	}
}

// golden is 2^64 divided by the golden ratio, for multiplicative hashing.
const golden = 0x9E3779B97F4A7C15

// add adds n to the calling goroutine's stripe and returns that stripe's new
// count.
func (s *stripedCounter) add(n int64) int64 {
	var here byte
	h := uint64(uintptr(unsafe.Pointer(&here))) >> 13 * golden // stacks are at least 8 KiB apart
	return s.stripes[h>>60].n.Add(n)
}

func (s *stripedCounter) load() int64 {
	var t int64
	for i := range s.stripes {
		t += s.stripes[i].n.Load()
	}
	return t
}

// Name returns Options.Name, or "default" when it is empty: the name to
// give the cache in metrics and logs.
func (c *Cache[V]) Name() string { return c.cfg.name() }

func (cfg *config[V]) name() string {
	if cfg.Name == "" {
		return "default"
	}
	return cfg.Name
}
