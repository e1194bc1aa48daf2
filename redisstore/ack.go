package redisstore

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"
)

// DefaultAckTimeout is how long a change waits for its replicas when
// Options.AckReplicas is set and AckTimeout is zero.
const DefaultAckTimeout = 250 * time.Millisecond

// ErrNotAcknowledged is returned, wrapped, by a change (Set, Invalidate,
// MarkStale, InvalidateTag, InvalidateAll) that fewer than
// Options.AckReplicas replicas acknowledged within AckTimeout. The master
// made and announced the change, and keeps it unless a failover or a
// restart loses it; doing the change again is safe.
var ErrNotAcknowledged = errors.New("redisstore: change not acknowledged by enough replicas")

// checkAck judges o's AckReplicas and AckTimeout, for a Remote whose calls
// have the deadline timeout, and returns the timeout of WAIT: AckTimeout or
// its default, in whole milliseconds, rounded up (zero when no change waits).
func checkAck(o Options, timeout time.Duration) (time.Duration, error) {
	switch {
	case o.AckReplicas < 0:
		return 0, fmt.Errorf("redisstore: AckReplicas %d is negative", o.AckReplicas)
	case o.AckTimeout < 0:
		return 0, fmt.Errorf("redisstore: AckTimeout %v is negative", o.AckTimeout)
	case o.AckReplicas == 0 && o.AckTimeout != 0:
		return 0, fmt.Errorf("redisstore: AckTimeout %v is set but AckReplicas is 0, so no change waits for replicas", o.AckTimeout)
	case o.AckReplicas == 0:
		return 0, nil
	}
	wait := cmp.Or(o.AckTimeout, DefaultAckTimeout)
	wait = (wait + time.Millisecond - 1).Truncate(time.Millisecond)
	var read time.Duration
	switch c := o.Client.(type) {
	case *redis.Client:
		read = c.Options().ReadTimeout
	case *redis.ClusterClient:
		read = c.Options().ReadTimeout
	default:
		return 0, fmt.Errorf("redisstore: AckReplicas needs a *redis.Client (one node, or Sentinel's failover client) or a *redis.ClusterClient, which redisstore can make send WAIT on the connection of the change; Options.Client is a %T", o.Client)
	}
	if read > 0 && read < wait+timeout { // -1 and -2 set no read deadline
		return 0, fmt.Errorf("redisstore: the Client's ReadTimeout %v is shorter than AckTimeout %v plus Timeout %v: WAIT's answer would time out", read, wait, timeout)
	}
	return wait, nil
}

// change runs s, a script that changes keys[0] (and only keys in its
// Cluster hash slot), as every change on behalf of the cache runs: alone
// while no replica needs to acknowledge it; otherwise, in one pipeline on
// one connection to the master of keys[0]'s slot, followed by WAIT, so
// that it fails, with an error wrapping ErrNotAcknowledged, when fewer
// than AckReplicas replicas acknowledged it within AckTimeout. ctx's
// deadline must leave room for AckTimeout.
func (r *Remote) change(ctx context.Context, s *redis.Script, keys []string, args ...any) *redis.Cmd {
	if r.ackReplicas == 0 {
		return r.run(ctx, s, keys, args...)
	}
	var node redis.Cmdable = r.client
	if cc, ok := r.client.(*redis.ClusterClient); ok {
		c, err := cc.MasterForKey(ctx, keys[0])
		if err != nil {
			cmd := redis.NewCmd(ctx)
			cmd.SetErr(fmt.Errorf("finding the master of %q: %w", keys[0], err))
			return cmd
		}
		node = c
	}
	cmd := r.acknowledged(ctx, node, s.EvalSha, keys, args)
	if redis.HasErrorPrefix(cmd.Err(), "NOSCRIPT") {
		cmd = r.acknowledged(ctx, node, s.Eval, keys, args)
	}
	if cc, ok := r.client.(*redis.ClusterClient); ok && (redis.HasErrorPrefix(cmd.Err(), "MOVED ") || redis.HasErrorPrefix(cmd.Err(), "ASK ")) {
		cc.ReloadState(ctx) // the slot has moved: the next change goes to its new master
	}
	return cmd
}

// acknowledged sends run and WAIT in one pipeline to node and returns
// run's reply, whose error is WAIT's when run succeeded but WAIT did not.
func (r *Remote) acknowledged(ctx context.Context, node redis.Cmdable, run func(context.Context, redis.Scripter, []string, ...any) *redis.Cmd, keys []string, args []any) *redis.Cmd {
	pipe := node.Pipeline()
	cmd := run(ctx, pipe, keys, args...)
	wait := pipe.Do(ctx, "wait", r.ackReplicas, r.ackTimeout.Milliseconds())
	_, _ = pipe.Exec(ctx) // each reply carries its own error
	if cmd.Err() != nil {
		return cmd
	}
	switch n, err := wait.Int64(); {
	case err != nil:
		cmd.SetErr(fmt.Errorf("waiting for %d replicas: %w", r.ackReplicas, err))
	case n < int64(r.ackReplicas):
		cmd.SetErr(fmt.Errorf("%w: %d of %d within %v", ErrNotAcknowledged, n, r.ackReplicas, r.ackTimeout))
	}
	return cmd
}
