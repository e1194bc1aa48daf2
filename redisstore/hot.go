package redisstore

import (
	"cmp"
	"context"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/herdcache/herd/remote"
)

var _ remote.HotSet = (*Remote)(nil)

// The hot set keeps each period's counts in a sorted set,
// <prefix>hot:{hot}:<period in ms>:<period number>, numbered by the
// replica's clock from the Unix epoch and kept until two periods after
// its own ends. All periods share one Cluster hash slot.

// hotKey names the sorted set of period n of the given length.
func (r *Remote) hotKey(length time.Duration, n int64) string {
	return r.space.Prefix() + "hot:{hot}:" + strconv.FormatInt(length.Milliseconds(), 10) + ":" + strconv.FormatInt(n, 10)
}

// AddHot adds reads to the current period's counts with ZINCRBY, trims
// them to the limit keys read most and sets their TTL, in transactions
// bounded as "Batches" in the package doc says (one for up to BatchKeys
// reads), the last of which trims; it stops at the first that fails.
func (r *Remote) AddHot(ctx context.Context, reads map[string]uint64, limit int, period time.Duration) error {
	n, err := r.hotArgs("add hot keys", limit, period)
	if err != nil {
		return err
	}
	key := r.hotKey(period, n)
	keys := slices.Collect(maps.Keys(reads))
	last := false
	for lo := 0; !last; {
		hi, bytes := lo, 0
		for hi < len(keys) && hi-lo < r.batchKeys {
			b := len(keys[hi]) + 2*argBytes
			if hi > lo && bytes+b > r.batchBytes {
				break
			}
			bytes += b
			hi++
		}
		last = hi == len(keys)
		if err := r.addHot(ctx, key, keys[lo:hi], reads, last, limit, period); err != nil {
			return r.fail("add hot keys", key, err)
		}
		lo = hi
	}
	return nil
}

// addHot adds the reads of keys to the counts in key in one transaction,
// within r.timeout; the last one also trims them and sets their TTL.
func (r *Remote) addHot(ctx context.Context, key string, keys []string, reads map[string]uint64, last bool, limit int, period time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, r.timeout)
	defer cancel()
	_, err := r.client.TxPipelined(ctx, func(p redis.Pipeliner) error {
		for _, k := range keys {
			p.ZIncrBy(ctx, key, float64(reads[k]), k)
		}
		if last {
			p.ZRemRangeByRank(ctx, key, 0, int64(-limit-1))
			p.PExpire(ctx, key, 3*period)
		}
		return nil
	})
	return err
}

// Hot reads the current and the last period's counts in one pipeline, at
// most 2n keys of each, and returns up to n keys by their sums.
func (r *Remote) Hot(ctx context.Context, n int, period time.Duration) ([]string, error) {
	now, err := r.hotArgs("read hot keys", n, period)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(ctx, r.timeout)
	defer cancel()
	var reads [2]*redis.ZSliceCmd
	_, err = r.client.Pipelined(ctx, func(p redis.Pipeliner) error {
		for i := range reads {
			reads[i] = p.ZRevRangeWithScores(ctx, r.hotKey(period, now-int64(i)), 0, int64(2*n-1))
		}
		return nil
	})
	if err != nil {
		return nil, r.fail("read hot keys", r.hotKey(period, now), err)
	}
	sum := map[string]float64{}
	for _, cmd := range reads {
		for _, z := range cmd.Val() {
			if k, ok := z.Member.(string); ok {
				sum[k] += z.Score
			}
		}
	}
	keys := slices.SortedFunc(maps.Keys(sum), func(a, b string) int {
		return cmp.Or(cmp.Compare(sum[b], sum[a]), cmp.Compare(a, b))
	})
	return keys[:min(n, len(keys))], nil
}

// hotArgs checks a hot set call's arguments and returns the number of the
// current period.
func (r *Remote) hotArgs(op string, n int, period time.Duration) (int64, error) {
	if err := r.check(op, ""); err != nil {
		return 0, err
	}
	switch {
	case n <= 0:
		return 0, fmt.Errorf("redisstore: %s: count %d is not positive: %w", op, n, remote.ErrRejected)
	case period < time.Millisecond:
		return 0, fmt.Errorf("redisstore: %s: period %v is under a millisecond: %w", op, period, remote.ErrRejected)
	}
	return time.Now().UnixNano() / int64(period), nil
}
