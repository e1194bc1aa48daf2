package redisstore

import (
	"context"
	"fmt"

	"github.com/redis/go-redis/v9"
)

// Reached reports whether the Remote has had an answer from Redis since
// New: the subscription confirmed, the generation read, or a Ping that
// succeeded. It makes no call. A herd cache made over a Remote that has
// not reached Redis starts with its breaker open and a probe due (see
// herd's Options.BreakerThreshold), so that its first Gets do not each
// wait for Timeout. Once set, it stays set: later outages are the
// breaker's to see.
func (r *Remote) Reached() bool { return r.reached.Load() }

// Ping asks Redis whether it is up, within Timeout and ctx: every master
// of a Cluster, the one node otherwise. It returns nil when all answered,
// and otherwise an error prefixed "redisstore: ping: ". Use it as a
// readiness check before a replica takes traffic.
func (r *Remote) Ping(ctx context.Context) error {
	if r.closed.Load() {
		return fmt.Errorf("redisstore: ping: %w", ErrClosed)
	}
	ctx, cancel := context.WithTimeout(ctx, r.timeout)
	defer cancel()
	var err error
	if cc, ok := r.client.(*redis.ClusterClient); ok {
		err = cc.ForEachMaster(ctx, func(ctx context.Context, c *redis.Client) error {
			return c.Ping(ctx).Err()
		})
	} else {
		err = r.client.Ping(ctx).Err()
	}
	if err != nil {
		return fmt.Errorf("redisstore: ping: %w", err)
	}
	r.reached.Store(true)
	return nil
}
