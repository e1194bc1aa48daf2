package redisstore

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/herdcache/herd/remote"
	"github.com/herdcache/herd/remote/keyspace"
)

// Cluster slot map and subscription recovery.
const (
	// reloadEvery is the least time between two reloads of a Cluster's slot
	// map that errors ask for.
	reloadEvery = 250 * time.Millisecond
	// pingEvery is how long the subscription may stay quiet before it is
	// pinged, so that a connection that broke without a word is found.
	pingEvery = 3 * time.Second
	// resubscribeMin and resubscribeMax bound the pause after a failed
	// receive on the subscription, which doubles with each failure in a row.
	resubscribeMin = 10 * time.Millisecond
	resubscribeMax = 250 * time.Millisecond
)

// reload has a Cluster client reload its slot map, at most once per
// reloadEvery, after err, if err may mean that the map is out of date: a
// connection or timeout error (a master died, or is being replaced), or a
// CLUSTERDOWN, MOVED, ASK, TRYAGAIN or READONLY reply. go-redis reloads on
// its own only after MOVED and ASK, or once a minute, so without this a
// client keeps dialling a master that died until then, though the Cluster
// promoted its replica within cluster-node-timeout. The reload runs in the
// background.
func (r *Remote) reload(err error) {
	if r.cluster == nil || !staleMap(err) {
		return
	}
	r.reloadMap()
}

// reloadMap has a Cluster client reload its slot map in the background,
// unless it did less than reloadEvery ago.
func (r *Remote) reloadMap() {
	now := int64(time.Since(r.born))
	last := r.reloadedAt.Load()
	if last != 0 && now-last < int64(reloadEvery) || !r.reloadedAt.CompareAndSwap(last, now) {
		return
	}
	r.cluster.ReloadState(context.Background())
}

// staleMap reports whether err, from a Redis call on a Cluster, may mean
// that the client's slot map is out of date.
func staleMap(err error) bool {
	switch {
	case err == nil, errors.Is(err, redis.Nil), errors.Is(err, context.Canceled), errors.Is(err, redis.ErrClosed):
		return false
	}
	var reply redis.Error
	if !errors.As(err, &reply) {
		return true // the connection failed or timed out
	}
	for _, p := range []string{"CLUSTERDOWN", "MOVED ", "ASK ", "TRYAGAIN", "READONLY"} {
		if redis.HasErrorPrefix(reply, p) {
			return true
		}
	}
	return false
}

// listen hands l's messages on until Close. A receive that fails (the
// connection broke, or its master died) is retried after a pause that
// grows from resubscribeMin to resubscribeMax, and on a Cluster has the
// slot map reloaded, so that the PubSub, which resubscribes on its next
// receive, dials the node that now holds the channel's slot. A shard
// channel's subscription that Redis ended (its slot left the master) or
// answered with an error (MOVED) is renewed after such a pause instead,
// with the map reloaded.
func (r *Remote) listen(ctx context.Context, l *listener) {
	first := true
	pause := time.Duration(0)
	for {
		ps := l.pubsub()
		m, err := ps.ReceiveTimeout(ctx, pingEvery)
		if err != nil {
			if r.closed.Load() || errors.Is(err, redis.ErrClosed) || ctx.Err() != nil {
				return
			}
			if isTimeout(err) && pause == 0 {
				_ = ps.Ping(ctx) // a broken connection fails the ping or the next receive
				continue
			}
			r.reload(err)
			pause = min(max(2*pause, resubscribeMin), resubscribeMax)
			if !sleep(ctx, pause) {
				return
			}
			var reply redis.Error
			if l.shard != "" && errors.As(err, &reply) {
				l.renew(ctx, r.cluster)
			}
			continue
		}
		pause = 0
		switch m := m.(type) {
		case *redis.Subscription:
			switch m.Kind {
			case "subscribe", "ssubscribe":
				r.subscribed(first)
				first = false
			case "sunsubscribe": // the slot left the master: none is asked for but at Close
				r.reloadMap()
				pause = resubscribeMin
				if !sleep(ctx, pause) {
					return
				}
				l.renew(ctx, r.cluster)
			}
		case *redis.Message:
			r.dispatch(m.Payload)
		}
	}
}

// isTimeout reports whether err is a network timeout.
func isTimeout(err error) bool {
	var t interface{ Timeout() bool }
	return errors.As(err, &t) && t.Timeout()
}

// sleep waits for d, or until ctx ends, and reports whether d passed.
func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}

// ErrSlotMigrating is returned, wrapped with [remote.ErrRejected], by a call
// whose key's Cluster slot is being migrated from one master to another
// (CLUSTER SETSLOT MIGRATING / IMPORTING) when Redis kept answering
// TRYAGAIN to its script through migratingTries tries: a script that
// touches several keys of the slot cannot run while some of them are on
// the source master and some are not. It says nothing of the server's
// health, so the cache's breaker does not count it. Only Extend and
// ExtendMany return it: the other calls fall back to one-key steps.
var ErrSlotMigrating = errors.New("redisstore: the key's Cluster slot is migrating")

// A script answered TRYAGAIN is run again up to migratingTries times in
// all, after pauses that double from migratingPause, within its deadline.
const (
	migratingTries = 5
	migratingPause = 10 * time.Millisecond
)

// Scripts of the one-key steps that Acquire, WriteRelease and the changes
// fall back to while a key's slot migrates (see also split.go).
var (
	freshScript    = script("fresh")
	advanceScript  = script("advance")
	putNewerScript = script("putnewer")
	keepScript     = script("keep")
)

// tryAgain reports whether err is Redis' TRYAGAIN reply: a command on
// several keys of a slot being migrated, some of them missing on the node.
func tryAgain(err error) bool {
	return err != nil && redis.HasErrorPrefix(err, "TRYAGAIN")
}

// run runs s as s.Run does, and when Redis answers TRYAGAIN (go-redis
// having followed ASK and retried already), runs it again, up to
// migratingTries times in all, after pauses that double from
// migratingPause, while ctx lasts; a TRYAGAIN that persists, or the end of
// ctx after one, is returned wrapped with ErrSlotMigrating and
// remote.ErrRejected.
func (r *Remote) run(ctx context.Context, s *redis.Script, keys []string, args ...any) *redis.Cmd {
	cmd := s.Run(ctx, r.client, keys, args...)
	migrating := tryAgain(cmd.Err())
	pause := migratingPause
	for try := 1; try < migratingTries && tryAgain(cmd.Err()); try++ {
		if !sleep(ctx, pause) {
			break
		}
		pause *= 2
		cmd = s.Run(ctx, r.client, keys, args...)
	}
	if err := cmd.Err(); migrating && err != nil && (tryAgain(err) || ctx.Err() != nil) {
		cmd.SetErr(fmt.Errorf("%w: %w: %w", ErrSlotMigrating, remote.ErrRejected, err))
	}
	return cmd
}

// acquireSplit does what the acquire script does in one-key steps, for a
// key whose slot is migrating, where the script meets TRYAGAIN until its
// three keys are on one node: it returns the stored envelope if it is
// fresh (the fresh script), else takes the lease with SET NX PX, or
// returns how long the holder's lease has left (PTTL), and advances the
// fence of a lease it took (the advance script). Each step goes to the
// node that holds its key, the target of the migration when the source no
// longer does (go-redis follows ASK), so the fleet's acquisitions meet on
// one lease key. The fence advances after the lease is taken, not with it:
// a write-back under an earlier fence that lands in between still writes.
func (r *Remote) acquireSplit(ctx context.Context, n keyspace.Names, key, token string, ms, afterMs int64) (remote.Grant, error) {
	v, err := freshScript.Run(ctx, r.client, []string{n.Value}, afterMs).Text()
	switch {
	case err == nil:
		return remote.Grant{Value: []byte(v)}, nil
	case !errors.Is(err, redis.Nil):
		return remote.Grant{}, err
	}
	took, err := r.client.SetNX(ctx, n.Lease, token, time.Duration(ms)*time.Millisecond).Result()
	if err != nil {
		return remote.Grant{}, err
	}
	if !took {
		left, err := r.client.PTTL(ctx, n.Lease).Result()
		if err != nil {
			return remote.Grant{}, err
		}
		return remote.Grant{HeldFor: max(left, time.Millisecond)}, nil // -1 or -2: held without an expiry, or just expired
	}
	fence, err := advanceScript.Run(ctx, r.client, []string{n.Fence}, r.fenceTTL(ms)).Int64()
	if err != nil {
		_ = releaseScript.Run(ctx, r.client, []string{n.Lease}, token, r.noticeChannel(ctx, n.Value), r.id, key).Err() // a lease without a fence is of no use
		return remote.Grant{}, err
	}
	// Announced as the acquire script announces it; a lost announcement
	// costs the other replicas one lease attempt each.
	_ = r.publish(ctx, r.noticeChannel(ctx, n.Value), "l"+strconv.FormatInt(ms, 10)+":"+r.id+key)
	return remote.Grant{Token: token, Fence: uint64(fence)}, nil
}

// writeReleaseSplit does what the write-release script does in one-key
// steps, for a key whose slot is migrating: the write of writeSplit, then
// the release of the lease and the announcement of the completion (the
// release script), in any case. It reports whether it stored.
func (r *Remote) writeReleaseSplit(ctx context.Context, n keyspace.Names, key string, env []byte, fence uint64, ms int64, token string) (bool, error) {
	wrote, err := r.writeSplit(ctx, n, key, env, fence, ms)
	if rerr := releaseScript.Run(ctx, r.client, []string{n.Lease}, token, r.noticeChannel(ctx, n.Value), r.id, key).Err(); err == nil {
		err = rerr
	}
	return wrote, err
}
