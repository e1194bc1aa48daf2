package redisstore

import (
	"context"
	"errors"
	"math"
	"strconv"

	"github.com/redis/go-redis/v9"

	"github.com/herdcache/herd/remote/keyspace"
)

// One-key steps of the changes and writes whose scripts meet TRYAGAIN
// while their key's Cluster slot migrates, some of its keys on the source
// master and some on the target. Each step touches one key, so that it
// runs on the node that holds that key (go-redis, or change with
// AckReplicas, follows ASK to the target). A change advances the fence
// first, then changes the value under the new fence unless the stored
// value carries a newer one; a write-back reads the fence, stores, and
// reads the fence again.
var (
	dropOlderScript  = script("dropolder")
	staleOlderScript = script("staleolder")
)

// setSplit does what the set script does in one-key steps: it advances
// the fence (the advance script), then stores env under the new fence
// unless the stored value carries a newer one, announcing the change (the
// putnewer script). It returns the new fence.
func (r *Remote) setSplit(ctx context.Context, n keyspace.Names, key string, env []byte, ms int64) (uint64, error) {
	fence, err := r.change(ctx, advanceScript, []string{n.Fence}, r.fenceTTL(ms)).Int64()
	if err != nil {
		return 0, err
	}
	f := strconv.FormatInt(fence, 10)
	if err := r.change(ctx, putNewerScript, []string{n.Value}, f, ms, env, r.noticeChannel(ctx, n.Value), key).Err(); err != nil {
		return 0, err
	}
	return uint64(fence), nil
}

// invalidateSplit does what the invalidate script does in one-key steps:
// it advances the fence, then deletes the value unless it carries a newer
// fence, and announces the deletion (the dropolder script). It returns the
// new fence.
func (r *Remote) invalidateSplit(ctx context.Context, n keyspace.Names, key string) (uint64, error) {
	fence, err := r.change(ctx, advanceScript, []string{n.Fence}, r.fenceTTL(0)).Int64()
	if err != nil {
		return 0, err
	}
	f := strconv.FormatInt(fence, 10)
	if err := r.change(ctx, dropOlderScript, []string{n.Value}, f, r.noticeChannel(ctx, n.Value), key).Err(); err != nil {
		return 0, err
	}
	return uint64(fence), nil
}

// markStaleSplit does what the markstale script does in one-key steps: it
// advances the fence, then makes the value stale under the new fence
// unless it carries a newer one, and announces the change (the staleolder
// script), then keeps the fence key as long as the value and the margin
// (the keep script). It returns the new fence.
func (r *Remote) markStaleSplit(ctx context.Context, n keyspace.Names, key string) (uint64, error) {
	fence, err := r.change(ctx, advanceScript, []string{n.Fence}, r.fenceTTL(0)).Int64()
	if err != nil {
		return 0, err
	}
	f := strconv.FormatInt(fence, 10)
	left, err := r.change(ctx, staleOlderScript, []string{n.Value}, f, r.noticeChannel(ctx, n.Value), key).Int64()
	if err != nil {
		return 0, err
	}
	if left > 0 {
		if err := r.change(ctx, keepScript, []string{n.Fence}, left+r.fenceMargin.Milliseconds()).Err(); err != nil {
			return 0, err
		}
	}
	return uint64(fence), nil
}

// writeSplit does what the write script does in one-key steps: it reads
// the fence key, and if it holds fence, stores env unless the stored value
// carries a newer fence (the putnewer script, which announces the change)
// and keeps the fence key as long as the value (the keep script). Then it
// reads the fence key again: a change that advanced it between the first
// read and the store may have retired the value before it was stored (an
// Invalidate that deleted the old one), so the value just stored is
// deleted again unless a newer one replaced it (the dropolder script),
// and the write reports that it did not store. It reports whether it
// stored.
func (r *Remote) writeSplit(ctx context.Context, n keyspace.Names, key string, env []byte, fence uint64, ms int64) (bool, error) {
	f := strconv.FormatUint(fence, 10)
	if cur, err := r.fenceAt(ctx, n); err != nil || cur != fence {
		return false, err
	}
	stored, err := putNewerScript.Run(ctx, r.client, []string{n.Value}, f, ms, env, r.noticeChannel(ctx, n.Value), key).Int64()
	if err != nil || stored != 1 {
		return false, err
	}
	if err := keepScript.Run(ctx, r.client, []string{n.Fence}, r.fenceTTL(ms)).Err(); err != nil {
		return true, err
	}
	cur, err := r.fenceAt(ctx, n)
	if err != nil || cur == fence {
		return err == nil, err
	}
	retired := strconv.FormatUint(max(cur, fence+1), 10) // a fence key that holds no fence retires it too
	if err := dropOlderScript.Run(ctx, r.client, []string{n.Value}, retired, r.noticeChannel(ctx, n.Value), key).Err(); err != nil {
		return true, err
	}
	return false, nil
}

// fenceAt reads the fence key of n: 0 when it is missing, and the largest
// uint64, which no write-back holds, when it holds no fence.
func (r *Remote) fenceAt(ctx context.Context, n keyspace.Names) (uint64, error) {
	cur, err := r.client.Get(ctx, n.Fence).Result()
	switch {
	case errors.Is(err, redis.Nil):
		return 0, nil
	case err != nil:
		return 0, err
	}
	f, err := strconv.ParseUint(cur, 10, 64)
	if err != nil {
		return math.MaxUint64, nil
	}
	return f, nil
}
