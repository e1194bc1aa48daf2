package memory

import (
	"context"
	"time"

	"github.com/herdcache/herd/remote"
	"github.com/herdcache/herd/remote/envelope"
	"github.com/herdcache/herd/remote/notify"
)

var _ remote.Clearer = (*Remote)(nil)

// InvalidateAll drops every key's value and lease and advances every
// key's fence, so that no write under a fence or lease taken before is
// accepted; it announces the change with one Notice (Dropped, no key, fence
// 0) and wakes every Wait-er. It takes time in proportion to the keys held,
// in memory.
func (r *Remote) InvalidateAll(ctx context.Context) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if err := r.check(ctx, "invalidate-all", ""); err != nil {
		return err
	}
	now := time.Now()
	for _, e := range r.keys {
		e.expire(now)
		if e.fence < envelope.MaxFence {
			advance(e, nextFence(e, now), now, 0)
		}
		e.value, e.token = nil, ""
	}
	r.stats.InvalidateAlls++
	for s := range r.subs {
		s.Push(notify.Notice{Dropped: true})
	}
	r.wakeAll()
	return nil
}
