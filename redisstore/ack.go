package redisstore

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
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
// than AckReplicas replicas acknowledged it within AckTimeout. While the
// slot migrates, a master that no longer holds the keys answers ASK: the
// change is then sent, after ASKING, with its WAIT, to the master that
// ASK names. A TRYAGAIN reply (the keys are split between the two
// masters) is returned as it is: the caller falls back to one-key steps,
// each a change of its own. ctx's deadline must leave room for
// AckTimeout.
func (r *Remote) change(ctx context.Context, s *redis.Script, keys []string, args ...any) *redis.Cmd {
	if r.ackReplicas == 0 {
		return s.Run(ctx, r.client, keys, args...)
	}
	cc, isCluster := r.client.(*redis.ClusterClient)
	if !isCluster {
		return r.acknowledged(ctx, r.client, false, s, keys, args)
	}
	node, err := cc.MasterForKey(ctx, keys[0])
	if err != nil {
		cmd := redis.NewCmd(ctx)
		cmd.SetErr(fmt.Errorf("finding the master of %q: %w", keys[0], err))
		return cmd
	}
	cmd := r.acknowledged(ctx, node, false, s, keys, args)
	if addr, ok := askedTo(cmd.Err()); ok {
		target, err := masterAt(ctx, cc, addr)
		if err != nil {
			cmd.SetErr(fmt.Errorf("%w (following it: %w)", cmd.Err(), err))
			return cmd
		}
		cmd = r.acknowledged(ctx, target, true, s, keys, args)
	}
	if redis.HasErrorPrefix(cmd.Err(), "MOVED ") || redis.HasErrorPrefix(cmd.Err(), "ASK ") {
		cc.ReloadState(ctx) // the slot has moved: the next change goes to its new master
	}
	return cmd
}

// askedTo returns the address that err, an ASK reply, sends its command
// to.
func askedTo(err error) (string, bool) {
	var reply redis.Error
	if !errors.As(err, &reply) || !redis.HasErrorPrefix(reply, "ASK ") {
		return "", false
	}
	f := strings.Fields(reply.Error())
	if len(f) != 3 {
		return "", false
	}
	return f[2], true
}

// masterAt returns cc's client of the master at addr.
func masterAt(ctx context.Context, cc *redis.ClusterClient, addr string) (*redis.Client, error) {
	var (
		mu    sync.Mutex
		found *redis.Client
	)
	err := cc.ForEachMaster(ctx, func(_ context.Context, c *redis.Client) error {
		if c.Options().Addr == addr {
			mu.Lock()
			found = c
			mu.Unlock()
		}
		return nil
	})
	switch {
	case err != nil:
		return nil, err
	case found == nil:
		return nil, fmt.Errorf("no master of the Cluster is at %s", addr)
	}
	return found, nil
}

// acknowledged sends s and WAIT in one pipeline to node, after ASKING when
// asking, and returns s's reply, whose error is WAIT's when s succeeded
// but WAIT did not. It sends the script whole (EVAL), not by its hash: an
// EVALSHA that node refused with NOSCRIPT would have had its WAIT wait all
// the same, behind a frozen replica the whole AckTimeout, and the change
// sent again would wait a second time, past its deadline.
func (r *Remote) acknowledged(ctx context.Context, node redis.Cmdable, asking bool, s *redis.Script, keys []string, args []any) *redis.Cmd {
	pipe := node.Pipeline()
	if asking {
		pipe.Do(ctx, "asking")
	}
	cmd := s.Eval(ctx, pipe, keys, args...)
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
