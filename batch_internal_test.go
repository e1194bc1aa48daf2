package herd

import (
	"slices"
	"testing"
)

// TestMarkLed: the keys a GetMany's fill led are found at their positions
// among the keys it missed, in order; a key that is not there marks
// nothing after it.
func TestMarkLed(t *testing.T) {
	missed := []string{"a", "b", "c", "d", "e"}
	for _, tc := range []struct {
		led  []string
		want []bool
	}{
		{nil, []bool{false, false, false, false, false}},
		{[]string{"a", "b", "c", "d", "e"}, []bool{true, true, true, true, true}},
		{[]string{"b", "d"}, []bool{false, true, false, true, false}},
		{[]string{"a", "e"}, []bool{true, false, false, false, true}},
		{[]string{"c", "x", "e"}, []bool{false, false, true, false, false}},
	} {
		ran := make([]bool, len(missed))
		markLed(ran, missed, tc.led)
		if !slices.Equal(ran, tc.want) {
			t.Errorf("led %q: marked %v, want %v", tc.led, ran, tc.want)
		}
	}
}
