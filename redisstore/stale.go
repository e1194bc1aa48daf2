package redisstore

import (
	"context"

	"github.com/herdcache/herd/remote"
)

var _ remote.Staler = (*Remote)(nil)

// MarkStale advances key's fence and, when a value is stored, makes its soft
// expiry the server's clock if that is earlier, under the new fence and with
// its TTL unchanged, in one script; it announces the change and returns the
// new fence.
func (r *Remote) MarkStale(ctx context.Context, key string) (uint64, error) {
	if err := r.check("mark stale", key); err != nil {
		return 0, err
	}
	n, err := r.names(ctx, "mark stale", key)
	if err != nil {
		return 0, err
	}
	ctx, cancel := context.WithTimeout(ctx, r.timeout+r.ackTimeout)
	defer cancel()
	fence, err := r.change(ctx, markStaleScript, []string{n.Value, n.Fence},
		r.noticeChannel(ctx, n.Value), key, r.fenceTTL(0), r.fenceMargin.Milliseconds()).Int64()
	if tryAgain(err) { // the key's slot is migrating
		var f uint64
		f, err = r.markStaleSplit(ctx, n, key)
		fence = int64(f)
	}
	if err != nil {
		return 0, r.fail("mark stale", key, err)
	}
	return uint64(fence), nil
}
