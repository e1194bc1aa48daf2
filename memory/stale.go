package memory

import (
	"context"
	"time"

	"github.com/herdcache/herd/remote"
	"github.com/herdcache/herd/remote/envelope"
)

var _ remote.Staler = (*Remote)(nil)

// MarkStale advances key's fence and, when a value is stored, makes its soft
// expiry now if that is earlier, under the new fence, keeping it until its
// hard expiry; it notifies subscribers and returns the new fence.
func (r *Remote) MarkStale(ctx context.Context, key string) (uint64, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if err := r.check(ctx, "mark stale", key); err != nil {
		return 0, err
	}
	now := time.Now()
	e := r.entry(key, now, true)
	if err := r.canAdvance(e, "mark stale", key); err != nil {
		return 0, err
	}
	fence := nextFence(e, now)
	if e.value != nil {
		if ev, err := envelope.Decode(e.value); err == nil {
			ev.Soft = min(ev.Soft, now.UnixMilli())
			ev.Fence = fence
			e.value = envelope.Append(nil, &ev)
		}
	}
	advance(e, fence, now, max(e.hard.Sub(now), 0))
	r.notify(key, e.fence, false)
	return e.fence, nil
}
