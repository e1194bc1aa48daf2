package herd

import (
	"math/rand/v2"
	"sync/atomic"
)

// Stats is a snapshot of a cache's counters since it was made.
type Stats struct {
	Hits           int64 // fresh values served from the local tier
	Misses         int64 // Gets that found no value they could serve at once
	NegativeHits   int64 // ErrNotFound served from a negative entry
	StaleServed    int64 // stale values served (stale-while-revalidate, lease losers)
	StaleIfError   int64 // stale values served because a load failed
	EarlyRefreshes int64 // background refreshes started early by XFetch
	// StaleRefreshes counts background refreshes started by a stale read.
	StaleRefreshes  int64
	RefreshFailures int64 // background refreshes whose load failed

	Loads      int64 // calls of a load function
	LoadErrors int64 // loads that returned an error
	Coalesced  int64 // callers that joined another caller's load

	LeaseAcquired     int64 // leases taken
	LeaseContended    int64 // acquisitions that found the lease held
	LeaseWaitTimeouts int64 // Wait losers that gave up
	LeaseExtended     int64 // watchdog extensions
	LeaseLost         int64 // extensions refused: the lease had expired or moved
	WokenByPush       int64 // Wait losers woken by a completion notice
	WokenByPoll       int64 // Wait losers that found the value on a fallback re-read
	FencedWrites      int64 // writes refused because a newer write or invalidation won

	Shed         int64 // loads refused by the limiter
	RemoteErrors int64 // failed remote calls
	DecodeErrors int64 // remote values that could not be decoded (served as misses)
	EncodeErrors int64 // values the codec could not encode (served, not cached)

	InFlight int // loads running now
}

// Stats returns a snapshot of the cache's counters.
func (c *Cache[V]) Stats() Stats {
	s := &c.st
	return Stats{
		Hits:              s.hits.load(),
		Misses:            s.misses.load(),
		NegativeHits:      s.negativeHits.load(),
		StaleServed:       s.staleServed.load(),
		StaleIfError:      s.staleIfError.load(),
		EarlyRefreshes:    s.earlyRefreshes.load(),
		StaleRefreshes:    s.staleRefreshes.load(),
		RefreshFailures:   s.refreshFailures.load(),
		Loads:             s.loads.load(),
		LoadErrors:        s.loadErrors.load(),
		Coalesced:         s.coalesced.load(),
		LeaseAcquired:     s.leaseAcquired.load(),
		LeaseContended:    s.leaseContended.load(),
		LeaseWaitTimeouts: s.leaseWaitTimeouts.load(),
		LeaseExtended:     s.leaseExtended.load(),
		LeaseLost:         s.leaseLost.load(),
		WokenByPush:       s.wokenByPush.load(),
		WokenByPoll:       s.wokenByPoll.load(),
		FencedWrites:      s.fencedWrites.load(),
		Shed:              s.shed.load(),
		RemoteErrors:      s.remoteErrors.load(),
		DecodeErrors:      s.decodeErrors.load(),
		EncodeErrors:      s.encodeErrors.load(),
		InFlight:          c.flights.InFlight(),
	}
}

type counters struct {
	hits, misses, negativeHits, staleServed, staleIfError        stripedCounter
	earlyRefreshes, staleRefreshes, refreshFailures              stripedCounter
	loads, loadErrors, coalesced                                 stripedCounter
	leaseAcquired, leaseContended, leaseWaitTimeouts             stripedCounter
	leaseExtended, leaseLost, wokenByPush, wokenByPoll           stripedCounter
	fencedWrites, shed, remoteErrors, decodeErrors, encodeErrors stripedCounter
}

// stripedCounter is a counter that many goroutines can add to without
// contending on one cache line.
type stripedCounter struct {
	stripes [8]struct {
		n atomic.Int64
		_ [56]byte
	}
}

func (s *stripedCounter) add(n int64) {
	s.stripes[rand.Uint32()%uint32(len(s.stripes))].n.Add(n)
}

func (s *stripedCounter) load() int64 {
	var t int64
	for i := range s.stripes {
		t += s.stripes[i].n.Load()
	}
	return t
}
