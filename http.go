package herd

import (
	"errors"
	"net/http"
	"strconv"
	"time"

	"github.com/herdcache/herd/limiter"
)

// WriteOverloaded writes 503 Service Unavailable with a Retry-After header
// when errors.Is(err, ErrOverloaded), and reports whether it did; otherwise it
// writes nothing and returns false. Retry-After is the RetryAfter hint of the
// [*limiter.OverloadError] in err's chain, in whole seconds rounded up and at
// least 1; it is 1 when err carries no hint.
func WriteOverloaded(w http.ResponseWriter, err error) bool {
	if !errors.Is(err, ErrOverloaded) {
		return false
	}
	secs := int64(1)
	var oe *limiter.OverloadError
	if errors.As(err, &oe) && oe.RetryAfter > 0 {
		secs = int64(oe.RetryAfter / time.Second)
		if oe.RetryAfter%time.Second != 0 {
			secs++
		}
	}
	w.Header().Set("Retry-After", strconv.FormatInt(secs, 10))
	http.Error(w, http.StatusText(http.StatusServiceUnavailable), http.StatusServiceUnavailable)
	return true
}
