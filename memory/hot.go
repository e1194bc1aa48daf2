package memory

import (
	"cmp"
	"context"
	"fmt"
	"maps"
	"slices"
	"time"

	"github.com/herdcache/herd/remote"
)

var _ remote.HotSet = (*Remote)(nil)

// hotPeriod names one period's counts of the hot set: its length and its
// number since the Unix epoch.
type hotPeriod struct {
	length time.Duration
	n      int64
}

// AddHot adds reads to the counts of the current period of the given length
// and keeps the limit keys read most in it. Counts of periods before the
// last are dropped.
func (r *Remote) AddHot(ctx context.Context, reads map[string]uint64, limit int, period time.Duration) error {
	if err := hotArgs("add hot keys", limit, period); err != nil {
		return err
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if err := r.check(ctx, "add hot keys", ""); err != nil {
		return err
	}
	now := r.hotNow(period)
	counts := r.hot[now]
	if counts == nil {
		counts = make(map[string]float64, len(reads))
		r.hot[now] = counts
	}
	for k, n := range reads {
		counts[k] += float64(n)
	}
	if len(counts) > limit {
		for _, k := range rank(counts)[limit:] {
			delete(counts, k)
		}
	}
	return nil
}

// Hot returns up to n keys, the most read first, by the counts of the
// current and the last period of the given length.
func (r *Remote) Hot(ctx context.Context, n int, period time.Duration) ([]string, error) {
	if err := hotArgs("read hot keys", n, period); err != nil {
		return nil, err
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if err := r.check(ctx, "read hot keys", ""); err != nil {
		return nil, err
	}
	now := r.hotNow(period)
	sum := maps.Clone(r.hot[now])
	if sum == nil {
		sum = map[string]float64{}
	}
	for k, v := range r.hot[hotPeriod{period, now.n - 1}] {
		sum[k] += v
	}
	keys := rank(sum)
	return keys[:min(n, len(keys))], nil
}

// hotNow returns the current period of the given length, and drops every
// period's counts older than the last. r.mu is held.
func (r *Remote) hotNow(length time.Duration) hotPeriod {
	now := hotPeriod{length, time.Now().UnixNano() / int64(length)}
	if r.hot == nil {
		r.hot = make(map[hotPeriod]map[string]float64)
	}
	for p := range r.hot {
		if p.length == length && p.n < now.n-1 {
			delete(r.hot, p)
		}
	}
	return now
}

// rank returns the keys of counts, the largest count first, ties by key.
func rank(counts map[string]float64) []string {
	return slices.SortedFunc(maps.Keys(counts), func(a, b string) int {
		return cmp.Or(cmp.Compare(counts[b], counts[a]), cmp.Compare(a, b))
	})
}

func hotArgs(op string, n int, period time.Duration) error {
	switch {
	case n <= 0:
		return fmt.Errorf("memory: %s: count %d is not positive: %w", op, n, remote.ErrRejected)
	case period <= 0:
		return fmt.Errorf("memory: %s: period %v is not positive: %w", op, period, remote.ErrRejected)
	}
	return nil
}
