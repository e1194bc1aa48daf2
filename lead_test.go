package herd

import (
	"strconv"
	"testing"

	"github.com/herdcache/herd/xfetch"
)

// The draw of a value's early refresh is the same for the same key and soft
// expiry, on any replica, and spreads evenly over keys written at one
// instant and over one key's successive values.
func TestValueHashDraws(t *testing.T) {
	key, same := "user:1", string([]byte("user:1"))
	if valueHash(key, 1234) != valueHash(same, 1234) {
		t.Fatal("valueHash is not a function of its inputs")
	}
	const n = 100_000
	for _, tt := range []struct {
		name string
		draw func(i int) float64
	}{
		{"keys written together", func(i int) float64 { return xfetch.UOf(valueHash("user:"+strconv.Itoa(i), 1_700_000_000_000)) }},
		{"one key's successive values", func(i int) float64 { return xfetch.UOf(valueHash("hot", 1_700_000_000_000+int64(i))) }},
	} {
		var bins [10]int
		for i := range n {
			bins[min(int(tt.draw(i)*10), 9)]++
		}
		for i, b := range bins {
			if b < n/10*95/100 || b > n/10*105/100 {
				t.Errorf("%s: bin %d holds %d of %d draws, want %d within 5%%", tt.name, i, b, n, n/10)
			}
		}
	}
}
