package herdhttp

import "github.com/herdcache/herd/observe"

// Name is the cache's Options.Name ("herd" when empty): with Stats, a
// Handler is a herdprom.Source.
func (h *Handler) Name() string { return h.e.o.Name }

// Stats returns a snapshot of the herd cache's statistics (loads, leases,
// shedding, breaker state; see observe.Stats).
func (h *Handler) Stats() observe.Stats { return h.e.hc.Stats() }

// Name is [Handler.Name] for a Transport's cache.
func (t *Transport) Name() string { return t.e.o.Name }

// Stats is [Handler.Stats] for a Transport's cache.
func (t *Transport) Stats() observe.Stats { return t.e.hc.Stats() }
