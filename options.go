package herd

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"math"
	"strings"
	"sync"
	"time"

	"github.com/herdcache/herd/internal/jitter"
	"github.com/herdcache/herd/limiter"
	"github.com/herdcache/herd/observe"
	"github.com/herdcache/herd/remote"
)

// LoserPolicy says what a replica does on a miss when another replica holds
// the key's lease.
type LoserPolicy uint8

const (
	// ServeStale returns the stale value at once when one is still within its
	// hard TTL, and otherwise waits as under Wait. Under NoStale it is Wait.
	ServeStale LoserPolicy = iota
	// Wait waits for the holder's completion notice (with a bounded
	// exponential-backoff re-read as a fallback) and returns its value, for at
	// most [Options.LeaseWait].
	Wait
	// FailFast returns [ErrLeaseHeld] at once.
	FailFast
)

func (p LoserPolicy) String() string {
	switch p {
	case ServeStale:
		return "serve-stale"
	case Wait:
		return "wait"
	case FailFast:
		return "fail-fast"
	}
	return fmt.Sprintf("LoserPolicy(%d)", uint8(p))
}

// Options configures a [Cache]. A nil *Options means [DefaultOptions]; a
// non-nil one means exactly what its fields say. [New] never changes the
// Options it is given, and refuses any duration that is negative or above
// [MaxTTL].
//
// The fields come in groups, in the order a user meets them: day one, the
// remote tier, refresh, observability, then tuning and testing. Options
// stays one flat struct rather than one sub-struct per group: a field is
// set the same way in a literal and on what DefaultOptions returns
// (o.NearTTL, not o.Remote.NearTTL), and checks that span groups (a Lease
// needs a Store, RefreshAheadHot needs Load, ShareHotKeys a Store that
// keeps a hot set) read as one set of rules.
//
// Starting from DefaultOptions and changing what differs is the
// recommended form. A literal that sets a Store must also say what becomes
// of the near-cache and the breaker (NearTTL or NoNearCache,
// BreakerThreshold or NoBreaker); New returns an error naming the missing
// choice otherwise, so that leaving a field out never turns a protection
// off unsaid.
type Options[V any] struct {
	// Day one: the local tier, its TTLs, the loader and the backing
	// store's limit. A literal that sets these alone is a complete
	// single-process cache.

	// Name identifies the cache in metrics and logs. Empty means "default".
	Name string
	// MaxEntries bounds the local tier (entries held in memory, decoded).
	// It must be positive, unless MaxWeight is set: then it must be zero.
	MaxEntries int
	// MaxWeight, when positive, bounds the local tier by the sum of its
	// entries' weights, as Weigher gives them, instead of by MaxEntries:
	// for values whose sizes differ, such as HTTP responses bounded in
	// bytes. It needs Weigher. Zero means the local tier is bounded by
	// MaxEntries.
	MaxWeight uint64
	// Weigher gives the weight of a local entry for MaxWeight: key, and its
	// value (the zero value for a remembered ErrNotFound). It is called on
	// every put to the local tier, and must be cheap and safe for concurrent
	// use. It is set exactly when MaxWeight is.
	Weigher func(key string, v V) uint32
	// SoftTTL is how long a loaded value is fresh. It must be positive.
	SoftTTL time.Duration
	// HardTTL is how long a value is kept at all. Between SoftTTL and HardTTL
	// the value is stale: Get serves it at once and refreshes it in the
	// background (stale-while-revalidate), and serves it when a refresh fails
	// (stale-if-error). Zero means equal to SoftTTL: no stale window. The
	// longest stale window is HardTTL = MaxTTL, which keeps the value, and
	// its fence in the Store, that long.
	HardTTL time.Duration
	// NoStale makes a stale value a miss: nothing stale is ever served, and a
	// failed load returns its error. For correctness-critical data.
	NoStale bool
	// NegativeTTL is how long a load's [ErrNotFound] is remembered. Zero means
	// never: every error, ErrNotFound included, reaches the next caller's load.
	NegativeTTL time.Duration
	// Load is the loader used when Get is given none. Nil means every Get
	// must pass one, unless LoadMany is set.
	Load func(ctx context.Context, key string) (V, error)
	// LoadMany is the batch loader used when GetMany is given none. It also
	// stands in for Load when Load is nil: for a Get's miss and for
	// refresh-ahead, one key per call; for the background refreshes that
	// Gets' stale and early reads start, one call per window of 2ms (or
	// MaxBatch keys, 100 when MaxBatch is zero); and for [Cache.Warm], in
	// batches.
	LoadMany BatchLoadFunc[V]
	// MaxBatch is the most keys one call of a batch loader is given; a
	// GetMany that must load more splits them. Zero means no limit; it must
	// not be negative.
	MaxBatch int
	// Codec encodes values for the Store. Nil means [DefaultCodec].
	Codec Codec[V]
	// Limiter caps concurrent loads and sheds what it cannot serve. Caches
	// in front of one backing store should share one limiter, so that their
	// loads together stay within its capacity: set the same *Limiter on
	// each (DefaultOptions does, with one limiter per process). Nil means
	// no cap.
	Limiter *limiter.Limiter

	// The remote tier, shared by the replicas of a fleet: the Store and its
	// near-cache, the Lease, the breaker, the fleet's hot set. With a Store
	// set, New requires NearTTL or NoNearCache, and BreakerThreshold or
	// NoBreaker, so that no protection is lost by leaving a field out.

	// Store is the remote tier shared by replicas. Nil means this process is
	// the whole fleet: the local tier is the only tier.
	Store remote.Store
	// NearTTL is, with a Store, how long a local copy is trusted as it is,
	// from when it was loaded here or the read of the Store that brought
	// it was sent.
	// Past NearTTL, and until it is 2×NearTTL old, the copy is still served
	// at once while one read of the Store replaces it in the background;
	// older copies are read again on the reader's path. 2×NearTTL bounds how
	// stale a replica can be after another replica's Set or Invalidate when
	// a change notice is lost. With a Store that proves its notices
	// complete (remote.LiveNotifier), copies are trusted past NearTTL
	// while the proofs hold, and NearTTL applies from when they end. With
	// a Store, it must be set unless NoNearCache is.
	NearTTL time.Duration
	// NoNearCache, with a Store, makes every read go to the Store: no local
	// copy is trusted. It exists so that turning the near-cache off is said
	// out loud: with a Store, New refuses a zero NearTTL without it, and a
	// NearTTL with it.
	NoNearCache bool
	// Lease makes a miss load once per fleet instead of once per replica, and
	// fences the Store: a load that began before a Set or Invalidate on any
	// replica cannot write its value afterwards. Nil means no lease: each
	// replica loads once per key (in-process coalescing only), and its writes
	// to the Store are not fenced against other replicas' Set and Invalidate.
	// A Lease needs a Store.
	Lease remote.Lease
	// LeaseTTL is how long a lease lasts without extension; while a load runs
	// its holder extends it every LeaseTTL/3. Required with a Lease.
	LeaseTTL time.Duration
	// OnLeaseHeld is what a miss does when another replica holds the lease.
	// The zero value is ServeStale.
	OnLeaseHeld LoserPolicy
	// LeaseWait bounds how long a Wait loser waits for the holder. Zero means
	// LeaseTTL.
	LeaseWait time.Duration
	// LoadOnLeaseTimeout makes a Wait loser whose wait timed out call its own
	// load and return the value without writing it; false returns
	// [ErrLeaseTimeout].
	LoadOnLeaseTimeout bool
	// BreakerThreshold is how many consecutive failed Store or Lease calls
	// open the breaker. While it is open the cache makes no remote calls: it
	// serves from the local tier (fresh and, unless NoStale, stale until the
	// hard TTL) and loads once per key per process. With a Store, it must
	// be set unless NoBreaker is. A Store with a method
	// Reached() bool that reports false when New is called (a
	// redisstore.Remote that has not reached Redis) starts the breaker
	// open, with a probe due: the first remote call probes the tier, and
	// the calls made meanwhile do without it rather than each wait for its
	// timeout.
	BreakerThreshold int
	// BreakerCooldown is how long the breaker stays open before one call
	// probes the remote tier; a successful probe closes it, and local copies
	// are then re-read from the Store before being served as fresh. Required
	// with a BreakerThreshold.
	BreakerCooldown time.Duration
	// NoBreaker, with a Store, keeps the breaker from ever opening: every
	// miss still tries the remote tier, and its failures fall back to the
	// local tier and the load. With a Store, New refuses a zero
	// BreakerThreshold without it, and a BreakerThreshold with it.
	NoBreaker bool
	// ShareHotKeys is how many of the keys this replica read most in each
	// period of ShareHotKeysEvery it adds, at the end of that period, to the
	// fleet's hot set in the Store, from which a new replica warms with
	// [Cache.WarmHot]. Reads are counted as for RefreshAheadHot. It needs a
	// Store that implements [remote.HotSet]; the set holds keys as they are given
	// to Get, so keys that carry personal data end up in the Store as
	// values do. Zero means none.
	ShareHotKeys int
	// ShareHotKeysEvery is the period of the hot set; every replica of a
	// fleet must use the same. Zero means SoftTTL.
	ShareHotKeysEvery time.Duration

	// Refresh: when a value is reloaded before or after it expires, and how
	// long a load may take.

	// Jitter spreads expiries: each write moves both TTLs by one offset drawn
	// uniformly from ±Jitter×SoftTTL. It must lie in [0, 1); zero means off.
	Jitter float64
	// Beta scales XFetch early refresh. Each value's refresh starts
	// delta×(1.2 + Beta×D) before its soft expiry, where delta is the
	// measured duration of the load that made it (or nine tenths of the
	// delta of the value it replaced, if that is longer, so that one fast
	// load does not cut the lead of a slower one) and D is drawn once for
	// the value, uniform on [0, 1) (the xfetch package's Lead); the first
	// read after that instant refreshes it in the background. Every replica
	// derives the same D from the value, so how early a value is refreshed
	// depends neither on how often it is read nor on how many replicas read
	// it, and the refreshes of values written together spread over
	// delta×Beta. A value is replaced on average every SoftTTL −
	// delta×(0.2 + Beta/2): at Beta 1, 1.16 loads per TTL for a load a fifth
	// of the TTL, 1.10 for an eighth. Zero means off; it must not be
	// negative.
	Beta float64
	// RefreshBackoff is the least time between a background refresh of a key
	// that failed, was shed by the limiter or found the lease held by another
	// replica, and the next one. A refresh that found the lease held waits at
	// least the time the holder's lease has left (the holder's completion
	// notice usually ends the wait first), and one the limiter shed at least
	// the limiter's RetryAfter; but a shed refresh of a stale value is
	// retried at High priority once half of its stale window has passed (see
	// [limiter.Options.Reserve]), so that the hottest key is not left stale
	// to its hard TTL while misses hold every slot. Zero means only those
	// bounds apply: a failed refresh may be retried by the next read.
	RefreshBackoff time.Duration
	// MaxRefreshAhead is how many keys may be kept fresh ahead of their
	// expiry at once: pinned ([Cache.Pin]) and hot (RefreshAheadHot) keys
	// together. Zero means none: Pin fails.
	MaxRefreshAhead int
	// RefreshAheadHot is how many of the keys read most are kept fresh as
	// pinned keys are, each only while it is read during its value's life:
	// a hot key that is no longer read stops being refreshed within a soft
	// TTL. Reads are counted over each soft TTL (hits sampled 1 in 16,
	// misses and stale reads all), whether or not stats are on. It needs
	// Load, and at most MaxRefreshAhead. Zero means none.
	RefreshAheadHot int
	// LoadTimeout bounds each load (foreground or background), whatever its
	// callers' contexts say, and each load's write-back to the Store. Zero
	// means one minute; there is no "no limit", as a shared load must end.
	LoadTimeout time.Duration

	// Observability: events as they happen, and what Stats counts.

	// Recorder receives events as they happen (and, if it implements Tracer,
	// wraps loads and lease waits in spans). Nil means none; Stats works
	// either way.
	Recorder observe.Recorder
	// DisableStats stops the counting done on the hit path: Stats then
	// reports no Hits and no hot keys. The other counters cost nothing next
	// to a miss and always count.
	DisableStats bool
	// HotKeys is how many of the keys with the most traffic Stats reports,
	// with their misses, loads and stale serves, tracked in memory bounded by
	// 10×HotKeys counters (hits sampled 1 in 256). Zero means none.
	HotKeys int
	// HotKeyNames makes Stats report hot keys in full. Keys may hold personal
	// data, so by default a hot key is reported as its namespace and a short
	// hash.
	HotKeyNames bool

	// Tuning and testing.

	// PreciseClock makes every hit read the precise time. Without it, when
	// SoftTTL, NearTTL and NegativeTTL (those that are set) are all at least
	// 100ms, a hit reads a clock that a goroutine advances once per
	// thousandth of the shortest of them (between 1ms and 50ms) while the
	// cache is read, and that stops when it is not. A value further than
	// that from its expiries is judged by that clock, and one nearer by the
	// precise time, so expiries stay exact. Only while the goroutine is
	// starved of CPU for longer than its period may a hit serve a value as
	// fresh, or as trusted, past its expiry, by at most how late the
	// goroutine is. The TTLs a load sets are judged the same way.
	PreciseClock bool
	// DisableCoalescing lets every miss call its own load. It exists to measure
	// what coalescing saves; never set it in production.
	DisableCoalescing bool
	// Executor runs background refreshes. Nil means each runs on a new
	// goroutine. It must not block the caller waiting on other tasks.
	Executor func(fn func())
}

// DefaultOptions returns the recommended settings, a starting point to
// adjust: 100,000 local entries, fresh for one minute and served stale for
// four more, jitter 0.1, XFetch beta 1, a second between a failed
// background refresh and the next, a limiter of 32 concurrent loads
// (a quarter reserved for foreground misses, a one-second queue timeout),
// near-cache TTL one second, a five-second lease, and a breaker that opens
// after five failed remote calls and probes every second (used once a Store
// and Lease are set), the 20 hottest keys tracked for Stats, and up to
// 1,000 pinned keys (Pin).
//
// The limiter is [SharedLimiter], one for the whole process: every cache
// made from DefaultOptions shares its 32 slots, so that two caches over one
// database make at most 32 concurrent loads between them, not 64. Caches in
// front of different backing stores should each have their own limiter,
// made with limiter.New and set on every cache over that store.
func DefaultOptions[V any]() *Options[V] {
	return &Options[V]{
		MaxEntries: 100_000,
		SoftTTL:    time.Minute,
		HardTTL:    5 * time.Minute,
		Jitter:     0.1,
		Beta:       1,
		Limiter:    SharedLimiter(),

		RefreshBackoff: time.Second,

		NearTTL:  time.Second,
		LeaseTTL: 5 * time.Second,

		BreakerThreshold: 5,
		BreakerCooldown:  time.Second,

		HotKeys: 20,

		MaxRefreshAhead: 1000,
	}
}

// SharedLimiter returns the process's default limiter, made on the first
// call: 32 concurrent loads, a quarter reserved for foreground misses, a
// one-second queue timeout (limiter.DefaultOptions(32)). [DefaultOptions]
// sets it on every cache it configures; set it on a literal Options to
// share the same slots.
func SharedLimiter() *limiter.Limiter { return sharedLimiter() }

var sharedLimiter = sync.OnceValue(func() *limiter.Limiter {
	l, err := limiter.New(limiter.DefaultOptions(32))
	if err != nil {
		panic(err) // the defaults are valid; a test checks it
	}
	return l
})

// MaxTTL is the longest duration any field of [Options] accepts: 100 years
// of 365 days. Every time the cache computes saturates, so no TTL, timeout or
// backoff within it can wrap around.
const MaxTTL = 100 * 365 * 24 * time.Hour

// config is Options after validation, with defaults resolved.
type config[V any] struct {
	Options[V]
	jitter jitter.Jitter
}

const defaultLoadTimeout = time.Minute

func (o *Options[V]) validate() (config[V], error) {
	c := config[V]{Options: *o}
	var errs []error
	bad := func(format string, args ...any) {
		errs = append(errs, fmt.Errorf("herd: "+format, args...))
	}
	errs = append(errs, o.durationErrors()...)
	switch {
	case o.MaxWeight > 0 && o.MaxEntries != 0:
		bad("MaxEntries must be zero with MaxWeight, got %d", o.MaxEntries)
	case o.MaxWeight == 0 && o.MaxEntries <= 0:
		bad("MaxEntries must be positive, got %d", o.MaxEntries)
	}
	if (o.MaxWeight > 0) != (o.Weigher != nil) {
		bad("MaxWeight and Weigher must be set together")
	}
	for _, msg := range ttlErrors(o.SoftTTL, o.HardTTL) {
		bad("%s", msg)
	}
	if !(o.Jitter >= 0 && o.Jitter < 1) {
		bad("Jitter must lie in [0, 1), got %v", o.Jitter)
	}
	if o.Beta < 0 || math.IsNaN(o.Beta) || math.IsInf(o.Beta, 0) {
		bad("Beta must be a finite number >= 0, got %v", o.Beta)
	}
	if o.Lease != nil && o.Store == nil {
		bad("a Lease needs a Store")
	}
	errs = append(errs, o.protectionErrors()...)
	errs = append(errs, o.hotKeyErrors()...)
	if o.HotKeys < 0 {
		bad("HotKeys must not be negative, got %d", o.HotKeys)
	}
	if o.MaxBatch < 0 {
		bad("MaxBatch must not be negative, got %d", o.MaxBatch)
	}
	if o.BreakerThreshold < 0 {
		bad("BreakerThreshold must not be negative, got %d", o.BreakerThreshold)
	}
	if o.OnLeaseHeld > FailFast {
		bad("unknown OnLeaseHeld policy %d", o.OnLeaseHeld)
	}
	c.jitter, _ = jitter.New(o.Jitter) // checked above; zero when invalid
	c.HardTTL = cmp.Or(o.HardTTL, o.SoftTTL)
	c.LoadTimeout = cmp.Or(o.LoadTimeout, defaultLoadTimeout)
	c.LeaseWait = cmp.Or(o.LeaseWait, o.LeaseTTL)
	if o.Codec == nil {
		c.Codec = DefaultCodec[V]()
	}
	if o.Executor == nil {
		c.Executor = func(fn func()) { go fn() }
	}
	return c, errors.Join(errs...)
}

// protectionErrors checks that a cache with a Store says what becomes of
// its near-cache and its breaker, so that a literal that leaves them out
// does not lose them unsaid.
func (o *Options[V]) protectionErrors() []error {
	var errs []error
	bad := func(format string, args ...any) {
		errs = append(errs, fmt.Errorf("herd: "+format, args...))
	}
	if o.NearTTL > 0 && o.NoNearCache {
		bad("NearTTL and NoNearCache are both set: choose one")
	}
	if o.BreakerThreshold > 0 && o.NoBreaker {
		bad("BreakerThreshold and NoBreaker are both set: choose one")
	}
	if o.Store == nil {
		return errs
	}
	if o.NearTTL == 0 && !o.NoNearCache {
		bad("a Store needs NearTTL (DefaultOptions: 1s) or NoNearCache to turn the near-cache off")
	}
	if o.BreakerThreshold == 0 && !o.NoBreaker {
		bad("a Store needs BreakerThreshold and BreakerCooldown (DefaultOptions: 5 and 1s) or NoBreaker to turn the breaker off")
	}
	return errs
}

// hotKeyErrors checks the options of refresh-ahead and of the hot set.
func (o *Options[V]) hotKeyErrors() []error {
	var errs []error
	bad := func(format string, args ...any) {
		errs = append(errs, fmt.Errorf("herd: "+format, args...))
	}
	if o.MaxRefreshAhead < 0 {
		bad("MaxRefreshAhead must not be negative, got %d", o.MaxRefreshAhead)
	}
	switch {
	case o.RefreshAheadHot < 0:
		bad("RefreshAheadHot must not be negative, got %d", o.RefreshAheadHot)
	case o.RefreshAheadHot > max(o.MaxRefreshAhead, 0):
		bad("RefreshAheadHot (%d) must not exceed MaxRefreshAhead (%d)", o.RefreshAheadHot, o.MaxRefreshAhead)
	case o.RefreshAheadHot > 0 && o.Load == nil && o.LoadMany == nil:
		bad("RefreshAheadHot needs Load: hot keys are refreshed without a caller's loader")
	}
	switch _, ok := o.Store.(remote.HotSet); {
	case o.ShareHotKeys < 0:
		bad("ShareHotKeys must not be negative, got %d", o.ShareHotKeys)
	case o.ShareHotKeys > 0 && !ok:
		bad("ShareHotKeys needs a Store that implements HotSet")
	}
	return errs
}

// durationErrors checks every duration field against its bounds: none is
// negative or above MaxTTL, and the required ones are positive.
func (o *Options[V]) durationErrors() []error {
	var errs []error
	for _, d := range []struct {
		name     string
		v        time.Duration
		positive bool // zero is refused too
	}{
		{"NegativeTTL", o.NegativeTTL, false},
		{"LoadTimeout", o.LoadTimeout, false},
		{"RefreshBackoff", o.RefreshBackoff, false},
		{"NearTTL", o.NearTTL, false},
		{"LeaseTTL", o.LeaseTTL, o.Lease != nil},
		{"LeaseWait", o.LeaseWait, false},
		{"BreakerCooldown", o.BreakerCooldown, o.BreakerThreshold > 0},
		{"ShareHotKeysEvery", o.ShareHotKeysEvery, false},
	} {
		if msg := durationError(d.name, d.v, d.positive); msg != "" {
			errs = append(errs, errors.New("herd: "+msg))
		}
	}
	return errs
}

// durationError is what is wrong with the duration v of the field name,
// without the "herd: " prefix; empty when nothing is. With positive, zero
// is refused too.
func durationError(name string, v time.Duration, positive bool) string {
	switch {
	case positive && v <= 0:
		return fmt.Sprintf("%s must be positive, got %v", name, v)
	case v < 0:
		return fmt.Sprintf("%s must not be negative, got %v", name, v)
	case v > MaxTTL:
		return fmt.Sprintf("%s must not exceed MaxTTL (%v), got %v", name, MaxTTL, v)
	}
	return ""
}

// ttlErrors is what is wrong with a soft and hard TTL, as New judges
// SoftTTL and HardTTL, and as SetWithTTL and a load's SetTTL are judged,
// without the "herd: " prefix: the soft TTL must be positive, the hard TTL
// zero (the soft one) or no shorter than it, and neither above MaxTTL.
func ttlErrors(soft, hard time.Duration) []string {
	var msgs []string
	for _, msg := range []string{durationError("SoftTTL", soft, true), durationError("HardTTL", hard, false)} {
		if msg != "" {
			msgs = append(msgs, msg)
		}
	}
	if hard > 0 && soft > 0 && hard < soft {
		msgs = append(msgs, fmt.Sprintf("HardTTL (%v) must not be shorter than SoftTTL (%v)", hard, soft))
	}
	return msgs
}

// ttlError is ttlErrors as one error whose text starts with prefix; nil
// when the TTLs are valid.
func ttlError(prefix string, soft, hard time.Duration) error {
	msgs := ttlErrors(soft, hard)
	if len(msgs) == 0 {
		return nil
	}
	return errors.New(prefix + strings.Join(msgs, "; "))
}
