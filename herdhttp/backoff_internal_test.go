package herdhttp

import (
	"strconv"
	"testing"
	"time"
)

// TestBackoffBounded fills the error backoff with more keys than it holds:
// it keeps at most maxBackoffKeys, makes room by sweeping expired ones,
// and backs off each key it kept until ErrorBackoff has passed.
func TestBackoffBounded(t *testing.T) {
	c := &engine{o: config{Options{ErrorBackoff: time.Second}}, backoff: map[string]int64{}}
	second := int64(time.Second)
	for i := range maxBackoffKeys + 10 {
		c.backOff(strconv.Itoa(i), 0)
	}
	if n := len(c.backoff); n != maxBackoffKeys {
		t.Fatalf("%d keys backed off, want the bound %d", n, maxBackoffKeys)
	}
	if !c.backingOff("0", second-1) || c.backingOff(strconv.Itoa(maxBackoffKeys), 0) {
		t.Error("a kept key is not backed off, or a key with no room is")
	}
	c.backOff("late", second) // every earlier key has expired: swept
	if n := len(c.backoff); n != 1 || !c.backingOff("late", second) {
		t.Errorf("after a sweep: %d keys, late backed off %v; want 1, true", n, c.backingOff("late", second))
	}
	if c.backingOff("late", 2*second) {
		t.Error("late still backed off after ErrorBackoff")
	}
}
