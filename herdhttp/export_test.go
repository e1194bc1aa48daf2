package herdhttp

import "net/http"

// NewProxyOver is NewProxy over a transport the test gives.
var NewProxyOver = newProxy

// LocalWeight is the weight the local tier of h holds, in bytes.
func (h *Handler) LocalWeight() uint64 { return h.e.hc.Stats().LocalWeight }

// ParseHit is the hit loop's parser over the request head at the start of
// b, as the loop reads it: nil when b holds no complete head, or one the
// loop leaves to net/http.
func ParseHit(b []byte) *http.Request {
	n := headEnd(b, 0)
	if n == 0 {
		return nil
	}
	cs := connState{base: new(http.Request)}
	return cs.parse(b[:n])
}
