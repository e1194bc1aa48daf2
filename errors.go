package herd

import (
	"errors"
	"fmt"
	"strings"

	"github.com/herdcache/herd/limiter"
)

var (
	// ErrNotFound is what a load returns when its key has no value. When
	// [Options.NegativeTTL] is set, the cache remembers it for that long and
	// Get returns ErrNotFound without calling the load.
	ErrNotFound = errors.New("herd: not found")

	// ErrOverloaded is returned, wrapped in a *[limiter.OverloadError], when the
	// backing-store limiter sheds a call: its queue timed out or was full. The
	// load was not called.
	ErrOverloaded = limiter.ErrOverloaded

	// ErrLeaseHeld is returned under [FailFast] when another replica holds the
	// key's lease and no value can be served.
	ErrLeaseHeld = errors.New("herd: lease held by another replica")

	// ErrLeaseTimeout is returned under [Wait] when the lease holder did not
	// complete within [Options.LeaseWait].
	ErrLeaseTimeout = errors.New("herd: timed out waiting for the lease holder")

	// ErrDegraded is returned, wrapped, by Invalidate when the remote tier is
	// unavailable: the local copy was dropped, other replicas were not told.
	ErrDegraded = errors.New("herd: remote tier unavailable")

	// ErrClosed is returned by calls on a cache after Close.
	ErrClosed = errors.New("herd: cache closed")

	// ErrNoFreshValue is returned, wrapped, by a Get that kept finding
	// values that had expired by the time it could take them (past their
	// HardTTL, or under NoStale past their SoftTTL), until it ran out of its
	// bounded attempts: with a HardTTL shorter than a load and its remote
	// calls take, a Get can end so.
	ErrNoFreshValue = errors.New("herd: no fresh value")

	// ErrNoLoader is returned by Get when neither the call nor the options
	// give a load function.
	ErrNoLoader = errors.New("herd: no load function")
)

// outward is err as a Cache method returns it for the call op on key
// (key empty: none): an error that the flight or limiter package made (a
// caller's wait that ended, a load's panic or runtime.Goexit, a call the
// limiter shed) gets a message of herd's own that names no internal
// package, and still wraps err, so that errors.Is and errors.As see what
// they saw. Any other error, a load's own among them, is returned as it is.
func outward(op, key string, err error) error {
	if err == nil {
		return nil
	}
	msg := err.Error()
	if !strings.Contains(msg, "flight: ") && !strings.Contains(msg, "limiter: ") {
		return err
	}
	where := op
	if key != "" {
		where = fmt.Sprintf("%s %q", op, key)
	}
	msg = strings.TrimPrefix(internalNames.Replace(msg), "herd: ")
	return &outwardError{msg: "herd: " + where + ": " + msg, err: err}
}

// internalNames rewrites what the flight and limiter packages say in
// herd's words.
var internalNames = strings.NewReplacer(
	"flight: function panicked", "load panicked",
	"flight: function called", "load called",
	"flight: function returned", "load returned",
	"flight: ", "",
	"limiter: ", "",
)

// outwardError is an error of the flight or limiter package, as a Cache
// method returns it.
type outwardError struct {
	msg string
	err error
}

func (e *outwardError) Error() string { return e.msg }
func (e *outwardError) Unwrap() error { return e.err }
