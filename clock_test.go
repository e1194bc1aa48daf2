package herd

import (
	"math"
	"testing"
	"time"
)

func TestAddTimeSaturates(t *testing.T) {
	for _, tc := range []struct {
		t    int64
		d    time.Duration
		want int64
	}{
		{0, time.Second, int64(time.Second)},
		{math.MaxInt64 - 1, 1, math.MaxInt64},
		{math.MaxInt64 - 1, 2, math.MaxInt64},
		{math.MaxInt64, math.MaxInt64, math.MaxInt64},
		{time.Now().UnixNano(), math.MaxInt64, math.MaxInt64},
		{math.MinInt64 + 1, -2, math.MinInt64},
		{math.MinInt64, math.MinInt64, math.MinInt64},
		{5, -3, 2},
	} {
		if got := addTime(tc.t, tc.d); got != tc.want {
			t.Errorf("addTime(%d, %d) = %d, want %d", tc.t, int64(tc.d), got, tc.want)
		}
	}
}
