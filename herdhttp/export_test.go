package herdhttp

// NewProxyOver is NewProxy over a transport the test gives.
var NewProxyOver = newProxy

// LocalWeight is the weight the local tier of h holds, in bytes.
func (h *Handler) LocalWeight() uint64 { return h.e.hc.Stats().LocalWeight }
