package herdhttp

// NewProxyOver is NewProxy over a transport the test gives.
var NewProxyOver = newProxy

// Stats returns the herd cache's counters.
func (h *Handler) Stats() any { return h.e.hc.Stats() }
