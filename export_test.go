package herd

import "time"

// Hooks for the external tests of this package.

// SetDraws replaces the random draws of c: xfetch must return numbers in
// (0, 1] for XFetch, jitter numbers in [0, 1) for TTL jitter. Call it before
// the cache is used.
func SetDraws[V any](c *Cache[V], xfetch, jitter func() float64) {
	if xfetch != nil {
		c.draw = xfetch
	}
	if jitter != nil {
		c.jitterDraw = jitter
	}
}

// SetClockOffset moves c's clock by d from the system's, as a replica whose
// clock is off would be. Call it before the cache is used.
func SetClockOffset[V any](c *Cache[V], d time.Duration) {
	c.clk.wall += int64(d)
}

// LocalParts returns the weight c's local tier holds in otter and in its
// list of heavy entries, after otter's pending maintenance.
func LocalParts[V any](c *Cache[V]) (main, heavy uint64) {
	t := c.local
	t.main.CleanUp()
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.main.WeightedSize(), t.held
}

// SetStaggerDraw replaces the draw, in [0, 1), that scales the random
// delay of c's due refreshes once it has heard another replica's hold.
// Call it before the cache is used.
func SetStaggerDraw[V any](c *Cache[V], draw func() float64) {
	c.staggerDraw = draw
}

// MaxStagger is the most a due refresh is delayed.
const MaxStagger = maxStagger
